//! Data path in QEMU (scripts/bench-qemu.sh, the full mode of scripts/bench.sh): fio in the node
//! VM against a volume of the edgevol target and against the kernel's nvmet-tcp, both served by
//! the same appliance VM from identical raw virtio-blk backing files. The volume is created and
//! published from the host through CSI over mTLS; the node VM connects both subsystems itself
//! through /dev/nvme-fabrics with the same options (its host NQN, default queues), fills the
//! measured region, then runs every workload `EDGEVOL_BENCH_RUNS` times per target, alternating
//! targets, in two passes, and writes markdown tables of medians and ratios to `EDGEVOL_BENCH_OUT`:
//! * unpaced: throughput, with how busy the node VM's one vCPU was during each target's runs
//!   (`/proc/stat` around each fio); at 70 % or more the row measures the initiator;
//! * paced (fio `rate_iops`, or `rate` for the MiB/s rows) at 60 % of the slower target's unpaced
//!   median, the same for both targets: the appliance VM's CPU time per I/O, its non-idle
//!   `/proc/stat` ticks read through the e2e-agent in it (`EDGEVOL_BENCH_APPLIANCE_EXEC`) right
//!   before and after each fio run, over the I/Os fio completed; for the QD1 4k workloads also
//!   fio's completion latency p50 and p99.
//!
//! Ignored unless run by the script (needs its VMs and EDGEVOL_E2E_* / EDGEVOL_BENCH_* variables).

use std::path::PathBuf;

use edgevol_e2e::{appliance_channel, env_addr, node_channel, within, Agent};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::node_client::NodeClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
use edgevol_proto::csi::v1::*;

const MIB: i64 = 1 << 20;
const CALL_SECS: u64 = 120;
/// The region fio touches on both targets (filled first, so reads hit written blocks).
const REGION_MIB: i64 = 256;
/// The paced pass runs at this share of the slower target's unpaced median: a load both sustain.
const PACE: f64 = 0.6;
/// From this share of busy ticks on, the node VM's one vCPU is what limits an unpaced run.
const INITIATOR_BOUND: f64 = 0.70;
/// `/proc/stat` ticks per second (USER_HZ: 100 on x86 whatever the kernel's HZ).
const USER_HZ: f64 = 100.0;

fn env_or(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{var}={v:?}")))
        .unwrap_or(default)
}

/// One fio workload: name, unit, rw, block size, queue depth.
struct Workload {
    name: &'static str,
    iops: bool,
    rw: &'static str,
    bs: &'static str,
    qd: u32,
}

const WORKLOADS: [Workload; 6] = [
    Workload {
        name: "4k randread QD1",
        iops: true,
        rw: "randread",
        bs: "4k",
        qd: 1,
    },
    Workload {
        name: "4k randread QD16",
        iops: true,
        rw: "randread",
        bs: "4k",
        qd: 16,
    },
    Workload {
        name: "4k randwrite QD1",
        iops: true,
        rw: "randwrite",
        bs: "4k",
        qd: 1,
    },
    Workload {
        name: "4k randwrite QD16",
        iops: true,
        rw: "randwrite",
        bs: "4k",
        qd: 16,
    },
    Workload {
        name: "128k seqread QD8",
        iops: false,
        rw: "read",
        bs: "128k",
        qd: 8,
    },
    Workload {
        name: "128k seqwrite QD8",
        iops: false,
        rw: "write",
        bs: "128k",
        qd: 8,
    },
];

/// Connects an NVMe/TCP subsystem through /dev/nvme-fabrics and prints its block device.
fn connect_script(addr: &str, port: &str, nqn: &str) -> String {
    format!(
        r#"set -e
h=$(cat /etc/nvme/hostnqn)
exec 3<>/dev/nvme-fabrics
echo "transport=tcp,traddr={addr},trsvcid={port},nqn={nqn},hostnqn=$h" >&3
read -r reply <&3 || true
exec 3>&-
for i in $(seq 1 100); do
  for b in /sys/block/nvme*; do
    n=$(basename "$b")
    case "$n" in *c*) continue ;; esac
    s=$(cat "$b/device/subsysnqn" 2>/dev/null || cat "$b/device/../subsysnqn" 2>/dev/null || true)
    if [ "$s" = "{nqn}" ] && [ -b "/dev/$n" ]; then echo "/dev/$n"; exit 0; fi
  done
  sleep 0.1
done
ls -l /sys/block
exit 1"#
    )
}

