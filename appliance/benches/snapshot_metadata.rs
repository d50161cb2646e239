//! GetMetadataDelta on thin volumes with 1 % of their clusters changed between two snapshots:
//! time to stream the whole answer, and the memory it took. Prints a markdown table.
//!
//! `cargo bench -p edgevol-appliance --bench snapshot_metadata` measures 1 GiB and 1 TiB volumes
//! (`-- --quick`: 1 GiB and 16 GiB, a smoke run). Each volume lives on its own sparse pool file
//! with the appliance's 1 MiB clusters: 2 % of its clusters (every 50th) are written before
//! snapshot S1, then 1 % (every 100th, so copy-on-write of S1's clusters) before S2. Writes only
//! map clusters (the answer comes from the maps; no data is read), so setting up a 1 TiB volume
//! writes no data. The service is called in-process, without TLS: what is measured is the walk,
//! the coalescing and the stream, consumed as fast as it comes.
//!
//! Memory is the process's peak resident set during the call minus its resident set before it
//! (Linux: `/proc/self/clear_refs` resets the peak), so it counts the walk's batches, the
//! messages in flight and the allocator's slack; it is "n/a" where the peak cannot be reset.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgevol_appliance::csi::snapshot_metadata::SnapshotMetadataService;
use edgevol_appliance::pool::{format_device, open_device, CLUSTER_SIZE};
use edgevol_appliance::state::State;
use edgevol_core::{VolumeSpec, WriteSegment};
use edgevol_proto::csi::v1::snapshot_metadata_server::SnapshotMetadata;
use edgevol_proto::csi::v1::GetMetadataDeltaRequest;
use tokio_stream::StreamExt;
use tonic::Request;

const GIB: u64 = 1 << 30;

/// One measured volume.
struct Row {
    size: u64,
    changed_ranges: usize,
    messages: usize,
    elapsed: Duration,
    peak_extra_kib: Option<u64>,
    peak_buffered: usize,
}

fn status_kib(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Resets the peak resident set (VmHWM) to the current one.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Maps every `step`-th cluster of the volume, as writes would.
fn map_every(
    pool: &mut edgevol_core::Pool<edgevol_appliance::pool::PoolDevice>,
    v: edgevol_core::VolumeId,
    clusters: u64,
    step: u64,
) {
    let cs = u64::from(CLUSTER_SIZE);
    for c in (0..clusters).step_by(usize::try_from(step).unwrap()) {
        let mut seg = [WriteSegment::EMPTY; 1];
        pool.map_write(v, c * cs, cs, &mut seg).unwrap();
    }
    pool.flush().unwrap();
}

async fn measure(size: u64) -> Row {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool.img");
    let cs = u64::from(CLUSTER_SIZE);
    let clusters = size / cs;
    // 2 % written, 1 % copied on write, and room for the metadata.
    std::fs::File::create(&path)
        .unwrap()
        .set_len(size / 25 + GIB)
        .unwrap();
    let mut pool = format_device(
        open_device(&path).unwrap(),
        &path,
        CLUSTER_SIZE,
        &mut |_| {},
    )
    .unwrap();
    // A thin volume (VolumeSpec's default).
    let v = pool.create_volume(VolumeSpec::new("bench", size)).unwrap();
    map_every(&mut pool, v, clusters, 50);
    let base = pool.create_snapshot(v, "s1", 1).unwrap();
    map_every(&mut pool, v, clusters, 100);
    let target = pool.create_snapshot(v, "s2", 2).unwrap();
    let state = Arc::new(State::new("bench".into(), BTreeMap::new()));
    state.set_pool(pool);
    let service = SnapshotMetadataService::new(state);

    let before = status_kib("VmRSS:");
    let peak_known = reset_peak();
    let started = Instant::now();
    let mut stream = service
        .get_metadata_delta(Request::new(GetMetadataDeltaRequest {
            base_snapshot_id: format!("bench-s{}", base.0),
            target_snapshot_id: format!("bench-s{}", target.0),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let (mut changed_ranges, mut messages) = (0, 0);
    while let Some(msg) = stream.next().await {
        changed_ranges += msg.unwrap().block_metadata.len();
        messages += 1;
    }
    let elapsed = started.elapsed();
    let peak_extra_kib = match (peak_known, before, status_kib("VmHWM:")) {
        (true, Some(before), Some(peak)) => Some(peak.saturating_sub(before)),
        _ => None,
    };
    assert_eq!(
        changed_ranges as u64,
        clusters.div_ceil(100),
        "every 100th cluster changed"
    );
    Row {
        size,
        changed_ranges,
        messages,
        elapsed,
        peak_extra_kib,
        peak_buffered: service.peak_buffered(),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let sizes: &[u64] = if quick {
        &[GIB, 16 * GIB]
    } else {
        &[GIB, 1024 * GIB]
    };
    println!(
        "GetMetadataDelta, 1 MiB clusters, 1 % of the volume changed ({})\n",
        if quick { "quick" } else { "full" }
    );
    println!("| volume | changed ranges | messages | time | peak extra memory | peak buffered messages |");
    println!("|---|---|---|---|---|---|");
    for &size in sizes {
        let row = measure(size).await;
        println!(
            "| {} GiB | {} | {} | {:.2} ms | {} | {} |",
            row.size / GIB,
            row.changed_ranges,
            row.messages,
            row.elapsed.as_secs_f64() * 1000.0,
            row.peak_extra_kib
                .map_or_else(|| "n/a".to_owned(), |k| format!("{k} KiB")),
            row.peak_buffered,
        );
    }
}
