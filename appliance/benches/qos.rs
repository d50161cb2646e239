//! QoS benchmark: per-volume limits enforced by the NVMe/TCP target, measured through the test
//! initiator over loopback, each figure a ratio from the same run:
//!
//! 1. achieved / limit for three IOPS limits and two bandwidth limits, at QD1 and QD32 (a QD1
//!    cell whose limit is above what one command at a time reaches shows that instead);
//! 2. an unlimited neighbour at QD1 next to a volume limited at QD32: its IOPS with / alone,
//!    and as controls the same next to an unlimited volume doing as many IOPS paced by the
//!    initiator (the same work without QoS), and next to one flat out;
//! 3. the cost of the limiter when it never holds anything back: an unlimited volume against one
//!    whose limit is far above what the target reaches (the limiter runs on every command).
//!    An unlimited volume takes one atomic load per command (nvme/throttle.rs); the A/B against
//!    a build without QoS is in BENCHMARKS.md.
//!
//! `cargo bench -p edgevol-appliance --bench qos` (`-- --quick` for the CI smoke run: cells of
//! 300 ms, where the bucket's 10 ms burst and start-up are a visible part). No timing is asserted.
#![allow(clippy::cast_precision_loss)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/nvme_host/mod.rs"]
mod nvme_host;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use edgevol_appliance::{naming, start, Running};
use edgevol_core::VolumeSpec;
use edgevol_nvmeof::pdu::Digests;
use nvme_host::{io, ok, Admin, Queue};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-9005-4000-8000-000000000017";
const SPAN: u64 = 8 << 20;

/// One volume's queue, connected.
struct Conn {
    _admin: Admin,
    q: Queue,
}

/// Creates a volume with `limits` (mutable parameters), publishes and connects it.
async fn volume(running: &Running, name: &str, limits: &[(&str, String)]) -> Conn {
    let limits: Vec<(String, String)> = limits
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    let name = name.to_owned();
    let id = running
        .state
        .on_pool(move |_, pool| {
            let id = pool.create_volume(VolumeSpec::new(&name, SPAN)).unwrap();
            if !limits.is_empty() {
                pool.modify_volume(id, &limits).unwrap();
            }
            pool.publish(id, HOST, false).unwrap();
            id
        })
        .await
        .unwrap();
    let addr: SocketAddr = running.target.endpoint;
    let nqn = naming::subsystem_nqn("test-box", id);
    let admin = Admin::connect(addr, &nqn, HOST, 0).await.unwrap();
    let q = admin
        .io_queue(addr, 1, &nqn, HOST, Digests::NONE)
        .await
        .unwrap();
    Conn { _admin: admin, q }
}

/// Random reads of `bytes` at depth `qd` for `dur`: commands per second.
async fn reads(q: &mut Queue, bytes: u64, qd: usize, dur: Duration) -> f64 {
    let blocks = u32::try_from(bytes / io::BLOCK).unwrap();
    let slots = SPAN / bytes;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut inflight = VecDeque::new();
    let (t0, mut done) = (Instant::now(), 0u64);
    loop {
        let more = t0.elapsed() < dur;
        if !more && inflight.is_empty() {
            break;
        }
        if more && inflight.len() < qd {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let (sqe, none) = io::read(state % slots * (bytes / io::BLOCK), blocks);
            inflight.push_back(q.submit(sqe, none));
            continue;
        }
        ok(&q.wait(inflight.pop_front().unwrap()).await);
        done += 1;
    }
    done as f64 / t0.elapsed().as_secs_f64()
}

