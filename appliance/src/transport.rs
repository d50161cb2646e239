//! TCP + mutual TLS under the gRPC server.
//!
//! Handshakes run in their own tasks (a slow or hostile client cannot stall accepts) under a
//! deadline; a failed handshake is logged with its reason and closes only that connection.
//! Each accepted stream carries the peer's verified identity to the request extensions through
//! tonic's [`Connected`].

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use edgevol_pki::{IdentityError, PeerIdentity};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::Connected;

/// Time a client has to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the gRPC server to pick them up.
const ACCEPT_BACKLOG: usize = 64;

/// What the server knows of the peer of a connection.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The peer's address.
    pub remote: SocketAddr,
    /// The identity of its (verified) certificate, or why it has none.
    pub identity: Result<PeerIdentity, IdentityError>,
    /// SHA-256 of its leaf certificate (DER): which certificate it was, for what is bound to
    /// one certificate rather than a name (a revoked node's certificate may not enrol again).
    pub cert_sha256: Option<[u8; 32]>,
}

impl fmt::Display for PeerInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.identity {
            Ok(id) => write!(f, "{id}@{}", self.remote),
            Err(_) => write!(f, "no-identity@{}", self.remote),
        }
    }
}

/// A server-side TLS stream whose client certificate was verified.
#[derive(Debug)]
pub struct MtlsStream {
    inner: TlsStream<TcpStream>,
    peer: PeerInfo,
}

impl Connected for MtlsStream {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.peer.clone()
    }
}

impl AsyncRead for MtlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for MtlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// SHA-256 of a DER certificate: its fingerprint.
pub fn certificate_sha256(der: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    let mut out = [0; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// Accepts TCP connections, runs each TLS handshake in its own task and yields the verified
/// streams. Ends when the listener fails fatally or the receiver is dropped.
pub fn incoming(
    listener: TcpListener,
    config: Arc<tokio_rustls::rustls::ServerConfig>,
) -> tokio_stream::wrappers::ReceiverStream<Result<MtlsStream, io::Error>> {
    let (tx, rx) = mpsc::channel(ACCEPT_BACKLOG);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (tcp, remote) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = tx.closed() => return,
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let leaf = tls
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|chain| chain.first());
                        let identity = leaf
                            .ok_or(IdentityError::Unparsable)
                            .and_then(|leaf| PeerIdentity::from_der(leaf));
                        let cert_sha256 = leaf.map(|leaf| certificate_sha256(leaf));
                        let peer = PeerInfo {
                            remote,
                            identity,
                            cert_sha256,
                        };
                        tracing::debug!(%peer, "TLS session established");
                        let _ = tx.send(Ok(MtlsStream { inner: tls, peer })).await;
                    }
                    Ok(Err(e)) => tracing::warn!(%remote, error = %e, "TLS handshake refused"),
                    Err(_) => tracing::warn!(%remote, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
