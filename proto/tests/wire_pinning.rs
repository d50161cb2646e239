//! Wire pinning: hand-assembled protobuf bytes, written tag by tag from the
//! CSI v1.12.0 and VolumeGroup field numbers, must decode into exactly the
//! expected values and re-encode to the very same bytes.
//!
//! A tag byte is `(field_number << 3) | wire_type`, with wire type 0 for
//! varints (int32/int64/bool/enum) and 2 for length-delimited data (strings,
//! messages, map entries, packed or repeated strings). A map entry is a
//! nested message with the key in field 1 and the value in field 2.
//!
//! If a field number or type in a `.proto` file drifts, the decode lands in
//! the wrong field (or fails) and these tests fail.

use edgevol_proto::csi::v1 as csi;
use edgevol_proto::volumegroup as vg;
use prost::Message;

use csi::volume_capability::{access_mode::Mode, AccessType};

/// Decodes `bytes` as `M`, then checks that encoding gives the same bytes.
fn decode_exact<M: Message + Default>(bytes: &[u8]) -> M {
    let msg = M::decode(bytes).expect("hand-assembled bytes must decode");
    assert_eq!(
        msg.encode_to_vec(),
        bytes,
        "re-encoding did not reproduce the hand-assembled bytes"
    );
    msg
}

fn map1(k: &str, v: &str) -> std::collections::HashMap<String, String> {
    std::iter::once((k.to_owned(), v.to_owned())).collect()
}

#[test]
fn create_volume_request() {
    #[rustfmt::skip]
    let bytes: &[u8] = &[
        // 1: name = "vol" (string)
        0x0a, 0x03, b'v', b'o', b'l',
        // 2: capacity_range (CapacityRange), 12 bytes
        0x12, 0x0c,
            // 1: required_bytes = 1 GiB (int64 varint 0x4000_0000)
            0x08, 0x80, 0x80, 0x80, 0x80, 0x04,
            // 2: limit_bytes = 2 GiB (int64 varint 0x8000_0000)
            0x10, 0x80, 0x80, 0x80, 0x80, 0x08,
        // 3: volume_capabilities[0] (VolumeCapability), 21 bytes
        0x1a, 0x15,
            // 2: mount (MountVolume, oneof access_type), 15 bytes
            0x12, 0x0f,
                // 1: fs_type = "ext4"
                0x0a, 0x04, b'e', b'x', b't', b'4',
                // 2: mount_flags[0] = "noatime"
                0x12, 0x07, b'n', b'o', b'a', b't', b'i', b'm', b'e',
            // 3: access_mode (AccessMode), 2 bytes
            0x1a, 0x02,
                // 1: mode = SINGLE_NODE_WRITER (1)
                0x08, 0x01,
        // 4: parameters entry, 12 bytes
        0x22, 0x0c,
            0x0a, 0x04, b't', b'h', b'i', b'n', // key = "thin"
            0x12, 0x04, b't', b'r', b'u', b'e', // value = "true"
        // 5: secrets entry, 14 bytes
        0x2a, 0x0e,
            0x0a, 0x04, b'u', b's', b'e', b'r', // key = "user"
            0x12, 0x06, b's', b'3', b'c', b'r', b'3', b't', // value = "s3cr3t"
    ];

    let req: csi::CreateVolumeRequest = decode_exact(bytes);

    assert_eq!(req.name, "vol");
    let range = req.capacity_range.expect("capacity_range");
    assert_eq!(range.required_bytes, 1 << 30);
    assert_eq!(range.limit_bytes, 1 << 31);

    assert_eq!(req.volume_capabilities.len(), 1);
    let cap = &req.volume_capabilities[0];
    match &cap.access_type {
        Some(AccessType::Mount(m)) => {
            assert_eq!(m.fs_type, "ext4");
            assert_eq!(m.mount_flags, vec!["noatime".to_owned()]);
            assert_eq!(m.volume_mount_group, "");
        }
        other => panic!("expected mount access type, got {other:?}"),
    }
    let mode = cap.access_mode.expect("access_mode").mode();
    assert_eq!(mode, Mode::SingleNodeWriter);

    assert_eq!(req.parameters, map1("thin", "true"));
    assert_eq!(req.secrets, map1("user", "s3cr3t"));
    assert!(req.volume_content_source.is_none());
    assert!(req.accessibility_requirements.is_none());
    assert!(req.mutable_parameters.is_empty());
}

