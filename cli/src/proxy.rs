//! The CO-side proxy: plaintext gRPC on a unix socket in, gRPC over mutual TLS to the appliance
//! out.
//!
//! CSI sidecars and conformance tools only speak to a unix socket; the appliance only speaks
//! mTLS over TCP. The proxy joins them at the HTTP/2 level: every request (any service, any
//! method, unary or streaming) is forwarded with its headers and body frames untouched, and the
//! response's headers, body and trailers come back the same way. Messages are never decoded, so
//! status codes, messages and metadata arrive exactly as the appliance sent them.
//!
//! One upstream HTTP/2 connection is shared by all calls. It is re-established on demand: when
//! the appliance restarts, the next call opens a new connection; a call that could not even be
//! sent on a dead connection is retried once on a fresh one. A call that cannot reach the
//! appliance is answered `UNAVAILABLE`.
//!
//! Clients that send the socket path as `:authority` (gRPC C-core, grpc-java) are served too:
//! [`UnixGrpcStream`] makes it `localhost` before HTTP/2 parsing, and the forwarded request
//! carries the appliance's authority anyway.
//!
//! With several appliances ([`serve_fleet`]) the proxy is one driver over all of them: calls
//! are routed by the appliance id their volume, snapshot or group ids carry, and the calls that
//! span appliances (CreateVolume, the listings, GetCapacity) are answered by the proxy itself
//! (see [`crate::fleet_router`]). With one appliance nothing is decoded.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use edgevol_pki::client::MtlsTarget;
use edgevol_uds::UnixGrpcStream;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Mutex;
use tokio_rustls::rustls::ClientConfig;
use tonic::Status;

use crate::fleet_router::{Fleet, Member};
use crate::grpc_unary::{refuse, ProxyBody};
use crate::node_route::{NodeRoute, NODE_SERVICE};

/// Time allowed to connect and handshake with the appliance.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 keep-alive towards the appliance, so a vanished box is noticed between calls.
const KEEPALIVE: Duration = Duration::from_secs(20);

/// Where to forward to: the appliance's CSI endpoint, reached with the mTLS connector the other
/// commands and the node plugin use (address rules, server name, `TCP_NODELAY`, handshake).
#[derive(Debug, Clone)]
pub struct Upstream(MtlsTarget);

impl Upstream {
    /// An upstream at `address` (`HOST:PORT`), verified as `server_name` or else as HOST.
    pub fn new(
        address: &str,
        server_name: Option<&str>,
        tls: Arc<ClientConfig>,
    ) -> Result<Upstream, String> {
        MtlsTarget::new(address, server_name, tls)
            .map(Upstream)
            .map_err(|e| e.to_string())
    }

    /// `HOST:PORT` of the appliance's CSI endpoint.
    pub fn address(&self) -> &str {
        self.0.address()
    }
}

/// The forwarding half: a lazily (re)connected HTTP/2 client to the appliance.
#[derive(Debug)]
pub struct Forwarder {
    upstream: Upstream,
    authority: Authority,
    conn: Mutex<Option<SendRequest<ProxyBody>>>,
}

impl Forwarder {
    /// A client of `upstream`; it connects on the first call.
    pub fn new(upstream: Upstream) -> Forwarder {
        let authority = upstream
            .address()
            .parse()
            .expect("checked by MtlsTarget::new");
        Forwarder {
            upstream,
            authority,
            conn: Mutex::new(None),
        }
    }

