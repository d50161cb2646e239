//! On an `O_DIRECT` pool a write's data goes from the buffer the decoder received it into (page-
//! aligned) to the device, with no copy into an aligned buffer of the target's: on the queue's
//! io_uring, on the worker threads and in place (a drive's file system), and in place at any
//! depth (tmpfs), for the write that allocates a cluster (under
//! the pool lock) and for the overwrite (outside it). The target counts every copy of a write's
//! data into aligned memory ([`aligned_copies`]); it stays at zero, and the data reads back
//! exact.

mod common;
mod nvme_host;

use edgevol_appliance::nvme::io::aligned_copies;
use edgevol_appliance::start;
use edgevol_core::VolumeSpec;
use nvme_host::{admin_and_queue, io, ok};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-2222-3333-4444-777777777777";
/// Writes of each size per round.
const WRITES: u64 = 8;
const SMALL: usize = 4 << 10;
const LARGE: usize = 128 << 10;

fn pattern(round: u8, i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|b| u8::try_from(b % 251).unwrap() ^ round.wrapping_mul(17) ^ u8::try_from(i).unwrap())
        .collect()
}

/// The i-th write of a size: its first block, each in a cluster of its own (4 KiB writes in
/// the first `WRITES` clusters, 128 KiB ones in the next), off the cluster's start.
fn slba(cluster_blocks: u64, large: bool, i: u64) -> u64 {
    let cluster = if large { WRITES + i } else { i };
    cluster * cluster_blocks + if large { 32 } else { 1 }
}

/// Where the pool lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backing {
    /// A file system on a drive: queued writes go on the queue's io_uring.
    Drive,
    /// tmpfs: every write is a copy to memory, done in place at any depth.
    Memory,
}

/// A drive's file system that takes `O_DIRECT`: queued writes run on the ring, and none is
/// copied on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_on_an_o_direct_drive_pool_reach_the_device_without_a_copy() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    if let Some(on_ring) = writes_without_a_copy(&dir, Backing::Drive).await {
        assert!(on_ring > 0, "some queued writes ran on the ring");
    }
}

/// A pool on tmpfs with `O_DIRECT`: queued writes run in place too (no ring, whose operations
/// the kernel would run on its worker threads), and none is copied on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_on_a_pool_in_memory_run_in_place_without_a_copy() {
    let dir = common::tmpfs_dir();
    if let Some(on_ring) = writes_without_a_copy(&dir, Backing::Memory).await {
        assert_eq!(on_ring, 0, "no write went on the ring");
    }
}

/// Runs the rounds on a pool in `dir`; the ring operations they made, or `None` (skipped, with
/// a message) where the pool is not `O_DIRECT` or not on the `backing` asked for.
async fn writes_without_a_copy(dir: &tempfile::TempDir, backing: Backing) -> Option<u64> {
    let running = start(common::dev_config(
        dir.path(),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .await
    .unwrap();
    let state = running.state.clone();
    common::pool_ready(&state).await;
    let endpoint = running.target.endpoint;
    let engines = running.target.engines.clone();
    let (id, cluster, direct, in_memory) = state
        .on_pool(|_, pool| {
            let cluster = u64::from(pool.cluster_size());
            let id = pool
                .create_volume(VolumeSpec::new("zc", 2 * WRITES * cluster))
                .unwrap();
            pool.publish(id, HOST, false).unwrap();
            // The data path's handle has the pool's O_DIRECT policy.
            let handle = edgevol_hal::DataHandle::open(pool.device_mut()).unwrap();
            (id, cluster, handle.is_direct(), handle.in_memory())
        })
        .await
        .unwrap();
    let found = if in_memory {
        Backing::Memory
    } else {
        Backing::Drive
    };
    if !direct || found != backing {
        eprintln!("{backing:?} asked, {found:?} found, O_DIRECT {direct}: skipped");
        return None;
    }
    let cluster_blocks = cluster / io::BLOCK;
    let nqn = edgevol_appliance::naming::subsystem_nqn("test-box", id);
    let (_admin, mut q) = admin_and_queue(endpoint, &nqn, HOST).await;

    let copies_before = aligned_copies();
    let ring_before = engines.ring_operations();
    // Round 0 allocates every cluster, rounds 1 and 2 overwrite. Rounds 0 and 1 submit all
    // their writes before awaiting any (queued: on a drive on the ring, or the workers where
    // there is no ring; in memory in place); round 2 awaits each (alone: in place).
    for round in 0..3u8 {
        let writes = (0..WRITES).flat_map(|i| [(false, i), (true, i)]);
        if round < 2 {
            let cids: Vec<u16> = writes
                .map(|(large, i)| {
                    let len = if large { LARGE } else { SMALL };
                    let at = slba(cluster_blocks, large, i);
                    let (sqe, data) = io::write(at, &pattern(round, i, len), false);
                    q.submit(sqe, data)
                })
                .collect();
            for cid in cids {
                ok(&q.wait(cid).await);
            }
        } else {
            for (large, i) in writes {
                let len = if large { LARGE } else { SMALL };
                let at = slba(cluster_blocks, large, i);
                let (sqe, data) = io::write(at, &pattern(round, i, len), false);
                ok(&q.cmd(sqe, data).await);
            }
        }
        for (large, i) in (0..WRITES).flat_map(|i| [(false, i), (true, i)]) {
            let len = if large { LARGE } else { SMALL };
            let blocks = u32::try_from(len as u64 / io::BLOCK).unwrap();
            let (sqe, data) = io::read(slba(cluster_blocks, large, i), blocks);
            let c = q.cmd(sqe, data).await;
            ok(&c);
            assert!(
                c.data == pattern(round, i, len),
                "round {round}: the {len}-byte write {i} reads back as written"
            );
        }
    }
    let copies = aligned_copies() - copies_before;
    let on_ring = engines.ring_operations() - ring_before;
    eprintln!(
        "{} writes: {copies} copies, {on_ring} ring operations",
        6 * WRITES
    );
    assert_eq!(copies, 0, "writes copied into aligned memory");
    Some(on_ring)
}
