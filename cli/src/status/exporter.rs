//! The appliance's Prometheus exporter: `GET /metrics` with hyper's client, the text parsed by
//! `prometheus-parse`.
//!
//! The parser skips lines it cannot read rather than failing the scrape (a value that is no
//! number, a malformed line); what it skipped is then shown as unknown. It does not undo label
//! escapes and splits labels at commas: the exporter's label values (volume ids, host NQNs,
//! device paths, CSI method names) hold no `"`, `\`, `,` or `=`.

use std::collections::BTreeSet;
use std::error::Error as StdError;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prometheus_parse::{Scrape, Value};

/// Largest /metrics answer accepted.
const MAX_METRICS_BYTES: usize = 64 << 20;
/// Time allowed for the whole scrape.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// The gauge: live controllers per volume and host NQN.
pub(crate) const HOST_CONTROLLERS: &str = "edgevol_volume_host_controllers";

/// One scrape of the exporter.
#[derive(Debug, Clone)]
pub struct Metrics {
    scrape: Scrape,
}

impl Metrics {
    /// Parses a Prometheus text exposition. Text with no sample at all (an HTML page, an
    /// empty answer) is an error.
    pub fn parse(text: &str) -> Result<Metrics, String> {
        let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
            .map_err(|e| format!("metrics: {e}"))?;
        if scrape.samples.is_empty() {
            return Err("metrics: the answer holds no Prometheus sample".into());
        }
        Ok(Metrics { scrape })
    }

    /// The value of the first sample of `name` whose labels include every pair of `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples(name)
            .find(|(l, _)| labels.iter().all(|(k, v)| l.get(k) == Some(*v)))
            .map(|(_, v)| v)
    }

    /// Every sample of `name` with a single value (counters, gauges, untyped), with its labels.
    pub fn samples<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = (&'a prometheus_parse::Labels, f64)> + 'a {
        self.scrape
            .samples
            .iter()
            .filter(move |s| s.metric == name)
            .filter_map(|s| match s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some((&s.labels, v)),
                Value::Histogram(_) | Value::Summary(_) => None,
            })
    }

    /// Whether the exporter describes family `name` (its `# HELP` line), samples or none: an
    /// appliance too old to export it is told from one that has nothing to report.
    pub fn has_family(&self, name: &str) -> bool {
        self.scrape.docs.contains_key(name)
    }

    /// The hosts (NQNs) with a live NVMe/TCP controller on `volume`'s subsystem, in order;
    /// `None` when the exporter does not say (an appliance older than the gauge).
    pub fn connected_hosts(&self, volume: &str) -> Option<BTreeSet<String>> {
        if !self.has_family(HOST_CONTROLLERS) {
            return None;
        }
        Some(
            self.samples(HOST_CONTROLLERS)
                .filter(|(l, n)| l.get("volume_id") == Some(volume) && *n > 0.0)
                .filter_map(|(l, _)| l.get("host_nqn").map(str::to_owned))
                .collect(),
        )
    }
}

/// `GET http://ADDR/metrics`, parsed. `addr` is the exporter's `HOST:PORT`.
pub async fn fetch_metrics(addr: &str) -> Result<Metrics, String> {
    let err = |e: &dyn std::fmt::Display| format!("metrics {addr}: {e}");
    let uri: Uri = format!("http://{addr}/metrics")
        .parse()
        .map_err(|e| err(&format!("not HOST:PORT ({e})")))?;
    let text = tokio::time::timeout(SCRAPE_TIMEOUT, scrape(uri))
        .await
        .map_err(|_| err(&format!("no answer within {SCRAPE_TIMEOUT:?}")))?
        .map_err(|e| err(&e))?;
    Metrics::parse(&text).map_err(|e| err(&e))
}

