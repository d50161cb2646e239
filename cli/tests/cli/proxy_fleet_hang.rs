//! An appliance that accepts the connection but never answers: the proxy's identity check gives
//! up (UNAVAILABLE) instead of holding the call forever.

use crate::fleet;

use edgevol_appliance::transport;
use edgevol_pki::tls::{server_config, TlsFiles};
use edgevol_proto::csi::v1::identity_server::{Identity, IdentityServer};
use edgevol_proto::csi::v1::*;
use fleet::{fleet_proxy, start_fleet};
use tokio::net::TcpListener;
use tonic::{Code, Request, Response, Status};

/// Identity that never answers GetPluginInfo.
struct Silent;

#[tonic::async_trait]
impl Identity for Silent {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        std::future::pending().await
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Err(Status::unimplemented("not part of this test"))
    }

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        Err(Status::unimplemented("not part of this test"))
    }
}

#[tokio::test]
async fn an_appliance_that_never_says_who_it_is_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-b"]).await;
    let pki = dir.path().join("pki");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tls = server_config(TlsFiles {
        ca: &pki.join("ca.pem"),
        cert: &pki.join("server.pem"),
        key: &pki.join("server.key"),
    })
    .unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(Silent))
            .serve_with_incoming(transport::incoming(listener, tls)),
    );
    boxes.push(fleet::Box_ {
        id: "box-h".into(),
        data: dir.path().join("box-h"),
        addr,
        running: None,
    });
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let status = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: "box-h-v1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("did not say who it is"),
        "{}",
        status.message()
    );
    boxes[0].stop().await;
}