#[test]
fn create_volume_request_from_block_with_source_topology_and_mutable() {
    #[rustfmt::skip]
    let bytes: &[u8] = &[
        // 1: name = "v2"
        0x0a, 0x02, b'v', b'2',
        // 3: volume_capabilities[0], 6 bytes
        0x1a, 0x06,
            // 1: block (BlockVolume, empty)
            0x0a, 0x00,
            // 3: access_mode { mode = SINGLE_NODE_MULTI_WRITER (7) }
            0x1a, 0x02, 0x08, 0x07,
        // 6: volume_content_source, 6 bytes
        0x32, 0x06,
            // 1: snapshot (SnapshotSource, oneof type), 4 bytes
            0x0a, 0x04,
                // 1: snapshot_id = "s1"
                0x0a, 0x02, b's', b'1',
        // 7: accessibility_requirements (TopologyRequirement), 13 bytes
        0x3a, 0x0d,
            // 1: requisite[0] (Topology), 11 bytes
            0x0a, 0x0b,
                // 1: segments entry, 9 bytes
                0x0a, 0x09,
                    0x0a, 0x04, b'z', b'o', b'n', b'e', // key = "zone"
                    0x12, 0x01, b'a',                   // value = "a"
        // 8: mutable_parameters entry, 11 bytes
        0x42, 0x0b,
            0x0a, 0x04, b'i', b'o', b'p', b's', // key = "iops"
            0x12, 0x03, b'5', b'0', b'0',       // value = "500"
    ];

    let req: csi::CreateVolumeRequest = decode_exact(bytes);
    assert_eq!(req.name, "v2");
    let cap = &req.volume_capabilities[0];
    assert_eq!(
        cap.access_type,
        Some(AccessType::Block(csi::volume_capability::BlockVolume {}))
    );
    assert_eq!(
        cap.access_mode.expect("access_mode").mode(),
        Mode::SingleNodeMultiWriter
    );
    assert_eq!(
        req.volume_content_source.expect("source").r#type,
        Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: "s1".into()
            }
        ))
    );
    let topo = req.accessibility_requirements.expect("topology");
    assert_eq!(topo.requisite.len(), 1);
    assert_eq!(topo.requisite[0].segments, map1("zone", "a"));
    assert!(topo.preferred.is_empty());
    assert_eq!(req.mutable_parameters, map1("iops", "500"));
}

#[test]
fn controller_publish_volume_request() {
    #[rustfmt::skip]
    let bytes: &[u8] = &[
        // 1: volume_id = "vol-1"
        0x0a, 0x05, b'v', b'o', b'l', b'-', b'1',
        // 2: node_id = "node-a"
        0x12, 0x06, b'n', b'o', b'd', b'e', b'-', b'a',
        // 3: volume_capability, 6 bytes
        0x1a, 0x06,
            // 1: block {}
            0x0a, 0x00,
            // 3: access_mode { mode = MULTI_NODE_READER_ONLY (3) }
            0x1a, 0x02, 0x08, 0x03,
        // 4: readonly = true (bool varint)
        0x20, 0x01,
        // 5: secrets entry, 8 bytes
        0x2a, 0x08,
            0x0a, 0x01, b'k',             // key = "k"
            0x12, 0x03, b'p', b'w', b'd', // value = "pwd"
        // 6: volume_context entry, 12 bytes
        0x32, 0x0c,
            0x0a, 0x04, b'n', b'q', b'n', b'x', // key = "nqnx"
            0x12, 0x04, b'1', b'0', b'.', b'1', // value = "10.1"
    ];

    let req: csi::ControllerPublishVolumeRequest = decode_exact(bytes);
    assert_eq!(req.volume_id, "vol-1");
    assert_eq!(req.node_id, "node-a");
    let cap = req.volume_capability.expect("volume_capability");
    assert!(matches!(cap.access_type, Some(AccessType::Block(_))));
    assert_eq!(
        cap.access_mode.expect("access_mode").mode(),
        Mode::MultiNodeReaderOnly
    );
    assert!(req.readonly);
    assert_eq!(req.secrets, map1("k", "pwd"));
    assert_eq!(req.volume_context, map1("nqnx", "10.1"));
}

