//! Changed-block tracking through `edgevol proxy` serving several appliances, as Kubernetes'
//! external-snapshot-metadata sidecar calls it on the controller's socket: a plain snapshot's
//! streams come from its appliance untouched; a replicated snapshot's from one leg, its offsets
//! moved back past md's superblock and bitmap (the first MiB of every leg), from the other leg
//! when the first one's appliance is down.

use crate::common;
use crate::fleet;

use common::{create_ok, snapshot_of, snapshot_ok, unix_channel};
use edgevol_appliance::csi::ids::Ids;
use edgevol_proto::csi::v1::snapshot_metadata_client::SnapshotMetadataClient;
use edgevol_proto::csi::v1::*;
use fleet::{create, fleet_proxy, home, start_fleet, stop_all, Box_};
use tonic::transport::Channel;
use tonic::Code;

const MIB: i64 = 1 << 20;

/// Maps `clusters` (1 MiB each) of volume `volume` on its appliance, as writes would: the
/// answers come from the maps alone.
fn write_clusters(boxes: &[Box_], volume: &str, clusters: &[i64]) {
    let b = boxes.iter().find(|b| b.id == home(volume)).unwrap();
    let id = Ids::new(&b.id).parse_volume(volume).unwrap();
    let mut pool = b.running.as_ref().unwrap().state.lock_pool().unwrap();
    for &cluster in clusters {
        let mut seg = [edgevol_core::WriteSegment::EMPTY; 1];
        let at = u64::try_from(cluster * MIB).unwrap();
        pool.map_write(id, at, 1 << 20, &mut seg).unwrap();
    }
    pool.flush().unwrap();
}

/// (capacity of every message, the ranges, the number of messages) of an Allocated stream.
async fn allocated(
    m: &mut SnapshotMetadataClient<Channel>,
    snapshot: &str,
    starting_offset: i64,
) -> Result<(Vec<i64>, Vec<(i64, i64)>, usize), tonic::Status> {
    let mut s = m
        .get_metadata_allocated(GetMetadataAllocatedRequest {
            snapshot_id: snapshot.into(),
            starting_offset,
            max_results: 2,
            ..Default::default()
        })
        .await?
        .into_inner();
    let (mut caps, mut ranges, mut n) = (Vec::new(), Vec::new(), 0);
    while let Some(msg) = s.message().await? {
        caps.push(msg.volume_capacity_bytes);
        ranges.extend(
            msg.block_metadata
                .iter()
                .map(|b| (b.byte_offset, b.size_bytes)),
        );
        n += 1;
    }
    Ok((caps, ranges, n))
}

async fn delta(
    m: &mut SnapshotMetadataClient<Channel>,
    base: &str,
    target: &str,
) -> Result<(Vec<i64>, Vec<(i64, i64)>), tonic::Status> {
    let mut s = m
        .get_metadata_delta(GetMetadataDeltaRequest {
            base_snapshot_id: base.into(),
            target_snapshot_id: target.into(),
            max_results: 2,
            ..Default::default()
        })
        .await?
        .into_inner();
    let (mut caps, mut ranges) = (Vec::new(), Vec::new());
    while let Some(msg) = s.message().await? {
        caps.push(msg.volume_capacity_bytes);
        ranges.extend(
            msg.block_metadata
                .iter()
                .map(|b| (b.byte_offset, b.size_bytes)),
        );
    }
    Ok((caps, ranges))
}

