//! A worker job that panics, as a host sees it: over a real connection.

use std::time::Duration;

use crate::nvme::test_host::{io as host_io, ok, status};
use crate::nvme::test_target::{serve_one_volume, Loopback};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0badc0de-3232-3333-4444-555555555555";

/// A FUA write always goes to a worker. Its job panics outside the command's own catch: the
/// command fails with Internal Error, no worker thread ends (the pool may still start another
/// when the next command comes before a worker is idle again: that is capacity, not a loss),
/// and later commands on the same queue succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_worker_job_fails_its_command_and_the_worker_lives() {
    let Loopback {
        dir: _dir,
        target,
        admin,
        mut q,
        ..
    } = serve_one_volume(HOST, "worker-panics").await;
    let workers = &target.subsystems.workers;
    let data = vec![0x32u8; 4096];
    let (sqe, d) = host_io::write(1, &data, true);
    ok(&q.cmd(sqe, d).await);
    assert!(workers.threads() >= 1, "the FUA write ran on a worker");

    workers.panic_next_job();
    let (sqe, d) = host_io::write(2, &data, true);
    // Before workers caught panics, this command was never answered.
    let failed = tokio::time::timeout(Duration::from_secs(30), q.cmd(sqe, d))
        .await
        .expect("the panicking job's command is answered");
    assert_eq!(
        status(&failed),
        (0, 0x06, false),
        "the panicking job's command fails with Internal Error"
    );
    assert_eq!(workers.ended_threads(), 0, "the worker lives");

    let (sqe, d) = host_io::write(2, &data, true);
    ok(&q.cmd(sqe, d).await);
    let (sqe, d) = host_io::flush();
    ok(&q.cmd(sqe, d).await);
    let (sqe, d) = host_io::read(2, 1);
    let read = q.cmd(sqe, d).await;
    ok(&read);
    assert_eq!(read.data, data);
    assert_eq!(workers.ended_threads(), 0);
    drop((q, admin));
    target.stop().await;
}
