//! `edgevol status`, `edgevol volumes`, `edgevol snapshots`: what an operator reads off an
//! appliance, over mTLS with an observer certificate.
//!
//! Everything comes from CSI calls the observer role may make (GetPluginInfo, Probe,
//! GetCapacity, ListVolumes, ListSnapshots), except what CSI has no call for: the pool's
//! total/used split, device health and connected NVMe hosts. Those come from the appliance's
//! Prometheus exporter when `--metrics HOST:PORT` is given, and are shown as unknown otherwise.
//! (An extra admin RPC would duplicate the exporter and widen the observer role's policy.)

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::volume_content_source::Type as Source;
use edgevol_proto::csi::v1::{
    GetCapacityRequest, GetPluginInfoRequest, ListSnapshotsRequest, ListVolumesRequest,
    ProbeRequest,
};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

use crate::proxy::{Upstream, CONNECT_TIMEOUT};

/// Entries asked for per List call.
const PAGE: i32 = 1000;
/// Largest /metrics answer accepted.
const MAX_METRICS_BYTES: u64 = 64 << 20;

/// A gRPC channel to the appliance over mutual TLS.
pub async fn connect(
    address: &str,
    server_name: Option<&str>,
    tls: Arc<ClientConfig>,
) -> Result<Channel, String> {
    let upstream = Upstream::new(address, server_name, tls)?;
    let addr = upstream.address.clone();
    Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(CONNECT_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_| {
            let (addr, upstream) = (addr.clone(), upstream.clone());
            async move {
                let tcp = TcpStream::connect(&addr).await?;
                tcp.set_nodelay(true)?;
                let stream = TlsConnector::from(upstream.tls)
                    .connect(upstream.server_name, tcp)
                    .await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| format!("appliance {address}: {}", source_chain(&e)))
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let _ = write!(text, ": {s}");
        cur = s.source();
    }
    text
}

pub(crate) fn call_err(what: &str) -> impl Fn(tonic::Status) -> String + '_ {
    move |s| format!("{what}: {:?}: {}", s.code(), s.message())
}

/// One volume, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRow {
    /// CSI volume id.
    pub id: String,
    /// Size in bytes.
    pub size: i64,
    /// The snapshot or volume it was created from, if any.
    pub source: Option<String>,
    /// Nodes (host NQNs) it is published to.
    pub published: Vec<String>,
    /// `ok`, or the abnormal condition's message.
    pub condition: String,
    /// The Kubernetes claim (`namespace/name`) and PV it was provisioned for, when the CO sent
    /// that metadata (external-provisioner's `--extra-create-metadata`).
    pub claim: Option<String>,
    /// The Kubernetes PersistentVolume name, likewise.
    pub pv: Option<String>,
}

/// The claim (`namespace/name`) and PV name in a volume's context (its CreateVolume
/// parameters, which the appliance returns as volume_context).
fn k8s_names(context: &HashMap<String, String>) -> (Option<String>, Option<String>) {
    let get = |k: &str| context.get(k).filter(|v| !v.is_empty()).cloned();
    let claim = match (
        get("csi.storage.k8s.io/pvc/namespace"),
        get("csi.storage.k8s.io/pvc/name"),
    ) {
        (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
        (None, Some(name)) => Some(name),
        _ => None,
    };
    (claim, get("csi.storage.k8s.io/pv/name"))
}

/// One snapshot, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRow {
    /// CSI snapshot id.
    pub id: String,
    /// The volume it froze.
    pub source: String,
    /// Size in bytes.
    pub size: i64,
    /// Creation time, seconds since the epoch.
    pub created: i64,
    /// Ready to use.
    pub ready: bool,
    /// The group snapshot it belongs to, if any.
    pub group: Option<String>,
}