#[tokio::test]
async fn snapshot_metadata_of_plain_and_replicated_snapshots_through_a_fleet_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let mut m = SnapshotMetadataClient::new(unix_channel(dir.path().join("csi.sock")).await);

    // A plain volume: both streams from its appliance, as it sends them.
    let plain = create_ok(&mut c, create("plain", 8 * MIB)).await.volume_id;
    let plain_base = snapshot_ok(&mut c, snapshot_of(&plain, "plain-base")).await;
    write_clusters(&boxes, &plain, &[1, 2, 5]);
    let plain_target = snapshot_ok(&mut c, snapshot_of(&plain, "plain-target")).await;
    let (caps, ranges, messages) = allocated(&mut m, &plain_target.snapshot_id, 0)
        .await
        .unwrap();
    assert_eq!(ranges, [(MIB, 2 * MIB), (5 * MIB, MIB)]);
    assert_eq!((caps[0], messages), (8 * MIB, 1));
    let (_, ranges) = delta(&mut m, &plain_base.snapshot_id, &plain_target.snapshot_id)
        .await
        .unwrap();
    assert_eq!(ranges, [(MIB, 2 * MIB), (5 * MIB, MIB)]);

    // A replicated volume: 16 MiB, each leg 17 MiB with md's superblock and bitmap in its first
    // MiB. The same writes on both legs, as md makes them: leg cluster 0 (md's own) and volume
    // cluster 2 before the base; md's bitmap again, volume clusters 0, 1 and 5 after it.
    let mut req = create("mirrored", 16 * MIB);
    req.parameters.insert("replicas".into(), "2".into());
    let volume = create_ok(&mut c, req).await.volume_id;
    let vol_legs: Vec<&str> = volume.split('+').collect();
    assert_eq!(vol_legs.len(), 2);
    for leg in &vol_legs {
        write_clusters(&boxes, leg, &[0, 3]);
    }
    let base = snapshot_ok(&mut c, snapshot_of(&volume, "mirrored-base")).await;
    for leg in &vol_legs {
        write_clusters(&boxes, leg, &[0, 1, 2, 6]);
    }
    let target = snapshot_ok(&mut c, snapshot_of(&volume, "mirrored-target")).await;
    assert!(target.snapshot_id.contains('+'), "{}", target.snapshot_id);

    let (caps, ranges, messages) = allocated(&mut m, &target.snapshot_id, 0).await.unwrap();
    assert_eq!(
        ranges,
        [(0, 3 * MIB), (5 * MIB, MIB)],
        "volume offsets, md's MiB left out"
    );
    assert!(
        caps.iter().all(|&cap| cap == 16 * MIB),
        "the volume's size: {caps:?}"
    );
    assert_eq!(messages, 1, "two ranges fit one message of max_results 2");
    let (_, ranges, _) = allocated(&mut m, &base.snapshot_id, 0).await.unwrap();
    assert_eq!(
        ranges,
        [(2 * MIB, MIB)],
        "only md's area and volume cluster 2 before the base"
    );
    // Resumed at a volume offset: the rest from there.
    let (_, ranges, _) = allocated(&mut m, &target.snapshot_id, MIB).await.unwrap();
    assert_eq!(ranges, [(MIB, 2 * MIB), (5 * MIB, MIB)]);
    let (caps, ranges) = delta(&mut m, &base.snapshot_id, &target.snapshot_id)
        .await
        .unwrap();
    assert_eq!(
        ranges,
        [(0, 2 * MIB), (5 * MIB, MIB)],
        "md's bitmap is no change of the volume"
    );
    assert_eq!(caps, [16 * MIB]);
    // The volume's end is an empty answer, past it the appliance's refusal; a negative offset
    // is refused as it is, not moved into md's area.
    let (_, ranges, _) = allocated(&mut m, &target.snapshot_id, 16 * MIB)
        .await
        .unwrap();
    assert!(ranges.is_empty());
    for bad in [17 * MIB, -1] {
        let status = allocated(&mut m, &target.snapshot_id, bad)
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::OutOfRange, "{bad}: {status:?}");
    }
    // A plain and a replicated snapshot are of different volumes.
    let status = delta(&mut m, &plain_base.snapshot_id, &target.snapshot_id)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // The first leg's appliance down: the other leg answers the same.
    let first = home(vol_legs[0]).to_owned();
    boxes
        .iter_mut()
        .find(|b| b.id == first)
        .unwrap()
        .stop()
        .await;
    let (_, ranges, _) = allocated(&mut m, &target.snapshot_id, 0).await.unwrap();
    assert_eq!(ranges, [(0, 3 * MIB), (5 * MIB, MIB)]);
    let (_, ranges) = delta(&mut m, &base.snapshot_id, &target.snapshot_id)
        .await
        .unwrap();
    assert_eq!(ranges, [(0, 2 * MIB), (5 * MIB, MIB)]);
    stop_all(&mut boxes).await;
}