#[test]
fn node_publish_volume_request() {
    #[rustfmt::skip]
    let bytes: &[u8] = &[
        // 1: volume_id = "v"
        0x0a, 0x01, b'v',
        // 2: publish_context entry { "a": "b" }
        0x12, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, b'b',
        // 3: staging_target_path = "/s"
        0x1a, 0x02, b'/', b's',
        // 4: target_path = "/t"
        0x22, 0x02, b'/', b't',
        // 5: volume_capability { block {}, access_mode { SINGLE_NODE_SINGLE_WRITER (6) } }
        0x2a, 0x06, 0x0a, 0x00, 0x1a, 0x02, 0x08, 0x06,
        // 6: readonly = true
        0x30, 0x01,
        // 7: secrets entry { "c": "d" }
        0x3a, 0x06, 0x0a, 0x01, b'c', 0x12, 0x01, b'd',
        // 8: volume_context entry { "e": "f" }
        0x42, 0x06, 0x0a, 0x01, b'e', 0x12, 0x01, b'f',
    ];

    let req: csi::NodePublishVolumeRequest = decode_exact(bytes);
    assert_eq!(req.volume_id, "v");
    assert_eq!(req.publish_context, map1("a", "b"));
    assert_eq!(req.staging_target_path, "/s");
    assert_eq!(req.target_path, "/t");
    assert_eq!(
        req.volume_capability
            .and_then(|c| c.access_mode)
            .expect("access_mode")
            .mode(),
        Mode::SingleNodeSingleWriter
    );
    assert!(req.readonly);
    assert_eq!(req.secrets, map1("c", "d"));
    assert_eq!(req.volume_context, map1("e", "f"));
}

#[test]
fn create_snapshot_response_with_timestamp_and_group_id() {
    #[rustfmt::skip]
    let bytes: &[u8] = &[
        // 1: snapshot (Snapshot), 24 bytes
        0x0a, 0x18,
            // 1: size_bytes = 300 (varint 0xac 0x02)
            0x08, 0xac, 0x02,
            // 2: snapshot_id = "s1"
            0x12, 0x02, b's', b'1',
            // 3: source_volume_id = "v1"
            0x1a, 0x02, b'v', b'1',
            // 4: creation_time (google.protobuf.Timestamp), 5 bytes
            0x22, 0x05,
                // 1: seconds = 1000 (varint 0xe8 0x07)
                0x08, 0xe8, 0x07,
                // 2: nanos = 5
                0x10, 0x05,
            // 5: ready_to_use = true
            0x28, 0x01,
            // 6: group_snapshot_id = "g1"
            0x32, 0x02, b'g', b'1',
    ];

    let resp: csi::CreateSnapshotResponse = decode_exact(bytes);
    let snap = resp.snapshot.expect("snapshot");
    assert_eq!(snap.size_bytes, 300);
    assert_eq!(snap.snapshot_id, "s1");
    assert_eq!(snap.source_volume_id, "v1");
    let ts = snap.creation_time.expect("creation_time");
    assert_eq!((ts.seconds, ts.nanos), (1000, 5));
    assert!(snap.ready_to_use);
    assert_eq!(snap.group_snapshot_id, "g1");
}

#[test]
fn create_volume_group_snapshot_request() {
    #[rustfmt::skip]
    let bytes: &[u8] = &[
        // 1: name = "gs"
        0x0a, 0x02, b'g', b's',
        // 2: source_volume_ids[0] = "a"
        0x12, 0x01, b'a',
        // 2: source_volume_ids[1] = "b"
        0x12, 0x01, b'b',
        // 3: secrets entry { "u": "p" }
        0x1a, 0x06, 0x0a, 0x01, b'u', 0x12, 0x01, b'p',
        // 4: parameters entry { "q": "1" }
        0x22, 0x06, 0x0a, 0x01, b'q', 0x12, 0x01, b'1',
    ];

    let req: csi::CreateVolumeGroupSnapshotRequest = decode_exact(bytes);
    assert_eq!(req.name, "gs");
    assert_eq!(req.source_volume_ids, vec!["a".to_owned(), "b".to_owned()]);
    assert_eq!(req.secrets, map1("u", "p"));
    assert_eq!(req.parameters, map1("q", "1"));
}

