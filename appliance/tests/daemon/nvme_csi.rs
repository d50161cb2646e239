//! The control plane and the data path together: a volume published with ControllerPublishVolume
//! over mTLS is reachable at its publish_context; ControllerUnpublishVolume cuts live queues; a
//! published host reconnects after the appliance restarts and finds its data.

use crate::common;
use crate::nvme_host;

use std::net::SocketAddr;
use std::time::Duration;

use common::{dev_config, DevAppliance};
use edgevol_nvmeof::initiator::Data;
use edgevol_nvmeof::pdu::Digests;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
use edgevol_proto::csi::v1::*;
use nvme_host::{io, ok, Admin, Ended, WAIT};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:c5c5c5c5-0000-4000-8000-000000000001";

fn block() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_connect_unpublish_and_reconnect_after_restart() {
    let app = DevAppliance::start().await;
    app.ready().await;
    let mut c = ControllerClient::new(app.channel("controller").await);
    let volume = c
        .create_volume(CreateVolumeRequest {
            name: "e2e".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 8 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![block()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let publish = ControllerPublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: HOST.into(),
        volume_capability: Some(block()),
        ..Default::default()
    };
    let ctx = c
        .controller_publish_volume(publish.clone())
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let addr: SocketAddr = format!("{}:{}", ctx["targetAddress"], ctx["targetPort"])
        .parse()
        .unwrap();
    let nqn = ctx["subsystemNqn"].clone();

    // Reachable exactly where publish_context says.
    let mut admin = Admin::connect(addr, &nqn, HOST, 0).await.unwrap();
    let ns = admin.identify(0, 1).await;
    ok(&ns);
    let nguid: String = ns.data[104..120]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        nguid, ctx["nguid"],
        "the namespace carries the published NGUID"
    );
    let mut q = admin
        .io_queue(addr, 1, &nqn, HOST, Digests::NONE)
        .await
        .unwrap();
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 241) as u8).collect();
    let (sqe, payload) = io::write(3, &data, true);
    ok(&q.cmd(sqe, payload).await);
    // A discard as Linux sends it (mkfs does this): one sub-cluster range in a buffer sized for
    // 256 ranges. Accepted; a partial cluster keeps its data.
    let (sqe, Data::Write(mut ranges)) = io::deallocate(&[(0, 2)]) else {
        unreachable!("deallocate carries data")
    };
    ranges.resize(4096, 0);
    ok(&q.cmd(sqe, Data::Write(ranges)).await);

    // Unpublish cuts the live queues and later connects are refused.
    c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: HOST.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(matches!(q.wait_closed().await, Ended::Eof));
    assert!(matches!(admin.q.wait_closed().await, Ended::Eof));
    assert!(Admin::connect(addr, &nqn, HOST, 0).await.is_err());

    // Publish again, restart the appliance: the host reconnects (new port in this test: the
    // listener uses port 0) and reads what it wrote.
    c.controller_publish_volume(publish).await.unwrap();
    let DevAppliance { dir, running } = app;
    running.stop().await.unwrap();
    let running = edgevol_appliance::start(dev_config(dir.path(), "127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let app = DevAppliance { dir, running };
    app.ready().await;
    let addr = app.running.target.endpoint;
    let admin = Admin::connect(addr, &nqn, HOST, 0)
        .await
        .expect("the publication survived the restart");
    let mut q = admin
        .io_queue(addr, 1, &nqn, HOST, Digests::NONE)
        .await
        .unwrap();
    let (sqe, none) = io::read(3, 2);
    let read = q.cmd(sqe, none).await;
    ok(&read);
    assert_eq!(read.data, data);
    app.running.stop().await.unwrap();
}

/// Stopping the daemon lets go of its state, and with it the pool and its device: nothing (the
/// target's access hook included) keeps them alive behind the caller's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_daemon_lets_go_of_its_pool() {
    let app = DevAppliance::start().await;
    app.ready().await;
    let state = std::sync::Arc::downgrade(&app.running.state);
    let DevAppliance { dir, running } = app;
    running.stop().await.unwrap();
    // Connection and listener tasks end with the stop; give the runtime a moment to drop them.
    let released = tokio::time::timeout(WAIT, async {
        while state.upgrade().is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        released.is_ok(),
        "the stopped daemon's state is still alive"
    );
    drop(dir);
}