/// Every volume (all pages).
pub async fn volumes(channel: &Channel) -> Result<Vec<VolumeRow>, String> {
    let mut client = ControllerClient::new(channel.clone());
    let mut rows = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_volumes(ListVolumesRequest {
                max_entries: PAGE,
                starting_token: token,
            })
            .await
            .map_err(call_err("ListVolumes"))?
            .into_inner();
        for entry in page.entries {
            let Some(v) = entry.volume else { continue };
            let status = entry.status.unwrap_or_default();
            let condition = match status.volume_condition {
                Some(c) if c.abnormal => format!("ABNORMAL: {}", c.message),
                _ => "ok".into(),
            };
            let (claim, pv) = k8s_names(&v.volume_context);
            rows.push(VolumeRow {
                id: v.volume_id,
                size: v.capacity_bytes,
                source: v.content_source.and_then(|s| s.r#type).map(|t| match t {
                    Source::Snapshot(s) => format!("snapshot {}", s.snapshot_id),
                    Source::Volume(v) => format!("volume {}", v.volume_id),
                }),
                published: status.published_node_ids,
                condition,
                claim,
                pv,
            });
        }
        if page.next_token.is_empty() {
            return Ok(rows);
        }
        token = page.next_token;
    }
}

/// Every snapshot (all pages).
pub async fn snapshots(channel: &Channel) -> Result<Vec<SnapshotRow>, String> {
    let mut client = ControllerClient::new(channel.clone());
    let mut rows = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_snapshots(ListSnapshotsRequest {
                max_entries: PAGE,
                starting_token: token,
                ..Default::default()
            })
            .await
            .map_err(call_err("ListSnapshots"))?
            .into_inner();
        for entry in page.entries {
            let Some(s) = entry.snapshot else { continue };
            rows.push(SnapshotRow {
                id: s.snapshot_id,
                source: s.source_volume_id,
                size: s.size_bytes,
                created: s.creation_time.map_or(0, |t| t.seconds),
                ready: s.ready_to_use,
                group: (!s.group_snapshot_id.is_empty()).then_some(s.group_snapshot_id),
            });
        }
        if page.next_token.is_empty() {
            return Ok(rows);
        }
        token = page.next_token;
    }
}

/// What `edgevol status` shows.
#[derive(Debug, Clone)]
pub struct StatusReport {
    /// Plugin name and version (GetPluginInfo).
    pub plugin: (String, String),
    /// Probe's readiness.
    pub ready: bool,
    /// GetCapacity: bytes available for new volumes.
    pub available: i64,
    /// The volumes.
    pub volumes: Vec<VolumeRow>,
    /// Number of snapshots.
    pub snapshots: usize,
    /// From the exporter, if asked for.
    pub metrics: Option<Result<Metrics, String>>,
}

/// Gathers the status; `metrics` is the exporter's `HOST:PORT`, if known.
pub async fn status(channel: &Channel, metrics: Option<&str>) -> Result<StatusReport, String> {
    let mut identity = IdentityClient::new(channel.clone());
    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .map_err(call_err("GetPluginInfo"))?
        .into_inner();
    let ready = identity
        .probe(ProbeRequest {})
        .await
        .map_err(call_err("Probe"))?
        .into_inner()
        .ready
        .unwrap_or(true);
    let mut controller = ControllerClient::new(channel.clone());
    let (available, volumes, snapshots) = if ready {
        let available = controller
            .get_capacity(GetCapacityRequest::default())
            .await
            .map_err(call_err("GetCapacity"))?
            .into_inner()
            .available_capacity;
        (
            available,
            volumes(channel).await?,
            snapshots(channel).await?.len(),
        )
    } else {
        (0, Vec::new(), 0)
    };
    let metrics = match metrics {
        Some(addr) => Some(fetch_metrics(addr).await),
        None => None,
    };
    Ok(StatusReport {
        plugin: (info.name, info.vendor_version),
        ready,
        available,
        volumes,
        snapshots,
        metrics,
    })
}

/// One exported sample: its labels and value.
pub type Sample = (BTreeMap<String, String>, f64);

/// The exporter's samples: `name -> [(labels, value)]`.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    samples: BTreeMap<String, Vec<Sample>>,
}