    async fn connect(&self) -> Result<SendRequest<ProxyBody>, Status> {
        // "edgevol proxy: appliance HOST:PORT unreachable: ..." (the connector's errors say
        // unreachable or refused the TLS handshake).
        let unavailable = |why: &dyn std::fmt::Display| {
            Status::unavailable(format!(
                "edgevol proxy: appliance {} {why}",
                self.upstream.address()
            ))
        };
        let connect = async {
            let tls = self
                .upstream
                .0
                .connect()
                .await
                .map_err(|e| unavailable(&e))?;
            let (sender, connection) =
                hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .keep_alive_interval(KEEPALIVE)
                    .keep_alive_while_idle(true)
                    .handshake(TokioIo::new(tls))
                    .await
                    .map_err(|e| unavailable(&format_args!("refused HTTP/2: {e}")))?;
            let address = self.upstream.address().to_owned();
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::info!(appliance = %address, error = %e, "upstream connection ended");
                }
            });
            tracing::info!(appliance = %self.upstream.address(), "connected to appliance");
            Ok(sender)
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .unwrap_or_else(|_| Err(unavailable(&"did not answer: connect timed out")))
    }

    /// A live connection: the current one if it still works, else a new one.
    async fn sender(&self, fresh: bool) -> Result<SendRequest<ProxyBody>, Status> {
        let mut slot = self.conn.lock().await;
        if !fresh {
            if let Some(sender) = slot.as_mut() {
                if !sender.is_closed() && sender.ready().await.is_ok() {
                    return Ok(sender.clone());
                }
            }
        }
        *slot = None;
        let sender = self.connect().await?;
        *slot = Some(sender.clone());
        Ok(sender)
    }

    /// The appliance's `HOST:PORT`.
    pub fn address(&self) -> &str {
        self.upstream.address()
    }

    /// Whether the appliance can be reached now (a live or new connection).
    pub async fn ready(&self) -> Result<(), Status> {
        self.sender(false).await.map(drop)
    }

    /// Sends `req` (its path and headers as given) to the appliance; its answer comes back as
    /// it was sent. `UNAVAILABLE` when the appliance cannot be reached.
    pub async fn forward(&self, req: Request<ProxyBody>) -> Result<Response<Incoming>, Status> {
        let (mut parts, body) = req.into_parts();
        let mut uri = Uri::builder()
            .scheme(Scheme::HTTPS)
            .authority(self.authority.clone());
        if let Some(pq) = parts.uri.path_and_query() {
            uri = uri.path_and_query(pq.clone());
        }
        parts.uri = uri.build().map_err(|e| {
            Status::invalid_argument(format!("edgevol proxy: bad request URI: {e}"))
        })?;
        let req = Request::from_parts(parts, body);

        let mut sender = self.sender(false).await?;
        match sender.try_send_request(req).await {
            Ok(resp) => Ok(resp),
            Err(mut e) => match e.take_message() {
                // Never reached the appliance (the connection died under us): safe to retry once.
                Some(req) => {
                    let mut sender = self.sender(true).await?;
                    sender.send_request(req).await.map_err(|e| {
                        Status::unavailable(format!("edgevol proxy: appliance call failed: {e}"))
                    })
                }
                None => Err(Status::unavailable(format!(
                    "edgevol proxy: appliance call failed: {}",
                    e.into_error()
                ))),
            },
        }
    }
}

/// Where the proxy sends what it does not send to the node plugin.
#[derive(Debug)]
enum Upstreams {
    /// One appliance: every call forwarded untouched.
    One(Forwarder),
    /// Several: routed by [`Fleet`].
    Fleet(Fleet),
}

impl Upstreams {
    async fn handle(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        match self {
            Upstreams::One(forwarder) => {
                let path = req.uri().path().to_owned();
                match forwarder.forward(req.map(BodyExt::boxed)).await {
                    Ok(resp) => resp.map(BodyExt::boxed),
                    Err(status) => {
                        tracing::warn!(method = %path, error = %status.message(), "call not forwarded");
                        refuse(status)
                    }
                }
            }
            Upstreams::Fleet(fleet) => fleet.handle(req).await,
        }
    }
}

/// Serves the proxy on `listener` until `shutdown` completes.
pub async fn serve(
    listener: UnixListener,
    upstream: Upstream,
    shutdown: impl std::future::Future<Output = ()>,
) {
    serve_with_node(listener, upstream, None, shutdown).await;
}

/// Serves one driver over several appliances, each named by its appliance id, with Node calls
/// sent to `node` when given.
pub async fn serve_fleet(
    listener: UnixListener,
    appliances: Vec<(String, Upstream)>,
    node: Option<NodeRoute>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let members = appliances
        .into_iter()
        .map(|(id, upstream)| Member::new(id, Forwarder::new(upstream)))
        .collect();
    run(
        listener,
        Upstreams::Fleet(Fleet::new(members)),
        node,
        shutdown,
    )
    .await;
}

/// [`serve`], with `csi.v1.Node` calls sent to the node plugin of `node` when given (one socket
/// for a Docker Swarm plugin, see [`crate::node_route`]).
pub async fn serve_with_node(
    listener: UnixListener,
    upstream: Upstream,
    node: Option<NodeRoute>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    run(
        listener,
        Upstreams::One(Forwarder::new(upstream)),
        node,
        shutdown,
    )
    .await;
}

