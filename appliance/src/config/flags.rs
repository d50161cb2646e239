//! `edgevold`'s command line: each flag overrides the same setting of the config file.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::Parser;

use super::checks::check_segment;

/// Command-line flags of `edgevold`. Each overrides the same setting of the config file.
#[derive(Debug, Parser, Default)]
#[command(
    name = "edgevold",
    version,
    about = "edgevol appliance daemon: CSI over mTLS",
    // Daemon flags and a command never mix: `edgevold --dev format` is an error, not a guess.
    args_conflicts_with_subcommands = true
)]
pub struct Args {
    /// An operator command to run instead of the daemon.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// TOML configuration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// First-run default: a sparse file pool and a generated dev PKI under the data dir.
    #[arg(long)]
    pub dev: bool,
    /// State directory (PKI defaults, appliance id, dev pool). Default ./edgevol-dev with --dev.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Address of the CSI endpoint (TCP, mutual TLS).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// A block device or pool file; repeat for several.
    #[arg(long = "device")]
    pub devices: Vec<PathBuf>,
    /// CA certificate that client certificates must chain to.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// The server's certificate.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// The server's private key.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// This appliance's id: 1-32 of [a-z0-9-]; stable, it names volumes and NVMe subsystems.
    #[arg(long)]
    pub appliance_id: Option<String>,
    /// An extra topology segment KEY=VALUE; repeat for several.
    #[arg(long = "topology", value_parser = parse_segment)]
    pub topology: Vec<(String, String)>,
    /// Address of the Prometheus exporter (plain HTTP, GET /metrics), or `off`. Default: off,
    /// or 127.0.0.1:9501 with --dev (skipped with a warning if that port is taken).
    #[arg(long, value_parser = parse_metrics_listen)]
    pub metrics_listen: Option<MetricsListen>,
    /// Address of the NVMe/TCP target (discovery and I/O). Default 0.0.0.0:4420
    /// (127.0.0.1:4420 with --dev).
    #[arg(long)]
    pub nvme_listen: Option<SocketAddr>,
    /// The address hosts connect to, given in publish_context and discovery log entries.
    /// Default: the listen address, which must then not be 0.0.0.0 or ::.
    #[arg(long)]
    pub nvme_advertise: Option<IpAddr>,
    /// Format a blank device (first MiB all zero, no partition table or filesystem signature)
    /// instead of refusing it: an appliance's first boot on a new drive. Never formats over data.
    #[arg(long)]
    pub format_blank: bool,
    /// Milliseconds between syncs that make unflushed writes durable against a power cut: the
    /// most a power cut can take of what hosts never flushed (default 1000).
    #[arg(long, value_name = "MS")]
    pub sync_interval_ms: Option<u64>,
    /// Let hosts that hold no DH-HMAC-CHAP keys connect without authenticating (true|false;
    /// default false). Anyone on the storage network who sends a published node's NQN then gets
    /// that node's volumes: for migrations and labs only. Logged as a warning at start.
    #[arg(long, value_name = "BOOL")]
    pub nvme_allow_unauthenticated_hosts: Option<bool>,
}

/// Operator commands of `edgevold`; without one it runs the daemon.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Format a device as a new, empty pool, deallocating (discarding) its data area. Offline:
    /// refused while a daemon holds the device.
    Format(crate::format::FormatArgs),
}

/// `--metrics-listen`: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsListen {
    /// No exporter.
    Off,
    /// Listen here (port 0 picks a free port: tests).
    At(SocketAddr),
}

pub(super) fn parse_metrics_listen(s: &str) -> Result<MetricsListen, String> {
    if s == "off" {
        return Ok(MetricsListen::Off);
    }
    s.parse()
        .map(MetricsListen::At)
        .map_err(|e| format!("metrics listen {s:?}: {e} (expected HOST:PORT or off)"))
}

fn parse_segment(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("topology segment {s:?}: expected KEY=VALUE"))?;
    check_segment(k, v).map_err(|e| e.0)?;
    Ok((k.to_owned(), v.to_owned()))
}