/// 4k reads at `rate` per second for `dur`, paced by the initiator (up to 32 in flight): what
/// a host that limits itself sends.
async fn paced_reads(q: &mut Queue, rate: u64, dur: Duration) -> f64 {
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut inflight = VecDeque::new();
    let (t0, mut issued, mut done) = (Instant::now(), 0u64, 0u64);
    while t0.elapsed() < dur {
        tick.tick().await;
        let due = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX) * rate / 1_000_000;
        while issued < due && inflight.len() < 32 {
            let (sqe, none) = io::read(issued % (SPAN / io::BLOCK), 1);
            inflight.push_back(q.submit(sqe, none));
            issued += 1;
        }
        while let Some(&cid) = inflight.front() {
            match q.try_take(cid) {
                Some(c) => {
                    ok(&c);
                    inflight.pop_front();
                    done += 1;
                }
                None => break,
            }
        }
        if inflight.len() >= 32 {
            ok(&q.wait(inflight.pop_front().unwrap()).await);
            done += 1;
        }
    }
    for cid in inflight {
        ok(&q.wait(cid).await);
        done += 1;
    }
    done as f64 / t0.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let dur = Duration::from_millis(if quick { 300 } else { 3000 });
    let dir = tempfile::tempdir().unwrap();
    let running = start(common::dev_config(
        dir.path(),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .await
    .unwrap();
    if let Err(e) = running.state.wait_ready(Duration::from_secs(60)).await {
        panic!("{e}");
    }
    println!(
        "QoS, {} mode: {dur:?} per cell, 8 MiB volumes on the dev pool, test initiator over loopback",
        if quick { "quick" } else { "full" }
    );
    println!("\n| limit | QD | achieved | achieved / limit |");
    println!("|---|---:|---:|---:|");
    let cells: [(&str, u64, u64); 5] = [
        ("maxIops", 500, 4096),
        ("maxIops", 2_000, 4096),
        ("maxIops", 8_000, 4096),
        ("maxBandwidthBytes", 8 << 20, 128 << 10),
        ("maxBandwidthBytes", 32 << 20, 128 << 10),
    ];
    for (i, (key, limit, bytes)) in cells.into_iter().enumerate() {
        for qd in [1, 32] {
            let mut c = volume(
                &running,
                &format!("limit-{i}-{qd}"),
                &[(key, limit.to_string())],
            )
            .await;
            let per_sec = reads(&mut c.q, bytes, qd, dur).await;
            let (achieved, unit) = if key == "maxIops" {
                (per_sec, "IOPS")
            } else {
                (per_sec * bytes as f64, "B/s")
            };
            println!(
                "| {key}={limit} ({} KiB reads) | {qd} | {achieved:.0} {unit} | {:.3} |",
                bytes >> 10,
                achieved / limit as f64
            );
        }
    }

    // 2. The neighbour, 4k reads QD1: alone; next to a volume held at 2000 IOPS by its limit
    //    with 32 in flight; next to an unlimited volume doing the same 2000 IOPS paced by the
    //    initiator (the work without QoS); next to an unlimited volume at QD32 flat out.
    let mut free = volume(&running, "neighbour", &[]).await;
    let noisy = volume(&running, "noisy", &[("maxIops", "2000".to_owned())]).await;
    let plain = volume(&running, "plain", &[]).await;
    let alone = reads(&mut free.q, 4096, 1, dur).await;
    println!("\n| unlimited neighbour, 4k reads QD1, next to | neighbour IOPS | other volume IOPS | with / alone |");
    println!("|---|---:|---:|---:|");
    println!("| nothing | {alone:.0} | | 1.000 |");
    let mut others = Vec::new();
    for (what, mut other, paced) in [
        ("a volume limited to 2000 IOPS, QD32", noisy, None),
        (
            "an unlimited volume paced to 2000 IOPS by the initiator",
            plain,
            Some(2000),
        ),
    ] {
        let noise = tokio::spawn(async move {
            let rate = match paced {
                Some(rate) => paced_reads(&mut other.q, rate, dur).await,
                None => reads(&mut other.q, 4096, 32, dur).await,
            };
            (other, rate)
        });
        let with = reads(&mut free.q, 4096, 1, dur).await;
        let (other, rate) = noise.await.unwrap();
        println!("| {what} | {with:.0} | {rate:.0} | {:.3} |", with / alone);
        others.push(other);
    }
    let mut flat_out = others.pop().unwrap();
    let noise = tokio::spawn(async move {
        let rate = reads(&mut flat_out.q, 4096, 32, dur).await;
        (flat_out, rate)
    });
    let with = reads(&mut free.q, 4096, 1, dur).await;
    let (_, rate) = noise.await.unwrap();
    println!(
        "| an unlimited volume at QD32, flat out | {with:.0} | {rate:.0} | {:.3} |",
        with / alone
    );

    // 3. The limiter's own cost: never limiting vs limited far above reach, interleaved.
    let mut high = volume(
        &running,
        "high-limit",
        &[("maxIops", "1000000000".to_owned())],
    )
    .await;
    println!("\n| 4k reads QD32, 3 rounds interleaved | no limit IOPS | limit 10^9 IOPS | limited / unlimited |");
    println!("|---|---:|---:|---:|");
    for round in 1..=3 {
        let a = reads(&mut free.q, 4096, 32, dur).await;
        let b = reads(&mut high.q, 4096, 32, dur).await;
        println!("| round {round} | {a:.0} | {b:.0} | {:.3} |", b / a);
    }
    drop((free, high));
    running.stop().await.unwrap();
}