async fn run(
    listener: UnixListener,
    upstreams: Upstreams,
    node: Option<NodeRoute>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let forwarder = Arc::new(upstreams);
    let node = node.map(Arc::new);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let forwarder = forwarder.clone();
        let node = node.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let forwarder = forwarder.clone();
                let node = node.clone();
                async move {
                    let path = req.uri().path().to_owned();
                    let resp = match node.as_deref() {
                        Some(node) if path.starts_with(NODE_SERVICE) => {
                            match node.forward(req).await {
                                Ok(resp) => resp.map(BodyExt::boxed),
                                Err(status) => {
                                    tracing::warn!(method = %path, error = %status.message(), "call not forwarded");
                                    refuse(status)
                                }
                            }
                        }
                        _ => forwarder.handle(req).await,
                    };
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            if let Err(e) = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(UnixGrpcStream::new(stream)), service)
                .await
            {
                tracing::debug!(error = %e, "client connection ended");
            }
        });
    }
}

/// Parses `unix:///path` (or a plain path) into the socket path.
pub fn socket_path(listen: &str) -> Result<PathBuf, String> {
    let path = listen.strip_prefix("unix://").unwrap_or(listen);
    if path.is_empty() || !path.starts_with('/') {
        return Err(format!(
            "listen {listen:?}: expected unix:///absolute/path or /absolute/path"
        ));
    }
    Ok(PathBuf::from(path))
}

/// Binds the unix socket, removing a stale socket file left by a dead proxy, but never one a
/// live proxy still answers on.
pub async fn bind(path: &Path) -> Result<UnixListener, String> {
    if path.exists() {
        let is_socket = std::fs::symlink_metadata(path)
            .map(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
            .unwrap_or(false);
        if !is_socket {
            return Err(format!("{}: exists and is not a socket", path.display()));
        }
        if UnixStream::connect(path).await.is_ok() {
            return Err(format!(
                "{}: a process is already serving there",
                path.display()
            ));
        }
        std::fs::remove_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    UnixListener::bind(path).map_err(|e: io::Error| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_pki::files::{init, issue, Pair};
    use edgevol_pki::tls::{client_config, server_config, TlsFiles};
    use edgevol_pki::{Role, Validity};
    use tokio::net::TcpListener;
    use tonic::Code;

    /// A PKI (server certificate valid for `localhost`) and an observer's client TLS.
    fn pki() -> (tempfile::TempDir, Arc<ClientConfig>) {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), &["localhost".into()], false).unwrap();
        issue(
            dir.path(),
            Role::Observer,
            "observer",
            Validity::days(1),
            false,
        )
        .unwrap();
        let tls = client_config(TlsFiles {
            ca: &Pair::in_dir(dir.path(), "ca").cert,
            cert: &Pair::in_dir(dir.path(), "observer").cert,
            key: &Pair::in_dir(dir.path(), "observer").key,
        })
        .unwrap();
        (dir, tls)
    }

    #[test]
    fn upstreams_follow_the_connectors_address_rules() {
        let (_dir, tls) = pki();
        let up = Upstream::new("10.0.0.1:9500", None, tls.clone()).unwrap();
        assert_eq!(up.address(), "10.0.0.1:9500");
        assert_eq!(
            Upstream::new("10.0.0.1", None, tls.clone()).unwrap_err(),
            "appliance address \"10.0.0.1\": expected HOST:PORT"
        );
        let e = Upstream::new("box:1", Some("not a name"), tls).unwrap_err();
        assert!(
            e.starts_with("appliance server name \"not a name\": "),
            "{e}"
        );
    }

    #[tokio::test]
    async fn an_appliance_unreachable_or_refusing_the_handshake_is_unavailable_by_name() {
        let (dir, tls) = pki();
        // Nothing listens on this port any more.
        let addr = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let up = Upstream::new(&addr.to_string(), Some("localhost"), tls.clone()).unwrap();
        let status = Forwarder::new(up).ready().await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        let prefix = format!("edgevol proxy: appliance {addr} unreachable: ");
        assert!(status.message().starts_with(&prefix), "{status:?}");

        // A server whose certificate is not valid for the name the upstream verifies.
        let server = Pair::in_dir(dir.path(), "server");
        let config = server_config(TlsFiles {
            ca: &Pair::in_dir(dir.path(), "ca").cert,
            cert: &server.cert,
            key: &server.key,
        })
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            tokio_rustls::TlsAcceptor::from(config).accept(tcp).await
        });
        let up = Upstream::new(&addr.to_string(), Some("box-9.example"), tls).unwrap();
        let status = Forwarder::new(up).ready().await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        let prefix = format!("edgevol proxy: appliance {addr} refused the TLS handshake: ");
        assert!(status.message().starts_with(&prefix), "{status:?}");
        assert!(accept.await.unwrap().is_err());
    }
}