#[test]
fn get_volume_group_snapshot_response() {
    #[rustfmt::skip]
    let bytes: &[u8] = &[
        // 1: group_snapshot (VolumeGroupSnapshot), 17 bytes
        0x0a, 0x11,
            // 1: group_snapshot_id = "g"
            0x0a, 0x01, b'g',
            // 2: snapshots[0] (Snapshot), 6 bytes
            0x12, 0x06,
                // 2: snapshot_id = "s"
                0x12, 0x01, b's',
                // 6: group_snapshot_id = "g"
                0x32, 0x01, b'g',
            // 3: creation_time { seconds = 7 }
            0x1a, 0x02, 0x08, 0x07,
            // 4: ready_to_use = true
            0x20, 0x01,
    ];

    let resp: csi::GetVolumeGroupSnapshotResponse = decode_exact(bytes);
    let group = resp.group_snapshot.expect("group_snapshot");
    assert_eq!(group.group_snapshot_id, "g");
    assert_eq!(group.snapshots.len(), 1);
    assert_eq!(group.snapshots[0].snapshot_id, "s");
    assert_eq!(group.snapshots[0].group_snapshot_id, "g");
    assert_eq!(group.creation_time.expect("creation_time").seconds, 7);
    assert!(group.ready_to_use);
}

#[test]
fn node_get_info_and_capabilities() {
    #[rustfmt::skip]
    let info: &[u8] = &[
        // 1: node_id = "n1"
        0x0a, 0x02, b'n', b'1',
        // 2: max_volumes_per_node = 16 (int64)
        0x10, 0x10,
        // 3: accessible_topology (Topology) { segments { "r": "x" } }
        0x1a, 0x08, 0x0a, 0x06, 0x0a, 0x01, b'r', 0x12, 0x01, b'x',
    ];
    let info: csi::NodeGetInfoResponse = decode_exact(info);
    assert_eq!(info.node_id, "n1");
    assert_eq!(info.max_volumes_per_node, 16);
    assert_eq!(
        info.accessible_topology.expect("topology").segments,
        map1("r", "x")
    );

    #[rustfmt::skip]
    let caps: &[u8] = &[
        // 1: capabilities[0] { 1: rpc { 1: type = STAGE_UNSTAGE_VOLUME (1) } }
        0x0a, 0x04, 0x0a, 0x02, 0x08, 0x01,
        // 1: capabilities[1] { 1: rpc { 1: type = VOLUME_MOUNT_GROUP (6) } }
        0x0a, 0x04, 0x0a, 0x02, 0x08, 0x06,
    ];
    let caps: csi::NodeGetCapabilitiesResponse = decode_exact(caps);
    use csi::node_service_capability::{rpc::Type, Type as Cap};
    let types: Vec<Type> = caps
        .capabilities
        .iter()
        .map(|c| match &c.r#type {
            Some(Cap::Rpc(rpc)) => rpc.r#type(),
            None => panic!("capability without rpc"),
        })
        .collect();
    assert_eq!(
        types,
        vec![Type::StageUnstageVolume, Type::VolumeMountGroup]
    );
}

#[test]
fn controller_capability_enum_numbers() {
    use csi::controller_service_capability::rpc::Type;
    let expected = [
        (Type::Unknown, 0),
        (Type::CreateDeleteVolume, 1),
        (Type::PublishUnpublishVolume, 2),
        (Type::ListVolumes, 3),
        (Type::GetCapacity, 4),
        (Type::CreateDeleteSnapshot, 5),
        (Type::ListSnapshots, 6),
        (Type::CloneVolume, 7),
        (Type::PublishReadonly, 8),
        (Type::ExpandVolume, 9),
        (Type::ListVolumesPublishedNodes, 10),
        (Type::VolumeCondition, 11),
        (Type::GetVolume, 12),
        (Type::SingleNodeMultiWriter, 13),
        (Type::ModifyVolume, 14),
        (Type::GetSnapshot, 15),
    ];
    for (value, number) in expected {
        assert_eq!(value as i32, number, "{value:?}");
    }
    // v1.12 ends at GET_SNAPSHOT.
    assert!(Type::try_from(16).is_err());

    use csi::plugin_capability::service::Type as Svc;
    assert_eq!(Svc::GroupControllerService as i32, 3);
    assert_eq!(Svc::SnapshotMetadataService as i32, 4);
}

