//! Calls through `edgevol proxy` on a unix socket: what a CO sidecar sees must be what a direct
//! mTLS client sees. The whole Controller conformance suite runs through the proxy in
//! proxy_controller_suite.rs; this file keeps a CO's short round trip (create, retry, snapshot,
//! list, GetSnapshot as csi-sanity asks it, delete, an empty listing after) and the
//! SnapshotMetadata streams.

use std::path::PathBuf;

use crate::common;
use crate::fleet;

use common::{
    create_ok, dev_config, dev_tls, snapshot_ids, snapshot_of, snapshot_ok, start_proxy,
    unix_channel,
};
use edgevol_appliance::start;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use edgevol_proto::csi::v1::*;
use tonic::Code;

fn mount() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

#[tokio::test]
async fn controller_calls_through_the_proxy_behave_as_direct_ones() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("appliance");
    let appliance = start(dev_config(&data, "127.0.0.1:0".parse().unwrap(), "proxied"))
        .await
        .unwrap();
    common::pool_ready(&appliance).await;
    let pki = data.join("pki");
    let tls = dev_tls(&pki, "controller");
    let socket: PathBuf = dir.path().join("csi.sock");
    start_proxy(&socket, appliance.local_addr, tls).await;
    let channel = unix_channel(socket).await;
    let mut c = ControllerClient::new(channel);
    conformance(&mut c).await;
    appliance.stop().await.unwrap();
}

/// What the external-snapshot-metadata sidecar does through the proxy's socket: a
/// GetMetadataDelta and a GetMetadataAllocated stream of several messages each, forwarded as the
/// appliance sends them.
#[tokio::test]
async fn snapshot_metadata_streams_through_the_proxy() {
    use edgevol_proto::csi::v1::snapshot_metadata_client::SnapshotMetadataClient;
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("appliance");
    let appliance = start(dev_config(&data, "127.0.0.1:0".parse().unwrap(), "meta"))
        .await
        .unwrap();
    common::pool_ready(&appliance).await;
    let socket: PathBuf = dir.path().join("csi.sock");
    start_proxy(
        &socket,
        appliance.local_addr,
        dev_tls(&data.join("pki"), "controller"),
    )
    .await;
    let channel = unix_channel(socket).await;
    let mut c = ControllerClient::new(channel.clone());
    let v = create_ok(
        &mut c,
        CreateVolumeRequest {
            name: "meta".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 16 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![mount()],
            ..Default::default()
        },
    )
    .await
    .volume_id;
    let base = snapshot_ok(&mut c, snapshot_of(&v, "base")).await;
    // Every other cluster, as writes would map them (the answer comes from the maps).
    {
        let id = edgevol_appliance::csi::ids::Ids::new("meta")
            .parse_volume(&v)
            .unwrap();
        let mut pool = appliance.state.lock_pool().unwrap();
        for cluster in (0..16).step_by(2) {
            let mut seg = [edgevol_core::WriteSegment::EMPTY; 1];
            pool.map_write(id, cluster * MIB, MIB, &mut seg).unwrap();
        }
        pool.flush().unwrap();
    }
    let target = snapshot_ok(&mut c, snapshot_of(&v, "target")).await;
    let mut m = SnapshotMetadataClient::new(channel);
    let mut delta = m
        .get_metadata_delta(GetMetadataDeltaRequest {
            base_snapshot_id: base.snapshot_id.clone(),
            target_snapshot_id: target.snapshot_id.clone(),
            max_results: 3,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut ranges = Vec::new();
    let mut messages = 0;
    while let Some(msg) = delta.message().await.unwrap() {
        assert_eq!(msg.volume_capacity_bytes, 16 << 20);
        ranges.extend(
            msg.block_metadata
                .iter()
                .map(|b| (b.byte_offset, b.size_bytes)),
        );
        messages += 1;
    }
    let want: Vec<(i64, i64)> = (0..8).map(|i| (2 * i * (1 << 20), 1 << 20)).collect();
    assert_eq!(ranges, want);
    assert_eq!(messages, 3, "8 ranges in messages of at most 3");
    let mut allocated = m
        .get_metadata_allocated(GetMetadataAllocatedRequest {
            snapshot_id: base.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        allocated.message().await.unwrap().is_none(),
        "nothing was written before base"
    );
    // The appliance's refusal reaches the sidecar as it was sent.
    let status = m
        .get_metadata_delta(GetMetadataDeltaRequest {
            base_snapshot_id: target.snapshot_id.clone(),
            target_snapshot_id: base.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    appliance.stop().await.unwrap();
}

/// The same calls through a proxy serving two appliances: one driver, as a CO sees it.
#[tokio::test]
async fn controller_calls_through_a_two_appliance_proxy_behave_as_direct_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = fleet::start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet::fleet_proxy(dir.path(), &boxes).await;
    conformance(&mut c).await;
    fleet::stop_all(&mut boxes).await;
}

async fn conformance(c: &mut ControllerClient<tonic::transport::Channel>) {
    let create = |name: &str| CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 3 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount()],
        ..Default::default()
    };
    let v = create_ok(c, create("via-proxy")).await;
    assert_eq!(v.capacity_bytes, 3 << 20);
    let again = create_ok(c, create("via-proxy")).await;
    assert_eq!(again.volume_id, v.volume_id, "idempotent through the proxy");
    let mut bigger = create("via-proxy");
    bigger.capacity_range.as_mut().unwrap().required_bytes = 1 << 30;
    let status = c.create_volume(bigger).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);
    let status = c.create_volume(create("")).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, "name is required")
    );

    let snap = snapshot_ok(c, snapshot_of(&v.volume_id, "snap")).await;
    let listed = snapshot_ids(
        c,
        ListSnapshotsRequest {
            source_volume_id: v.volume_id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(listed[0], snap.snapshot_id);
    get_snapshot_specs(c, &snap).await;
    let status = c
        .list_volumes(ListVolumesRequest {
            max_entries: 1,
            starting_token: "bogus".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Aborted);
    c.delete_volume(DeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let listed = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.entries.is_empty());
}

/// csi-sanity's GetSnapshot specs (run once GET_SNAPSHOT is advertised): no id, an unknown id,
/// and the snapshot with its fields as CreateSnapshot and ListSnapshots give them.
async fn get_snapshot_specs(c: &mut ControllerClient<tonic::transport::Channel>, snap: &Snapshot) {
    use controller_service_capability::rpc::Type as Rpc;
    use controller_service_capability::Type as CapType;
    let caps = c
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert!(
        caps.iter().any(
            |cap| matches!(cap.r#type, Some(CapType::Rpc(r)) if r.r#type() == Rpc::GetSnapshot)
        ),
        "GET_SNAPSHOT is advertised, so no GetSnapshot spec is skipped"
    );
    let get = |id: &str| GetSnapshotRequest {
        snapshot_id: id.into(),
        ..Default::default()
    };
    let status = c.get_snapshot(get("")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    // An id of this driver's form that names nothing, and one of no known form.
    let unknown = format!("{}999", snap.snapshot_id);
    for id in [unknown.as_str(), "some-id"] {
        let status = c.get_snapshot(get(id)).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{id}");
    }
    let got = c
        .get_snapshot(get(&snap.snapshot_id))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(&got, snap);
}
