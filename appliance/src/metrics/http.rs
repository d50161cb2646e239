//! The exporter's HTTP server: HTTP/1.1 on its own listener, `GET /metrics` only.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use super::{gather, Sources, CONTENT_TYPE};

/// The running exporter.
#[derive(Debug)]
pub struct MetricsServer {
    /// Where it listens.
    pub local_addr: SocketAddr,
    task: JoinHandle<()>,
}

impl MetricsServer {
    /// Serves `sources` on `listener` until [`MetricsServer::stop`].
    pub fn start(listener: TcpListener, sources: Arc<Sources>) -> std::io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let task = tokio::spawn(accept(listener, sources));
        tracing::info!(listen = %local_addr, "metrics exporter listening");
        Ok(MetricsServer { local_addr, task })
    }

    /// Stops accepting and closes every connection.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

async fn accept(listener: TcpListener, sources: Arc<Sources>) {
    // Dropped with this task on stop: every connection ends with it.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let sources = sources.clone();
                    connections.spawn(async move {
                        let service = service_fn(move |req| handle(req, sources.clone()));
                        let conn = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service);
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "metrics connection ended");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(%e, "metrics accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
}

async fn handle(
    req: Request<Incoming>,
    sources: Arc<Sources>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, text: &'static str| {
        let mut resp = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *resp.status_mut() = status;
        resp
    };
    if req.uri().path() != "/metrics" {
        return Ok(reply(StatusCode::NOT_FOUND, "only /metrics is served\n"));
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut resp = reply(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
        resp.headers_mut().insert(
            http::header::ALLOW,
            http::HeaderValue::from_static("GET, HEAD"),
        );
        return Ok(resp);
    }
    let text = gather(&sources).await;
    let mut resp = Response::new(Full::new(Bytes::from(text)));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(CONTENT_TYPE),
    );
    Ok(resp)
}