impl Metrics {
    /// Parses a Prometheus text exposition (comments skipped, escapes undone).
    pub fn parse(text: &str) -> Result<Metrics, String> {
        let mut samples: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || format!("metrics line {}: cannot parse {line:?}", n + 1);
            let (name, labels, rest) = match line.find('{') {
                Some(open) => {
                    let (labels, rest) = parse_labels(&line[open + 1..]).ok_or_else(bad)?;
                    (&line[..open], labels, rest)
                }
                None => {
                    let (name, rest) = line.split_once(' ').ok_or_else(bad)?;
                    (name, BTreeMap::new(), rest)
                }
            };
            let value = rest.split_whitespace().next().ok_or_else(bad)?;
            let value = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().map_err(|_| bad())?,
            };
            samples
                .entry(name.to_owned())
                .or_default()
                .push((labels, value));
        }
        Ok(Metrics { samples })
    }

    /// The value of `name` whose labels include every pair of `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.all(name)
            .iter()
            .find(|(l, _)| {
                labels
                    .iter()
                    .all(|(k, v)| l.get(*k).is_some_and(|x| x == v))
            })
            .map(|(_, v)| *v)
    }

    /// Every sample of `name`.
    pub fn all(&self, name: &str) -> &[Sample] {
        self.samples.get(name).map_or(&[], Vec::as_slice)
    }
}

/// Parses `k="v",k2="v2"} rest`; returns the labels and what follows the brace.
fn parse_labels(s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    let mut rest = s.trim_start();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim().to_owned(), value);
        rest = after[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
}

/// GETs `http://ADDR/metrics` (plain HTTP/1.0: one request, the answer ends with the
/// connection) and parses it.
pub async fn fetch_metrics(addr: &str) -> Result<Metrics, String> {
    let err = |e: &dyn std::fmt::Display| format!("metrics {addr}: {e}");
    let fetch = async {
        let mut tcp = TcpStream::connect(addr).await.map_err(|e| err(&e))?;
        let request =
            format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\nAccept: text/plain\r\n\r\n");
        tcp.write_all(request.as_bytes())
            .await
            .map_err(|e| err(&e))?;
        let mut body = Vec::new();
        tcp.take(MAX_METRICS_BYTES)
            .read_to_end(&mut body)
            .await
            .map_err(|e| err(&e))?;
        Ok::<_, String>(body)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .map_err(|_| err(&"timed out"))??;
    let text = String::from_utf8(raw).map_err(|e| err(&e))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| err(&"no HTTP header"))?;
    let status = head.lines().next().unwrap_or("");
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(err(&format!("answered {status:?}")));
    }
    Metrics::parse(body)
}

/// `1.5 GiB`-style sizes.
pub fn human_bytes(bytes: i64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = 0;
    let mut whole = bytes.unsigned_abs();
    let mut rem = 0;
    while whole >= 1024 && unit + 1 < UNITS.len() {
        rem = whole % 1024;
        whole /= 1024;
        unit += 1;
    }
    let sign = if bytes < 0 { "-" } else { "" };
    if unit == 0 || whole >= 100 {
        format!("{sign}{whole} {}", UNITS[unit])
    } else {
        // One decimal, truncated: 1.5 GiB, never a rounded-up figure.
        format!("{sign}{whole}.{} {}", rem * 10 / 1024, UNITS[unit])
    }
}

/// A byte gauge of the exporter (an integer below 2^53, written as a float) as a size.
#[allow(clippy::cast_possible_truncation)] // exact: byte counts of a pool are far below 2^53
pub fn gauge_bytes(value: f64) -> String {
    human_bytes(value as i64)
}

