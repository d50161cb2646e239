//! Data-path benchmark: the NVMe/TCP target through the test initiator over loopback, against
//! two baselines measured in the same run: raw loopback TCP moving the same bytes per command at
//! the same queue depth, and the raw device (hal `FileDevice` on the same tmpfs).
//!
//! `cargo bench -p edgevol-appliance --bench data_path` (add `-- --quick` for a smoke run in CI;
//! other words after `--` run only the workloads whose name contains one, e.g. `-- write`;
//! `-- --target-only` skips the baselines, for profiling).
//! Prints a table; the ratios are what matter (the machine is shared, absolute numbers vary).
//! No timing is asserted; data read back is checked on the way.
//!
//! Overwrites (`randwrite`, `seqwrite`) land in clusters the volume already owns. Allocating
//! writes (`allocwrite`) put each 4 KiB write into a cluster of the volume nothing was written to
//! yet (stride: the pool's cluster size), so every one allocates, zero-fills the rest of its
//! cluster and records a mapping. Each costs a cluster of tmpfs, so those cells also stop after
//! 1.5 GiB of clusters. The write rows at QD1 also give mean / p50 / p99 latency. The pool is the
//! dev pool (its default cluster size) unless `-- --cluster-kib N` formats it with another;
//! `-- --busy-poll-us N` sets the engines' `nvme.busy_poll_us` (default: the daemon's). The pool
//! is on tmpfs, where Reads and Writes run in place; `-- --pool-dir DIR` puts it on DIR's file
//! system instead, where `O_DIRECT` I/O goes on the queue's io_uring as on a drive. `-- --pin`
//! runs the target on one engine thread pinned to CPU 0 (`nvme.io_cpus = [0]`) and the host's
//! threads on CPU 1, so that neither waits for the other's core and no run differs from the
//! next by where the scheduler put them. `-- --pause-ms N` idles N ms after the table's header
//! and after each cell (for `scripts/bench-instructions.sh`, which acts on each line).
//!
//! The host side (test initiator, TCP baseline) runs on its own runtime; a counting allocator
//! counts the heap allocations of every other thread, the target's, and prints them per command.
//! The target's CPU time per command is printed the same way: the engine threads' alone
//! (`edgevol-io-N`, where queues run) and every thread but the host's (engines, workers, the
//! daemon's runtime), from each thread's `/proc/self/task/<tid>/schedstat` (nanoseconds; the
//! `stat` file's utime + stime, in clock ticks, where there is no schedstat). The QD32 rows
//! also give p99 / mean latency (how far the tail is from the average).
//!
//! The `polling host` rows run queue depth 1 with a host that never sleeps: it spins on
//! non-blocking reads for each answer (`Queue::cmd_polling`), as SPDK's `spdk_nvme_perf` does,
//! so that the latency is the target's and the link's and not the host's wake-up; their raw TCP
//! baseline polls at both ends, each on a thread of its own (the floor of a round trip here).
// Host-only bench on 64-bit machines: byte counts fit in usize, rates are printed as floats.
#![allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/counting_alloc/mod.rs"]
mod counting_alloc;
#[path = "../tests/nvme_host/mod.rs"]
mod nvme_host;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgevol_appliance::config::DEV_POOL_BYTES;
use edgevol_appliance::{pool, start};
use edgevol_core::VolumeSpec;
use edgevol_hal::FileDevice;
use edgevol_nvmeof::pdu::Digests;
use nvme_host::{admin_and_queue, io, ok, read_spinning, write_spinning, Queue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-2222-3333-4444-555555555555";
const BLOCK: u64 = 4096;

/// Where a workload's commands go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pattern {
    /// Uniformly random aligned slots of the filled span.
    Random,
    /// Consecutive slots of the filled span, wrapping.
    Sequential,
    /// The first block of one never-written cluster after another (allocating writes).
    Fresh,
}

