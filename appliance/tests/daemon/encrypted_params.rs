//! The encryption parameters (`encrypted`, `encryptedDiscard`): checked, stored with the volume
//! and shown in its volume_context (the node plugin reads them there), inherited by the
//! restores and clones of an encrypted volume, and refused where a copy would contradict its
//! source. The appliance never sees a key: there is none in any of these calls. Once a
//! snapshot's volume is deleted, the LUKS2 header the snapshot starts with says it is encrypted.

use crate::common;

use std::collections::HashMap;

use common::DevAppliance;
use edgevol_core::{BlockDevice, WriteSegment};
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

/// A LUKS2 primary binary header as cryptsetup lays out its first 4 KiB (LUKS2 on-disk format:
/// big-endian fields; magic, version 2, header size with its JSON area, sequence id, checksum
/// algorithm, UUID). No key slot: the appliance must need none to tell.
fn luks2_header() -> Vec<u8> {
    let mut h = vec![0u8; 4096];
    h[..6].copy_from_slice(b"LUKS\xba\xbe");
    h[6..8].copy_from_slice(&2u16.to_be_bytes());
    h[8..16].copy_from_slice(&16384u64.to_be_bytes());
    h[16..24].copy_from_slice(&1u64.to_be_bytes());
    h[72..78].copy_from_slice(b"sha256");
    h[168..204].copy_from_slice(b"5f0c1c4e-9a52-4d0c-a3b4-6a8b7e0f2d11");
    h
}

/// Puts `data` at the start of volume `name`, as a host's write would land: through core's
/// mapping onto the pool device, one whole first cluster.
async fn write_first_cluster(app: &DevAppliance, name: &'static str, data: Vec<u8>) {
    app.running
        .state
        .on_pool(move |_, pool| {
            let id = pool.volume_by_name(name).unwrap().id();
            let cluster = u64::from(pool.cluster_size());
            let mut whole = data;
            whole.resize(usize::try_from(cluster).unwrap(), 0);
            let mut seg = [WriteSegment::EMPTY; 1];
            assert_eq!(pool.map_write(id, 0, cluster, &mut seg).unwrap(), 1);
            let block = u64::from(pool.device_mut().block_size());
            pool.device_mut()
                .write(seg[0].device_offset / block, &whole)
                .unwrap();
            pool.flush().unwrap();
        })
        .await
        .unwrap();
}

async fn snapshot_then_delete(
    c: &mut ControllerClient<tonic::transport::Channel>,
    volume: &Volume,
) -> String {
    let snap = c
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: volume.volume_id.clone(),
            name: format!("{}-snap", volume.volume_id),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    c.delete_volume(DeleteVolumeRequest {
        volume_id: volume.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    snap.snapshot_id
}

fn restore(name: &str, params: &[(&str, &str)], snapshot_id: &str) -> CreateVolumeRequest {
    create(
        name,
        params,
        Some(Type::Snapshot(SnapshotSource {
            snapshot_id: snapshot_id.to_owned(),
        })),
    )
}

#[tokio::test]
async fn a_snapshot_outliving_its_encrypted_volume_restores_encrypted() {
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
    write_first_cluster(&app, "enc", luks2_header()).await;
    // A plain volume holding a LUKS1 header and one holding other data: neither is LUKS2.
    let mut luks1 = luks2_header();
    luks1[6..8].copy_from_slice(&1u16.to_be_bytes());
    let mut plain_snaps = Vec::new();
    for (name, data) in [
        ("plain-luks1", luks1),
        ("plain-data", b"plain data".to_vec()),
    ] {
        let plain = c
            .create_volume(create(name, &[], None))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        write_first_cluster(&app, name, data).await;
        plain_snaps.push(snapshot_then_delete(&mut c, &plain).await);
    }
    let snap = snapshot_then_delete(&mut c, &enc).await;
    let gone = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: enc.volume_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);

    // From a class that does not say: encrypted, discards off (the volume's choice is lost).
    for (name, params) in [
        ("r-unsaid", &[][..]),
        ("r-fs", &[("fsType", "xfs")][..]),
        ("r-asked", &[("encrypted", "true")][..]),
    ] {
        let restored = c
            .create_volume(restore(name, params, &snap))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(
            flags(&restored.volume_context),
            (Some("true"), None),
            "{name}"
        );
    }
    // Asked unencrypted: refused, as for a snapshot whose volume exists.
    let e = c
        .create_volume(restore("r-plain", &[("encrypted", "false")], &snap))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("encrypted"), "{}", e.message());

    // No LUKS2 header: restored as the request says (plain unless it asks).
    for (i, snap) in plain_snaps.iter().enumerate() {
        let restored = c
            .create_volume(restore(&format!("p{i}"), &[], snap))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(flags(&restored.volume_context), (None, None), "{snap}");
    }
}
