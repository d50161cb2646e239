//! The connection as a host sees it, end to end over loopback.

use edgevol_core::ReadSegment;
use edgevol_nvmeof::pdu::Digests;

use crate::nvme::test_host::{io as host_io, ok, status};
use crate::nvme::test_target::{serve_one_volume, Loopback};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0badc0de-2222-3333-4444-555555555555";
const LBA: u64 = 77;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_one_io_command_fails_only_that_command() {
    let Loopback {
        dir: _dir,
        state,
        target,
        id,
        addr,
        nqn,
        admin,
        mut q,
    } = serve_one_volume(HOST, "panics").await;
    let data = vec![0x5au8; 4096];
    let (sqe, d) = host_io::write(LBA, &data, false);
    ok(&q.cmd(sqe, d).await);

    // The device read of LBA's data panics (the test build's data path handle, see
    // `nvme::test_device`): outside the pool lock, with its cluster pinned.
    let offset = {
        let pool = state.lock_pool().unwrap();
        match pool.map_read(id, LBA << 12, 4096).unwrap().next().unwrap() {
            ReadSegment::Data { device_offset, .. } => device_offset,
            ReadSegment::Zero { .. } => panic!("LBA {LBA} was written"),
        }
    };
    let device = target
        .subsystems
        .data_path()
        .expect("a second handle on a file pool");
    device.handle().panic_on_read_of(Some(offset));
    let (sqe, d) = host_io::read(LBA, 1);
    assert_eq!(
        status(&q.cmd(sqe, d).await),
        (0, 0x06, false),
        "the panicking command fails with Internal Error"
    );
    // The same connection keeps serving, reads and writes, and so does a second queue.
    let (sqe, d) = host_io::write(LBA + 1, &data, false);
    ok(&q.cmd(sqe, d).await);
    let (sqe, d) = host_io::read(LBA + 1, 1);
    let read = q.cmd(sqe, d).await;
    ok(&read);
    assert_eq!(read.data, data);
    let mut q2 = admin
        .io_queue(addr, 2, &nqn, HOST, Digests::NONE)
        .await
        .unwrap();
    device.handle().panic_on_read_of(None);
    let (sqe, d) = host_io::read(LBA, 1);
    let read = q2.cmd(sqe, d).await;
    ok(&read);
    assert_eq!(read.data, data, "the failed read changed nothing");
    // The panic happened outside the pool lock: the pool is not poisoned.
    assert!(state.lock_pool().is_ok());
    drop((q, q2, admin));
    target.stop().await;
}