/// `x` rounded down to a whole number (a rate well inside u64; a negative or NaN one gives 0).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn whole(x: f64) -> u64 {
    x.floor() as u64
}

impl Workload {
    fn write(&self) -> bool {
        self.rw.contains("write")
    }

    fn bs_kib(&self) -> u64 {
        self.bs
            .strip_suffix('k')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("block size {:?} is not <N>k", self.bs))
    }

    /// Whether the paced pass also reports completion latency (the QD1 4k rows).
    fn latency_row(&self) -> bool {
        self.iops && self.qd == 1
    }

    /// The fio option that paces it at `PACE` of `slower` (its unpaced median, in its unit), and
    /// that pace as the tables print it.
    fn pace(&self, slower: f64) -> (String, String) {
        if self.iops {
            let n = whole(slower * PACE).max(1);
            (format!("--rate_iops={n}"), format!("{n} IOPS"))
        } else {
            let b = whole(slower * PACE * 1_048_576.0).max(self.bs_kib() * 1024);
            (
                format!("--rate={b}"),
                format!("{:.1} MiB/s", b as f64 / 1_048_576.0),
            )
        }
    }

    /// fio against `dev` for `secs`, terse v3; `extra`: a ramp or a pace.
    fn fio(&self, dev: &str, secs: u64, extra: &str) -> String {
        format!(
            "fio --name=b --filename={dev} --direct=1 --ioengine=libaio --rw={} --bs={} \
             --iodepth={} --size={REGION_MIB}m --time_based --runtime={secs} {extra} \
             --norandommap --randrepeat=0 --output-format=terse --terse-version=3",
            self.rw, self.bs, self.qd
        )
    }
}

