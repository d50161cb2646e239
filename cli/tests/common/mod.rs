//! Fixtures of the CLI tests: a dev appliance config, a proxy in front of it, a client on the
//! proxy's unix socket.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use edgevol_appliance::{Args, Config};
use edgevol_cli::proxy;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio_rustls::rustls::ClientConfig;
use tonic::transport::{Channel, Endpoint};

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