#[derive(Clone, Copy)]
struct Workload {
    name: &'static str,
    bytes: u64,
    qd: usize,
    write: bool,
    pattern: Pattern,
    /// I/O queues, each at depth `qd` (the raw TCP baseline stays one connection at `qd`).
    queues: usize,
    /// The host polls (never sleeps) waiting for each answer, and so does the raw TCP
    /// baseline's: queue depth 1 only.
    polling: bool,
}

impl Workload {
    /// Whether the row is in IOPS (else MiB/s).
    fn iops(&self) -> bool {
        self.pattern != Pattern::Sequential
    }

    /// Whether latency rows follow the throughput row.
    fn latency(&self) -> bool {
        self.qd == 1 && (self.write || self.polling)
    }
}

const WORKLOADS: [Workload; 11] = [
    Workload {
        name: "4k randread QD1",
        bytes: 4096,
        qd: 1,
        write: false,
        pattern: Pattern::Random,
        queues: 1,
        polling: false,
    },
    Workload {
        name: "4k randread QD32",
        bytes: 4096,
        qd: 32,
        write: false,
        pattern: Pattern::Random,
        queues: 1,
        polling: false,
    },
    Workload {
        name: "4k randread QD32 2 queues",
        bytes: 4096,
        qd: 32,
        write: false,
        pattern: Pattern::Random,
        queues: 2,
        polling: false,
    },
    Workload {
        name: "4k randwrite QD1",
        bytes: 4096,
        qd: 1,
        write: true,
        pattern: Pattern::Random,
        queues: 1,
        polling: false,
    },
    Workload {
        name: "4k randwrite QD32",
        bytes: 4096,
        qd: 32,
        write: true,
        pattern: Pattern::Random,
        queues: 1,
        polling: false,
    },
    Workload {
        name: "4k allocwrite QD1",
        bytes: 4096,
        qd: 1,
        write: true,
        pattern: Pattern::Fresh,
        queues: 1,
        polling: false,
    },
    Workload {
        name: "4k allocwrite QD32",
        bytes: 4096,
        qd: 32,
        write: true,
        pattern: Pattern::Fresh,
        queues: 1,
        polling: false,
    },
    Workload {
        name: "128k seqread QD8",
        bytes: 128 << 10,
        qd: 8,
        write: false,
        pattern: Pattern::Sequential,
        queues: 1,
        polling: false,
    },
    Workload {
        name: "128k seqwrite QD8",
        bytes: 128 << 10,
        qd: 8,
        write: true,
        pattern: Pattern::Sequential,
        queues: 1,
        polling: false,
    },
    Workload {
        name: "4k randread QD1 polling host",
        bytes: 4096,
        qd: 1,
        write: false,
        pattern: Pattern::Random,
        queues: 1,
        polling: true,
    },
    Workload {
        name: "4k randwrite QD1 polling host",
        bytes: 4096,
        qd: 1,
        write: true,
        pattern: Pattern::Random,
        queues: 1,
        polling: true,
    },
];

/// How long a cell runs: `dur`, or `max_ops` commands if that comes first.
#[derive(Clone, Copy)]
struct Budget {
    dur: Duration,
    max_ops: u64,
}

/// Where the commands of a cell go, in blocks: the filled span of `span` bytes for random and
/// sequential workloads; for fresh ones `max_ops` clusters of `cluster` bytes from block `base`.
#[derive(Clone, Copy)]
struct Target {
    span: u64,
    base: u64,
    cluster: u64,
}

/// Offsets (in blocks) of a workload: xorshift for random, wrapping for sequential, one cluster
/// after another for fresh.
struct Offsets {
    state: u64,
    next_seq: u64,
    span_blocks: u64,
    step: u64,
    base: u64,
    stride: u64,
    pattern: Pattern,
}

impl Offsets {
    fn new(w: &Workload, t: Target) -> Self {
        Offsets {
            state: 0x9e37_79b9_7f4a_7c15,
            next_seq: 0,
            span_blocks: t.span / BLOCK,
            step: w.bytes / BLOCK,
            base: t.base,
            stride: t.cluster / BLOCK,
            pattern: w.pattern,
        }
    }

    /// Block of fresh slot `slot`.
    fn fresh(&self, slot: u64) -> u64 {
        self.base + slot * self.stride
    }