/// A plain text table: a header row, left-aligned columns two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let _ = write!(text, "{cell:<w$}");
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn utc(seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let secs = seconds.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

fn connected_hosts(metrics: Option<&Metrics>, volume: &str) -> String {
    match metrics.and_then(|m| m.get("edgevol_volume_connected_hosts", &[("volume_id", volume)])) {
        Some(n) => format!("{n}"),
        None if metrics.is_some() => "0".into(),
        None => "?".into(),
    }
}

/// The `edgevol volumes` table. CONNECTED is `?` without metrics.
pub fn render_volumes(rows: &[VolumeRow], metrics: Option<&Metrics>) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|v| {
            vec![
                v.id.clone(),
                human_bytes(v.size),
                v.source.clone().unwrap_or_else(|| "-".into()),
                if v.published.is_empty() {
                    "-".into()
                } else {
                    v.published.join(",")
                },
                connected_hosts(metrics, &v.id),
                v.claim.clone().unwrap_or_else(|| "-".into()),
                v.pv.clone().unwrap_or_else(|| "-".into()),
                v.condition.clone(),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "VOLUME",
            "SIZE",
            "SOURCE",
            "PUBLISHED TO",
            "CONNECTED",
            "CLAIM",
            "PV",
            "CONDITION",
        ],
        &cells,
    );
    let _ = writeln!(out, "{} volume(s)", rows.len());
    out
}

/// The `edgevol snapshots` table.
pub fn render_snapshots(rows: &[SnapshotRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.source.clone(),
                human_bytes(s.size),
                utc(s.created),
                if s.ready { "yes" } else { "no" }.into(),
                s.group.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "SNAPSHOT",
            "SOURCE VOLUME",
            "SIZE",
            "CREATED (UTC)",
            "READY",
            "GROUP SNAPSHOT",
        ],
        &cells,
    );
    let _ = writeln!(out, "{} snapshot(s)", rows.len());
    out
}

/// The `edgevol status` text.
pub fn render_status(s: &StatusReport) -> String {
    let mut out = String::new();
    let (metrics, metrics_note) = match &s.metrics {
        Some(Ok(m)) => (Some(m), None),
        Some(Err(e)) => (None, Some(format!("unknown ({e})"))),
        None => (None, Some("unknown (pass --metrics HOST:PORT)".to_owned())),
    };
    let unknown = || metrics_note.clone().unwrap_or_else(|| "unknown".into());
    let _ = writeln!(out, "appliance   {} {}", s.plugin.0, s.plugin.1);
    if let Some(m) = metrics {
        if let Some((labels, _)) = m.all("edgevol_build_info").first() {
            if let Some(id) = labels.get("appliance") {
                let _ = writeln!(out, "id          {id}");
            }
        }
    }
    let _ = writeln!(
        out,
        "ready       {}",
        if s.ready { "yes" } else { "no (pool opening)" }
    );
    let gauge = |name: &str| metrics.and_then(|m| m.get(name, &[])).map(gauge_bytes);
    let _ = writeln!(out, "\npool");
    let rows = vec![
        vec![
            "available".into(),
            human_bytes(s.available),
            "GetCapacity: free for new volumes".into(),
        ],
        vec![
            "total".into(),
            gauge("edgevol_pool_total_bytes").unwrap_or_else(unknown),
            String::new(),
        ],
        vec![
            "used".into(),
            gauge("edgevol_pool_used_bytes").unwrap_or_else(unknown),
            String::new(),
        ],
        vec![
            "reserved".into(),
            gauge("edgevol_pool_reserved_bytes").unwrap_or_else(unknown),
            "thick volumes' unwritten clusters".into(),
        ],
    ];
    out.push_str(&indent(&table(&["", "", ""], &rows)));
    let _ = writeln!(out, "\nhealth");
    match metrics {
        None => {
            let _ = writeln!(out, "  {}", unknown());
        }
        Some(m) => {
            let pool = match m.get("edgevol_pool_healthy", &[]) {
                Some(1.0) => "healthy",
                Some(_) => "FAILED (device error; restart the appliance)",
                None => "unknown",
            };
            let _ = writeln!(out, "  pool      {pool}");
            for (labels, _) in m.all("edgevol_pool_device_info") {
                let device = labels.get("device").map_or("?", String::as_str);
                let kind = labels.get("kind").map_or("?", String::as_str);
                let l = [("device", device)];
                let line = if m.get("edgevol_nvme_smart_available", &l) == Some(1.0) {
                    let v = |n: &str| {
                        m.get(n, &l)
                            .map_or_else(|| "?".to_owned(), |v| format!("{v}"))
                    };
                    format!(
                        "NVMe: {} C, {}% used, {} media errors, spare {}%, critical warning {}",
                        v("edgevol_nvme_temperature_celsius"),
                        v("edgevol_nvme_percentage_used"),
                        v("edgevol_nvme_media_errors_total"),
                        v("edgevol_nvme_available_spare_percent"),
                        v("edgevol_nvme_critical_warning"),
                    )
                } else if kind == "nvme" {
                    "NVMe SMART log unreadable".to_owned()
                } else {
                    format!("{kind} device: no SMART log")
                };
                let _ = writeln!(out, "  device    {device}: {line}");
            }
        }
    }
    let published = s.volumes.iter().filter(|v| !v.published.is_empty()).count();
    let abnormal = s.volumes.iter().filter(|v| v.condition != "ok").count();
    let _ = writeln!(
        out,
        "\nvolumes     {} ({published} published, {abnormal} abnormal)\nsnapshots   {}",
        s.volumes.len(),
        s.snapshots
    );
    let _ = writeln!(out, "\nconnected hosts");
    match metrics {
        None => {
            let _ = writeln!(out, "  {}", unknown());
        }
        Some(m) => {
            let rows: Vec<Vec<String>> = m
                .all("edgevol_volume_connected_hosts")
                .iter()
                .filter(|(_, n)| *n > 0.0)
                .map(|(l, n)| {
                    vec![
                        l.get("volume_id").cloned().unwrap_or_default(),
                        format!("{n}"),
                    ]
                })
                .collect();
            if rows.is_empty() {
                let _ = writeln!(out, "  none");
            } else {
                out.push_str(&indent(&table(&["VOLUME", "HOSTS"], &rows)));
            }
        }
    }
    out
}

