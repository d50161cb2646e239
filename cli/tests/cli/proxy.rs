//! The proxy: plaintext gRPC on a unix socket reaches the appliance over mTLS, statuses come
//! back untouched, and it keeps serving across an appliance restart.

use std::path::PathBuf;
use std::time::Duration;

use crate::common;

use common::{dev_config, dev_tls, start_proxy, unix_channel};
use edgevol_appliance::start;
use edgevol_cli::proxy;
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::node_client::NodeClient;
use edgevol_proto::csi::v1::{GetPluginInfoRequest, GetPluginInfoResponse, NodeGetInfoRequest};
use tonic::Code;

#[tokio::test]
async fn proxy_forwards_calls_and_statuses_and_survives_an_appliance_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("appliance");
    let appliance = start(dev_config(&data, "127.0.0.1:0".parse().unwrap(), "proxied"))
        .await
        .unwrap();
    let addr = appliance.local_addr;
    let pki = data.join("pki");
    let tls = dev_tls(&pki, "controller");
    let socket = dir.path().join("csi.sock");
    start_proxy(&socket, addr, tls).await;

    let channel = unix_channel(socket.clone()).await;
    let mut identity = IdentityClient::new(channel.clone());
    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "csi.edgevol.io");
    assert_eq!(info.manifest["appliance-id"], "proxied");

    // A method the appliance does not have: UNIMPLEMENTED, passed through.
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let status = grpc
        .unary::<_, GetPluginInfoResponse, _>(
            tonic::Request::new(GetPluginInfoRequest {}),
            http::uri::PathAndQuery::from_static("/csi.v1.Controller/NoSuchMethod"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);

    // The appliance's own refusal, message and all, passed through: the controller role may
    // not call the Node service.
    let status = NodeClient::new(channel.clone())
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(
        status.message(),
        "role controller of client \"controller\" may not call csi.v1.Node/NodeGetInfo"
    );

    // Appliance down: the proxy answers UNAVAILABLE, naming the appliance.
    appliance.stop().await.unwrap();
    let status = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains(&addr.to_string()),
        "{}",
        status.message()
    );

    // Back on the same address: the same client, through the same proxy, is served again.
    let appliance = start(dev_config(&data, addr, "proxied")).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let info = loop {
        match identity.get_plugin_info(GetPluginInfoRequest {}).await {
            Ok(resp) => break resp.into_inner(),
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "proxy never reconnected"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(info.name, "csi.edgevol.io");

    appliance.stop().await.unwrap();
}

#[tokio::test]
async fn bind_refuses_a_live_socket_and_a_regular_file_but_replaces_a_stale_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let live = proxy::bind(&path).await.unwrap();
    let err = proxy::bind(&path).await.unwrap_err();
    assert!(err.contains("already serving"), "{err}");
    drop(live);
    proxy::bind(&path)
        .await
        .expect("a stale socket is replaced");

    let file = dir.path().join("notes.txt");
    std::fs::write(&file, b"keep me").unwrap();
    let err = proxy::bind(&file).await.unwrap_err();
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");

    assert!(proxy::socket_path("unix://relative").is_err());
    assert_eq!(
        proxy::socket_path("unix:///run/csi.sock").unwrap(),
        PathBuf::from("/run/csi.sock")
    );
}