#[test]
fn get_snapshot_request_and_response() {
    #[rustfmt::skip]
    let req: &[u8] = &[
        // 1: snapshot_id = "s1"
        0x0a, 0x02, b's', b'1',
        // 2: secrets entry { "k": "v" }
        0x12, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v',
    ];
    let req: csi::GetSnapshotRequest = decode_exact(req);
    assert_eq!(req.snapshot_id, "s1");
    assert_eq!(req.secrets, map1("k", "v"));

    #[rustfmt::skip]
    let resp: &[u8] = &[
        // 1: snapshot (Snapshot), 9 bytes
        0x0a, 0x09,
            // 2: snapshot_id = "s1"
            0x12, 0x02, b's', b'1',
            // 3: source_volume_id = "v"
            0x1a, 0x01, b'v',
            // 5: ready_to_use = true
            0x28, 0x01,
    ];
    let resp: csi::GetSnapshotResponse = decode_exact(resp);
    let snap = resp.snapshot.expect("snapshot");
    assert_eq!(snap.snapshot_id, "s1");
    assert_eq!(snap.source_volume_id, "v");
    assert!(snap.ready_to_use);
}

#[test]
fn get_metadata_delta_stream_message() {
    #[rustfmt::skip]
    let req: &[u8] = &[
        // 1: base_snapshot_id = "a"
        0x0a, 0x01, b'a',
        // 2: target_snapshot_id = "b"
        0x12, 0x01, b'b',
        // 3: starting_offset = 4096 (int64 varint 0x80 0x20)
        0x18, 0x80, 0x20,
        // 4: max_results = 8 (int32)
        0x20, 0x08,
        // 5: secrets entry { "k": "v" }
        0x2a, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v',
    ];
    let req: csi::GetMetadataDeltaRequest = decode_exact(req);
    assert_eq!(req.base_snapshot_id, "a");
    assert_eq!(req.target_snapshot_id, "b");
    assert_eq!(req.starting_offset, 4096);
    assert_eq!(req.max_results, 8);
    assert_eq!(req.secrets, map1("k", "v"));

    #[rustfmt::skip]
    let resp: &[u8] = &[
        // 1: block_metadata_type = VARIABLE_LENGTH (2)
        0x08, 0x02,
        // 2: volume_capacity_bytes = 1 MiB (varint 0x80 0x80 0x40)
        0x10, 0x80, 0x80, 0x40,
        // 3: block_metadata[0] { 1: byte_offset = 0 omitted, 2: size_bytes = 512 }
        0x1a, 0x03, 0x10, 0x80, 0x04,
    ];
    let resp: csi::GetMetadataDeltaResponse = decode_exact(resp);
    assert_eq!(
        resp.block_metadata_type(),
        csi::BlockMetadataType::VariableLength
    );
    assert_eq!(resp.volume_capacity_bytes, 1 << 20);
    assert_eq!(
        resp.block_metadata,
        vec![csi::BlockMetadata {
            byte_offset: 0,
            size_bytes: 512
        }]
    );
}

#[test]
fn volumegroup_create_volume_group_request() {
    #[rustfmt::skip]
    let bytes: &[u8] = &[
        // 1: name = "grp"
        0x0a, 0x03, b'g', b'r', b'p',
        // 2: parameters entry { "tier": "ssd" }
        0x12, 0x0b,
            0x0a, 0x04, b't', b'i', b'e', b'r',
            0x12, 0x03, b's', b's', b'd',
        // 3: secrets entry { "t": "x" }
        0x1a, 0x06, 0x0a, 0x01, b't', 0x12, 0x01, b'x',
    ];

    let req: vg::CreateVolumeGroupRequest = decode_exact(bytes);
    assert_eq!(req.name, "grp");
    assert_eq!(req.parameters, map1("tier", "ssd"));
    assert_eq!(req.secrets, map1("t", "x"));
}

