//! The Prometheus exporter of a real dev daemon: known CSI calls and known NVMe/TCP I/O (test
//! initiator over loopback), then a scrape over HTTP must show counters moved by exactly those
//! amounts, and never a secret.
#![allow(clippy::cast_possible_truncation)] // test sizes are small constants

use crate::common;
use crate::nvme_host;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::{dev_config, DevAppliance};
use edgevol_appliance::config::MetricsConfig;
use edgevol_appliance::csi::ids::Ids;
use edgevol_appliance::naming;
use edgevol_appliance::pool::CLUSTER_SIZE;
use edgevol_appliance::start;
use edgevol_nvmeof::pdu::Digests;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
use edgevol_proto::csi::v1::*;
use nvme_host::{io, ok, Admin, WAIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const SECRET: &str = "hunter2-metrics-must-never-show-this";

async fn dev_with_metrics() -> DevAppliance {
    let dir = tempfile::tempdir().unwrap();
    let mut config = dev_config(dir.path(), "127.0.0.1:0".parse().unwrap());
    config.metrics = MetricsConfig {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        best_effort: false,
    };
    let running = start(config).await.unwrap();
    let app = DevAppliance { dir, running };
    app.ready().await;
    app
}

/// A raw HTTP/1.1 exchange: status code and body.
async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    tcp.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    if code == 200 {
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
    }
    (code, body.to_owned())
}

/// Samples of a scrape: `name{labels}` as written (labels in exposition order) -> value.
struct Scrape {
    text: String,
}

impl Scrape {
    async fn take(addr: SocketAddr) -> Scrape {
        let (code, text) = http(addr, "GET", "/metrics").await;
        assert_eq!(code, 200, "{text}");
        assert!(!text.contains(SECRET), "a secret leaked into /metrics");
        Scrape { text }
    }

    /// The value of the sample whose name is `name` and whose labels include all of `labels`;
    /// 0 if there is none (a counter never incremented).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut found = None;
        for line in self.text.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (n, l) = series.split_once('{').unwrap_or((series, ""));
            if n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
            {
                assert!(found.is_none(), "{name} {labels:?} matches twice");
                found = Some(value.parse::<f64>().unwrap());
            }
        }
        found.unwrap_or(0.0)
    }
}

async fn run(
    q: &mut nvme_host::Queue,
    (sqe, data): (edgevol_nvmeof::sqe::Sqe, edgevol_nvmeof::initiator::Data),
) -> edgevol_nvmeof::initiator::Completed {
    q.cmd(sqe, data).await
}

