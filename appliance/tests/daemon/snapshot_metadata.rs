//! CSI SnapshotMetadata over mTLS, as a backup tool uses it: data written through the NVMe/TCP
//! target, snapshots, GetMetadataAllocated and GetMetadataDelta; the base plus the delta read
//! from the target snapshot rebuild it byte for byte. Also the spec's error rows and who may call.

// Host-only test code on 64-bit machines: byte counts of test volumes fit in usize.
#![allow(clippy::cast_possible_truncation)]

use crate::common;
use crate::nvme_host;

use std::net::SocketAddr;

use common::DevAppliance;
use edgevol_nvmeof::pdu::Digests;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::snapshot_metadata_client::SnapshotMetadataClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
use edgevol_proto::csi::v1::volume_content_source::{SnapshotSource, Type as SourceType};
use edgevol_proto::csi::v1::*;
use nvme_host::{io, ok, Admin, Queue};
use tonic::transport::Channel;
use tonic::Code;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:c5c5c5c5-0000-4000-8000-0000000000c3";
const MIB: u64 = 1 << 20;
/// The dev appliance's cluster.
const CLUSTER: u64 = MIB;
/// Bytes per NVMe command here (well under the target's transfer limit).
const CHUNK: u64 = 128 << 10;

fn block() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

async fn volume(
    c: &mut ControllerClient<Channel>,
    name: &str,
    size: u64,
    from: Option<&str>,
) -> String {
    c.create_volume(CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: size as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![block()],
        volume_content_source: from.map(|s| VolumeContentSource {
            r#type: Some(SourceType::Snapshot(SnapshotSource {
                snapshot_id: s.into(),
            })),
        }),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .volume
    .unwrap()
    .volume_id
}

