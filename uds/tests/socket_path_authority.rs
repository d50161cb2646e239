//! A gRPC C-core style request (`:authority` = the percent-encoded socket path) against a real
//! hyper HTTP/2 server: reset by h2 on a bare connection, answered through [`UnixGrpcStream`].

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use loona_hpack::Encoder;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

use edgevol_uds::UnixGrpcStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const RST_STREAM: u8 = 0x3;
const HEADERS: u8 = 0x1;

fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: S) {
    tokio::spawn(async move {
        let service =
            hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                let authority = req
                    .uri()
                    .authority()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(authority))))
            });
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(io), service)
            .await;
    });
}

/// Sends one request with `authority`; returns the type of the first frame the server sends
/// on stream 1, and the response body when it answered.
async fn call(mut client: DuplexStream, authority: &str) -> (u8, Vec<u8>) {
    let block = Encoder::new().encode([
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/csi.v1.Identity/GetPluginInfo"),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
    ]);
    let mut out = PREFACE.to_vec();
    out.extend([0, 0, 0, 0x4, 0, 0, 0, 0, 0]); // SETTINGS
    let len = u32::try_from(block.len()).unwrap().to_be_bytes();
    out.extend([len[1], len[2], len[3], HEADERS, 0x4 | 0x1, 0, 0, 0, 1]);
    out.extend(block);
    client.write_all(&out).await.unwrap();

    let mut first = None;
    loop {
        let mut head = [0u8; 9];
        client.read_exact(&mut head).await.unwrap();
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0; len];
        client.read_exact(&mut payload).await.unwrap();
        if u32::from_be_bytes([head[5], head[6], head[7], head[8]]) != 1 {
            continue;
        }
        let kind = *first.get_or_insert(head[3]);
        if kind == RST_STREAM {
            return (kind, Vec::new());
        }
        if head[3] == 0x0 {
            return (kind, payload); // DATA: the body
        }
    }
}

#[tokio::test]
async fn bare_h2_resets_a_socket_path_authority() {
    let (client, server) = tokio::io::duplex(64 * 1024);
    serve(server);
    assert_eq!(
        call(client, "%2Frun%2Fedgevol%2Fcsi.sock").await.0,
        RST_STREAM
    );
}

#[tokio::test]
async fn wrapped_server_answers_a_socket_path_authority_as_localhost() {
    let (client, server) = tokio::io::duplex(64 * 1024);
    serve(UnixGrpcStream::new(server));
    let (kind, body) = call(client, "%2Frun%2Fedgevol%2Fcsi.sock").await;
    assert_eq!(kind, HEADERS);
    assert_eq!(body, b"localhost");
}

#[tokio::test]
async fn wrapped_server_keeps_a_valid_authority() {
    let (client, server) = tokio::io::duplex(64 * 1024);
    serve(UnixGrpcStream::new(server));
    let (kind, body) = call(client, "localhost:7000").await;
    assert_eq!(kind, HEADERS);
    assert_eq!(body, b"localhost:7000");
}

#[tokio::test]
async fn wrapped_server_answers_grpc_javas_raw_socket_path() {
    // grpc-java (Netty, DomainSocketAddress) sends the path itself, not percent-encoded.
    let (client, server) = tokio::io::duplex(64 * 1024);
    serve(UnixGrpcStream::new(server));
    let (kind, body) = call(client, "/var/run/edgevol/csi.sock").await;
    assert_eq!(kind, HEADERS);
    assert_eq!(body, b"localhost");
}