fn block_cap(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

fn create(name: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 64 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![block_cap(Mode::SingleNodeWriter)],
        secrets: HashMap::from([("password".to_owned(), SECRET.to_owned())]),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_move_by_exactly_the_known_calls_and_io() {
    let app = dev_with_metrics().await;
    let metrics = app.running.metrics_addr.expect("exporter runs");
    let state = app.running.state.clone();
    let nvme = app.running.target.endpoint;

    // Only /metrics, only GET (and HEAD).
    assert_eq!(http(metrics, "GET", "/").await.0, 404);
    assert_eq!(http(metrics, "POST", "/metrics").await.0, 405);

    let before = Scrape::take(metrics).await;
    assert_eq!(before.get("edgevol_pool_ready", &[]), 1.0);
    assert_eq!(before.get("edgevol_pool_healthy", &[]), 1.0);
    let capacity = state.on_pool(|_, pool| pool.capacity()).await.unwrap();
    assert_eq!(
        before.get("edgevol_pool_total_bytes", &[]),
        capacity.total as f64
    );
    assert_eq!(before.get("edgevol_pool_used_bytes", &[]), 0.0);
    // A file pool has no SMART log, and says so.
    let device = app.dir.path().join("pool.img").display().to_string();
    assert_eq!(
        before.get(
            "edgevol_pool_device_info",
            &[("device", &device), ("kind", "file")]
        ),
        1.0
    );
    assert_eq!(
        before.get("edgevol_nvme_smart_available", &[("device", &device)]),
        0.0
    );
    assert!(!before.text.contains("edgevol_nvme_temperature_celsius "));

    // Known CSI calls: 2 OK creates (the second idempotent), 1 INVALID_ARGUMENT, 1 publish,
    // 1 PERMISSION_DENIED delete from an observer, 3 Probes.
    let mut admin = ControllerClient::new(app.channel("admin").await);
    let volume = admin
        .create_volume(create("m1"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    admin.create_volume(create("m1")).await.unwrap();
    let err = admin.create_volume(create("")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    admin
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: volume.clone(),
            node_id: HOST.into(),
            volume_capability: Some(block_cap(Mode::SingleNodeWriter)),
            secrets: HashMap::from([("token".to_owned(), SECRET.to_owned())]),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut observer = ControllerClient::new(app.channel("observer").await);
    let err = observer
        .delete_volume(DeleteVolumeRequest {
            volume_id: volume.clone(),
            secrets: HashMap::from([("token".to_owned(), SECRET.to_owned())]),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let mut identity = IdentityClient::new(app.channel("observer").await);
    for _ in 0..3 {
        identity.probe(ProbeRequest {}).await.unwrap();
    }

    // Known I/O: 3 writes (16 KiB), 2 reads (16 KiB), 1 flush.
    let id = Ids::new(&state.appliance_id).parse_volume(&volume).unwrap();
    let nqn = naming::subsystem_nqn("test-box", id);
    let ctrl = Admin::connect(nvme, &nqn, HOST, 0).await.unwrap();
    let mut q = ctrl
        .io_queue(nvme, 1, &nqn, HOST, Digests::NONE)
        .await
        .unwrap();
    let blocks_per_cluster = u64::from(CLUSTER_SIZE) / io::BLOCK;
    // Two writes in cluster 0, one in cluster 2: two clusters allocated.
    for (slba, len) in [(0, 4096), (1, 8192), (2 * blocks_per_cluster, 4096)] {
        ok(&run(&mut q, io::write(slba, &vec![0xa5; len], false)).await);
    }
    ok(&run(&mut q, io::read(0, 3)).await);
    ok(&run(&mut q, io::read(2 * blocks_per_cluster, 1)).await);
    ok(&run(&mut q, io::flush()).await);

    let after = Scrape::take(metrics).await;
    let csi = |method: &str, code: &str| {
        after.get(
            "edgevol_csi_calls_total",
            &[("method", method), ("code", code)],
        ) - before.get(
            "edgevol_csi_calls_total",
            &[("method", method), ("code", code)],
        )
    };
    assert_eq!(csi("CreateVolume", "OK"), 2.0);
    assert_eq!(csi("CreateVolume", "INVALID_ARGUMENT"), 1.0);
    assert_eq!(csi("ControllerPublishVolume", "OK"), 1.0);
    assert_eq!(csi("DeleteVolume", "PERMISSION_DENIED"), 1.0);
    assert_eq!(csi("DeleteVolume", "OK"), 0.0);
    assert_eq!(csi("Probe", "OK"), 3.0);
    let count =
        |name: &str, labels: &[(&str, &str)]| after.get(name, labels) - before.get(name, labels);
    assert_eq!(
        count(
            "edgevol_csi_call_duration_seconds_count",
            &[("method", "CreateVolume")]
        ),
        3.0
    );
    assert_eq!(
        count(
            "edgevol_csi_call_duration_seconds_bucket",
            &[("method", "CreateVolume"), ("le", "+Inf")]
        ),
        3.0
    );
    // Commits: the two creates that reached the pool and the publish; not the refused calls,
    // not the reads.
    assert_eq!(
        count(
            "edgevol_metadata_commit_seconds_count",
            &[("method", "CreateVolume")]
        ),
        2.0
    );
    assert_eq!(
        count(
            "edgevol_metadata_commit_seconds_count",
            &[("method", "ControllerPublishVolume")]
        ),
        1.0
    );
    assert_eq!(
        count(
            "edgevol_metadata_commit_seconds_count",
            &[("method", "DeleteVolume")]
        ),
        0.0
    );
    assert_eq!(
        after.get(
            "edgevol_metadata_commit_seconds_count",
            &[("method", "Probe")]
        ),
        0.0
    );

    let v = [("volume_id", volume.as_str())];
    let io = |op: &str, what: &str| {
        after.get(
            &format!("edgevol_volume_io_{what}_total"),
            &[("volume_id", &volume), ("op", op)],
        )
    };
    assert_eq!(io("write", "ops"), 3.0);
    assert_eq!(io("write", "bytes"), (4096 + 8192 + 4096) as f64);
    assert_eq!(io("read", "ops"), 2.0);
    assert_eq!(io("read", "bytes"), (3 * 4096 + 4096) as f64);
    assert_eq!(io("flush", "ops"), 1.0);
    assert_eq!(io("deallocate", "ops"), 0.0);
    assert_eq!(io("write", "errors"), 0.0);
    assert_eq!(
        after.get("edgevol_volume_io_latency_seconds_count", &v),
        6.0
    );
    assert_eq!(
        after.get(
            "edgevol_volume_io_latency_seconds_bucket",
            &[("volume_id", &volume), ("le", "+Inf")]
        ),
        6.0
    );
    assert_eq!(after.get("edgevol_volume_connected_hosts", &v), 1.0);
    assert!(after.get("edgevol_nvme_controllers", &[]) >= 1.0);
    // Two clusters written (thin): used moved by exactly two clusters.
    assert_eq!(
        after.get("edgevol_pool_used_bytes", &[]) - before.get("edgevol_pool_used_bytes", &[]),
        2.0 * f64::from(CLUSTER_SIZE)
    );
    assert_eq!(
        after.get("edgevol_build_info", &[("appliance", "test-box")]),
        1.0
    );
    // The host's NQN (no secret: it is the CSI node id) with its live controllers.
    let host = [("volume_id", volume.as_str()), ("host_nqn", HOST)];
    assert_eq!(after.get("edgevol_volume_host_controllers", &host), 1.0);

    // The host goes away: its controller is torn down and the gauge falls back to 0.
    drop(q);
    drop(ctrl);
    let gone = tokio::time::timeout(WAIT, async {
        loop {
            let s = Scrape::take(metrics).await;
            if s.get("edgevol_volume_connected_hosts", &v) == 0.0 {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("controller torn down after disconnect");
    assert!(!gone.text.contains(HOST), "a gone host is still listed");
    // Counters survive the disconnect.
    assert_eq!(
        gone.get(
            "edgevol_volume_io_ops_total",
            &[("volume_id", &volume), ("op", "write")]
        ),
        3.0
    );
    app.running.stop().await.unwrap();
}

/// QoS: the limits a volume carries, and exactly the commands its limit held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_limits_and_held_back_commands_are_exported() {
    let app = dev_with_metrics().await;
    let metrics = app.running.metrics_addr.expect("exporter runs");
    let mut admin = ControllerClient::new(app.channel("admin").await);
    let volume = admin
        .create_volume(CreateVolumeRequest {
            mutable_parameters: HashMap::from([
                ("maxIops".to_owned(), "1".to_owned()),
                ("maxWriteBandwidthBytes".to_owned(), "65536".to_owned()),
            ]),
            ..create("qos")
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    admin
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: volume.clone(),
            node_id: HOST.into(),
            volume_capability: Some(block_cap(Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .unwrap();
    let limits = Scrape::take(metrics).await;
    for (limit, value) in [("maxIops", 1.0), ("maxWriteBandwidthBytes", 65536.0)] {
        assert_eq!(
            limits.get(
                "edgevol_volume_qos_limit",
                &[("volume_id", &volume), ("limit", limit)]
            ),
            value
        );
    }

    // Three reads at 1 IOPS: the first goes, two are held until the limit is lifted.
    let nvme = app.running.target.endpoint;
    let id = Ids::new(&app.running.state.appliance_id)
        .parse_volume(&volume)
        .unwrap();
    let nqn = naming::subsystem_nqn("test-box", id);
    let ctrl = Admin::connect(nvme, &nqn, HOST, 0).await.unwrap();
    let mut q = ctrl
        .io_queue(nvme, 1, &nqn, HOST, Digests::NONE)
        .await
        .unwrap();
    let cids: Vec<u16> = (0..3)
        .map(|_| {
            let (sqe, none) = io::read(0, 1);
            q.submit(sqe, none)
        })
        .collect();
    ok(&q.wait(cids[0]).await);
    admin
        .controller_modify_volume(ControllerModifyVolumeRequest {
            volume_id: volume.clone(),
            mutable_parameters: HashMap::from([("maxIops".to_owned(), String::new())]),
            ..Default::default()
        })
        .await
        .unwrap();
    for &cid in &cids[1..] {
        ok(&tokio::time::timeout(WAIT, q.wait(cid))
            .await
            .expect("lifted"));
    }
    let after = Scrape::take(metrics).await;
    let v = [("volume_id", volume.as_str())];
    assert_eq!(after.get("edgevol_volume_qos_delayed_total", &v), 2.0);
    assert!(after.get("edgevol_volume_qos_wait_seconds_total", &v) > 0.0);
    assert_eq!(
        after.get(
            "edgevol_volume_qos_limit",
            &[("volume_id", &volume), ("limit", "maxIops")]
        ),
        0.0,
        "a removed limit is not exported"
    );
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn an_address_asked_for_must_bind_and_the_dev_default_may_not() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = dev_config(dir.path(), "127.0.0.1:0".parse().unwrap());
    config.metrics = MetricsConfig {
        listen: Some(addr),
        best_effort: false,
    };
    let err = start(config.clone()).await.unwrap_err().to_string();
    assert!(err.contains(&addr.to_string()), "{err}");
    config.metrics.best_effort = true;
    let running = start(config).await.unwrap();
    assert_eq!(running.metrics_addr, None, "skipped with a warning");
    running.stop().await.unwrap();
}
