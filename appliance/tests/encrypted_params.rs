//! The encryption parameters (`encrypted`, `encryptedDiscard`): checked, stored with the volume
//! and shown in its volume_context (the node plugin reads them there), inherited by the
//! restores and clones of an encrypted volume, and refused where a copy would contradict its
//! source. The appliance never sees a key: there is none in any of these calls.

mod common;

use std::collections::HashMap;

use common::DevAppliance;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use edgevol_proto::csi::v1::volume_content_source::{SnapshotSource, Type, VolumeSource};
use edgevol_proto::csi::v1::*;
use tonic::Code;

const MIB: i64 = 1 << 20;

fn create(name: &str, params: &[(&str, &str)], source: Option<Type>) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 5 * MIB,
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
        volume_content_source: source.map(|t| VolumeContentSource { r#type: Some(t) }),
        ..Default::default()
    }
}

fn flags(ctx: &HashMap<String, String>) -> (Option<&str>, Option<&str>) {
    (
        ctx.get("encrypted").map(String::as_str),
        ctx.get("encryptedDiscard").map(String::as_str),
    )
}

#[tokio::test]
async fn encryption_is_stored_shown_and_inherited_by_copies() {
    let app = DevAppliance::start().await;
    app.ready().await;
    let mut c = ControllerClient::new(app.channel("controller").await);

    let enc = c
        .create_volume(create(
            "enc",
            &[("encrypted", "true"), ("encryptedDiscard", "true")],
            None,
        ))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(flags(&enc.volume_context), (Some("true"), Some("true")));
    let got = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: enc.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(flags(&got.volume_context), (Some("true"), Some("true")));

    // A snapshot's restore and a clone, from a class that does not say: encrypted like the source.
    let snap = c
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: enc.volume_id.clone(),
            name: "enc-snap".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let restored = c
        .create_volume(create(
            "enc-restored",
            &[],
            Some(Type::Snapshot(SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            })),
        ))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        flags(&restored.volume_context),
        (Some("true"), Some("true"))
    );
    let clone = c
        .create_volume(create(
            "enc-clone",
            &[("fsType", "xfs")],
            Some(Type::Volume(VolumeSource {
                volume_id: enc.volume_id.clone(),
            })),
        ))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(flags(&clone.volume_context), (Some("true"), Some("true")));
    // The retry of that CreateVolume finds the same volume (idempotent by name).
    let again = c
        .create_volume(create(
            "enc-clone",
            &[("fsType", "xfs")],
            Some(Type::Volume(VolumeSource {
                volume_id: enc.volume_id.clone(),
            })),
        ))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, clone.volume_id);

    // Contradictions are INVALID_ARGUMENT: an unencrypted copy of ciphertext, an encrypted
    // copy of plain data, and malformed flags.
    let plain = c
        .create_volume(create("plain", &[], None))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(flags(&plain.volume_context), (None, None));
    let refused = [
        create(
            "x1",
            &[("encrypted", "false")],
            Some(Type::Snapshot(SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            })),
        ),
        create(
            "x2",
            &[("encrypted", "true")],
            Some(Type::Volume(VolumeSource {
                volume_id: plain.volume_id.clone(),
            })),
        ),
        create("x3", &[("encrypted", "yes")], None),
        create("x4", &[("encryptedDiscard", "true")], None),
    ];
    for req in refused {
        let name = req.name.clone();
        let e = c.create_volume(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{name}: {}", e.message());
        assert!(e.message().contains("encrypted"), "{name}: {}", e.message());
    }
}
