//! What the QEMU benches read off a node VM's fio runs: the figure of a terse-v3 line, and how
//! busy the VM's CPU was around it.

/// IOPS (`iops`) or MiB/s of the one terse-v3 fio line in `output` (read fields 7-8, write
/// fields 48-49, 1-based).
pub fn terse_figure(output: &str, write: bool, iops: bool) -> f64 {
    let line = output
        .lines()
        .find(|l| l.starts_with("3;"))
        .unwrap_or_else(|| panic!("no terse fio line in:\n{output}"));
    let f: Vec<&str> = line.split(';').collect();
    let (bw_kib, ops) = if write { (f[47], f[48]) } else { (f[6], f[7]) };
    if iops {
        ops.parse().expect("iops")
    } else {
        bw_kib.parse::<f64>().expect("bw") / 1024.0
    }
}

/// How busy the node VM's CPU was between the first and the last `/proc/stat` "cpu" line of
/// `output` (0-1; idle and iowait count as idle). Near 1, the initiator's one vCPU is what limits
/// the run, whichever volume or target it measures.
pub fn node_busy(output: &str) -> f64 {
    let stats: Vec<Vec<u64>> = output
        .lines()
        .filter(|l| l.starts_with("cpu "))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .map_while(|x| x.parse().ok())
                .collect()
        })
        .collect();
    let (Some(a), Some(b)) = (stats.first(), stats.last()) else {
        panic!("no /proc/stat lines in:\n{output}");
    };
    let d: Vec<u64> = b.iter().zip(a).map(|(y, x)| y.saturating_sub(*x)).collect();
    let total: u64 = d.iter().sum();
    let idle = d.iter().skip(3).take(2).sum::<u64>();
    assert!(
        total > 0,
        "no CPU time passed between the /proc/stat lines of:\n{output}"
    );
    (total - idle) as f64 / total as f64
}
