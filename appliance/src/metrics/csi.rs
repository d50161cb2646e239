//! CSI call metrics: a tower layer outside the role check that counts every call by method and
//! gRPC status code and times it, and times each mutating call's metadata commit (staging under
//! the pool lock and the wait for the group commit covering it: the metadata commit histogram)
//! by observing the pool handle while it runs ([`crate::state::observe_holds`]).
//!
//! A unary gRPC response carries its status in the trailers, after the message; an error
//! answered before any message carries it in the headers ("trailers-only"). The layer reads
//! the headers first, else wraps the response body and reads the trailers when they pass. A
//! body dropped before its status (the client went away) counts as `CANCELLED`.
//!
//! Like the role layer, this one never looks at messages, so `secrets` cannot reach a metric.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tower::{Layer, Service};

use super::histogram::{Histogram, HistogramSnapshot};
use super::Registry;
use crate::state::{observe_holds, HoldObserver};

/// At most this many distinct `(service, method)` series; further ones count as `other`.
pub const MAX_METHODS: usize = 128;

/// gRPC's canonical name of a status code, as the CSI spec's error tables write them.
pub fn code_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        15 => "DATA_LOSS",
        16 => "UNAUTHENTICATED",
        _ => "UNKNOWN",
    }
}

#[derive(Debug, Default)]
struct MethodStats {
    codes: BTreeMap<&'static str, u64>,
    latency: Histogram,
}

/// Calls per `(service, method)`: counts per code, and a latency histogram.
#[derive(Debug, Default)]
pub struct CsiCalls {
    methods: Mutex<BTreeMap<(String, String), MethodStats>>,
}

/// One method's figures, for the exporter.
#[derive(Debug, Clone)]
pub struct MethodSnapshot {
    /// `csi.v1.Controller`, ...
    pub service: String,
    /// `CreateVolume`, ...
    pub method: String,
    /// Calls per status code name.
    pub codes: Vec<(&'static str, u64)>,
    /// Latency from request to status.
    pub latency: HistogramSnapshot,
}

impl CsiCalls {
    /// The series key of a request path, capped at [`MAX_METHODS`] distinct keys.
    fn key(&self, path: &str) -> (String, String) {
        let (service, method) = path
            .strip_prefix('/')
            .and_then(|p| p.split_once('/'))
            .unwrap_or(("other", "other"));
        let key = (service.to_owned(), method.to_owned());
        let methods = self.methods.lock().unwrap_or_else(|p| p.into_inner());
        if methods.contains_key(&key) || methods.len() < MAX_METHODS {
            key
        } else {
            ("other".into(), "other".into())
        }
    }

    /// Records one finished call.
    pub fn record(&self, key: &(String, String), code: i32, elapsed: Duration) {
        let mut methods = self.methods.lock().unwrap_or_else(|p| p.into_inner());
        let stats = methods.entry(key.clone()).or_default();
        *stats.codes.entry(code_name(code)).or_default() += 1;
        stats.latency.observe(elapsed);
    }

    /// Every method seen so far.
    pub fn snapshot(&self) -> Vec<MethodSnapshot> {
        let methods = self.methods.lock().unwrap_or_else(|p| p.into_inner());
        methods
            .iter()
            .map(|((service, method), s)| MethodSnapshot {
                service: service.clone(),
                method: method.clone(),
                codes: s.codes.iter().map(|(k, v)| (*k, *v)).collect(),
                latency: s.latency.snapshot(),
            })
            .collect()
    }
}

/// Whether a CSI method changes metadata (and so commits): not Identity, not List/Get.
fn is_mutation(service: &str, method: &str) -> bool {
    service != "csi.v1.Identity" && service != "other" && !crate::auth::is_read_only(method)
}

/// Counts and times every call; install it outside [`crate::auth::AuthLayer`] so refused calls
/// count too.
#[derive(Debug, Clone)]
pub struct CsiMetricsLayer {
    registry: Arc<Registry>,
}

impl CsiMetricsLayer {
    /// A layer recording into `registry`.
    pub fn new(registry: Arc<Registry>) -> Self {
        CsiMetricsLayer { registry }
    }
}

impl<S> Layer<S> for CsiMetricsLayer {
    type Service = CsiMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CsiMetrics {
            inner,
            registry: self.registry.clone(),
        }
    }
}

/// The service of [`CsiMetricsLayer`].
#[derive(Debug, Clone)]
pub struct CsiMetrics<S> {
    inner: S,
    registry: Arc<Registry>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B> Service<http::Request<B>> for CsiMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let registry = self.registry.clone();
        let key = registry.csi.key(req.uri().path());
        let mutation = is_mutation(&key.0, &key.1).then(|| key.1.clone());
        let started = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = match mutation {
                Some(method) => {
                    let commits = registry.clone();
                    let observer: HoldObserver =
                        Arc::new(move |held| commits.observe_commit(&method, held));
                    observe_holds(observer, fut).await?
                }
                None => fut.await?,
            };
            let mut recorder = Recorder {
                registry,
                key,
                started,
                done: false,
            };
            let in_headers = resp
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok());
            Ok(match in_headers {
                Some(code) => {
                    recorder.finish(code);
                    resp
                }
                None => resp.map(|inner| tonic::body::Body::new(Metered { inner, recorder })),
            })
        })
    }
}

#[derive(Debug)]
struct Recorder {
    registry: Arc<Registry>,
    key: (String, String),
    started: Instant,
    done: bool,
}

impl Recorder {
    fn finish(&mut self, code: i32) {
        if !self.done {
            self.done = true;
            self.registry
                .csi
                .record(&self.key, code, self.started.elapsed());
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // The body went away before its status: the client cancelled.
        self.finish(1);
    }
}

/// A response body that records the call when its trailers (or its end) pass.
#[derive(Debug)]
struct Metered<B> {
    inner: B,
    recorder: Recorder,
}

impl<B> Body for Metered<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_frame(cx);
        match &poll {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = trailers
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<i32>().ok())
                        .unwrap_or(2);
                    this.recorder.finish(code);
                }
            }
            // A body that ends or fails without a status: the call failed in transport.
            Poll::Ready(Some(Err(_))) | Poll::Ready(None) => this.recorder.finish(2),
            Poll::Pending => {}
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_capped_and_codes_named() {
        let calls = CsiCalls::default();
        for i in 0..MAX_METHODS + 5 {
            let key = calls.key(&format!("/svc/M{i}"));
            calls.record(&key, 0, Duration::from_micros(5));
        }
        let snap = calls.snapshot();
        assert_eq!(snap.len(), MAX_METHODS + 1);
        let other = snap.iter().find(|m| m.service == "other").unwrap();
        assert_eq!(other.codes, vec![("OK", 5)]);
        assert_eq!(code_name(9), "FAILED_PRECONDITION");
        assert!(is_mutation("csi.v1.Controller", "CreateVolume"));
        assert!(!is_mutation("csi.v1.Controller", "ListVolumes"));
        assert!(!is_mutation("csi.v1.Identity", "Probe"));
    }
}
