//! `edgevol status`, `volumes` and `snapshots` against an in-process dev appliance, run as the
//! real binary with an observer certificate: the printed tables show what was created, and the
//! host connected over NVMe/TCP (the test initiator of `edgevol-nvmeof`).

use crate::nvme_host;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use edgevol_appliance::config::MetricsConfig;
use edgevol_appliance::csi::ids::Ids;
use edgevol_appliance::naming;
use edgevol_appliance::{start, Args, Config, Running};
use edgevol_cli::status;
use edgevol_pki::tls::{client_config, TlsFiles};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
use edgevol_proto::csi::v1::*;

const NODE: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-2222-3333-4444-555555555555";

async fn appliance(dir: &Path) -> Running {
    let mut config = Config::from_args(Args {
        dev: true,
        data_dir: Some(dir.to_path_buf()),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        nvme_listen: Some("127.0.0.1:0".parse().unwrap()),
        appliance_id: Some("cli-box".into()),
        // The test's NVMe host holds no DH-HMAC-CHAP keys.
        nvme_allow_unauthenticated_hosts: Some(true),
        ..Args::default()
    })
    .unwrap();
    config.metrics = MetricsConfig {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        best_effort: false,
    };
    let running = start(config).await.unwrap();
    // The pool opens in the background; the error names whose pool did not.
    if let Err(e) = running.state.wait_ready(Duration::from_secs(60)).await {
        panic!("{e}");
    }
    running
}

fn cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

