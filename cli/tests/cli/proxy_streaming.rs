//! The proxy passes server-streaming calls, request and response metadata and a status that
//! arrives in trailers after messages, frame by frame, to an mTLS gRPC server.

use std::pin::Pin;

use crate::common;

use common::{start_proxy, unix_channel};
use edgevol_appliance::transport;
use edgevol_pki::files::{self, Pair};
use edgevol_pki::tls::{client_config, server_config, TlsFiles};
use edgevol_pki::{Role, Validity};
use edgevol_proto::csi::v1::snapshot_metadata_client::SnapshotMetadataClient;
use edgevol_proto::csi::v1::snapshot_metadata_server::{SnapshotMetadata, SnapshotMetadataServer};
use edgevol_proto::csi::v1::{
    GetMetadataAllocatedRequest, GetMetadataAllocatedResponse, GetMetadataDeltaRequest,
    GetMetadataDeltaResponse,
};
use tokio::net::TcpListener;
use tonic::codegen::tokio_stream::{self, Stream, StreamExt};
use tonic::{Code, Request, Response, Status};

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

struct Streamer;

#[tonic::async_trait]
impl SnapshotMetadata for Streamer {
    type GetMetadataAllocatedStream = Stream_<GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Stream_<GetMetadataDeltaResponse>;

    async fn get_metadata_allocated(
        &self,
        request: Request<GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let echo = request
            .metadata()
            .get("x-request-id")
            .cloned()
            .ok_or_else(|| Status::invalid_argument("x-request-id did not arrive"))?;
        let count = request.into_inner().max_results;
        let items = (0..count).map(|i| {
            Ok(GetMetadataAllocatedResponse {
                volume_capacity_bytes: i64::from(i),
                ..Default::default()
            })
        });
        let tail = std::iter::once(Err(Status::data_loss("stream ends here on purpose")));
        let mut response = Response::new(
            Box::pin(tokio_stream::iter(items.chain(tail))) as Self::GetMetadataAllocatedStream
        );
        response.metadata_mut().insert("x-request-id", echo);
        Ok(response)
    }

    async fn get_metadata_delta(
        &self,
        _request: Request<GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        Err(Status::unimplemented("not part of this test"))
    }
}

#[tokio::test]
async fn streaming_calls_metadata_and_trailing_statuses_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path();
    files::init(pki, &["localhost".into()], false).unwrap();
    files::issue(pki, Role::Controller, "co", Validity::days(1), false).unwrap();
    let server = Pair::in_dir(pki, "server");
    let client = Pair::in_dir(pki, "co");
    let ca = pki.join("ca.pem");

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tls = server_config(TlsFiles {
        ca: &ca,
        cert: &server.cert,
        key: &server.key,
    })
    .unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(SnapshotMetadataServer::new(Streamer))
            .serve_with_incoming(transport::incoming(listener, tls)),
    );

    let socket = dir.path().join("csi.sock");
    let tls = client_config(TlsFiles {
        ca: &ca,
        cert: &client.cert,
        key: &client.key,
    })
    .unwrap();
    start_proxy(&socket, addr, tls).await;
    let channel = unix_channel(socket).await;

    let mut request = Request::new(GetMetadataAllocatedRequest {
        max_results: 5,
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("x-request-id", "req-42".parse().unwrap());
    let response = SnapshotMetadataClient::new(channel)
        .get_metadata_allocated(request)
        .await
        .unwrap();
    assert_eq!(response.metadata().get("x-request-id").unwrap(), "req-42");
    let mut stream = response.into_inner();
    for i in 0..5 {
        let item = stream.next().await.unwrap().unwrap();
        assert_eq!(item.volume_capacity_bytes, i);
    }
    let status = stream.next().await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::DataLoss);
    assert_eq!(status.message(), "stream ends here on purpose");
    assert!(stream.next().await.is_none());
}
