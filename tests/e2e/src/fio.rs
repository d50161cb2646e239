//! What the QEMU benches read off fio runs and a VM's `/proc/stat`: the figure of a terse-v3 line,
//! the I/Os it completed, its completion-latency percentiles, and how busy a VM's CPU was around it.

/// The fields of the one terse-v3 fio line in `output`.
fn terse_fields(output: &str) -> Vec<&str> {
    output
        .lines()
        .find(|l| l.starts_with("3;"))
        .unwrap_or_else(|| panic!("no terse fio line in:\n{output}"))
        .split(';')
        .collect()
}

/// 0-based index of the first field of the read (fields 6-46, 1-based) or write (47-87) block.
fn block(write: bool) -> usize {
    if write {
        46
    } else {
        5
    }
}

/// IOPS (`iops`) or MiB/s of the one terse-v3 fio line in `output` (read fields 7-8, write
/// fields 48-49, 1-based).
pub fn terse_figure(output: &str, write: bool, iops: bool) -> f64 {
    let f = terse_fields(output);
    let b = block(write);
    if iops {
        f[b + 2].parse().expect("iops")
    } else {
        f[b + 1].parse::<f64>().expect("bw") / 1024.0
    }
}

/// I/Os the terse-v3 line in `output` completed: its total KiB (read field 6, write field 47,
/// 1-based) over the block size `bs_kib` (every I/O of a fixed-`bs` job is that size).
pub fn terse_ios(output: &str, write: bool, bs_kib: u64) -> u64 {
    let kib: u64 = terse_fields(output)[block(write)]
        .parse()
        .expect("total KiB");
    kib / bs_kib
}

/// Completion latency percentile `pct` (e.g. 50.0, 99.0) in µs of the terse-v3 line in `output`:
/// one of the `P%=usec` fields (read 18-37, write 59-78, 1-based; fio's default list).
pub fn terse_clat_percentile(output: &str, write: bool, pct: f64) -> f64 {
    let f = terse_fields(output);
    let b = block(write);
    f[b + 12..b + 32]
        .iter()
        .find_map(|field| {
            let (p, v) = field.split_once("%=")?;
            let p: f64 = p.parse().ok()?;
            ((p - pct).abs() < 1e-6).then(|| v.parse().expect("percentile value"))
        })
        .unwrap_or_else(|| panic!("no {pct} % completion latency in:\n{output}"))
}

/// The change of each field of the `/proc/stat` "cpu" line (user, nice, system, idle, iowait,
/// irq, softirq, steal) between the first and the last such line of `output`.
fn cpu_deltas(output: &str) -> [u64; 8] {
    let stats: Vec<Vec<u64>> = output
        .lines()
        .filter(|l| l.starts_with("cpu "))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .take(8)
                .map_while(|x| x.parse().ok())
                .collect()
        })
        .collect();
    let (Some(a), Some(b)) = (stats.first(), stats.last()) else {
        panic!("no /proc/stat lines in:\n{output}");
    };
    let mut d = [0; 8];
    for (i, (y, x)) in b.iter().zip(a).enumerate() {
        d[i] = y.saturating_sub(*x);
    }
    d
}

/// CPU ticks (USER_HZ, 1/100 s on x86) between the first and the last `/proc/stat` "cpu" line of
/// `output`: (busy, total). Busy is everything but idle and iowait: user, nice, system, irq,
/// softirq, steal. guest and guest_nice are left out (the kernel already counts them in user).
pub fn cpu_ticks(output: &str) -> (u64, u64) {
    let d = cpu_deltas(output);
    let total: u64 = d.iter().sum();
    (total - d[3] - d[4], total)
}

/// Where the busy ticks of [`cpu_ticks`] went: (user + nice, system, irq + softirq + steal).
pub fn cpu_split(output: &str) -> (u64, u64, u64) {
    let d = cpu_deltas(output);
    (d[0] + d[1], d[2], d[5] + d[6] + d[7])
}

/// How busy the node VM's CPU was between the first and the last `/proc/stat` "cpu" line of
/// `output` (0-1; idle and iowait count as idle). Near 1, the initiator's one vCPU is what limits
/// the run, whichever volume or target it measures.
pub fn node_busy(output: &str) -> f64 {
    let (busy, total) = cpu_ticks(output);
    assert!(
        total > 0,
        "no CPU time passed between the /proc/stat lines of:\n{output}"
    );
    busy as f64 / total as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A terse-v3 line of fio 3.33 (4k randread, 201 I/Os, rate_iops=200), trimmed after the write
    /// block's percentiles.
    const READ: &str = "3;fio-3.33;b;0;0;804;803;200;1001;0;0;0.000000;0.000000;66;5473;\
        155.197303;381.158281;1.000000%=67;5.000000%=73;10.000000%=79;20.000000%=86;\
        30.000000%=88;40.000000%=91;50.000000%=96;60.000000%=118;70.000000%=158;80.000000%=185;\
        90.000000%=209;95.000000%=234;99.000000%=264;99.500000%=403;99.900000%=5472;\
        99.950000%=5472;99.990000%=5472;0%=0;0%=0;0%=0;66;5476;155.871418;381.1;0;0;0;0;0;\
        0;0;0;0;0;0;0;0;0;0;0;0;1.000000%=0;5.000000%=0;10.000000%=0;20.000000%=0;30.000000%=0;\
        40.000000%=0;50.000000%=0;60.000000%=0;70.000000%=0;80.000000%=0;90.000000%=0;\
        95.000000%=0;99.000000%=0;99.500000%=0;99.900000%=0;99.950000%=0;99.990000%=0;0%=0;0%=0;0%=0";

    #[test]
    fn terse_read_block() {
        let out = format!("fio: starting\n{READ}\n");
        assert_eq!(terse_figure(&out, false, true), 200.0);
        assert!((terse_figure(&out, false, false) - 803.0 / 1024.0).abs() < 1e-9);
        assert_eq!(terse_ios(&out, false, 4), 201);
        assert_eq!(terse_ios(&out, true, 4), 0);
        assert_eq!(terse_clat_percentile(&out, false, 50.0), 96.0);
        assert_eq!(terse_clat_percentile(&out, false, 99.0), 264.0);
        assert_eq!(terse_clat_percentile(&out, true, 99.0), 0.0);
    }

    #[test]
    #[should_panic(expected = "no 42 % completion latency")]
    fn terse_missing_percentile() {
        terse_clat_percentile(READ, false, 42.0);
    }

    #[test]
    fn cpu_ticks_leave_out_idle_iowait_and_guest() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let out = "cpu  100 0 50 1000 10 5 5 0 7 0\n3;fio...\ncpu  160 1 80 1400 30 9 8 2 99 0\n";
        // busy: 60 + 1 + 30 + 4 + 3 + 2 = 100; total: busy + 400 idle + 20 iowait.
        assert_eq!(cpu_ticks(out), (100, 520));
        assert!((node_busy(out) - 100.0 / 520.0).abs() < 1e-12);
        // user + nice, system, irq + softirq + steal: the busy ticks, split.
        assert_eq!(cpu_split(out), (61, 30, 9));
    }
}