async fn snapshot(c: &mut ControllerClient<Channel>, volume: &str, name: &str) -> String {
    c.create_snapshot(CreateSnapshotRequest {
        source_volume_id: volume.into(),
        name: name.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .snapshot
    .unwrap()
    .snapshot_id
}

/// Publishes `volume` to the test host and opens an I/O queue on it.
async fn attach(c: &mut ControllerClient<Channel>, volume: &str) -> (Admin, Queue) {
    let ctx = c
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: volume.into(),
            node_id: HOST.into(),
            volume_capability: Some(block()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let addr: SocketAddr = format!("{}:{}", ctx["targetAddress"], ctx["targetPort"])
        .parse()
        .unwrap();
    let nqn = ctx["subsystemNqn"].clone();
    let admin = Admin::connect(addr, &nqn, HOST, 0).await.unwrap();
    let q = admin
        .io_queue(addr, 1, &nqn, HOST, Digests::NONE)
        .await
        .unwrap();
    (admin, q)
}

fn lba(offset: u64) -> u64 {
    offset / io::BLOCK
}

async fn write(q: &mut Queue, offset: u64, data: &[u8]) {
    for (i, chunk) in data.chunks(CHUNK as usize).enumerate() {
        let (sqe, payload) = io::write(lba(offset + i as u64 * CHUNK), chunk, false);
        ok(&q.cmd(sqe, payload).await);
    }
}

async fn read(q: &mut Queue, offset: u64, len: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len as usize);
    let mut at = offset;
    while at < offset + len {
        let n = CHUNK.min(offset + len - at);
        let (sqe, none) = io::read(lba(at), u32::try_from(n / io::BLOCK).unwrap());
        let got = q.cmd(sqe, none).await;
        ok(&got);
        out.extend_from_slice(&got.data);
        at += n;
    }
    out
}

/// Distinct bytes for each write: a rewrite is never the same content by accident.
fn pattern(seed: u8, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

fn ranges(blocks: &[BlockMetadata]) -> Vec<(u64, u64)> {
    blocks
        .iter()
        .map(|b| (b.byte_offset as u64, b.size_bytes as u64))
        .collect()
}

async fn allocated(
    m: &mut SnapshotMetadataClient<Channel>,
    snapshot: &str,
    from: u64,
    max: i32,
) -> Vec<GetMetadataAllocatedResponse> {
    let mut stream = m
        .get_metadata_allocated(GetMetadataAllocatedRequest {
            snapshot_id: snapshot.into(),
            starting_offset: from as i64,
            max_results: max,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(msg) = stream.message().await.unwrap() {
        out.push(msg);
    }
    out
}

async fn delta(
    m: &mut SnapshotMetadataClient<Channel>,
    base: &str,
    target: &str,
    from: u64,
    max: i32,
) -> Result<Vec<GetMetadataDeltaResponse>, tonic::Status> {
    let mut stream = m
        .get_metadata_delta(GetMetadataDeltaRequest {
            base_snapshot_id: base.into(),
            target_snapshot_id: target.into(),
            starting_offset: from as i64,
            max_results: max,
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(msg) = stream.message().await? {
        out.push(msg);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_tool_rebuilds_the_target_from_the_base_and_the_delta() {
    let app = DevAppliance::start().await;
    app.ready().await;
    let mut c = ControllerClient::new(app.channel("controller").await);
    let mut m = SnapshotMetadataClient::new(app.channel("controller").await);

    // A fresh thin volume with three written ranges.
    let v = volume(&mut c, "data", 16 * MIB, None).await;
    let (_admin, mut q) = attach(&mut c, &v).await;
    write(&mut q, 0, &pattern(1, 2 * MIB)).await;
    write(&mut q, 5 * MIB, &pattern(2, MIB)).await;
    write(&mut q, 9 * MIB, &pattern(3, 2 * MIB)).await;
    let s1 = snapshot(&mut c, &v, "s1").await;
    let got = allocated(&mut m, &s1, 0, 0).await;
    assert_eq!(got.len(), 1, "three ranges fit one message");
    assert_eq!(
        got[0].block_metadata_type(),
        BlockMetadataType::VariableLength
    );
    assert_eq!(got[0].volume_capacity_bytes, 16 * MIB as i64);
    assert_eq!(
        ranges(&got[0].block_metadata),
        [(0, 2 * MIB), (5 * MIB, MIB), (9 * MIB, 2 * MIB)],
        "exactly the written ranges"
    );
    // Resumed inside the first range: cut to the offset; one range per message.
    let resumed = allocated(&mut m, &s1, MIB + 4096, 1).await;
    let resumed: Vec<(u64, u64)> = resumed
        .iter()
        .flat_map(|r| ranges(&r.block_metadata))
        .collect();
    assert_eq!(
        resumed,
        [(MIB + 4096, MIB - 4096), (5 * MIB, MIB), (9 * MIB, 2 * MIB)]
    );

    // Overwrite part of a cluster, deallocate one, zero one, grow the volume and write past the
    // old end; rewrite another cluster with identical bytes.
    write(&mut q, MIB + 8192, &pattern(4, 8192)).await;
    let (sqe, payload) =
        io::deallocate(&[(lba(9 * MIB), u32::try_from(CLUSTER / io::BLOCK).unwrap())]);
    ok(&q.cmd(sqe, payload).await);
    let (sqe, payload) =
        io::write_zeroes(lba(10 * MIB), u32::try_from(CLUSTER / io::BLOCK).unwrap());
    ok(&q.cmd(sqe, payload).await);
    write(&mut q, 5 * MIB, &pattern(2, MIB)).await;
    c.controller_expand_volume(ControllerExpandVolumeRequest {
        volume_id: v.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: 20 * MIB as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(block()),
        ..Default::default()
    })
    .await
    .unwrap();
    write(&mut q, 17 * MIB, &pattern(5, 4096)).await;
    let s2 = snapshot(&mut c, &v, "s2").await;

    let changes = delta(&mut m, &s1, &s2, 0, 0).await.unwrap();
    assert_eq!(
        changes[0].volume_capacity_bytes,
        20 * MIB as i64,
        "the target's size"
    );
    let changed: Vec<(u64, u64)> = changes
        .iter()
        .flat_map(|r| ranges(&r.block_metadata))
        .collect();
    // Cluster 1 (overwritten), 5 (same bytes rewritten: we do not read data), 9 (deallocated),
    // 10 (zeroed), 17 (past the old end): exactly those clusters, not the volume.
    assert_eq!(
        changed,
        [
            (MIB, MIB),
            (5 * MIB, MIB),
            (9 * MIB, 2 * MIB),
            (17 * MIB, MIB)
        ]
    );

    // The backup: S1 read whole, then only the delta's ranges read from S2.
    let b1 = volume(&mut c, "restore-s1", 16 * MIB, Some(&s1)).await;
    let b2 = volume(&mut c, "restore-s2", 20 * MIB, Some(&s2)).await;
    let (_a1, mut q1) = attach(&mut c, &b1).await;
    let (_a2, mut q2) = attach(&mut c, &b2).await;
    let mut image = read(&mut q1, 0, 16 * MIB).await;
    image.resize((20 * MIB) as usize, 0);
    for (offset, len) in &changed {
        let bytes = read(&mut q2, *offset, *len).await;
        image[*offset as usize..(offset + len) as usize].copy_from_slice(&bytes);
    }
    let whole = read(&mut q2, 0, 20 * MIB).await;
    // The restored target holds what was written (not, say, zeros on both sides).
    let p1 = pattern(1, 2 * MIB);
    assert!(whole[..MIB as usize + 8192] == p1[..MIB as usize + 8192]);
    assert!(whole[(MIB + 8192) as usize..(MIB + 16384) as usize] == pattern(4, 8192)[..]);
    assert!(whole[(17 * MIB) as usize..(17 * MIB + 4096) as usize] == pattern(5, 4096)[..]);
    assert!(whole[(9 * MIB) as usize..(11 * MIB) as usize]
        .iter()
        .all(|&b| b == 0));
    assert!(image == whole, "base plus delta differs from the target");
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn the_spec_error_rows_and_who_may_call() {
    let app = DevAppliance::start().await;
    app.ready().await;
    let mut c = ControllerClient::new(app.channel("controller").await);
    let mut m = SnapshotMetadataClient::new(app.channel("controller").await);
    let a = volume(&mut c, "a", 4 * MIB, None).await;
    let b = volume(&mut c, "b", 4 * MIB, None).await;
    let a1 = snapshot(&mut c, &a, "a1").await;
    let a2 = snapshot(&mut c, &a, "a2").await;
    let b1 = snapshot(&mut c, &b, "b1").await;
    let code = |r: Result<Vec<GetMetadataDeltaResponse>, tonic::Status>| r.unwrap_err().code();

    assert_eq!(
        code(delta(&mut m, &a1, "test-box-s999", 0, 0).await),
        Code::NotFound
    );
    assert_eq!(
        code(delta(&mut m, "other-box-s1", &a2, 0, 0).await),
        Code::NotFound
    );
    assert_eq!(
        code(delta(&mut m, "", &a2, 0, 0).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(delta(&mut m, &a1, &b1, 0, 0).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(delta(&mut m, &a2, &a1, 0, 0).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(delta(&mut m, &a1, &a2, 4 * MIB + 1, 0).await),
        Code::OutOfRange
    );
    assert_eq!(
        code(delta(&mut m, &a1, &a2, u64::MAX, 0).await),
        Code::OutOfRange,
        "negative"
    );
    assert_eq!(
        code(delta(&mut m, &a1, &a2, 0, -1).await),
        Code::InvalidArgument
    );
    // Nothing changed, and an offset at the very end: empty streams.
    assert!(delta(&mut m, &a1, &a2, 0, 0).await.unwrap().is_empty());
    assert!(delta(&mut m, &a1, &a2, 4 * MIB, 0)
        .await
        .unwrap()
        .is_empty());
    let status = m
        .get_metadata_allocated(GetMetadataAllocatedRequest {
            snapshot_id: "test-box-s999".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    // The observer role may not read changed-block metadata; the controller may (above).
    let mut o = SnapshotMetadataClient::new(app.channel("observer").await);
    let status = o
        .get_metadata_delta(GetMetadataDeltaRequest {
            base_snapshot_id: a1.clone(),
            target_snapshot_id: a2.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    app.running.stop().await.unwrap();
}
