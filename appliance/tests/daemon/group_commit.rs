//! Group commit through the CSI Controller: concurrent CreateVolume calls share journal flushes,
//! and when the group's commit fails or is torn by a power cut (hal's fault device under the
//! pool) every call it covered fails, and no call that succeeded is missing after recovery.

use crate::common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::block_volume;
use edgevol_appliance::csi::controller::ControllerService;
use edgevol_appliance::pool::PoolDevice;
use edgevol_appliance::state::State;
use edgevol_core::Pool;
use edgevol_hal::{FaultConfig, FaultDevice, FileDevice};
use edgevol_proto::csi::v1::controller_server::Controller;
use tonic::Code;

type Faults = Arc<Mutex<FaultDevice<FileDevice>>>;

/// A dev pool file behind the fault device, served by a Controller (no NVMe target).
fn controller(dir: &tempfile::TempDir) -> (ControllerService, Faults) {
    let pool = edgevol_appliance::pool::open(&[dir.path().join("pool.img")], true).unwrap();
    let PoolDevice::File(file) = pool.into_device() else {
        panic!("a dev pool is a file");
    };
    let faults = Arc::new(Mutex::new(FaultDevice::new(file, FaultConfig::default())));
    let pool = Pool::open(PoolDevice::Faulty(faults.clone())).unwrap();
    let state = Arc::new(State::new("test-box".into(), Default::default()));
    state.set_pool(pool);
    (ControllerService::new(state, None), faults)
}

/// Creates volumes `prefix-0..n`, all in flight at once; the name and outcome of each.
async fn create_all(
    ctl: &ControllerService,
    prefix: &str,
    n: usize,
) -> Vec<(String, Result<(), Code>)> {
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..n {
        let (ctl, name) = (ctl.clone(), format!("{prefix}-{i}"));
        calls.spawn(async move {
            let result = ctl
                .create_volume(tonic::Request::new(block_volume(name.clone())))
                .await;
            (name, result.map(drop).map_err(|s| s.code()))
        });
    }
    let mut outcomes = Vec::new();
    while let Some(outcome) = calls.join_next().await {
        outcomes.push(outcome.unwrap());
    }
    outcomes
}

fn flushes(faults: &Faults) -> u64 {
    faults.lock().unwrap().stats().flushes
}

/// The volume names a pool recovered from the device shows.
fn recovered(faults: &Faults) -> BTreeSet<String> {
    faults.lock().unwrap().power_on();
    let pool = Pool::open(PoolDevice::Faulty(faults.clone())).unwrap();
    pool.volumes(None).map(|v| v.name().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_share_journal_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, faults) = controller(&dir);
    // A slow device: calls arriving during one commit are covered by the next.
    faults.lock().unwrap().config_mut().latency = Some(Duration::from_millis(2));
    let before = flushes(&faults);
    const CALLS: usize = 32;
    let outcomes = create_all(&ctl, "pvc", CALLS).await;
    assert!(outcomes.iter().all(|(_, r)| r.is_ok()), "{outcomes:?}");
    let used = flushes(&faults) - before;
    println!("{CALLS} concurrent CreateVolume calls, {used} flushes");
    assert!(
        used < CALLS as u64,
        "{used} flushes for {CALLS} calls: no group commit"
    );
    faults.lock().unwrap().config_mut().latency = None;
    let expected: BTreeSet<String> = outcomes.into_iter().map(|(name, _)| name).collect();
    assert_eq!(recovered(&faults), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_group_write_fails_every_call_it_covered() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, faults) = controller(&dir);
    let acked = create_all(&ctl, "acked", 8).await;
    assert!(acked.iter().all(|(_, r)| r.is_ok()), "{acked:?}");
    {
        let mut dev = faults.lock().unwrap();
        let blocks = dev.inner_mut().block_count();
        dev.config_mut().write_errors = (0..blocks).collect();
    }
    let failed = create_all(&ctl, "lost", 24).await;
    for (name, result) in &failed {
        assert_eq!(
            *result,
            Err(Code::Internal),
            "{name}: answered without a durable commit"
        );
    }
    faults.lock().unwrap().config_mut().write_errors.clear();
    let expected: BTreeSet<String> = acked.into_iter().map(|(name, _)| name).collect();
    assert_eq!(recovered(&faults), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cut_during_group_commits_loses_no_acknowledged_call() {
    // A cut during the first commit of the group, or a later one; with the drive's volatile cache
    // lost (a power cut) or kept (a drive without one, or a crash of the process only).
    for cut in 1..=3u64 {
        for lose_unflushed in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let (ctl, faults) = controller(&dir);
            let first = create_all(&ctl, "acked", 8).await;
            assert!(first.iter().all(|(_, r)| r.is_ok()), "{first:?}");
            {
                let mut dev = faults.lock().unwrap();
                let writes = dev.stats().writes;
                let cfg = dev.config_mut();
                cfg.seed = cut;
                cfg.lose_unflushed = lose_unflushed;
                cfg.cut_after_writes = Some(writes + cut);
                cfg.latency = Some(Duration::from_millis(1));
            }
            // Three waves of 8 in flight: at least three commits, so every cut strikes one.
            let mut during = Vec::new();
            for wave in 0..3 {
                during.extend(create_all(&ctl, &format!("during{wave}"), 8).await);
            }
            let failures = during.iter().filter(|(_, r)| r.is_err()).count();
            println!("cut at write {cut} (lose unflushed: {lose_unflushed}): {failures} of 24 calls failed");
            assert!(failures > 0, "the cut struck no commit");
            if cut == 1 {
                assert_eq!(
                    failures, 24,
                    "the first commit was cut: no call may succeed"
                );
            }
            for (name, result) in &during {
                assert!(
                    matches!(result, Ok(()) | Err(Code::Internal)),
                    "{name}: {result:?}"
                );
            }
            faults.lock().unwrap().config_mut().latency = None;
            let got = recovered(&faults);
            for (name, _) in first.iter().chain(&during).filter(|(_, r)| r.is_ok()) {
                assert!(
                    got.contains(name),
                    "cut at write {cut}: {name} was acknowledged and is lost"
                );
            }
        }
    }
}
