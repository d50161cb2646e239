//! Fixtures of the CLI tests: a dev appliance config, a proxy in front of it, a client on the
//! proxy's unix socket.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use edgevol_appliance::{Args, Config};
use edgevol_cli::proxy;
use edgevol_pki::tls::{client_config, TlsFiles};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::{
    CreateSnapshotRequest, CreateVolumeRequest, ListSnapshotsRequest, Snapshot, Volume,
};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio_rustls::rustls::ClientConfig;
use tonic::transport::{Channel, Endpoint};

/// How much wider real-time windows are on a busy machine: `EDGEVOL_TEST_TIME_SCALE`, a whole
/// number from 1 to 99 (default 1; `scripts/test.sh --under-load` sets 3).
pub fn time_scale() -> u32 {
    match std::env::var("EDGEVOL_TEST_TIME_SCALE") {
        Err(_) => 1,
        Ok(v) => v
            .parse()
            .ok()
            .filter(|n| (1..100).contains(n))
            .unwrap_or_else(|| {
                panic!("EDGEVOL_TEST_TIME_SCALE must be a whole number from 1 to 99, not {v:?}")
            }),
    }
}

/// `d` times [`time_scale`]: the deadline of a wait for something a busy machine makes slower.
pub fn scaled(d: Duration) -> Duration {
    d * time_scale()
}

/// Waits until `running`'s pool is open (in the background: a debug build on a busy machine
/// takes a while), a minute times [`time_scale`] at most; then panics saying whose pool.
pub async fn pool_ready(running: &edgevol_appliance::Running) {
    if let Err(e) = running
        .state
        .wait_ready(scaled(Duration::from_secs(60)))
        .await
    {
        panic!("{e}");
    }
}

/// A dev appliance in `dir` listening on `listen` (NVMe/TCP on an ephemeral port).
pub fn dev_config(dir: &Path, listen: SocketAddr, appliance_id: &str) -> Config {
    Config::from_args(Args {
        dev: true,
        data_dir: Some(dir.to_path_buf()),
        listen: Some(listen),
        nvme_listen: Some("127.0.0.1:0".parse().unwrap()),
        appliance_id: Some(appliance_id.into()),
        ..Args::default()
    })
    .unwrap()
}

/// A client TLS config with the dev certificate of `who` (`controller`, `admin`, ...) in `pki`.
pub fn dev_tls(pki: &Path, who: &str) -> Arc<ClientConfig> {
    client_config(TlsFiles {
        ca: &pki.join("ca.pem"),
        cert: &pki.join(format!("{who}.pem")),
        key: &pki.join(format!("{who}.key")),
    })
    .unwrap()
}

/// Starts a proxy on `socket` forwarding to `upstream` with `tls`.
pub async fn start_proxy(socket: &Path, upstream: SocketAddr, tls: Arc<ClientConfig>) {
    let upstream = proxy::Upstream::new(&upstream.to_string(), Some("localhost"), tls).unwrap();
    let listener = proxy::bind(socket).await.unwrap();
    tokio::spawn(proxy::serve(listener, upstream, std::future::pending()));
}

/// A plaintext gRPC channel over a unix socket, as CO sidecars open one.
pub async fn unix_channel(path: PathBuf) -> Channel {
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .unwrap()
}

/// Runs `edgevol <command> <args> --appliance <appliance> --ca .. --cert <who>.pem --key
/// <who>.key` with the dev certificates in `pki`.
pub async fn edgevol_as(
    appliance: SocketAddr,
    pki: &Path,
    who: &str,
    command: &str,
    args: &[&str],
) -> Output {
    let file = |name: String| -> String { pki.join(name).display().to_string() };
    let mut all: Vec<String> = std::iter::once(&command)
        .chain(args)
        .map(|s| s.to_string())
        .collect();
    all.extend([
        "--appliance".into(),
        appliance.to_string(),
        "--server-name".into(),
        "localhost".into(),
        "--ca".into(),
        file("ca.pem".into()),
        "--cert".into(),
        file(format!("{who}.pem")),
        "--key".into(),
        file(format!("{who}.key")),
    ]);
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_edgevol"))
            .args(&all)
            .env("RUST_LOG", "off")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// The standard output of a command that must have succeeded.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "edgevol failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// CreateVolume that must succeed: the volume.
pub async fn create_ok(c: &mut ControllerClient<Channel>, req: CreateVolumeRequest) -> Volume {
    c.create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

/// CreateSnapshot of `source` named `name`, nothing else.
pub fn snapshot_of(source: &str, name: &str) -> CreateSnapshotRequest {
    CreateSnapshotRequest {
        source_volume_id: source.into(),
        name: name.into(),
        ..Default::default()
    }
}

/// CreateSnapshot that must succeed: the snapshot.
pub async fn snapshot_ok(
    c: &mut ControllerClient<Channel>,
    req: CreateSnapshotRequest,
) -> Snapshot {
    c.create_snapshot(req)
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
}

/// The ids of the snapshots a ListSnapshots call (that must succeed) returns, in its order.
pub async fn snapshot_ids(
    c: &mut ControllerClient<Channel>,
    req: ListSnapshotsRequest,
) -> Vec<String> {
    c.list_snapshots(req)
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.snapshot.unwrap().snapshot_id)
        .collect()
}