fn indent(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| format!("  {l}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_exposition_format() {
        let m = Metrics::parse(
            "# HELP x y\n# TYPE x gauge\nx 3\nv{volume_id=\"a\\\"b\",op=\"read\"} 7\nh_bucket{le=\"+Inf\"} 2\n",
        )
        .unwrap();
        assert_eq!(m.get("x", &[]), Some(3.0));
        assert_eq!(m.get("v", &[("volume_id", "a\"b")]), Some(7.0));
        assert_eq!(m.get("v", &[("op", "write")]), None);
        assert_eq!(m.get("h_bucket", &[("le", "+Inf")]), Some(2.0));
        assert!(Metrics::parse("x{a=\"1\" 3").is_err());
    }

    #[test]
    fn kubernetes_names_come_from_the_volume_context() {
        let ctx = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            k8s_names(&ctx(&[
                ("csi.storage.k8s.io/pvc/name", "data"),
                ("csi.storage.k8s.io/pvc/namespace", "shop"),
                ("csi.storage.k8s.io/pv/name", "pvc-1234"),
                ("provisioning", "thin"),
            ])),
            (Some("shop/data".into()), Some("pvc-1234".into()))
        );
        assert_eq!(k8s_names(&ctx(&[("provisioning", "thin")])), (None, None));
    }

    #[test]
    fn sizes_dates_and_tables() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536 << 20), "1.5 GiB");
        assert_eq!(human_bytes(16 << 30), "16.0 GiB");
        assert_eq!(human_bytes(200 << 20), "200 MiB");
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_709_251_199), "2024-02-29 23:59:59");
        assert_eq!(
            table(&["A", "LONG"], &[vec!["xyz".into(), "1".into()]]),
            "A    LONG\nxyz  1\n"
        );
    }
}