async fn scrape(uri: Uri) -> Result<String, String> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let request = Request::get(uri)
        .header(ACCEPT, "text/plain")
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let answer = client.request(request).await.map_err(|e| error_chain(&e))?;
    if answer.status() != StatusCode::OK {
        return Err(format!("answered {}", answer.status()));
    }
    let content_type = answer
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !content_type.starts_with("text/plain") {
        return Err(format!(
            "answered {content_type:?}, not the Prometheus text format (is this the exporter?)"
        ));
    }
    let body = Limited::new(answer.into_body(), MAX_METRICS_BYTES)
        .collect()
        .await
        .map_err(|e| error_chain(&*e))?
        .to_bytes();
    String::from_utf8(body.to_vec()).map_err(|e| e.to_string())
}

/// An error and its causes, `: `-separated (hyper's own text is only "client error").
fn error_chain(e: &dyn StdError) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = "\
# HELP edgevol_pool_total_bytes Pool size.
# TYPE edgevol_pool_total_bytes gauge
edgevol_pool_total_bytes 17179869184
# HELP edgevol_csi_calls_total Calls.
# TYPE edgevol_csi_calls_total counter
edgevol_csi_calls_total{method=\"CreateVolume\",code=\"OK\"} 2
edgevol_csi_calls_total{method=\"Probe\",code=\"OK\"} 3
# HELP edgevol_csi_call_duration_seconds Latency.
# TYPE edgevol_csi_call_duration_seconds histogram
edgevol_csi_call_duration_seconds_bucket{method=\"Probe\",le=\"0.001\"} 3
edgevol_csi_call_duration_seconds_bucket{method=\"Probe\",le=\"+Inf\"} 3
edgevol_csi_call_duration_seconds_count{method=\"Probe\"} 3
# HELP edgevol_volume_host_controllers Controllers by host.
# TYPE edgevol_volume_host_controllers gauge
edgevol_volume_host_controllers{volume_id=\"box:v1\",host_nqn=\"nqn.2014-08.org.nvmexpress:uuid:b\"} 2
edgevol_volume_host_controllers{volume_id=\"box:v1\",host_nqn=\"nqn.2014-08.org.nvmexpress:uuid:a\"} 1
edgevol_volume_host_controllers{volume_id=\"box:v2\",host_nqn=\"nqn.2014-08.org.nvmexpress:uuid:a\"} 1
";

    #[test]
    fn samples_are_found_by_name_and_labels() {
        let m = Metrics::parse(SCRAPE).unwrap();
        assert_eq!(
            m.get("edgevol_pool_total_bytes", &[]),
            Some(17_179_869_184.0)
        );
        assert_eq!(
            m.get("edgevol_csi_calls_total", &[("method", "Probe")]),
            Some(3.0)
        );
        assert_eq!(
            m.get("edgevol_csi_calls_total", &[("method", "DeleteVolume")]),
            None
        );
        assert_eq!(m.get("edgevol_nvme_temperature_celsius", &[]), None);
        assert!(m.has_family("edgevol_volume_host_controllers"));
        assert!(!m.has_family("edgevol_nvme_temperature_celsius"));
    }

    #[test]
    fn connected_hosts_are_the_nqns_with_controllers_on_the_volume() {
        let m = Metrics::parse(SCRAPE).unwrap();
        let hosts = m.connected_hosts("box:v1").unwrap();
        assert_eq!(
            hosts.into_iter().collect::<Vec<_>>(),
            [
                "nqn.2014-08.org.nvmexpress:uuid:a",
                "nqn.2014-08.org.nvmexpress:uuid:b"
            ]
        );
        assert_eq!(m.connected_hosts("box:v9"), Some(BTreeSet::new()));
        // An exporter without the gauge says nothing about hosts: unknown, not "none".
        let old = Metrics::parse("edgevol_pool_total_bytes 1\n").unwrap();
        assert_eq!(old.connected_hosts("box:v1"), None);
    }

    #[test]
    fn an_answer_without_samples_is_an_error() {
        assert!(Metrics::parse("").is_err());
        assert!(Metrics::parse("<html><body>login</body></html>\n").is_err());
    }
}
