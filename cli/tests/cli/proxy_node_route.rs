//! `edgevol proxy --node-socket`: one socket for a Docker Swarm plugin. csi.v1.Node calls reach
//! the node plugin's socket, everything else the appliance.

use std::convert::Infallible;
use std::path::{Path, PathBuf};

use crate::common;

use bytes::Bytes;
use common::{dev_config, dev_tls, unix_channel};
use edgevol_appliance::{start, Running};
use edgevol_cli::node_route::NodeRoute;
use edgevol_cli::proxy;
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::node_client::NodeClient;
use edgevol_proto::csi::v1::{GetPluginInfoRequest, NodeGetInfoRequest};
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixListener;
use tonic::Code;

/// A stand-in node plugin: answers every call UNIMPLEMENTED "fake node plugin".
fn fake_node_plugin(listener: UnixListener) {
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    let status = tonic::Status::unimplemented("fake node plugin");
                    Ok::<_, Infallible>(status.into_http::<()>().map(|()| Empty::<Bytes>::new()))
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

/// A dev appliance in `dir` and `edgevol proxy --node-socket <node_socket>` in front of it; the
/// proxy's socket.
async fn swarm_proxy(dir: &Path, node_socket: PathBuf) -> (Running, PathBuf) {
    let data = dir.join("appliance");
    let appliance = start(dev_config(&data, "127.0.0.1:0".parse().unwrap(), "swarm"))
        .await
        .unwrap();
    let tls = dev_tls(&data.join("pki"), "controller");
    let upstream =
        proxy::Upstream::new(&appliance.local_addr.to_string(), Some("localhost"), tls).unwrap();
    let socket = dir.join("csi.sock");
    let listener = proxy::bind(&socket).await.unwrap();
    tokio::spawn(proxy::serve_with_node(
        listener,
        upstream,
        Some(NodeRoute::new(node_socket)),
        std::future::pending(),
    ));
    (appliance, socket)
}

#[tokio::test]
async fn node_calls_go_to_the_node_socket_and_the_rest_to_the_appliance() {
    let dir = tempfile::tempdir().unwrap();
    let node_socket = dir.path().join("node.sock");
    fake_node_plugin(UnixListener::bind(&node_socket).unwrap());
    let (_appliance, socket) = swarm_proxy(dir.path(), node_socket).await;

    let channel = unix_channel(socket).await;
    let info = IdentityClient::new(channel.clone())
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.manifest["appliance-id"], "swarm");
    // Without the route the appliance would refuse the controller role (PERMISSION_DENIED).
    let status = NodeClient::new(channel)
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unimplemented, "fake node plugin")
    );
}

#[tokio::test]
async fn a_missing_node_plugin_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let (_appliance, socket) = swarm_proxy(dir.path(), dir.path().join("absent.sock")).await;
    let status = NodeClient::new(unix_channel(socket).await)
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("node plugin"),
        "{}",
        status.message()
    );
}
