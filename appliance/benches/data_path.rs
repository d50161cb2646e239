//! Data-path benchmark: the NVMe/TCP target through the test initiator over loopback, against
//! two baselines measured in the same run: raw loopback TCP moving the same bytes per command at
//! the same queue depth, and the raw device (hal `FileDevice` on the same tmpfs).
//!
//! `cargo bench -p edgevol-appliance --bench data_path` (add `-- --quick` for a smoke run in CI).
//! Prints a table; the ratios are what matter (the machine is shared, absolute numbers vary).
//! No timing is asserted; data read back is checked on the way.
// Host-only bench on 64-bit machines: byte counts fit in usize, rates are printed as floats.
#![allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/nvme_host/mod.rs"]
mod nvme_host;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgevol_appliance::start;
use edgevol_core::VolumeSpec;
use edgevol_hal::FileDevice;
use edgevol_nvmeof::pdu::Digests;
use nvme_host::{io, ok, Admin, Queue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-2222-3333-4444-555555555555";
const BLOCK: u64 = 4096;

#[derive(Clone, Copy)]
struct Workload {
    name: &'static str,
    bytes: u64,
    qd: usize,
    write: bool,
    random: bool,
}

const WORKLOADS: [Workload; 6] = [
    Workload {
        name: "4k randread QD1",
        bytes: 4096,
        qd: 1,
        write: false,
        random: true,
    },
    Workload {
        name: "4k randread QD32",
        bytes: 4096,
        qd: 32,
        write: false,
        random: true,
    },
    Workload {
        name: "4k randwrite QD1",
        bytes: 4096,
        qd: 1,
        write: true,
        random: true,
    },
    Workload {
        name: "4k randwrite QD32",
        bytes: 4096,
        qd: 32,
        write: true,
        random: true,
    },
    Workload {
        name: "128k seqread QD8",
        bytes: 128 << 10,
        qd: 8,
        write: false,
        random: false,
    },
    Workload {
        name: "128k seqwrite QD8",
        bytes: 128 << 10,
        qd: 8,
        write: true,
        random: false,
    },
];

/// Offsets (in blocks) of a workload: xorshift for random, wrapping for sequential.
struct Offsets {
    state: u64,
    next_seq: u64,
    span_blocks: u64,
    step: u64,
    random: bool,
}

impl Offsets {
    fn new(w: &Workload, span: u64) -> Self {
        Offsets {
            state: 0x9e37_79b9_7f4a_7c15,
            next_seq: 0,
            span_blocks: span / BLOCK,
            step: w.bytes / BLOCK,
            random: w.random,
        }
    }

    fn next(&mut self) -> u64 {
        let slots = self.span_blocks / self.step;
        let slot = if self.random {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            self.state % slots
        } else {
            let s = self.next_seq % slots;
            self.next_seq += 1;
            s
        };
        slot * self.step
    }
}

/// Ops completed in `secs`: returns (ops, elapsed).
struct Run {
    ops: u64,
    elapsed: Duration,
}

impl Run {
    fn per_sec(&self, w: &Workload) -> f64 {
        let ops = self.ops as f64 / self.elapsed.as_secs_f64();
        if w.random {
            ops
        } else {
            ops * w.bytes as f64 / f64::from(1 << 20)
        }
    }
}

async fn edgevol(q: &mut Queue, w: &Workload, span: u64, dur: Duration) -> Run {
    let mut offsets = Offsets::new(w, span);
    let payload = vec![0x5a; w.bytes as usize];
    let blocks = u32::try_from(w.bytes / BLOCK).unwrap();
    let mut inflight = VecDeque::new();
    let mut ops = 0;
    let t0 = Instant::now();
    while t0.elapsed() < dur || !inflight.is_empty() {
        if t0.elapsed() < dur && inflight.len() < w.qd {
            let slba = offsets.next();
            let (sqe, data) = if w.write {
                io::write(slba, &payload, false)
            } else {
                io::read(slba, blocks)
            };
            inflight.push_back(q.submit(sqe, data));
            continue;
        }
        let c = q.wait(inflight.pop_front().unwrap()).await;
        ok(&c);
        if !w.write {
            assert_eq!(c.data.len() as u64, w.bytes);
        }
        ops += 1;
    }
    Run {
        ops,
        elapsed: t0.elapsed(),
    }
}

/// Raw loopback TCP: each request carries the command's bytes one way and gets the other back
/// (a write sends 64 + data and receives 16; a read sends 64 and receives 16 + data), pipelined
/// at the same depth. The server answers requests in order.
async fn tcp_echo_server(listener: TcpListener) {
    while let Ok((mut s, _)) = listener.accept().await {
        s.set_nodelay(true).unwrap();
        tokio::spawn(async move {
            let mut hdr = [0u8; 8];
            let mut buf = vec![0u8; 1 << 20];
            loop {
                if s.read_exact(&mut hdr).await.is_err() {
                    return;
                }
                let up = u32::from_le_bytes(hdr[0..4].try_into().unwrap()) as usize;
                let down = u32::from_le_bytes(hdr[4..8].try_into().unwrap()) as usize;
                if s.read_exact(&mut buf[..up]).await.is_err()
                    || s.write_all(&buf[..down]).await.is_err()
                {
                    return;
                }
            }
        });
    }
}

async fn tcp(addr: SocketAddr, w: &Workload, dur: Duration) -> Run {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    // One direction is always small, so a single task can write then read without deadlock.
    let (up, down) = if w.write {
        (64 + w.bytes, 16)
    } else {
        (64, 16 + w.bytes)
    };
    let mut req = Vec::new();
    req.extend_from_slice(&u32::try_from(up).unwrap().to_le_bytes());
    req.extend_from_slice(&u32::try_from(down).unwrap().to_le_bytes());
    req.resize(8 + up as usize, 0x5a);
    let mut buf = vec![0u8; down as usize];
    let t0 = Instant::now();
    for _ in 0..w.qd {
        s.write_all(&req).await.unwrap();
    }
    let (mut outstanding, mut ops) = (w.qd, 0);
    while outstanding > 0 {
        s.read_exact(&mut buf).await.unwrap();
        ops += 1;
        if t0.elapsed() < dur {
            s.write_all(&req).await.unwrap();
        } else {
            outstanding -= 1;
        }
    }
    Run {
        ops,
        elapsed: t0.elapsed(),
    }
}

/// Raw device: `qd` blocking workers doing pread/pwrite on a hal file device.
async fn device(dev: Arc<FileDevice>, w: &Workload, span: u64, dur: Duration) -> Run {
    let t0 = Instant::now();
    let mut workers = Vec::new();
    for i in 0..w.qd {
        let dev = dev.clone();
        let w = *w;
        workers.push(tokio::task::spawn_blocking(move || {
            let mut offsets = Offsets::new(&w, span);
            offsets.state ^= (i as u64 + 1) * 0x1234_5678_9abc;
            offsets.next_seq = i as u64;
            let mut buf = vec![0x5a; w.bytes as usize];
            let mut ops = 0u64;
            while t0.elapsed() < dur {
                let block = offsets.next();
                if w.write {
                    dev.write_blocks(block, &buf).unwrap();
                } else {
                    dev.read_blocks(block, &mut buf).unwrap();
                }
                ops += 1;
            }
            ops
        }));
    }
    let mut ops = 0;
    for wk in workers {
        ops += wk.await.unwrap();
    }
    Run {
        ops,
        elapsed: t0.elapsed(),
    }
}

fn tmpfs_dir() -> tempfile::TempDir {
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
    let quick = std::env::args().any(|a| a == "--quick");
    let (span, dur) = if quick {
        (16 << 20, Duration::from_millis(200))
    } else {
        (256 << 20, Duration::from_secs(3))
    };

    let dir = tmpfs_dir();
    let running = start(common::dev_config(
        dir.path(),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .await
    .unwrap();
    let state = running.state.clone();
    while !state.is_ready() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let endpoint = running.target.endpoint;
    let id = state
        .on_pool(move |_, pool| {
            let id = pool.create_volume(VolumeSpec::new("bench", span)).unwrap();
            pool.publish(id, HOST, false).unwrap();
            id
        })
        .await
        .unwrap();
    let nqn = edgevol_appliance::naming::subsystem_nqn("test-box", id);
    let admin = Admin::connect(endpoint, &nqn, HOST, 0).await.unwrap();
    let mut q = admin
        .io_queue(endpoint, 1, &nqn, HOST, Digests::NONE)
        .await
        .unwrap();
    // Fill the volume once so writes measure the steady state (in place, no allocation).
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

    let raw_path = dir.path().join("raw.img");
    let raw = Arc::new(FileDevice::create(&raw_path, span).unwrap());
    raw.write_blocks(0, &vec![0x11u8; span as usize]).unwrap();

    println!(
        "Data path, {} mode: {} MiB volume on tmpfs, {:?} per cell, test initiator over loopback",
        if quick { "quick" } else { "full" },
        span >> 20,
        dur
    );
    println!("| workload | unit | edgevol NVMe/TCP | raw loopback TCP | raw device | edgevol / TCP | edgevol / device |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for w in &WORKLOADS {
        let e = edgevol(&mut q, w, span, dur).await.per_sec(w);
        let t = tcp(echo, w, dur).await.per_sec(w);
        let d = device(raw.clone(), w, span, dur).await.per_sec(w);
        let unit = if w.random { "IOPS" } else { "MiB/s" };
        println!(
            "| {} | {unit} | {e:.0} | {t:.0} | {d:.0} | {:.2} | {:.2} |",
            w.name,
            e / t,
            e / d
        );
    }
    let c = q.cmd(io::flush().0, io::flush().1).await;
    ok(&c);
}