#[test]
fn volumegroup_response_with_member_volume() {
    #[rustfmt::skip]
    let bytes: &[u8] = &[
        // 1: volume_group (VolumeGroup), 27 bytes
        0x0a, 0x1b,
            // 1: volume_group_id = "g"
            0x0a, 0x01, b'g',
            // 2: volume_group_context entry { "a": "b" }
            0x12, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, b'b',
            // 3: volumes[0] (VgVolume), 14 bytes
            0x1a, 0x0e,
                // 1: capacity_bytes = 10
                0x08, 0x0a,
                // 2: volume_id = "v"
                0x12, 0x01, b'v',
                // 4: content_source { 2: volume { 1: volume_id = "w" } }
                0x22, 0x05, 0x12, 0x03, 0x0a, 0x01, b'w',
                // 5: accessible_topology[0] {} (empty Topology)
                0x2a, 0x00,
    ];

    let resp: vg::ModifyVolumeGroupMembershipResponse = decode_exact(bytes);
    let group = resp.volume_group.expect("volume_group");
    assert_eq!(group.volume_group_id, "g");
    assert_eq!(group.volume_group_context, map1("a", "b"));
    assert_eq!(group.volumes.len(), 1);
    let vol = &group.volumes[0];
    assert_eq!(vol.capacity_bytes, 10);
    assert_eq!(vol.volume_id, "v");
    assert_eq!(
        vol.content_source.as_ref().and_then(|s| s.r#type.clone()),
        Some(vg::vg_volume_content_source::Type::Volume(
            vg::vg_volume_content_source::VolumeSource {
                volume_id: "w".into()
            }
        ))
    );
    assert_eq!(vol.accessible_topology, vec![vg::VgTopology::default()]);
}

#[test]
fn volumegroup_list_request_and_membership() {
    #[rustfmt::skip]
    let list: &[u8] = &[
        // 1: max_entries = 50 (int32)
        0x08, 0x32,
        // 2: starting_token = "t"
        0x12, 0x01, b't',
        // 3: secrets entry { "s": "x" }
        0x1a, 0x06, 0x0a, 0x01, b's', 0x12, 0x01, b'x',
    ];
    let list: vg::ListVolumeGroupsRequest = decode_exact(list);
    assert_eq!(list.max_entries, 50);
    assert_eq!(list.starting_token, "t");
    assert_eq!(list.secrets, map1("s", "x"));

    #[rustfmt::skip]
    let modify: &[u8] = &[
        // 1: volume_group_id = "g"
        0x0a, 0x01, b'g',
        // 2: volume_ids[0] = "a", volume_ids[1] = "b"
        0x12, 0x01, b'a', 0x12, 0x01, b'b',
        // 3: secrets entry { "s": "x" }
        0x1a, 0x06, 0x0a, 0x01, b's', 0x12, 0x01, b'x',
    ];
    let modify: vg::ModifyVolumeGroupMembershipRequest = decode_exact(modify);
    assert_eq!(modify.volume_group_id, "g");
    assert_eq!(modify.volume_ids, vec!["a".to_owned(), "b".to_owned()]);
    assert_eq!(modify.secrets, map1("s", "x"));
}

#[test]
fn built_messages_encode_to_the_pinned_bytes() {
    // The other direction: a message built in Rust encodes to bytes written
    // by hand (DeleteVolumeRequest: 1 volume_id, 2 secrets).
    let req = csi::DeleteVolumeRequest {
        volume_id: "x".into(),
        secrets: map1("a", "b"),
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0x0a, 0x01, b'x',                                 // 1: volume_id
        0x12, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, b'b',   // 2: secrets entry
    ];
    assert_eq!(req.encode_to_vec(), expected);

    // ControllerExpandVolumeResponse: 1 capacity_bytes, 2 node_expansion_required.
    let resp = csi::ControllerExpandVolumeResponse {
        capacity_bytes: 1,
        node_expansion_required: true,
    };
    assert_eq!(resp.encode_to_vec(), [0x08, 0x01, 0x10, 0x01]);
}