/// IOPS or MiB/s of `w`'s terse fio line in `output`.
fn parse_fio(output: &str, w: &Workload) -> f64 {
    edgevol_e2e::fio::terse_figure(output, w.write(), w.iops)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn fmt(x: f64, iops: bool) -> String {
    if iops {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

fn ratio(e: f64, n: f64) -> f64 {
    if n > 0.0 {
        e / n
    } else {
        f64::NAN
    }
}

fn list(v: &[f64], decimals: usize) -> String {
    v.iter()
        .map(|x| format!("{x:.decimals$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// "initiator-bound" when the node VM's median busy share reached `INITIATOR_BOUND` during
/// either target's runs (naming the target when only one did), else "-".
fn bound_mark(busy: [f64; 2]) -> &'static str {
    match (busy[0] >= INITIATOR_BOUND, busy[1] >= INITIATOR_BOUND) {
        (true, true) => "initiator-bound",
        (true, false) => "initiator-bound (edgevol)",
        (false, true) => "initiator-bound (nvmet-tcp)",
        (false, false) => "-",
    }
}

/// The appliance VM's `/proc/stat` "cpu" line, read through its e2e-agent.
async fn appliance_stat(appliance: &Agent) -> String {
    appliance.ok(30, "head -1 /proc/stat").await
}

/// The tables so far (written after every workload: a matrix cut short by its budget still
/// leaves the rows it finished).
struct Tables {
    throughput: String,
    cpu: String,
    latency: String,
    /// The appliance VM's busy share with no fio running, and over how many seconds.
    background: (f64, u64),
}

impl Tables {
    fn markdown(&self) -> String {
        let (idle_busy, idle_secs) = self.background;
        let mut md = format!(
            "Throughput, unpaced (initiator-bound: the node VM's one vCPU was at least {:.0} % busy \
             during a target's runs, so that row measures the initiator, not the target):\n\n\
             | workload | unit | edgevol (median) | nvmet-tcp (median) | edgevol / nvmet-tcp | edgevol runs | nvmet-tcp runs | node VM CPU busy, edgevol | same, nvmet-tcp | initiator-bound |\n\
             |---|---|---:|---:|---:|---|---|---:|---:|---|\n{}",
            INITIATOR_BOUND * 100.0,
            self.throughput,
        );
        md += &format!(
            "\nAppliance VM CPU per I/O, paced (one fio rate for both targets, {:.0} % of the slower \
             one's unpaced median; the appliance VM's non-idle /proc/stat time from right before to \
             right after each fio run, over the I/Os fio completed):\n\n\
             | workload | pace | achieved (median), edgevol / nvmet-tcp | CPU per I/O, edgevol (µs, median) | CPU per I/O, nvmet-tcp (µs, median) | edgevol runs (µs) | nvmet-tcp runs (µs) | edgevol / nvmet-tcp |\n\
             |---|---|---|---:|---:|---|---|---:|\n{}\n\
             Appliance VM with no fio running: {:.1} % busy over {idle_secs} s ({:.0} µs of CPU per \
             second). That background is in every window above: divided by the pace, it is its \
             share of each CPU per I/O figure.\n",
            PACE * 100.0,
            self.cpu,
            idle_busy * 100.0,
            idle_busy * 1e6,
        );
        if !self.latency.is_empty() {
            md += &format!(
                "\nCompletion latency at QD1, paced as above (fio clat, µs, medians):\n\n\
                 | workload | pace | edgevol p50 | nvmet-tcp p50 | edgevol / nvmet-tcp p50 | edgevol p99 | nvmet-tcp p99 | edgevol / nvmet-tcp p99 |\n\
                 |---|---|---:|---:|---:|---:|---:|---:|\n{}",
                self.latency
            );
        }
        md
    }
}

/// Runs `fio` in the node VM while perf samples the appliance VM (cpu-clock, as there is no PMU
/// under TCG, with call chains) and counts each virtio notification (`vp_notify`: under TCG a
/// trap to QEMU, and so dear) and each system call. Returns fio's I/O count and perf's reports:
/// time by command and symbol, events by command, the call chains that notify and copy, and
/// the system calls each thread made.
async fn profile_run(
    appliance: &Agent,
    node: &Agent,
    w: &Workload,
    fio: &str,
    secs: u64,
) -> (u64, String) {
    appliance
        .ok(
            60,
            &format!(
                "rm -f /tmp/perf.data; mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null; \
                 echo p:probe/vp_notify vp_notify >/sys/kernel/tracing/kprobe_events; \
                 (perf record -a -g -e cpu-clock/freq=1000/ -e probe:vp_notify \
                 -e raw_syscalls:sys_enter --exclude-perf -o /tmp/perf.data -- sleep {secs} \
                 >/tmp/perf.log 2>&1 &)"
            ),
        )
        .await;
    let output = node.ok(secs + 120, fio).await;
    let ios = edgevol_e2e::fio::terse_ios(&output, w.write(), w.bs_kib());
    let report = appliance
        .ok(
            300,
            r#"while pidof perf >/dev/null; do sleep 1; done; cat /tmp/perf.log
r() { perf report -i /tmp/perf.data --stdio -g none "$@" 2>&1 |
      grep -v -e '^$' -e '^#$' -e '^# [^SE]'; }
r --no-children --sort comm --percent-limit 1
r --no-children --sort comm,dso,sym --percent-limit 0.3 | head -150
echo '--- inclusive (children) time by command and symbol'
r --children --sort comm,sym --percent-limit 1.5 | head -120
echo '--- who notifies (call chains of probe:vp_notify, frames 2-7)'
perf script -i /tmp/perf.data -F comm,event,ip,sym 2>/dev/null | awk '
function flush() { if (key != "") c[key]++; key = "" }
/^[^ \t]/ { flush(); want = index($0, "probe:vp_notify") > 0; if (want) { key = $1; n = 0 }; next }
want && NF >= 2 { n++; if (n >= 2 && n <= 7) key = key " <- " $2 }
END { flush(); for (k in c) print c[k], k }' | sort -rn | head -25
echo '--- who copies in user space (call chains of cpu-clock samples in memcpy, frames 2-5)'
perf script -i /tmp/perf.data -F comm,event,ip,sym 2>/dev/null | awk '
function flush() { if (key != "") c[key]++; key = "" }
/^[^ \t]/ { flush(); want = index($0, "cpu-clock") > 0; n = 0; comm = $1; next }
want && NF >= 2 { n++; if (n == 1 && $2 != "memcpy") want = 0; else if (n == 1) key = comm; else if (n <= 5) key = key " <- " $2 }
END { flush(); for (k in c) print c[k], k }' | sort -rn | head -15
echo '--- system calls by thread and number (x86_64 names)'
perf script -i /tmp/perf.data -F comm,event,trace 2>/dev/null | awk '
BEGIN { split("0 read 1 write 7 poll 17 pread64 18 pwrite64 19 readv 20 writev 24 sched_yield 44 sendto 45 recvfrom 46 sendmsg 47 recvmsg 202 futex 228 clock_gettime 232 epoll_wait 233 epoll_ctl 271 ppoll 281 epoll_pwait 426 io_uring_enter", a, " "); for (i = 1; i < length(a); i += 2) name[a[i]] = a[i + 1] }
/raw_syscalls:sys_enter/ { for (i = 1; i < NF; i++) if ($i == "NR") { nr = $(i + 1); c[$1 " " (nr in name ? name[nr] : "NR " nr)]++ } }
END { for (k in c) print c[k], k }' | sort -rn | head -25"#,
        )
        .await;
    (ios, report)
}

#[tokio::test]
#[ignore = "needs the VMs of scripts/bench-qemu.sh"]
async fn bench_qemu() {
    let pki = PathBuf::from(std::env::var("EDGEVOL_E2E_PKI").expect("EDGEVOL_E2E_PKI"));
    let nvmet = std::env::var("EDGEVOL_BENCH_NVMET").expect("EDGEVOL_BENCH_NVMET=ADDR:PORT:NQN");
    let mut nv = nvmet.splitn(3, ':');
    let (nv_addr, nv_port, nv_nqn) = (
        nv.next().expect("addr"),
        nv.next().expect("port"),
        nv.next().expect("nqn"),
    );
    let out = PathBuf::from(std::env::var("EDGEVOL_BENCH_OUT").expect("EDGEVOL_BENCH_OUT"));
    let secs = env_or("EDGEVOL_BENCH_SECS", 10);
    let runs = usize::try_from(env_or("EDGEVOL_BENCH_RUNS", 3).max(1)).expect("runs");
    // `EDGEVOL_BENCH_ONLY=4k randread QD1,128k seqread QD8`: only the workloads so named.
    let only = std::env::var("EDGEVOL_BENCH_ONLY").unwrap_or_default();
    let picked = |w: &Workload| only.is_empty() || only.split(',').any(|o| w.name == o.trim());
    // `EDGEVOL_BENCH_PROFILE=1`: one more paced run per workload and target under perf.
    let profile = env_or("EDGEVOL_BENCH_PROFILE", 0) == 1;

    let mut ctl = ControllerClient::new(
        appliance_channel(env_addr("EDGEVOL_E2E_CSI"), &pki, "controller").await,
    );
    let mut node = NodeClient::new(node_channel(env_addr("EDGEVOL_E2E_NODE_CSI")).await);
    let agent = Agent {
        addr: env_addr("EDGEVOL_E2E_NODE_EXEC"),
    };
    // The appliance VM's e2e-agent: only its /proc/stat is read through it.
    let appliance = Agent {
        addr: env_addr("EDGEVOL_BENCH_APPLIANCE_EXEC"),
    };
    let node_id = within(
        CALL_SECS,
        "NodeGetInfo",
        node.node_get_info(NodeGetInfoRequest {}),
    )
    .await
    .expect("NodeGetInfo")
    .into_inner()
    .node_id;

    let capability = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    };
    let volume = within(
        CALL_SECS,
        "CreateVolume",
        ctl.create_volume(CreateVolumeRequest {
            name: "bench-qemu".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 2 * REGION_MIB * MIB,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability.clone()],
            ..Default::default()
        }),
    )
    .await
    .expect("CreateVolume")
    .into_inner()
    .volume
    .expect("a volume");
    let context = within(
        CALL_SECS,
        "ControllerPublishVolume",
        ctl.controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: node_id.clone(),
            volume_capability: Some(capability),
            readonly: false,
            ..Default::default()
        }),
    )
    .await
    .expect("ControllerPublishVolume")
    .into_inner()
    .publish_context;
    let get = |k: &str| {
        context
            .get(k)
            .unwrap_or_else(|| panic!("publish_context lacks {k}: {context:?}"))
            .clone()
    };
    let ev_script = connect_script(
        &get("targetAddress"),
        &get("targetPort"),
        &get("subsystemNqn"),
    );
    // The agent merges stderr into the output: the device is the last line.
    let last = |out: String| out.lines().last().unwrap_or_default().trim().to_owned();
    let ev_dev = last(agent.ok(60, &ev_script).await);
    let nv_dev = last(
        agent
            .ok(60, &connect_script(nv_addr, nv_port, nv_nqn))
            .await,
    );
    eprintln!(
        "bench-qemu: edgevol volume {} on {ev_dev}, nvmet-tcp on {nv_dev}",
        volume.volume_id
    );
    let targets = [("edgevol", ev_dev), ("nvmet-tcp", nv_dev)];

    for (name, dev) in &targets {
        let t = std::time::Instant::now();
        agent
            .ok(
                600,
                &format!(
                    "fio --name=fill --filename={dev} --direct=1 --ioengine=libaio --rw=write \
                     --bs=1m --iodepth=4 --size={REGION_MIB}m --output-format=terse"
                ),
            )
            .await;
        eprintln!(
            "bench-qemu: filled {REGION_MIB} MiB of {name} in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }

    // The appliance VM's own activity with no I/O (edgevold, nvmet-tcp, both controllers'
    // keep-alives): part of every paced window, so the reader can weigh it.
    let before = appliance_stat(&appliance).await;
    tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
    let after = appliance_stat(&appliance).await;
    let idle_busy = edgevol_e2e::fio::node_busy(&format!("{before}\n{after}"));
    eprintln!(
        "bench-qemu: appliance VM {:.1} % busy over {secs} s with no fio running",
        idle_busy * 100.0
    );
    // Where a clock read goes: the vDSO (user time) with tsc, a system call without.
    let clock = appliance
        .ok(
            30,
            "cat /sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .await;
    eprintln!("bench-qemu: appliance VM clocksource {}", clock.trim());
    let mut tables = Tables {
        throughput: String::new(),
        cpu: String::new(),
        latency: String::new(),
        background: (idle_busy, secs),
    };
    for w in WORKLOADS.iter().filter(|w| picked(w)) {
        // a. Unpaced: throughput, and how busy the node VM was.
        let mut results: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut busy: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for run in 0..runs {
            for (i, (name, dev)) in targets.iter().enumerate() {
                let cmd = format!(
                    "head -1 /proc/stat && {} && head -1 /proc/stat",
                    w.fio(dev, secs, "--ramp_time=1")
                );
                let output = agent.ok(secs + 120, &cmd).await;
                let v = parse_fio(&output, w);
                let b = edgevol_e2e::fio::node_busy(&output);
                eprintln!(
                    "bench-qemu: {} run {} {name}: {} (node VM CPU busy {b:.2})",
                    w.name,
                    run + 1,
                    fmt(v, w.iops)
                );
                results[i].push(v);
                busy[i].push(b);
            }
        }
        let (e, n) = (median(&results[0]), median(&results[1]));
        let node_busy = [median(&busy[0]), median(&busy[1])];
        let dec = if w.iops { 0 } else { 1 };
        tables.throughput.push_str(&format!(
            "| {} | {} | {} | {} | {:.2} | {} | {} | {:.2} | {:.2} | {} |\n",
            w.name,
            if w.iops { "IOPS" } else { "MiB/s" },
            fmt(e, w.iops),
            fmt(n, w.iops),
            ratio(e, n),
            list(&results[0], dec),
            list(&results[1], dec),
            node_busy[0],
            node_busy[1],
            bound_mark(node_busy),
        ));
        std::fs::write(&out, tables.markdown()).expect("write EDGEVOL_BENCH_OUT");

        // b. Paced, the same rate for both targets: the appliance VM's CPU per I/O (its
        // /proc/stat right around each fio run, so neither boot nor volume creation counts) and
        // the QD1 rows' completion latency. No ramp: every I/O in the window is one fio counts.
        let slower = e.min(n);
        assert!(
            slower > 0.0,
            "{}: a target did no I/O unpaced ({e} / {n}): no pace for it",
            w.name
        );
        let (pace_opt, pace) = w.pace(slower);
        eprintln!("bench-qemu: {} paced at {pace} ({pace_opt})", w.name);
        let mut cpu: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut achieved: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut p50: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut p99: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for run in 0..runs {
            for (i, (name, dev)) in targets.iter().enumerate() {
                let before = appliance_stat(&appliance).await;
                let output = agent.ok(secs + 120, &w.fio(dev, secs, &pace_opt)).await;
                let after = appliance_stat(&appliance).await;
                let stat = format!("{before}\n{after}");
                let (ticks, _) = edgevol_e2e::fio::cpu_ticks(&stat);
                let (user, system, irq) = edgevol_e2e::fio::cpu_split(&stat);
                let ios = edgevol_e2e::fio::terse_ios(&output, w.write(), w.bs_kib());
                assert!(
                    ios > 0,
                    "{} {name}: paced fio completed no I/O:\n{output}",
                    w.name
                );
                let us = ticks as f64 * 1e6 / USER_HZ / ios as f64;
                let v = parse_fio(&output, w);
                eprintln!(
                    "bench-qemu: {} paced run {} {name}: {} achieved, appliance VM {ticks} ticks \
                     over {ios} I/Os = {us:.1} µs per I/O (user {user}, system {system}, \
                     irq+softirq {irq})",
                    w.name,
                    run + 1,
                    fmt(v, w.iops)
                );
                cpu[i].push(us);
                achieved[i].push(v);
                if w.latency_row() {
                    let (a, b) = (
                        edgevol_e2e::fio::terse_clat_percentile(&output, w.write(), 50.0),
                        edgevol_e2e::fio::terse_clat_percentile(&output, w.write(), 99.0),
                    );
                    eprintln!(
                        "bench-qemu: {} paced run {} {name}: clat p50 {a} µs, p99 {b} µs",
                        w.name,
                        run + 1
                    );
                    p50[i].push(a);
                    p99[i].push(b);
                }
            }
        }
        if profile {
            for (name, dev) in &targets {
                let fio = w.fio(dev, secs, &pace_opt);
                let (ios, report) = profile_run(&appliance, &agent, w, &fio, secs).await;
                eprintln!(
                    "bench-qemu: {} profile of the appliance VM, {name}, paced, {ios} I/Os \
                     (perf: cpu-clock samples, vp_notify calls, system calls):\n{report}",
                    w.name
                );
            }
        }
        let (ce, cn) = (median(&cpu[0]), median(&cpu[1]));
        tables.cpu.push_str(&format!(
            "| {} | {pace} | {} / {} | {ce:.1} | {cn:.1} | {} | {} | {:.2} |\n",
            w.name,
            fmt(median(&achieved[0]), w.iops),
            fmt(median(&achieved[1]), w.iops),
            list(&cpu[0], 1),
            list(&cpu[1], 1),
            ratio(ce, cn),
        ));
        if w.latency_row() {
            let (e50, n50, e99, n99) = (
                median(&p50[0]),
                median(&p50[1]),
                median(&p99[0]),
                median(&p99[1]),
            );
            tables.latency.push_str(&format!(
                "| {} | {pace} | {e50:.0} | {n50:.0} | {:.2} | {e99:.0} | {n99:.0} | {:.2} |\n",
                w.name,
                ratio(e50, n50),
                ratio(e99, n99),
            ));
        }
        std::fs::write(&out, tables.markdown()).expect("write EDGEVOL_BENCH_OUT");
    }
    eprintln!("{}", tables.markdown());
}
