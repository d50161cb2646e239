//! The proxy's optional second upstream: the local node plugin's unix socket, for the
//! `csi.v1.Node` service.
//!
//! Docker Swarm runs one managed plugin per driver that declares both `docker.csicontroller/1.0`
//! and `docker.csinode/1.0` on a single socket. The appliance serves Identity and Controller;
//! `edgevol-node` serves Node. With `edgevol proxy --node-socket`, Node calls go to the node
//! plugin (plaintext HTTP/2 over its unix socket, frames untouched like every forwarded call)
//! and everything else to the appliance.

use std::path::PathBuf;

use http::uri::Scheme;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;
use tokio::sync::Mutex;
use tonic::Status;

/// The gRPC path prefix of the CSI Node service.
pub const NODE_SERVICE: &str = "/csi.v1.Node/";

/// A lazily (re)connected HTTP/2 client of the node plugin's socket.
#[derive(Debug)]
pub struct NodeRoute {
    path: PathBuf,
    conn: Mutex<Option<SendRequest<Incoming>>>,
}

impl NodeRoute {
    /// Node calls will go to the plugin listening on `path`.
    pub fn new(path: PathBuf) -> NodeRoute {
        NodeRoute {
            path,
            conn: Mutex::new(None),
        }
    }

    fn unavailable(&self, e: &dyn std::fmt::Display) -> Status {
        Status::unavailable(format!(
            "edgevol proxy: node plugin {}: {e}",
            self.path.display()
        ))
    }

    async fn sender(&self) -> Result<SendRequest<Incoming>, Status> {
        let mut slot = self.conn.lock().await;
        if let Some(sender) = slot.as_mut() {
            if !sender.is_closed() && sender.ready().await.is_ok() {
                return Ok(sender.clone());
            }
        }
        *slot = None;
        let stream = UnixStream::connect(&self.path)
            .await
            .map_err(|e| self.unavailable(&e))?;
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.unavailable(&e))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "node plugin connection ended");
            }
        });
        *slot = Some(sender.clone());
        Ok(sender)
    }

    /// Forwards one Node call; the plugin's answer comes back as it sent it.
    pub async fn forward(&self, req: Request<Incoming>) -> Result<Response<Incoming>, Status> {
        let (mut parts, body) = req.into_parts();
        let mut uri = Uri::builder().scheme(Scheme::HTTP).authority("localhost");
        if let Some(pq) = parts.uri.path_and_query() {
            uri = uri.path_and_query(pq.clone());
        }
        parts.uri = uri.build().map_err(|e| {
            Status::invalid_argument(format!("edgevol proxy: bad request URI: {e}"))
        })?;
        let mut sender = self.sender().await?;
        sender
            .send_request(Request::from_parts(parts, body))
            .await
            .map_err(|e| self.unavailable(&e))
    }
}