/// Runs the `edgevol` binary; returns stdout, or panics with stderr.
async fn edgevol(args: Vec<String>) -> String {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_edgevol"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "edgevol {args:?} failed: {stderr}");
        String::from_utf8(out.stdout).unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_show_what_was_created() {
    let dir = tempfile::tempdir().unwrap();
    let app = appliance(dir.path()).await;
    let pki = dir.path().join("pki");
    let admin_tls = client_config(TlsFiles {
        ca: &pki.join("ca.pem"),
        cert: &pki.join("admin.pem"),
        key: &pki.join("admin.key"),
    })
    .unwrap();
    let addr = app.local_addr.to_string();
    let channel = status::connect(&addr, Some("localhost"), admin_tls)
        .await
        .unwrap();
    let mut c = ControllerClient::new(channel);
    let mut volumes = Vec::new();
    // "db" as Kubernetes' external-provisioner creates it (--extra-create-metadata).
    let k8s: std::collections::HashMap<String, String> = [
        ("csi.storage.k8s.io/pvc/name", "db-data"),
        ("csi.storage.k8s.io/pvc/namespace", "shop"),
        ("csi.storage.k8s.io/pv/name", "pvc-5b1e"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (name, size, parameters) in [
        ("logs", 64i64 << 20, Default::default()),
        ("db", 1 << 30, k8s),
    ] {
        let v = c
            .create_volume(CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: size,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap()],
                parameters,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        volumes.push(v.volume_id);
    }
    c.controller_publish_volume(ControllerPublishVolumeRequest {
        volume_id: volumes[1].clone(),
        node_id: NODE.into(),
        volume_capability: Some(cap()),
        ..Default::default()
    })
    .await
    .unwrap();
    let snapshot = c
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: volumes[1].clone(),
            name: "nightly".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
        .snapshot_id;

    let conn = |cmd: &str, metrics: bool| {
        let mut args: Vec<String> = vec![
            cmd.into(),
            "--appliance".into(),
            addr.clone(),
            "--server-name".into(),
            "localhost".into(),
            "--ca".into(),
            pki.join("ca.pem").display().to_string(),
            "--cert".into(),
            pki.join("observer.pem").display().to_string(),
            "--key".into(),
            pki.join("observer.key").display().to_string(),
        ];
        if metrics {
            args.push("--metrics".into());
            args.push(app.metrics_addr.unwrap().to_string());
        }
        args
    };

    let out = edgevol(conn("volumes", false)).await;
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("VOLUME"), "{out}");
    let row = |id: &str| {
        *lines
            .iter()
            .find(|l| l.split_whitespace().next() == Some(id))
            .unwrap_or_else(|| panic!("no row for {id} in\n{out}"))
    };
    // Without the exporter the hosts are not known: no CONNECTED column, and how to get it.
    assert!(!lines[0].contains("CONNECTED"), "{out}");
    assert!(!out.contains('?'), "{out}");
    assert!(
        out.contains("connected hosts: pass --metrics HOST:PORT"),
        "{out}"
    );
    assert!(row(&volumes[0]).contains("64.0 MiB"), "{out}");
    assert!(row(&volumes[1]).contains("1.0 GiB"), "{out}");
    assert!(row(&volumes[1]).contains(NODE), "{out}");
    assert!(row(&volumes[1]).contains(" shop/db-data "), "{out}");
    assert!(row(&volumes[1]).contains(" pvc-5b1e "), "{out}");
    assert!(
        lines[0].contains("CLAIM") && lines[0].contains("PV "),
        "{out}"
    );
    assert!(row(&volumes[1]).trim_end().ends_with("ok"), "{out}");
    assert!(out.contains("2 volume(s)"), "{out}");

    let out = edgevol(conn("snapshots", false)).await;
    let line = out
        .lines()
        .find(|l| l.starts_with(&snapshot))
        .unwrap_or_else(|| panic!("no row for {snapshot} in\n{out}"));
    assert!(line.contains(&volumes[1]), "{out}");
    assert!(line.contains("yes"), "{out}");
    assert!(out.contains("1 snapshot(s)"), "{out}");

    let out = edgevol(conn("status", true)).await;
    assert!(out.contains("id          cli-box"), "{out}");
    assert!(out.contains("ready       yes"), "{out}");
    assert!(out.contains("pool      healthy"), "{out}");
    assert!(out.contains("file device: no SMART log"), "{out}");
    assert!(
        out.contains("volumes     2 (1 published, 0 abnormal)"),
        "{out}"
    );
    assert!(out.contains("snapshots   1"), "{out}");
    let metrics = status::fetch_metrics(&app.metrics_addr.unwrap().to_string())
        .await
        .unwrap();
    let total = metrics.get("edgevol_pool_total_bytes", &[]).unwrap();
    assert!(total > 15.0 * f64::from(1u32 << 30), "{total}");
    let total = status::gauge_bytes(total);
    assert!(out.contains(&format!("total      {total}")), "{out}");
    let section = out.split("connected hosts").nth(1).unwrap();
    assert!(section.contains("none"), "{out}");

    // A host connects to "db" over NVMe/TCP: CONNECTED names it there, and only there.
    let id = Ids::new("cli-box").parse_volume(&volumes[1]).unwrap();
    let subnqn = naming::subsystem_nqn("cli-box", id);
    let _host = nvme_host::Admin::connect(app.target.endpoint, &subnqn, NODE, 0)
        .await
        .unwrap_or_else(|c| panic!("NVMe connect refused: {:?}", c.cqe.status()));
    let out = edgevol(conn("volumes", true)).await;
    let lines: Vec<&str> = out.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "VOLUME",
            "SIZE",
            "SOURCE",
            "PUBLISHED",
            "TO",
            "CONNECTED",
            "CLAIM",
            "PV",
            "CONDITION"
        ],
        "{out}"
    );
    let cells = |id: &str| -> Vec<&str> {
        lines
            .iter()
            .find(|l| l.split_whitespace().next() == Some(id))
            .unwrap_or_else(|| panic!("no row for {id} in\n{out}"))
            .split_whitespace()
            .collect()
    };
    // VOLUME, SIZE (two words), SOURCE, PUBLISHED TO, CONNECTED, ...
    assert_eq!(cells(&volumes[1])[4..6], [NODE, NODE], "{out}");
    assert_eq!(cells(&volumes[0])[4..6], ["-", "-"], "{out}");
    let out = edgevol(conn("status", true)).await;
    let section = out.split("connected hosts").nth(1).unwrap();
    assert!(
        section
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == [volumes[1].as_str(), NODE]),
        "{out}"
    );
    // Without --metrics, what only the exporter knows is reported unknown, not made up.
    let out = edgevol(conn("status", false)).await;
    assert!(out.contains("unknown (pass --metrics HOST:PORT)"), "{out}");
    assert!(!out.contains("no SMART log"), "{out}");
    app.stop().await.unwrap();
}
