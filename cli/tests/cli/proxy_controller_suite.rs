//! The project's CSI Controller conformance suite (cli/tests/controller_suite, which
//! appliance/tests/daemon/controller.rs runs over direct mTLS) through `edgevol proxy`: with one
//! appliance (the proxy passes every call through) and with two (it routes each call, places
//! volumes and pages listings across both). A CO sidecar on the socket sees the direct answers.

use std::path::PathBuf;

use crate::common;
use crate::controller_suite;
use crate::fleet;

use common::{dev_tls, start_proxy, unix_channel};
use fleet::{fleet_proxy, start_fleet, Box_};
use tonic::transport::Channel;

/// In-process appliances behind an in-process `edgevol proxy` on a unix socket.
struct Proxied {
    /// Holds the appliances' data and the socket until the test ends.
    _dir: tempfile::TempDir,
    boxes: Vec<Box_>,
    socket: PathBuf,
}

impl Proxied {
    fn running(&self, id: &str) -> &edgevol_appliance::Running {
        let b = self.boxes.iter().find(|b| b.id == id).unwrap();
        b.running.as_ref().expect("the appliance runs")
    }
}

/// `edgevol proxy` with one appliance: as with one `--appliance`, a pass-through.
async fn one_box() -> Proxied {
    let dir = tempfile::tempdir().unwrap();
    let boxes = start_fleet(dir.path(), &["box-a"]).await;
    let socket = dir.path().join("csi.sock");
    let tls = dev_tls(&dir.path().join("pki"), "controller");
    start_proxy(&socket, boxes[0].addr, tls).await;
    Proxied {
        _dir: dir,
        boxes,
        socket,
    }
}

/// `edgevol proxy` serving two appliances as one driver.
async fn two_boxes() -> Proxied {
    let dir = tempfile::tempdir().unwrap();
    let boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    // fleet_proxy serves on dir/csi.sock; the suite opens its own channels there.
    fleet_proxy(dir.path(), &boxes).await;
    let socket = dir.path().join("csi.sock");
    Proxied {
        _dir: dir,
        boxes,
        socket,
    }
}

impl controller_suite::Driver for Proxied {
    fn appliances(&self) -> Vec<String> {
        self.boxes.iter().map(|b| b.id.clone()).collect()
    }

    async fn channel(&self) -> Channel {
        unix_channel(self.socket.clone()).await
    }

    async fn restart(&mut self) {
        for b in &mut self.boxes {
            b.stop().await;
            b.restart().await;
        }
    }

    fn nvme_port(&self, id: &str) -> u16 {
        self.running(id).target.endpoint.port()
    }

    fn stored_mutable_parameters(&self, volume_id: &str) -> Vec<(String, String)> {
        let home = controller_suite::home(volume_id);
        let state = &self.running(home).state;
        let id = edgevol_appliance::csi::ids::Ids::new(home)
            .parse_volume(volume_id)
            .unwrap();
        let pool = state.lock_pool().unwrap();
        pool.volume(id).unwrap().mutable_parameters().to_vec()
    }

    fn group_home(&self, name: &str) -> String {
        let ids = self.appliances();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        ids[edgevol_cli::fleet_placement::order(None, &ids, name)[0]].to_owned()
    }
}

mod through_a_one_appliance_proxy {
    use super::one_box;
    crate::controller_suite::controller_suite!(one_box);
}

mod through_a_two_appliance_proxy {
    use super::two_boxes;
    crate::controller_suite::controller_suite!(two_boxes);
}

/// Rows the suite cannot ask one appliance, as CSI states them for the driver: a name is the
/// plugin's, not one box's. Through two boxes a snapshot name already taken by a snapshot of a
/// volume on the other box, and a volume name asked again with a requisite that places it on
/// the other box, are ALREADY_EXISTS naming the box that holds them, and nothing is made.
#[tokio::test]
async fn names_are_the_drivers_across_appliances() {
    use controller_suite::{create, pinned, snapshot, vol, MIB};
    use edgevol_proto::csi::v1::controller_client::ControllerClient;
    use edgevol_proto::csi::v1::volume_content_source::{SnapshotSource, Type as SourceType};
    use edgevol_proto::csi::v1::{
        CreateSnapshotRequest, ListSnapshotsRequest, ListVolumesRequest, VolumeContentSource,
    };
    use tonic::Code;
    let d = two_boxes().await;
    let mut c = ControllerClient::new(controller_suite::Driver::channel(&d).await);
    let a = vol(&mut c, pinned(create("a", MIB), "box-a")).await;
    let b = vol(&mut c, pinned(create("b", MIB), "box-b")).await;
    let s1 = snapshot(&mut c, &a.volume_id, "s1").await;
    let sb = snapshot(&mut c, &b.volume_id, "sb").await;
    let other_source = c
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: b.volume_id.clone(),
            name: "s1".into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().snapshot)
        .unwrap_err();
    assert_eq!(
        other_source.code(),
        Code::AlreadyExists,
        "s1 is a snapshot of {}: {other_source:?}",
        a.volume_id
    );
    assert!(other_source.message().contains("box-a"), "{other_source:?}");
    // The CO cannot ask the proxy's question itself.
    let asked = c
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: b.volume_id.clone(),
            name: "s9".into(),
            parameters: [("edgevol.io/existing-only".into(), "true".into())].into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(asked.code(), Code::InvalidArgument, "{asked:?}");

    let elsewhere = c
        .create_volume(pinned(create("a", MIB), "box-b"))
        .await
        .map(|r| r.into_inner().volume)
        .unwrap_err();
    assert_eq!(
        elsewhere.code(),
        Code::AlreadyExists,
        "volume a is {} on box-a: {elsewhere:?}",
        a.volume_id
    );
    assert!(
        elsewhere.message().contains(&a.volume_id),
        "names the volume and its box: {elsewhere:?}"
    );
    // A restore named a, from a snapshot on box-b: that name is box-a's volume too.
    let mut restore = create("a", MIB);
    restore.volume_content_source = Some(VolumeContentSource {
        r#type: Some(SourceType::Snapshot(SnapshotSource {
            snapshot_id: sb.snapshot_id.clone(),
        })),
    });
    let restored = c
        .create_volume(restore)
        .await
        .map(|r| r.into_inner().volume)
        .unwrap_err();
    assert_eq!(restored.code(), Code::AlreadyExists, "{restored:?}");
    assert!(restored.message().contains("box-a"), "{restored:?}");
    // Asked again where it is, compatibly: the same volume.
    assert_eq!(
        vol(&mut c, pinned(create("a", MIB), "box-a"))
            .await
            .volume_id,
        a.volume_id
    );

    // Nothing was made by the refused calls.
    let volumes = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(volumes.len(), 2, "{volumes:?}");
    let snapshots: Vec<String> = c
        .list_snapshots(ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.snapshot.unwrap().snapshot_id)
        .collect();
    assert_eq!(snapshots, vec![s1.snapshot_id, sb.snapshot_id]);
}
