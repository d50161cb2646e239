//! Allocating writes (the first write into a cluster) allocate nothing on the heap per command
//! once the queue is warm: the zero fill of the rest of the cluster, the write of the host's
//! data to an `O_DIRECT` device and the journal frame of the new mapping all reuse memory. A
//! counting allocator counts every allocation made outside the host's threads (the test
//! initiator runs on its own runtime), as the data-path bench does.
//!
//! The volume's mapping tables grow as clusters are allocated (a B-tree node now and then), so
//! the bound is below one allocation per command, not zero: any allocation made per command
//! comes back as at least one.

mod common;
mod counting_alloc;
mod nvme_host;

use edgevol_appliance::start;
use edgevol_core::VolumeSpec;
use nvme_host::{admin_and_queue, io, ok};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-2222-3333-4444-666666666666";
const BLOCK: u64 = 4096;
const BLOCK_LEN: usize = 4096;
/// Allocating writes before counting (the queue's buffers, the journal's scratch, the zeros).
const WARM: u64 = 16;
/// Allocating writes counted.
const COUNTED: u64 = 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocating_writes_allocate_nothing_per_command_once_warm() {
    let dir = common::tmpfs_dir();
    let running = start(common::dev_config(
        dir.path(),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .await
    .unwrap();
    let state = running.state.clone();
    common::pool_ready(&state).await;
    let endpoint = running.target.endpoint;
    let (id, cluster) = state
        .on_pool(|_, pool| {
            let cluster = u64::from(pool.cluster_size());
            let size = (WARM + COUNTED) * cluster;
            let id = pool.create_volume(VolumeSpec::new("fresh", size)).unwrap();
            pool.publish(id, HOST, false).unwrap();
            (id, cluster)
        })
        .await
        .unwrap();
    let host = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .on_thread_start(counting_alloc::mark_host_thread)
        .enable_all()
        .build()
        .unwrap();
    let allocs = host
        .spawn(async move {
            let nqn = edgevol_appliance::naming::subsystem_nqn("test-box", id);
            let (_admin, mut q) = admin_and_queue(endpoint, &nqn, HOST).await;
            let payload = vec![0x5a; BLOCK_LEN];
            let stride = cluster / BLOCK;
            let mut before = 0;
            for slot in 0..WARM + COUNTED {
                if slot == WARM {
                    before = counting_alloc::target_allocs();
                }
                let (sqe, data) = io::write(slot * stride, &payload, false);
                ok(&q.cmd(sqe, data).await);
            }
            let allocs = counting_alloc::target_allocs() - before;
            // Each fresh cluster reads back as the write's block, then zeros to its end.
            for slot in [0, WARM + COUNTED - 1] {
                let blocks = u32::try_from(cluster.min(1 << 20) / BLOCK).unwrap();
                let (sqe, data) = io::read(slot * stride, blocks);
                let c = q.cmd(sqe, data).await;
                ok(&c);
                let (head, rest) = c.data.split_at(BLOCK_LEN);
                assert!(head.iter().all(|&b| b == 0x5a), "cluster {slot}: data");
                assert!(rest.iter().all(|&b| b == 0), "cluster {slot}: zero fill");
            }
            allocs
        })
        .await
        .unwrap();
    host.shutdown_background();
    eprintln!("{COUNTED} allocating writes made {allocs} target allocations");
    assert!(
        allocs < COUNTED,
        "{COUNTED} allocating writes made {allocs} target allocations"
    );
}
