//! `edgevol status`, `edgevol volumes`, `edgevol snapshots`: what an operator reads off an
//! appliance, over mTLS with an observer certificate.
//!
//! Everything comes from CSI calls the observer role may make (GetPluginInfo, Probe,
//! GetCapacity, ListVolumes, ListSnapshots; [`listing`]), except what CSI has no call for: the
//! pool's total/used split, device health and the hosts connected to each volume. Those come
//! from the appliance's Prometheus exporter when `--metrics HOST:PORT` is given ([`exporter`]),
//! and are shown as unknown, or left out, otherwise. (An extra admin RPC would duplicate the
//! exporter and widen the observer role's policy.) [`render`] writes the tables.

pub mod diff;
pub mod exporter;
pub mod listing;
pub mod render;
pub mod units;

use std::sync::Arc;
use std::time::Duration;

use edgevol_pki::client::MtlsTarget;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::{GetCapacityRequest, GetPluginInfoRequest, ProbeRequest};
use tokio_rustls::rustls::ClientConfig;
use tonic::transport::Channel;

pub use exporter::{fetch_metrics, Metrics};
pub use listing::{snapshots, volumes, SnapshotRow, VolumeRow};
pub use render::{render_snapshots, render_status, render_volumes, table};
pub use units::{gauge_bytes, human_bytes, utc};

/// Time allowed to connect and handshake with the appliance.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A gRPC channel to the appliance at `address` (`HOST:PORT`) over mutual TLS, its certificate
/// verified as `server_name` or else as HOST.
pub async fn connect(
    address: &str,
    server_name: Option<&str>,
    tls: Arc<ClientConfig>,
) -> Result<Channel, String> {
    MtlsTarget::new(address, server_name, tls)
        .map_err(|e| e.to_string())?
        .channel(CONNECT_TIMEOUT, None)
        .await
        .map_err(|e| format!("appliance {address}: {e}"))
}

pub(crate) fn call_err(what: &str) -> impl Fn(tonic::Status) -> String + '_ {
    move |s| format!("{what}: {:?}: {}", s.code(), s.message())
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