    fn next(&mut self) -> u64 {
        let slots = self.span_blocks / self.step;
        match self.pattern {
            Pattern::Random => {
                self.state ^= self.state << 13;
                self.state ^= self.state >> 7;
                self.state ^= self.state << 17;
                self.state % slots * self.step
            }
            Pattern::Sequential => {
                let s = self.next_seq % slots;
                self.next_seq += 1;
                s * self.step
            }
            Pattern::Fresh => {
                let s = self.next_seq;
                self.next_seq += 1;
                self.fresh(s)
            }
        }
    }
}

/// Names the host runtime's threads, so that their CPU time is not counted as the target's.
const HOST_THREAD: &str = "bench-host";

/// With `--pin`: the CPU of the target's one engine thread (and of the polling TCP baseline's
/// server), and of the host's threads.
const TARGET_CPU: usize = 0;
const HOST_CPU: usize = 1;

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    use nix::sched::{sched_setaffinity, CpuSet};
    let mut set = CpuSet::new();
    set.set(cpu).unwrap();
    sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .unwrap_or_else(|e| panic!("--pin needs CPU {cpu}: {e}"));
}
/// The engine threads' name prefix (`edgevol-io-N`).
const ENGINE_THREAD: &str = "edgevol-io-";

/// CPU time of every thread of this process, by thread id: its name and nanoseconds on a CPU.
struct ThreadCpu(std::collections::HashMap<u32, (String, u64)>);

impl ThreadCpu {
    fn now() -> Self {
        let mut threads = std::collections::HashMap::new();
        for entry in std::fs::read_dir("/proc/self/task")
            .into_iter()
            .flatten()
            .flatten()
        {
            let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            let dir = entry.path();
            let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if let Some(ns) = Self::cpu_ns(&dir) {
                threads.insert(tid, (name.trim_end().to_owned(), ns));
            }
        }
        ThreadCpu(threads)
    }

    /// A thread's time on a CPU: schedstat's first field, else stat's utime + stime.
    fn cpu_ns(dir: &Path) -> Option<u64> {
        if let Ok(s) = std::fs::read_to_string(dir.join("schedstat")) {
            if let Some(ns) = s.split_whitespace().next().and_then(|n| n.parse().ok()) {
                return Some(ns);
            }
        }
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        // Fields after the name (which may hold spaces) in parentheses; utime, stime are 14, 15.
        let rest = &stat[stat.rfind(')')? + 2..];
        let mut f = rest.split_whitespace().skip(11);
        let ticks: u64 = f.next()?.parse::<u64>().ok()? + f.next()?.parse::<u64>().ok()?;
        // USER_HZ: /proc counts in hundredths of a second on every Linux architecture.
        Some(ticks * 10_000_000)
    }

    /// Nanoseconds since `before`: (engine threads, every thread but the host's). A thread that
    /// ended in between is not counted (the target's threads stay).
    fn since(&self, before: &ThreadCpu) -> (u64, u64) {
        let (mut engine, mut target) = (0, 0);
        for (tid, (name, ns)) in &self.0 {
            if name.starts_with(HOST_THREAD) {
                continue;
            }
            let d = ns.saturating_sub(before.0.get(tid).map_or(0, |b| b.1));
            target += d;
            if name.starts_with(ENGINE_THREAD) {
                engine += d;
            }
        }
        (engine, target)
    }
}

/// A cell: ops completed in `elapsed`, and the latency of each (submission to completion).
struct Run {
    ops: u64,
    elapsed: Duration,
    lat: Vec<Duration>,
}

impl Run {
    fn per_sec(&self, w: &Workload) -> f64 {
        let ops = self.ops as f64 / self.elapsed.as_secs_f64();
        if w.iops() {
            ops
        } else {
            ops * w.bytes as f64 / f64::from(1 << 20)
        }
    }

