//! Per-volume QoS through the whole stack: limits set by CreateVolume's mutable_parameters hold
//! a volume's commands back; ControllerModifyVolume changes (or removes) them on
//! connected queues without a reconnect; they survive a restart; an unlimited neighbour is not
//! held. The achieved rates are measured by the qos bench, not here: these tests only
//! count commands and wait with bounded timeouts.

mod common;
mod nvme_host;

use std::collections::HashMap;
use std::time::Duration;

use common::{dev_config, DevAppliance};
use edgevol_appliance::csi::ids::Ids;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
use edgevol_proto::csi::v1::*;
use nvme_host::{admin_and_queue, io, ok, Queue, WAIT};
use tonic::transport::Channel;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:9a9a9a9a-0000-4000-8000-000000000017";
/// Commands queued at once: at 1 IOPS they would take half a minute, longer than `WAIT`.
const DEPTH: u8 = 30;

fn block() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Creates and publishes a volume; its id and subsystem NQN.
async fn volume(
    c: &mut ControllerClient<Channel>,
    name: &str,
    mutable: &[(&str, &str)],
) -> (String, String) {
    let v = c
        .create_volume(CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 8 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![block()],
            mutable_parameters: params(mutable),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let ctx = c
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            node_id: HOST.into(),
            volume_capability: Some(block()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    (v.volume_id, ctx["subsystemNqn"].clone())
}

async fn modify(c: &mut ControllerClient<Channel>, id: &str, changes: &[(&str, &str)]) {
    c.controller_modify_volume(ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: params(changes),
        ..Default::default()
    })
    .await
    .unwrap();
}

/// Queues `DEPTH` writes of LBA 0, the i-th filled with byte `first + i`; their command ids.
fn write_burst(q: &mut Queue, first: u8) -> Vec<u16> {
    (0..DEPTH)
        .map(|i| {
            let (sqe, data) = io::write(0, &[first + i; 4096], false);
            q.submit(sqe, data)
        })
        .collect()
}

/// Waits for every command of `cids` (each must succeed) within `WAIT`.
async fn all_done(q: &mut Queue, cids: &[u16], why: &str) {
    tokio::time::timeout(WAIT, async {
        for &cid in cids {
            ok(&q.wait(cid).await);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{why}"));
}

/// Whether command `cid` is still held back a moment later (at 1 IOPS the last of `DEPTH`
/// commands is due half a minute after the first).
async fn held(q: &mut Queue, cid: u16) -> bool {
    tokio::time::timeout(Duration::from_millis(500), q.wait(cid))
        .await
        .is_err()
}

fn delayed(app: &DevAppliance, volume_id: &str) -> u64 {
    let id = Ids::new(&app.running.state.appliance_id)
        .parse_volume(volume_id)
        .unwrap();
    let c = app.running.target.stats.volume(id);
    c.qos_delayed.load(std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modify_reaches_held_commands_of_a_connected_queue() {
    let app = DevAppliance::start().await;
    app.ready().await;
    let mut c = ControllerClient::new(app.channel("controller").await);
    let (id, nqn) = volume(&mut c, "limited", &[("maxIops", "1")]).await;
    let (_admin, mut q) = admin_and_queue(app.running.target.endpoint, &nqn, HOST).await;

    let cids = write_burst(&mut q, 0);
    ok(&q.wait(cids[0]).await);
    assert!(
        held(&mut q, cids[cids.len() - 1]).await,
        "1 IOPS holds the last write back"
    );
    // Raised on the live queue: the held writes go now. (They start in the order they came;
    // NVMe lets outstanding commands complete in any order, so the content of the block they
    // all overwrite proves nothing: the limiter's tests check the order.)
    modify(&mut c, &id, &[("maxIops", "100000")]).await;
    all_done(
        &mut q,
        &cids[1..],
        "raised limit not applied to the held writes",
    )
    .await;
    assert!(delayed(&app, &id) >= 1);

    // Lowered again, then the key removed: the limit is lifted.
    modify(&mut c, &id, &[("maxIops", "1")]).await;
    let cids = write_burst(&mut q, 100);
    ok(&q.wait(cids[0]).await);
    modify(&mut c, &id, &[("maxIops", "")]).await;
    all_done(&mut q, &cids[1..], "removed limit still holds the writes").await;
    app.running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_survive_a_restart_and_an_unlimited_neighbour_is_not_held() {
    let app = DevAppliance::start().await;
    app.ready().await;
    let mut c = ControllerClient::new(app.channel("controller").await);
    let (slow, slow_nqn) = volume(&mut c, "slow", &[("maxReadIops", "1")]).await;
    let (fast, fast_nqn) = volume(&mut c, "fast", &[]).await;
    drop(c);
    let DevAppliance { dir, running } = app;
    running.stop().await.unwrap();
    let running = edgevol_appliance::start(dev_config(dir.path(), "127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let app = DevAppliance { dir, running };
    app.ready().await;
    let addr = app.running.target.endpoint;
    let (_a1, mut slow_q) = admin_and_queue(addr, &slow_nqn, HOST).await;
    let (_a2, mut fast_q) = admin_and_queue(addr, &fast_nqn, HOST).await;

    let reads = |q: &mut Queue| -> Vec<u16> {
        (0..DEPTH)
            .map(|_| {
                let (sqe, none) = io::read(0, 1);
                q.submit(sqe, none)
            })
            .collect()
    };
    let slow_cids = reads(&mut slow_q);
    let fast_cids = reads(&mut fast_q);
    all_done(&mut fast_q, &fast_cids, "the unlimited volume was held").await;
    assert_eq!(delayed(&app, &fast), 0);
    assert!(
        held(&mut slow_q, slow_cids[slow_cids.len() - 1]).await,
        "the stored limit holds reads back after the restart"
    );
    let mut c = ControllerClient::new(app.channel("controller").await);
    modify(&mut c, &slow, &[("maxReadIops", "")]).await;
    all_done(
        &mut slow_q,
        &slow_cids,
        "removed limit still holds the reads",
    )
    .await;
    assert!(delayed(&app, &slow) >= 1);
    app.running.stop().await.unwrap();
}
