//! `edgevol.io/existing-only`, the question `edgevol proxy` asks before it places a volume or
//! snapshot: answered like an idempotent CreateVolume (CreateSnapshot) when the name exists
//! (ALREADY_EXISTS when it does not match), NOT_FOUND when it does not, and nothing is ever
//! created or stored by it.

use crate::common;

use std::collections::HashMap;

use common::DevAppliance;
use edgevol_appliance::csi::params::EXISTING_ONLY_PARAM;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use edgevol_proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::Code;

const MIB: i64 = 1 << 20;

fn create(name: &str, bytes: i64, params: &[(&str, &str)]) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }],
        parameters: params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

async fn volume_ids(c: &mut ControllerClient<Channel>) -> Vec<String> {
    c.list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.volume.unwrap().volume_id)
        .collect()
}

async fn free(c: &mut ControllerClient<Channel>) -> i64 {
    c.get_capacity(GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner()
        .available_capacity
}

#[tokio::test]
async fn existing_only_finds_the_named_volume_and_never_creates_one() {
    let app = DevAppliance::start().await;
    app.ready().await;
    let mut c = ControllerClient::new(app.channel("controller").await);
    let ask = [(EXISTING_ONLY_PARAM, "true")];
    let free_before = free(&mut c).await;

    // No volume of the name: NOT_FOUND, and still none (thick would have taken space).
    let s = c
        .create_volume(create(
            "data",
            8 * MIB,
            &[ask[0], ("provisioning", "thick")],
        ))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound, "{s:?}");
    assert!(volume_ids(&mut c).await.is_empty());
    assert_eq!(free(&mut c).await, free_before, "no space taken");

    // Made: the question answers that very volume, as an idempotent CreateVolume does.
    let thick = [("provisioning", "thick")];
    let made = c
        .create_volume(create("data", 8 * MIB, &thick))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let found = c
        .create_volume(create("data", 8 * MIB, &[ask[0], thick[0]]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(found, made, "same id, size, context");
    assert!(
        !found.volume_context.contains_key(EXISTING_ONLY_PARAM),
        "never stored: {:?}",
        found.volume_context
    );

    // Not what was made (size, parameters): ALREADY_EXISTS, as a CreateVolume answers.
    for other in [
        create("data", 16 * MIB, &[ask[0], thick[0]]),
        create("data", 8 * MIB, &ask),
    ] {
        let s = c.create_volume(other).await.unwrap_err();
        assert_eq!(s.code(), Code::AlreadyExists, "{s:?}");
    }
    assert_eq!(volume_ids(&mut c).await, vec![made.volume_id.clone()]);

    // Only "true" is a question; GetCapacity does not take it.
    let s = c
        .create_volume(create("other", MIB, &[(EXISTING_ONLY_PARAM, "yes")]))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    let s = c
        .get_capacity(GetCapacityRequest {
            parameters: HashMap::from([(EXISTING_ONLY_PARAM.to_owned(), "true".to_owned())]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert_eq!(volume_ids(&mut c).await, vec![made.volume_id]);
}

async fn snapshot_ids(c: &mut ControllerClient<Channel>) -> Vec<String> {
    c.list_snapshots(ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.snapshot.unwrap().snapshot_id)
        .collect()
}

fn snap(source: &str, name: &str, params: &[(&str, &str)]) -> CreateSnapshotRequest {
    CreateSnapshotRequest {
        source_volume_id: source.into(),
        name: name.into(),
        parameters: params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn existing_only_finds_the_named_snapshot_before_resolving_its_source() {
    let app = DevAppliance::start().await;
    app.ready().await;
    let mut c = ControllerClient::new(app.channel("controller").await);
    let ask = [(EXISTING_ONLY_PARAM, "true")];
    let v = c
        .create_volume(create("data", 8 * MIB, &[]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();

    // No snapshot of the name: NOT_FOUND, and none made (the source exists).
    let s = c
        .create_snapshot(snap(&v.volume_id, "s1", &ask))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound, "{s:?}");
    assert!(s.message().contains("s1"), "{s:?}");
    assert!(snapshot_ids(&mut c).await.is_empty());

    let made = c
        .create_snapshot(snap(&v.volume_id, "s1", &[]))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let found = c
        .create_snapshot(snap(&v.volume_id, "s1", &ask))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(
        found, made,
        "the snapshot an idempotent CreateSnapshot answers"
    );

    // Another source, even one of another appliance that names nothing here: the name answers
    // first, ALREADY_EXISTS (without the question that source would be NOT_FOUND).
    for other in [format!("{}9", v.volume_id), "box-b-v0".to_owned()] {
        let s = c
            .create_snapshot(snap(&other, "s1", &ask))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::AlreadyExists, "{other}: {s:?}");
        let plain = c
            .create_snapshot(snap(&other, "s1", &[]))
            .await
            .unwrap_err();
        assert_eq!(plain.code(), Code::NotFound, "{other}: {plain:?}");
    }
    // A foreign source and a free name: NOT_FOUND, nothing made.
    let s = c
        .create_snapshot(snap("box-b-v0", "s2", &ask))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound, "{s:?}");
    assert_eq!(snapshot_ids(&mut c).await, vec![made.snapshot_id]);

    // Only "true" is a question; snapshots take no other parameter.
    let s = c
        .create_snapshot(snap(&v.volume_id, "s3", &[(EXISTING_ONLY_PARAM, "yes")]))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert_eq!(snapshot_ids(&mut c).await.len(), 1);
}