    /// Mean, p50 and p99 latency in microseconds (nearest rank).
    fn latency_us(&mut self) -> [f64; 3] {
        if self.lat.is_empty() {
            return [f64::NAN; 3];
        }
        self.lat.sort_unstable();
        let n = self.lat.len();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let rank = |p: usize| self.lat[(n * p).div_ceil(100).max(1) - 1];
        let mean = self.lat.iter().map(|&d| us(d)).sum::<f64>() / n as f64;
        [mean, us(rank(50)), us(rank(99))]
    }

    /// p99 over mean latency, printed for the deep-queue rows.
    fn tail_ratio(&mut self, w: &Workload) -> String {
        if w.qd < 32 {
            return String::new();
        }
        let [mean, _, p99] = self.latency_us();
        format!("{:.2}", p99 / mean)
    }
}

/// One command at a time with a host that polls for each answer (blocks this thread).
fn edgevol_polling(q: &mut Queue, w: &Workload, t: Target, b: Budget) -> Run {
    let mut offsets = Offsets::new(w, t);
    let payload = vec![0x5a; w.bytes as usize];
    let blocks = u32::try_from(w.bytes / BLOCK).unwrap();
    let mut lat = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < b.dur && (lat.len() as u64) < b.max_ops {
        let slba = offsets.next();
        let (sqe, data) = if w.write {
            io::write(slba, &payload, false)
        } else {
            io::read(slba, blocks)
        };
        let sent = Instant::now();
        let c = q.cmd_polling(sqe, data);
        lat.push(sent.elapsed());
        ok(&c);
        if !w.write {
            assert_eq!(c.data.len() as u64, w.bytes);
        }
    }
    Run {
        ops: lat.len() as u64,
        elapsed: t0.elapsed(),
        lat,
    }
}

async fn edgevol(q: &mut Queue, w: &Workload, t: Target, b: Budget) -> Run {
    if w.polling {
        return edgevol_polling(q, w, t, b);
    }
    let mut offsets = Offsets::new(w, t);
    let payload = vec![0x5a; w.bytes as usize];
    let blocks = u32::try_from(w.bytes / BLOCK).unwrap();
    let mut inflight = VecDeque::new();
    let (mut ops, mut issued) = (0, 0u64);
    let mut lat = Vec::new();
    let t0 = Instant::now();
    loop {
        let more = t0.elapsed() < b.dur && issued < b.max_ops;
        if !more && inflight.is_empty() {
            break;
        }
        if more && inflight.len() < w.qd {
            let slba = offsets.next();
            let (sqe, data) = if w.write {
                io::write(slba, &payload, false)
            } else {
                io::read(slba, blocks)
            };
            inflight.push_back((q.submit(sqe, data), Instant::now()));
            issued += 1;
            continue;
        }
        let (cid, sent) = inflight.pop_front().unwrap();
        let c = q.wait(cid).await;
        lat.push(sent.elapsed());
        ok(&c);
        if !w.write {
            assert_eq!(c.data.len() as u64, w.bytes);
        }
        ops += 1;
    }
    Run {
        ops,
        elapsed: t0.elapsed(),
        lat,
    }
}

/// Raw loopback TCP: each request carries the command's bytes one way and gets the other back
/// (a write sends 64 + data and receives 16; a read sends 64 and receives 16 + data), pipelined
/// at the same depth. Both ends send and receive at once, as an initiator and a target do: the
/// server's reader hands each answer's size to its writer, the client's reader frees a slot for
/// its writer.
async fn tcp_echo_server(listener: TcpListener) {
    while let Ok((s, _)) = listener.accept().await {
        s.set_nodelay(true).unwrap();
        let (mut rd, mut wr) = s.into_split();
        let (answer, mut answers) = tokio::sync::mpsc::unbounded_channel::<usize>();
        tokio::spawn(async move {
            let mut hdr = [0u8; 8];
            let mut buf = vec![0u8; 1 << 20];
            loop {
                if rd.read_exact(&mut hdr).await.is_err() {
                    return;
                }
                let up = u32::from_le_bytes(hdr[0..4].try_into().unwrap()) as usize;
                let down = u32::from_le_bytes(hdr[4..8].try_into().unwrap()) as usize;
                if rd.read_exact(&mut buf[..up]).await.is_err() || answer.send(down).is_err() {
                    return;
                }
            }
        });
        tokio::spawn(async move {
            let buf = vec![0u8; 1 << 20];
            while let Some(down) = answers.recv().await {
                if wr.write_all(&buf[..down]).await.is_err() {
                    return;
                }
            }
        });
    }
}

