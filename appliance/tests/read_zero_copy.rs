//! Large read data goes out with `MSG_ZEROCOPY`, and its buffers are held until the kernel is
//! done with them. Over loopback the kernel copies anyway and says so in its first
//! notification: the queue then stops asking, and every read still returns its data exact
//! (the real zero-copy path, over a NIC, runs in the QEMU suites' `fio --verify`).

mod common;
mod nvme_host;

use edgevol_appliance::start;
use edgevol_core::VolumeSpec;
use nvme_host::{admin_and_queue, io, ok};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-2222-3333-4444-888888888888";
const LARGE: usize = 128 << 10;
/// Extents of `LARGE` bytes, read at once per round.
const EXTENTS: u64 = 4;
const ROUNDS: u64 = 16;

fn pattern(i: u64) -> Vec<u8> {
    (0..LARGE)
        .map(|b| u8::try_from(b % 251).unwrap() ^ u8::try_from(i * 29 % 256).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_reads_are_sent_zero_copy_until_the_kernel_reports_a_copy() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let running = start(common::dev_config(
        dir.path(),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .await
    .unwrap();
    let state = running.state.clone();
    common::pool_ready(&state).await;
    let engines = running.target.engines.clone();
    let id = state
        .on_pool(|_, pool| {
            let id = pool
                .create_volume(VolumeSpec::new("zc-read", EXTENTS * LARGE as u64))
                .unwrap();
            pool.publish(id, HOST, false).unwrap();
            id
        })
        .await
        .unwrap();
    let nqn = edgevol_appliance::naming::subsystem_nqn("test-box", id);
    let (_admin, mut q) = admin_and_queue(running.target.endpoint, &nqn, HOST).await;
    let blocks = u32::try_from(LARGE as u64 / io::BLOCK).unwrap();
    let slba = |i: u64| i * u64::from(blocks);
    for i in 0..EXTENTS {
        let (sqe, data) = io::write(slba(i), &pattern(i), false);
        ok(&q.cmd(sqe, data).await);
    }

    let before = engines.zero_copy_sends();
    for round in 0..ROUNDS {
        let cids: Vec<u16> = (0..EXTENTS)
            .map(|i| {
                let (sqe, data) = io::read(slba(i), blocks);
                q.submit(sqe, data)
            })
            .collect();
        for (i, cid) in (0..EXTENTS).zip(cids) {
            let c = q.wait(cid).await;
            ok(&c);
            assert!(c.data == pattern(i), "round {round}: extent {i} reads back");
        }
    }
    let sends = engines.zero_copy_sends() - before;
    eprintln!(
        "{} reads of 128 KiB: {sends} zero-copy sends",
        ROUNDS * EXTENTS
    );
    assert!(sends >= 1, "the first large transmit asked for zero copy");
    assert!(
        sends < ROUNDS,
        "loopback copies, the kernel says so, and the queue stops asking: {sends} sends"
    );
}
