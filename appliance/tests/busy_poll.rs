//! Engine busy polling (`nvme.busy_poll_us`, `nvme::busy_poll`): a host at queue depth 1 finds
//! the engine polling for its next command instead of asleep, polling off never polls, and an
//! engine whose queue falls idle goes back to sleep and spends (almost) no CPU. A host that
//! polls for its answers (`Queue::cmd_polling`, the data-path bench's polling rows) reads back
//! what it wrote.

mod common;
mod nvme_host;

use std::time::Duration;

use common::DevAppliance;
use edgevol_core::VolumeSpec;
use nvme_host::{admin_and_queue, io, ok};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-2222-3333-4444-888888888888";
/// Commands, one at a time.
const COMMANDS: u64 = 400;

/// CPU time the process's engine threads (`edgevol-io-N`) have used, from their schedstat
/// (nanoseconds on the CPU).
fn engines_cpu() -> Duration {
    let mut ns = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("edgevol-io-") {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Duration::from_nanos(ns)
}

/// Runs `COMMANDS` writes and reads one at a time on an appliance polling for `budget`; the
/// polls that found work, and the engines' CPU over a quiet second after.
async fn depth_one(budget: Duration) -> (u64, Duration) {
    let app = DevAppliance::start_with(|c| {
        c.nvme.busy_poll = budget;
        c.nvme.io_threads = 1;
    })
    .await;
    app.ready().await;
    let id = app
        .running
        .state
        .on_pool(|_, pool| {
            let id = pool.create_volume(VolumeSpec::new("bp", 8 << 20)).unwrap();
            pool.publish(id, HOST, false).unwrap();
            id
        })
        .await
        .unwrap();
    let endpoint = app.running.target.endpoint;
    let engines = app.running.target.engines.clone();
    let nqn = edgevol_appliance::naming::subsystem_nqn("test-box", id);
    let (_admin, mut q) = admin_and_queue(endpoint, &nqn, HOST).await;
    let block = vec![0x5au8; 4096];
    for i in 0..COMMANDS {
        let (sqe, data) = io::write(i % 256, &block, false);
        ok(&q.cmd(sqe, data).await);
        let (sqe, data) = io::read(i % 256, 1);
        let c = q.cmd(sqe, data).await;
        ok(&c);
        assert_eq!(c.data, block);
    }
    // A host that polls for each answer instead of sleeping (the bench's polling rows).
    for i in 0..COMMANDS / 8 {
        let block = vec![u8::try_from(i).unwrap(); 4096];
        let (sqe, data) = io::write(i, &block, false);
        ok(&q.cmd_polling(sqe, data));
        let (sqe, data) = io::read(i, 1);
        let c = q.cmd_polling(sqe, data);
        ok(&c);
        assert_eq!(c.data, block, "polled read {i}");
    }
    let found = engines.busy_polls_found();
    // The queue stays connected and idle.
    let before = engines_cpu();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = engines_cpu() - before;
    drop(q);
    (found, idle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_at_depth_one_meets_a_polling_engine_and_an_idle_engine_sleeps() {
    // The longest budget the config takes: a debug build's host answers within it.
    let (found, idle) = depth_one(Duration::from_millis(1)).await;
    eprintln!("polling: {found} polls found work in {COMMANDS} x 2 commands; idle engine CPU {idle:?} in 1 s");
    assert!(found > 0, "no busy poll found a command");
    assert!(
        idle < Duration::from_millis(50),
        "an idle engine used {idle:?} of CPU in a second"
    );
    let (found, idle) = depth_one(Duration::ZERO).await;
    eprintln!("polling off: {found} polls; idle engine CPU {idle:?} in 1 s");
    assert_eq!(found, 0, "polling off, yet an engine polled");
    assert!(idle < Duration::from_millis(50));
}