async fn tcp(addr: SocketAddr, w: &Workload, dur: Duration) -> Run {
    let s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let (mut rd, mut wr) = s.into_split();
    let (up, down) = if w.write {
        (64 + w.bytes, 16)
    } else {
        (64, 16 + w.bytes)
    };
    let mut req = Vec::new();
    req.extend_from_slice(&u32::try_from(up).unwrap().to_le_bytes());
    req.extend_from_slice(&u32::try_from(down).unwrap().to_le_bytes());
    req.resize(8 + up as usize, 0x5a);
    // The writer waits for a free slot before each send and passes its send time to the reader.
    let (free, mut slots) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (sent, mut sent_at) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    for _ in 0..w.qd {
        free.send(()).unwrap();
    }
    let t0 = Instant::now();
    let writer = tokio::spawn(async move {
        while slots.recv().await.is_some() && t0.elapsed() < dur {
            sent.send(Instant::now()).unwrap();
            wr.write_all(&req).await.unwrap();
        }
        wr
    });
    let mut buf = vec![0u8; down as usize];
    let mut lat = Vec::new();
    while let Some(at) = sent_at.recv().await {
        rd.read_exact(&mut buf).await.unwrap();
        lat.push(at.elapsed());
        let _ = free.send(());
    }
    drop(writer.await.unwrap());
    Run {
        ops: lat.len() as u64,
        elapsed: t0.elapsed(),
        lat,
    }
}

/// Raw loopback TCP with both ends polling, each on a thread of its own that never sleeps (reads
/// that do not block, in a loop): what one request and its answer cost on this machine when
/// neither side waits to be woken. Queue depth 1, the bytes of [`tcp`].
fn tcp_polling(w: &Workload, dur: Duration, pin: bool) -> Run {
    let (up, down) = if w.write {
        (64 + w.bytes as usize, 16)
    } else {
        (64, 16 + w.bytes as usize)
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        if pin {
            pin_to(TARGET_CPU);
        }
        let (mut s, _) = listener.accept().unwrap();
        spinning(&s);
        let mut request = vec![0u8; up];
        let answer = vec![0u8; down];
        while read_spinning(&mut s, &mut request) {
            write_spinning(&mut s, &answer);
        }
    });
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    spinning(&c);
    let request = vec![0x5au8; up];
    let mut answer = vec![0u8; down];
    let mut lat = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < dur {
        let at = Instant::now();
        write_spinning(&mut c, &request);
        assert!(read_spinning(&mut c, &mut answer), "echo server closed");
        lat.push(at.elapsed());
    }
    let elapsed = t0.elapsed();
    drop(c);
    server.join().unwrap();
    Run {
        ops: lat.len() as u64,
        elapsed,
        lat,
    }
}

fn spinning(s: &std::net::TcpStream) {
    s.set_nodelay(true).unwrap();
    s.set_nonblocking(true).unwrap();
}

