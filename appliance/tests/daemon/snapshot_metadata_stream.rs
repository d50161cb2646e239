//! SnapshotMetadata streams of 100,000 changed ranges: memory stays bounded (the walk runs at
//! most a few messages ahead of a slow reader, counted, not timed), and resuming from a
//! `starting_offset` mid-stream yields exactly the rest.

// Host-only test code on 64-bit machines: byte counts of test volumes fit in usize.
#![allow(clippy::cast_possible_truncation)]

use std::collections::BTreeMap;
use std::sync::Arc;

use edgevol_appliance::csi::metadata_stream::STREAM_DEPTH;
use edgevol_appliance::csi::snapshot_metadata::SnapshotMetadataService;
use edgevol_appliance::pool::{format_device, open_device};
use edgevol_appliance::state::State;
use edgevol_core::{VolumeSpec, WriteSegment};
use edgevol_proto::csi::v1::snapshot_metadata_server::SnapshotMetadata;
use edgevol_proto::csi::v1::{GetMetadataDeltaRequest, GetMetadataDeltaResponse};
use tokio_stream::StreamExt;
use tonic::Request;

const CLUSTER: u64 = 4096;
const CHANGED: u64 = 100_000;
const PER_MESSAGE: i32 = 1000;

/// A pool of 4 KiB clusters with one volume, snapshot "base" of it empty, and snapshot
/// "target" after every other cluster of its first 200,000 was written (mapped: the walk reads
/// maps, so no data needs to reach the device).
fn pool_with_changes(dir: &std::path::Path) -> (Arc<State>, String, String) {
    let path = dir.join("pool.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let mut pool = format_device(
        open_device(&path).unwrap(),
        &path,
        CLUSTER as u32,
        &mut |_| {},
    )
    .unwrap();
    let v = pool
        .create_volume(VolumeSpec::new("v", 2 * CHANGED * CLUSTER))
        .unwrap();
    let base = pool.create_snapshot(v, "base", 1).unwrap();
    for i in 0..CHANGED {
        let mut seg = [WriteSegment::EMPTY; 1];
        pool.map_write(v, 2 * i * CLUSTER, CLUSTER, &mut seg)
            .unwrap();
    }
    let target = pool.create_snapshot(v, "target", 2).unwrap();
    let state = Arc::new(State::new("box".into(), BTreeMap::new()));
    state.set_pool(pool);
    (
        state,
        format!("box-s{}", base.0),
        format!("box-s{}", target.0),
    )
}

fn request(base: &str, target: &str, from: u64) -> Request<GetMetadataDeltaRequest> {
    Request::new(GetMetadataDeltaRequest {
        base_snapshot_id: base.into(),
        target_snapshot_id: target.into(),
        starting_offset: i64::try_from(from).unwrap(),
        max_results: PER_MESSAGE,
        ..Default::default()
    })
}

fn ranges(msg: &GetMetadataDeltaResponse) -> impl Iterator<Item = (u64, u64)> + '_ {
    msg.block_metadata.iter().map(|b| {
        (
            u64::try_from(b.byte_offset).unwrap(),
            u64::try_from(b.size_bytes).unwrap(),
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_ranges_stream_in_bounded_memory_and_resume_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (state, base, target) = pool_with_changes(dir.path());
    let service = SnapshotMetadataService::new(state);

    let mut stream = service
        .get_metadata_delta(request(&base, &target, 0))
        .await
        .unwrap()
        .into_inner();
    let mut all: Vec<(u64, u64)> = Vec::new();
    let mut messages = 0;
    while let Some(msg) = stream.next().await {
        let msg = msg.unwrap();
        assert!(msg.block_metadata.len() <= PER_MESSAGE as usize);
        all.extend(ranges(&msg));
        messages += 1;
        // A slow reader: the walk gets every chance to run ahead.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(all.len() as u64, CHANGED);
    assert!(all
        .iter()
        .enumerate()
        .all(|(i, &r)| r == (2 * i as u64 * CLUSTER, CLUSTER)));
    assert_eq!(messages, CHANGED as usize / PER_MESSAGE as usize);
    // Collecting the ranges first would have buffered all 100 messages. The bound: the
    // channel's STREAM_DEPTH, the one the walk is sending, and the one the reader has taken off
    // the channel but not yet counted off (on another worker thread the walk may send the next
    // one in between: seen once on a busy machine with STREAM_DEPTH + 1 as the bound).
    assert!(
        service.peak_buffered() <= STREAM_DEPTH + 2,
        "{} messages were waiting for the reader",
        service.peak_buffered()
    );

    // Resume in the middle of range 61,234: that range cut to the offset, then the rest.
    let k = 61_234;
    let from = all[k].0 + 512;
    let mut resumed = service
        .get_metadata_delta(request(&base, &target, from))
        .await
        .unwrap()
        .into_inner();
    let mut rest: Vec<(u64, u64)> = Vec::new();
    while let Some(msg) = resumed.next().await {
        rest.extend(ranges(&msg.unwrap()));
    }
    let mut expected = vec![(from, CLUSTER - 512)];
    expected.extend_from_slice(&all[k + 1..]);
    assert_eq!(rest, expected);
}
