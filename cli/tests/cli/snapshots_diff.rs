//! `edgevol snapshots diff` against an in-process dev appliance, run as the real binary: the
//! changed and allocated ranges as lines of bytes, the summary, resuming, and the roles.

use crate::common;

use common::{create_ok, dev_config, dev_tls, edgevol_as, ok, snapshot_of, snapshot_ok};
use edgevol_appliance::start;
use edgevol_cli::status;
use edgevol_core::WriteSegment;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
use edgevol_proto::csi::v1::*;

const MIB: u64 = 1 << 20;

/// Maps `clusters` of the volume as a write would (the listing reads maps, not data).
fn write_clusters(state: &edgevol_appliance::state::State, volume: &str, clusters: &[u64]) {
    let id = edgevol_appliance::csi::ids::Ids::new(&state.appliance_id)
        .parse_volume(volume)
        .unwrap();
    let mut pool = state.lock_pool().unwrap();
    for &c in clusters {
        let mut seg = [WriteSegment::EMPTY; 1];
        pool.map_write(id, c * MIB, MIB, &mut seg).unwrap();
    }
    pool.flush().unwrap();
}

fn lines(out: &str) -> Vec<&str> {
    out.lines().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_prints_changed_and_allocated_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("appliance");
    let app = start(dev_config(
        &data,
        "127.0.0.1:0".parse().unwrap(),
        "diff-box",
    ))
    .await
    .unwrap();
    common::pool_ready(&app).await;
    let pki = data.join("pki");
    let channel = status::connect(
        &app.local_addr.to_string(),
        Some("localhost"),
        dev_tls(&pki, "controller"),
    )
    .await
    .unwrap();
    let mut c = ControllerClient::new(channel);
    let volume = create_ok(
        &mut c,
        CreateVolumeRequest {
            name: "v".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 16 * MIB as i64,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(AccessType::Block(BlockVolume {})),
            }],
            ..Default::default()
        },
    )
    .await
    .volume_id;
    write_clusters(&app.state, &volume, &[0, 1, 4]);
    let s1 = snapshot_ok(&mut c, snapshot_of(&volume, "s1"))
        .await
        .snapshot_id;
    write_clusters(&app.state, &volume, &[1, 2, 9]);
    let s2 = snapshot_ok(&mut c, snapshot_of(&volume, "s2"))
        .await
        .snapshot_id;

    let out = ok(&edgevol_as(
        app.local_addr,
        &pki,
        "controller",
        "snapshots",
        &["diff", "--base", &s1, "--target", &s2],
    )
    .await);
    assert_eq!(
        lines(&out),
        [
            "OFFSET LENGTH END",
            "1048576 2097152 3145728",
            "9437184 1048576 10485760",
            "2 range(s), 3.0 MiB changed of 16.0 MiB (18.8%)",
        ],
        "{out}"
    );

    let out = ok(&edgevol_as(
        app.local_addr,
        &pki,
        "admin",
        "snapshots",
        &["diff", "--allocated", &s2, "--starting-offset", "1572864"],
    )
    .await);
    assert_eq!(
        lines(&out),
        [
            "OFFSET LENGTH END",
            "1572864 1572864 3145728",
            "4194304 1048576 5242880",
            "9437184 1048576 10485760",
            "3 range(s), 3.5 MiB allocated of 16.0 MiB (21.9%)",
        ],
        "{out}"
    );

    // An observer may list snapshots but not their changed blocks.
    let out = edgevol_as(
        app.local_addr,
        &pki,
        "observer",
        "snapshots",
        &["diff", "--base", &s1, "--target", &s2],
    )
    .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("PermissionDenied"), "{stderr}");
    // Snapshots of the wrong order: the appliance's reason, not a listing.
    let out = edgevol_as(
        app.local_addr,
        &pki,
        "controller",
        "snapshots",
        &["diff", "--base", &s2, "--target", &s1],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("FailedPrecondition"), "{stderr}");
    app.stop().await.unwrap();
}