/// Raw device: `qd` blocking workers doing pread/pwrite on a hal file device. Fresh workloads
/// write one never-written block per cluster stride of a sparse file, the workers sharing one
/// sequence of slots.
async fn device(dev: Arc<FileDevice>, w: &Workload, t: Target, b: Budget) -> Run {
    let t0 = Instant::now();
    let slots = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for i in 0..w.qd {
        let (dev, slots) = (dev.clone(), slots.clone());
        let w = *w;
        workers.push(tokio::task::spawn_blocking(move || {
            let mut offsets = Offsets::new(&w, t);
            offsets.state ^= (i as u64 + 1) * 0x1234_5678_9abc;
            offsets.next_seq = i as u64;
            let mut buf = vec![0x5a; w.bytes as usize];
            let mut lat = Vec::new();
            while t0.elapsed() < b.dur {
                let block = if w.pattern == Pattern::Fresh {
                    let slot = slots.fetch_add(1, Ordering::Relaxed);
                    if slot >= b.max_ops {
                        break;
                    }
                    offsets.fresh(slot)
                } else {
                    offsets.next()
                };
                let at = Instant::now();
                if w.write {
                    dev.write_blocks(block, &buf).unwrap();
                } else {
                    dev.read_blocks(block, &mut buf).unwrap();
                }
                lat.push(at.elapsed());
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for wk in workers {
        lat.extend(wk.await.unwrap());
    }
    Run {
        ops: lat.len() as u64,
        elapsed: t0.elapsed(),
        lat,
    }
}

/// The pool's folder: under `under` (a drive's file system: Reads and Writes go on the queue's
/// io_uring, as on a drive), else on tmpfs (they run in place, as on memory).
fn pool_dir(under: Option<&str>) -> tempfile::TempDir {
    if let Some(dir) = under {
        return tempfile::tempdir_in(dir).unwrap();
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        eprintln!("no /dev/shm: using the default temp dir (not tmpfs)");
        tempfile::tempdir().unwrap()
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // Profiling: only the edgevol cells, no baselines in the same process.
    let target_only = args.iter().any(|a| a == "--target-only");
    let value = |flag: &str| {
        args.iter().position(|a| a == flag).map(|i| {
            args.get(i + 1)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{flag} N"))
        })
    };
    let cluster_kib =
        value("--cluster-kib").map(|kib| u32::try_from(kib).expect("--cluster-kib N"));
    let busy_poll_us = value("--busy-poll-us");
    // Idle time around each cell, for a tool that acts when a table line appears (see
    // scripts/bench-instructions.sh): the target does nothing while it acts.
    let pause = value("--pause-ms").map(Duration::from_millis);
    // The setup: the target's one engine on CPU 0, the host on CPU 1.
    let pin = args.iter().any(|a| a == "--pin");
    let pool_under = args
        .iter()
        .position(|a| a == "--pool-dir")
        .map(|i| args.get(i + 1).expect("--pool-dir DIR").as_str());
    // Words that are neither flags nor the value of one: workload name filters.
    let filters: Vec<String> = args
        .iter()
        .enumerate()
        .skip(1)
        .filter(|&(i, a)| {
            !a.starts_with("--")
                && ![
                    "--cluster-kib",
                    "--busy-poll-us",
                    "--pool-dir",
                    "--pause-ms",
                ]
                .contains(&args[i - 1].as_str())
        })
        .map(|(_, a)| a.clone())
        .collect();
    let (span, dur) = if quick {
        (16 << 20, Duration::from_millis(200))
    } else {
        (256 << 20, Duration::from_secs(3))
    };
    let fresh_cells = WORKLOADS
        .iter()
        .filter(|w| w.pattern == Pattern::Fresh)
        .count() as u64;

    let dir = pool_dir(pool_under);
    if let Some(kib) = cluster_kib {
        // The dev pool file, formatted here: the daemon opens it as it finds it.
        let path = dir.path().join("pool.img");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(DEV_POOL_BYTES)
            .unwrap();
        let device = pool::open_device(&path).unwrap();
        drop(pool::format_device(device, &path, kib << 10, &mut |_| {}).unwrap());
    }
    let mut config = common::dev_config(dir.path(), "127.0.0.1:0".parse().unwrap());
    if let Some(us) = busy_poll_us {
        config.nvme.busy_poll = Duration::from_micros(us);
    }
    if pin {
        config.nvme.io_cpus = vec![TARGET_CPU];
    }
    let running = start(config).await.unwrap();
    let state = running.state.clone();
    if let Err(e) = state.wait_ready(Duration::from_secs(60)).await {
        panic!("{e}");
    }
    let endpoint = running.target.endpoint;
    // One thin volume: the filled span the overwrites and reads use, then `fresh` never-written
    // clusters for each allocating cell.
    let (id, cluster, fresh) = state
        .on_pool(move |_, pool| {
            let cluster = u64::from(pool.cluster_size());
            // Clusters per allocating cell: 16 in --quick, else 1.5 GiB of them.
            let fresh = if quick { 16 } else { (3 << 29) / cluster };
            let size = span + fresh_cells * fresh * cluster;
            let id = pool.create_volume(VolumeSpec::new("bench", size)).unwrap();
            pool.publish(id, HOST, false).unwrap();
            (id, cluster, fresh)
        })
        .await
        .unwrap();
    // The host on its own threads, so that the allocation count is the target's alone.
    // Pinned, one thread on the host's one CPU: a second would only take turns with it there.
    let host = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(if pin { 1 } else { 2 })
        .thread_name(HOST_THREAD)
        .on_thread_start(move || {
            counting_alloc::mark_host_thread();
            if pin {
                pin_to(HOST_CPU);
            }
        })
        .enable_all()
        .build()
        .unwrap();
    let dir_path = dir.path().to_path_buf();
    let pool_on = pool_under.map(|d| format!("{d}'s file system"));
    host.spawn(async move {
        let nqn = edgevol_appliance::naming::subsystem_nqn("test-box", id);
        let (admin, mut q) = admin_and_queue(endpoint, &nqn, HOST).await;
        // Queue 2 lands on the other engine thread (one per core).
        let mut q2 = Some(
            admin
                .io_queue(endpoint, 2, &nqn, HOST, Digests::NONE)
                .await
                .unwrap(),
        );
        // Fill the span once so overwrites measure the steady state (in place, no allocation).
        let fill = vec![0x11u8; 1 << 20];
        for mib in 0..span >> 20 {
            let c = q
                .cmd(
                    io::write(mib * 256, &fill, false).0,
                    io::write(mib * 256, &fill, false).1,
                )
                .await;
            ok(&c);
        }
        let back = q.cmd(io::read(0, 256).0, io::read(0, 256).1).await;
        ok(&back);
        assert_eq!(back.data, fill, "read back");

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo = listener.local_addr().unwrap();
        tokio::spawn(tcp_echo_server(listener));

        let raw_path = dir_path.as_path().join("raw.img");
        let raw = Arc::new(FileDevice::create(&raw_path, span).unwrap());
        raw.write_blocks(0, &vec![0x11u8; span as usize]).unwrap();
        // The raw device's never-written blocks: a sparse file of the allocating cells' size.
        let raw_fresh = Arc::new(
            FileDevice::create(dir_path.as_path().join("fresh.img"), fresh_cells * fresh * cluster).unwrap(),
        );

        println!(
            "Data path, {} mode: {} MiB volume on {}, {:?} per cell (allocating cells: at most {} \
             writes, one per {} KiB cluster), test initiator over loopback{}",
            if quick { "quick" } else { "full" },
            span >> 20,
            pool_on.as_deref().unwrap_or("tmpfs"),
            dur,
            fresh,
            cluster >> 10,
            if pin {
                format!("; pinned: the target's engine on CPU {TARGET_CPU}, the host on CPU {HOST_CPU}")
            } else {
                String::new()
            }
        );
        println!("| workload | unit | edgevol NVMe/TCP | raw loopback TCP | raw device | edgevol / TCP | edgevol / device | target allocations / command | engine CPU-µs / command | target CPU-µs / command | p99 / mean latency |");
        println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let mut fresh_cell = 0;
        let mut first_fresh = None;
        // edgevol's rate per workload name, for the multi-queue scaling line.
        let mut rates = std::collections::HashMap::new();
        let selected = WORKLOADS
            .iter()
            .filter(|w| filters.is_empty() || filters.iter().any(|f| w.name.contains(f.as_str())));
        let idle = || async {
            if let Some(p) = pause {
                tokio::time::sleep(p).await;
            }
        };
        for w in selected {
            idle().await;
            let (budget, target, dev) = if w.pattern == Pattern::Fresh {
                let region = fresh_cell * fresh * cluster;
                fresh_cell += 1;
                let target = |base: u64| Target {
                    span,
                    base: base / BLOCK,
                    cluster,
                };
                let budget = Budget {
                    dur,
                    max_ops: fresh,
                };
                first_fresh.get_or_insert((span + region) / BLOCK);
                (
                    budget,
                    [target(span + region), target(region)],
                    raw_fresh.clone(),
                )
            } else {
                let target = Target {
                    span,
                    base: 0,
                    cluster,
                };
                let budget = Budget {
                    dur,
                    max_ops: u64::MAX,
                };
                (budget, [target; 2], raw.clone())
            };
            let allocs = counting_alloc::target_allocs();
            let cpu = ThreadCpu::now();
            let mut e = if w.queues == 2 {
                // The second queue on its own host task, so both host threads drive one each.
                let (mut other, wc, t) = (q2.take().expect("second queue"), *w, target[0]);
                let second = tokio::spawn(async move {
                    let run = edgevol(&mut other, &wc, t, budget).await;
                    (other, run)
                });
                let mut first = edgevol(&mut q, w, target[0], budget).await;
                let (other, second) = second.await.unwrap();
                q2 = Some(other);
                first.ops += second.ops;
                first.elapsed = first.elapsed.max(second.elapsed);
                first.lat.extend(second.lat);
                first
            } else {
                edgevol(&mut q, w, target[0], budget).await
            };
            let allocs = (counting_alloc::target_allocs() - allocs) as f64 / e.ops as f64;
            let (engine_ns, target_ns) = ThreadCpu::now().since(&cpu);
            let per_op_us = |ns: u64| ns as f64 / 1e3 / e.ops as f64;
            let cpu_cols = format!(
                "{:.2} | {:.2} | {}",
                per_op_us(engine_ns),
                per_op_us(target_ns),
                e.tail_ratio(w)
            );
            let unit = if w.iops() { "IOPS" } else { "MiB/s" };
            rates.insert(w.name, e.per_sec(w));
            if target_only {
                println!(
                    "| {} | {unit} | {:.0} | | | | | {allocs:.1} | {cpu_cols} |",
                    w.name,
                    e.per_sec(w)
                );
                continue;
            }
            let mut t = if w.polling {
                tcp_polling(w, dur, pin)
            } else {
                tcp(echo, w, dur).await
            };
            let mut d = device(dev, w, target[1], budget).await;
            let (er, tr, dr) = (e.per_sec(w), t.per_sec(w), d.per_sec(w));
            println!(
                "| {} | {unit} | {er:.0} | {tr:.0} | {dr:.0} | {:.2} | {:.2} | {allocs:.1} | {cpu_cols} |",
                w.name,
                er / tr,
                er / dr
            );
            if w.latency() {
                let (el, tl, dl) = (e.latency_us(), t.latency_us(), d.latency_us());
                for (i, what) in ["mean", "p50", "p99"].iter().enumerate() {
                    println!(
                        "| {} latency {what} | µs | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | | | | |",
                        w.name,
                        el[i],
                        tl[i],
                        dl[i],
                        el[i] / tl[i],
                        el[i] / dl[i]
                    );
                }
            }
        }
        idle().await;
        if let (Some(one), Some(two)) = (
            rates.get("4k randread QD32"),
            rates.get("4k randread QD32 2 queues"),
        ) {
            println!("\n4k randread QD32: 2 queues / 1 queue = {:.2}", two / one);
        }
        // The first allocating write of the run: its 4 KiB, then zeros to the end of its cluster.
        if let Some(slba) = first_fresh {
            let blocks = u32::try_from(cluster.min(1 << 20) / BLOCK).unwrap();
            let c = q
                .cmd(io::read(slba, blocks).0, io::read(slba, blocks).1)
                .await;
            ok(&c);
            let (head, rest) = c.data.split_at(BLOCK as usize);
            assert!(
                head.iter().all(|&b| b == 0x5a),
                "allocating write read back"
            );
            assert!(
                rest.iter().all(|&b| b == 0),
                "rest of a fresh cluster reads as zeros"
            );
        }
        let c = q.cmd(io::flush().0, io::flush().1).await;
        ok(&c);    })
    .await
    .unwrap();
    host.shutdown_background();
}
