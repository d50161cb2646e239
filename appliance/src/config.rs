//! The daemon's configuration: a TOML file (`--config`) overridden by flags, resolved once at
//! start into a [`Config`] whose every path and value has been checked.

use edgevol_nvmeof::auth::{DhGroup, HashId, TargetConfig};
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

/// The topology key every appliance sets to its id, so a CO can address one box of a fleet.
pub const TOPOLOGY_KEY: &str = "edgevol.io/appliance";
/// Where the CSI endpoint listens unless told otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9500";
/// The data directory of `--dev` unless `--data-dir` says otherwise.
pub const DEFAULT_DEV_DIR: &str = "./edgevol-dev";
/// The conventional NVMe/TCP port.
pub const NVME_PORT: u16 = 4420;
/// Where the metrics exporter listens in dev mode unless told otherwise.
pub const DEV_METRICS_LISTEN: &str = "127.0.0.1:9501";
/// Size of the sparse file pool `--dev` creates.
pub const DEV_POOL_BYTES: u64 = 16 << 30;

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

/// The config file. Relative paths are relative to the file's directory.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    appliance_id: Option<String>,
    listen: Option<SocketAddr>,
    metrics: Option<FileMetrics>,
    data_dir: Option<PathBuf>,
    #[serde(default)]
    devices: Vec<PathBuf>,
    tls: Option<FileTls>,
    #[serde(default)]
    topology: BTreeMap<String, String>,
    nvme: Option<FileNvme>,
    #[serde(default)]
    format_blank: bool,
    sync_interval_ms: Option<u64>,
    firmware: Option<FileFirmware>,
}

/// `[firmware]`: present on an appliance image, absent elsewhere (no firmware service then).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFirmware {
    boot_dir: Option<PathBuf>,
    public_key: Option<PathBuf>,
    version_file: Option<PathBuf>,
    cmdline: Option<PathBuf>,
    health_secs: Option<u64>,
    watchdog: Option<String>,
    reboot_command: Option<Vec<String>>,
}

/// Firmware management (the A/B slots on the boot partition), from `[firmware]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirmwareConfig {
    /// Where the boot partition is mounted (`/boot`).
    pub boot_dir: PathBuf,
    /// The bundle verification key baked into the image.
    pub public_key: PathBuf,
    /// The running firmware's version, baked into the image.
    pub version_file: PathBuf,
    /// The kernel command line (`edgevol.slot=`).
    pub cmdline: PathBuf,
    /// How long a trial boot must stay healthy before it is kept (`health_secs`).
    pub health_hold: Duration,
    /// The watchdog device, or `None` (`watchdog = "off"`).
    pub watchdog: Option<PathBuf>,
    /// How to reboot (program and arguments).
    pub reboot_command: Vec<String>,
}

/// Default of `firmware.health_secs`.
pub const DEFAULT_HEALTH_SECS: u64 = 60;

impl FileFirmware {
    fn resolve(self, rel: impl Fn(PathBuf) -> PathBuf) -> Result<FirmwareConfig, ConfigError> {
        let health_secs = self.health_secs.unwrap_or(DEFAULT_HEALTH_SECS);
        if !(1..=3600).contains(&health_secs) {
            return Err(ConfigError(format!(
                "firmware.health_secs = {health_secs}: must be 1 to 3600"
            )));
        }
        let reboot_command = self
            .reboot_command
            .unwrap_or_else(|| vec!["reboot".into(), "-f".into()]);
        if reboot_command.is_empty() {
            return Err(ConfigError("firmware.reboot_command is empty".into()));
        }
        let path = |p: Option<PathBuf>, default: &str| rel(p.unwrap_or_else(|| default.into()));
        Ok(FirmwareConfig {
            boot_dir: path(self.boot_dir, "/boot"),
            public_key: path(self.public_key, "/etc/edgevol/firmware-signing.pub"),
            version_file: path(self.version_file, "/etc/edgevol/firmware-version"),
            cmdline: path(self.cmdline, "/proc/cmdline"),
            health_hold: Duration::from_secs(health_secs),
            watchdog: match self.watchdog.as_deref() {
                Some("off") => None,
                Some(p) => Some(rel(p.into())),
                None => Some("/dev/watchdog".into()),
            },
            reboot_command,
        })
    }
}

/// `[metrics] listen = "ADDR"` or `"off"`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileMetrics {
    listen: Option<String>,
}

/// `--metrics-listen`: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsListen {
    /// No exporter.
    Off,
    /// Listen here (port 0 picks a free port: tests).
    At(SocketAddr),
}

fn parse_metrics_listen(s: &str) -> Result<MetricsListen, String> {
    if s == "off" {
        return Ok(MetricsListen::Off);
    }
    s.parse()
        .map(MetricsListen::At)
        .map_err(|e| format!("metrics listen {s:?}: {e} (expected HOST:PORT or off)"))
}

/// Where the Prometheus exporter listens.
///
/// Off by default on an appliance: the exporter speaks plain HTTP without authentication, so
/// exposing it is a deliberate choice (bind it to the management network). Dev mode turns it on
/// at [`DEV_METRICS_LISTEN`], on loopback only; since several dev daemons may run side by side
/// (tests), that default is skipped with a warning if the port is taken, while an address that
/// was asked for must bind or the daemon does not start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetricsConfig {
    /// The address, or `None`: no exporter.
    pub listen: Option<SocketAddr>,
    /// Whether a failure to bind only warns (the dev default).
    pub best_effort: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileNvme {
    listen: Option<SocketAddr>,
    advertise: Option<IpAddr>,
    io_threads: Option<usize>,
    allow_unauthenticated_hosts: Option<bool>,
    auth_hashes: Option<Vec<String>>,
    auth_dh_groups: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTls {
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

/// Server TLS files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPaths {
    /// CA that client certificates must chain to.
    pub ca: PathBuf,
    /// The server certificate.
    pub cert: PathBuf,
    /// The server key.
    pub key: PathBuf,
}

/// Where the NVMe/TCP target listens, and the address hosts are told to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmeConfig {
    /// Listen address (port 0 picks a free port: tests).
    pub listen: SocketAddr,
    /// Address for publish_context and discovery log pages.
    pub advertise: IpAddr,
    /// Threads I/O queues run on (`nvme.io_threads`); 0: one per core.
    pub io_threads: usize,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Development mode: create what is missing under the data dir.
    pub dev: bool,
    /// The appliance id, if configured; otherwise read from or generated into the data dir.
    pub appliance_id: Option<String>,
    /// The CSI endpoint.
    pub listen: SocketAddr,
    /// The Prometheus exporter.
    pub metrics: MetricsConfig,
    /// The state directory.
    pub data_dir: PathBuf,
    /// The pool's devices.
    pub devices: Vec<PathBuf>,
    /// The server's TLS files.
    pub tls: TlsPaths,
    /// Extra topology segments (the appliance segment is always added).
    pub topology: BTreeMap<String, String>,
    /// The NVMe/TCP target.
    pub nvme: NvmeConfig,
    /// Format a blank device instead of refusing it (`--format-blank`).
    pub format_blank: bool,
    /// The power-loss window: how often unflushed writes are made durable (`sync_interval_ms`).
    pub sync_interval: Duration,
    /// Who must authenticate on the data path (`nvme.allow_unauthenticated_hosts`).
    pub host_auth: HostAuthPolicy,
    /// Firmware management, if `[firmware]` is configured.
    pub firmware: Option<FirmwareConfig>,
}

/// Who must authenticate (DH-HMAC-CHAP) on the NVMe/TCP data path, and with what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAuthPolicy {
    /// Whether a host whose NQN holds no keys (never enrolled, or revoked) may connect without
    /// authenticating. Off by default: every host authenticates. A host that holds keys always
    /// authenticates, whatever this says.
    pub allow_unauthenticated_hosts: bool,
    /// Hashes the target accepts, most preferred first (`nvme.auth_hashes`).
    pub hashes: Vec<HashId>,
    /// DH groups the target accepts, most preferred first (`nvme.auth_dh_groups`).
    pub dh_groups: Vec<DhGroup>,
}

impl Default for HostAuthPolicy {
    /// Authentication required; every hash (SHA-256 first) and every DH group (ffdhe2048 first,
    /// null last: a host that offers a group gets its forward secrecy).
    fn default() -> Self {
        let defaults = TargetConfig::new("-", "-", Vec::new());
        HostAuthPolicy {
            allow_unauthenticated_hosts: false,
            hashes: defaults.hashes,
            dh_groups: defaults.dh_groups,
        }
    }
}

/// Parses a non-empty list of names from `names` against the known `(name, value)`s.
fn parse_names<T: Copy>(
    key: &str,
    names: &[String],
    known: impl Iterator<Item = (&'static str, T)> + Clone,
) -> Result<Vec<T>, ConfigError> {
    if names.is_empty() {
        return Err(ConfigError(format!("{key} is empty")));
    }
    names
        .iter()
        .map(|n| {
            known
                .clone()
                .find(|(name, _)| name == n)
                .map(|(_, v)| v)
                .ok_or_else(|| {
                    let all: Vec<_> = known.clone().map(|(name, _)| name).collect();
                    ConfigError(format!("{key}: unknown {n:?} (known: {})", all.join(", ")))
                })
        })
        .collect()
}

impl HostAuthPolicy {
    /// What the daemon logs as a warning at start about this policy, if anything.
    pub fn warning(&self) -> Option<&'static str> {
        self.allow_unauthenticated_hosts.then_some(
            "nvme.allow_unauthenticated_hosts is on: hosts without DH-HMAC-CHAP keys connect \
             unauthenticated, so anyone on the storage network who sends a published node's \
             host NQN gets that node's volumes",
        )
    }
}

/// Default of `sync_interval_ms`: a power cut takes at most one second of unflushed writes,
/// like dm-thin's commit period.
pub const DEFAULT_SYNC_INTERVAL_MS: u64 = 1000;
/// Bounds of `sync_interval_ms`: below 10 ms the syncs cost more than they save; above a
/// minute the window is no longer a bound an operator can reason about.
const SYNC_INTERVAL_MS: std::ops::RangeInclusive<u64> = 10..=60_000;

/// A configuration error: one line naming the file, flag or value at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Resolves flags and the config file they name.
    pub fn from_args(args: Args) -> Result<Config, ConfigError> {
        let (file, base) = match &args.config {
            Some(path) => (read_file(path)?, parent_dir(path)),
            None => (FileConfig::default(), PathBuf::from(".")),
        };
        let rel = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };

        let data_dir = args
            .data_dir
            .or_else(|| file.data_dir.map(rel))
            .or_else(|| args.dev.then(|| PathBuf::from(DEFAULT_DEV_DIR)))
            .ok_or_else(|| {
                ConfigError(
                    "no data dir: pass --data-dir, set data_dir in the config, or use --dev".into(),
                )
            })?;
        let pki = data_dir.join("pki");
        let file_tls = file.tls.unwrap_or_default();
        let tls = TlsPaths {
            ca: args
                .tls_ca
                .or_else(|| file_tls.ca.map(rel))
                .unwrap_or_else(|| pki.join("ca.pem")),
            cert: args
                .tls_cert
                .or_else(|| file_tls.cert.map(rel))
                .unwrap_or_else(|| pki.join("server.pem")),
            key: args
                .tls_key
                .or_else(|| file_tls.key.map(rel))
                .unwrap_or_else(|| pki.join("server.key")),
        };
        let mut devices = if args.devices.is_empty() {
            file.devices.into_iter().map(rel).collect()
        } else {
            args.devices
        };
        if devices.is_empty() && args.dev {
            devices.push(data_dir.join("pool.img"));
        }
        if devices.is_empty() {
            return Err(ConfigError(
                "no device: pass --device, set devices in the config, or use --dev".into(),
            ));
        }
        let appliance_id = args.appliance_id.or(file.appliance_id);
        if let Some(id) = &appliance_id {
            check_appliance_id(id)?;
        }
        let mut topology = file.topology;
        topology.extend(args.topology);
        for (key, value) in &topology {
            check_segment(key, value)?;
        }
        if topology.contains_key(TOPOLOGY_KEY) {
            return Err(ConfigError(format!(
                "topology key {TOPOLOGY_KEY} is set by the appliance to its id; choose another key"
            )));
        }
        let file_nvme = file.nvme.unwrap_or_default();
        let nvme_listen = args.nvme_listen.or(file_nvme.listen).unwrap_or_else(|| {
            let ip = if args.dev {
                IpAddr::from([127, 0, 0, 1])
            } else {
                IpAddr::from([0, 0, 0, 0])
            };
            SocketAddr::new(ip, NVME_PORT)
        });
        let advertise = match args.nvme_advertise.or(file_nvme.advertise) {
            Some(ip) => ip,
            None if !nvme_listen.ip().is_unspecified() => nvme_listen.ip(),
            None => {
                return Err(ConfigError(format!(
                    "NVMe/TCP listens on {nvme_listen}: set nvme.advertise (--nvme-advertise) to the address hosts should connect to"
                )))
            }
        };
        if advertise.is_unspecified() {
            return Err(ConfigError(format!(
                "nvme advertise address {advertise} is not an address hosts can connect to"
            )));
        }
        let sync_ms = args
            .sync_interval_ms
            .or(file.sync_interval_ms)
            .unwrap_or(DEFAULT_SYNC_INTERVAL_MS);
        if !SYNC_INTERVAL_MS.contains(&sync_ms) {
            return Err(ConfigError(format!(
                "sync_interval_ms {sync_ms} is outside {}..={}",
                SYNC_INTERVAL_MS.start(),
                SYNC_INTERVAL_MS.end()
            )));
        }
        let defaults = HostAuthPolicy::default();
        let host_auth = HostAuthPolicy {
            allow_unauthenticated_hosts: args
                .nvme_allow_unauthenticated_hosts
                .or(file_nvme.allow_unauthenticated_hosts)
                .unwrap_or(false),
            hashes: match &file_nvme.auth_hashes {
                Some(names) => parse_names(
                    "nvme.auth_hashes",
                    names,
                    HashId::ALL.into_iter().map(|h| (h.name(), h)),
                )?,
                None => defaults.hashes,
            },
            dh_groups: match &file_nvme.auth_dh_groups {
                Some(names) => parse_names(
                    "nvme.auth_dh_groups",
                    names,
                    DhGroup::ALL.into_iter().map(|g| (g.name(), g)),
                )?,
                None => defaults.dh_groups,
            },
        };
        let file_metrics = match file.metrics.and_then(|m| m.listen) {
            Some(text) => Some(parse_metrics_listen(&text).map_err(ConfigError)?),
            None => None,
        };
        let metrics = match args.metrics_listen.or(file_metrics) {
            Some(MetricsListen::At(addr)) => MetricsConfig {
                listen: Some(addr),
                best_effort: false,
            },
            Some(MetricsListen::Off) => MetricsConfig::default(),
            None if args.dev => MetricsConfig {
                listen: Some(DEV_METRICS_LISTEN.parse().expect("valid default address")),
                best_effort: true,
            },
            None => MetricsConfig::default(),
        };
        let firmware_config = file.firmware.map(|f| f.resolve(rel)).transpose()?;
        Ok(Config {
            dev: args.dev,
            appliance_id,
            metrics,
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid default address")),
            data_dir,
            devices,
            tls,
            topology,
            nvme: NvmeConfig {
                listen: nvme_listen,
                advertise,
                io_threads: file_nvme.io_threads.unwrap_or(0),
            },
            format_blank: args.format_blank || file.format_blank,
            sync_interval: Duration::from_millis(sync_ms),
            host_auth,
            firmware: firmware_config,
        })
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("config {}: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| {
        // toml's message spans several lines (a source excerpt); keep the first for one clear line.
        let message = e
            .message()
            .lines()
            .next()
            .unwrap_or("invalid TOML")
            .to_owned();
        let at = e
            .span()
            .map(|span| {
                let line = text[..span.start].matches('\n').count() + 1;
                format!(" at line {line}")
            })
            .unwrap_or_default();
        ConfigError(format!("config {}{at}: {message}", path.display()))
    })
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Checks an appliance id: it becomes part of NVMe qualified names and a topology value.
pub fn check_appliance_id(id: &str) -> Result<(), ConfigError> {
    let ok = (1..=32).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.starts_with('-')
        && !id.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(ConfigError(format!(
            "appliance id {id:?}: use 1-32 of [a-z0-9-], not starting or ending with '-'"
        )))
    }
}

fn parse_segment(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("topology segment {s:?}: expected KEY=VALUE"))?;
    check_segment(k, v).map_err(|e| e.0)?;
    Ok((k.to_owned(), v.to_owned()))
}

/// CSI topology rules (as Kubernetes labels): key = optional DNS prefix + '/' + name of at most
/// 63 characters; value at most 63 characters; names and values start and end alphanumeric
/// and hold only `[-_.A-Za-z0-9]`.
fn check_segment(key: &str, value: &str) -> Result<(), ConfigError> {
    fn label(s: &str, may_be_empty: bool) -> bool {
        if s.is_empty() {
            return may_be_empty;
        }
        let b = s.as_bytes();
        s.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
    }
    let (prefix, name) = key.rsplit_once('/').unwrap_or(("", key));
    let prefix_ok = prefix.is_empty()
        || (prefix.len() <= 253 && prefix.split('.').all(|part| label(part, false)));
    if !(prefix_ok && label(name, false)) {
        return Err(ConfigError(format!(
            "topology key {key:?} is not a valid key"
        )));
    }
    if !label(value, true) {
        return Err(ConfigError(format!(
            "topology value {value:?} of {key:?} is not a valid value"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("edgevold.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn dev_defaults_live_under_the_data_dir() {
        let c = Config::from_args(Args {
            dev: true,
            ..Args::default()
        })
        .unwrap();
        let dir = PathBuf::from(DEFAULT_DEV_DIR);
        assert_eq!(c.data_dir, dir);
        assert_eq!(c.devices, vec![dir.join("pool.img")]);
        assert_eq!(c.tls.ca, dir.join("pki/ca.pem"));
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.nvme.listen.to_string(), "127.0.0.1:4420");
        assert_eq!(c.nvme.advertise.to_string(), "127.0.0.1");
    }

    #[test]
    fn metrics_are_on_in_dev_off_otherwise_and_configurable() {
        let dev = Config::from_args(Args {
            dev: true,
            ..Args::default()
        })
        .unwrap();
        assert_eq!(
            dev.metrics,
            MetricsConfig {
                listen: Some(DEV_METRICS_LISTEN.parse().unwrap()),
                best_effort: true
            }
        );
        let base = || Args {
            data_dir: Some("/tmp/x".into()),
            devices: vec!["/dev/nvme0n1".into()],
            nvme_advertise: Some("192.0.2.7".parse().unwrap()),
            ..Args::default()
        };
        assert_eq!(
            Config::from_args(base()).unwrap().metrics,
            MetricsConfig::default()
        );
        let flag = parse_metrics_listen("0.0.0.0:9100").unwrap();
        let c = Config::from_args(Args {
            metrics_listen: Some(flag),
            ..base()
        })
        .unwrap();
        assert_eq!(c.metrics.listen, Some("0.0.0.0:9100".parse().unwrap()));
        assert!(!c.metrics.best_effort, "an address asked for must bind");
        let off = Config::from_args(Args {
            dev: true,
            metrics_listen: Some(parse_metrics_listen("off").unwrap()),
            ..Args::default()
        })
        .unwrap();
        assert_eq!(off.metrics.listen, None);
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "[metrics]\nlisten = \"127.0.0.1:9700\"\n");
        let c = Config::from_args(Args {
            config: Some(path),
            ..base()
        })
        .unwrap();
        assert_eq!(c.metrics.listen, Some("127.0.0.1:9700".parse().unwrap()));
        let path = write(dir.path(), "[metrics]\nlisten = \"nowhere\"\n");
        let e = Config::from_args(Args {
            config: Some(path),
            ..base()
        })
        .unwrap_err()
        .0;
        assert!(
            e.contains("nowhere") && e.contains("HOST:PORT or off"),
            "{e}"
        );
    }

    #[test]
    fn a_wildcard_nvme_listener_needs_an_advertised_address() {
        let base = || Args {
            data_dir: Some("/tmp/x".into()),
            devices: vec!["/dev/nvme0n1".into()],
            ..Args::default()
        };
        let e = Config::from_args(base()).unwrap_err().0;
        assert!(
            e.contains("0.0.0.0:4420") && e.contains("--nvme-advertise"),
            "{e}"
        );
        let c = Config::from_args(Args {
            nvme_advertise: Some("192.0.2.7".parse().unwrap()),
            ..base()
        })
        .unwrap();
        assert_eq!(c.nvme.advertise.to_string(), "192.0.2.7");
        let e = Config::from_args(Args {
            nvme_advertise: Some("0.0.0.0".parse().unwrap()),
            ..base()
        })
        .unwrap_err()
        .0;
        assert!(e.contains("not an address hosts can connect to"), "{e}");
    }

    #[test]
    fn file_values_are_relative_to_the_file_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            r#"
appliance_id = "box-1"
listen = "0.0.0.0:9600"
data_dir = "state"
devices = ["/dev/nvme0n1", "pool.img"]
[nvme]
listen = "0.0.0.0:4420"
advertise = "192.0.2.1"
io_threads = 3
[tls]
ca = "pki/ca.pem"
[topology]
"example.com/rack" = "r7"
"#,
        );
        let c = Config::from_args(Args {
            config: Some(path.clone()),
            listen: Some("127.0.0.1:1".parse().unwrap()),
            ..Args::default()
        })
        .unwrap();
        assert_eq!(c.appliance_id.as_deref(), Some("box-1"));
        assert_eq!(c.listen.to_string(), "127.0.0.1:1");
        assert_eq!(c.nvme.io_threads, 3);
        assert_eq!(c.data_dir, dir.path().join("state"));
        assert_eq!(
            c.devices,
            vec![PathBuf::from("/dev/nvme0n1"), dir.path().join("pool.img")]
        );
        assert_eq!(c.tls.ca, dir.path().join("pki/ca.pem"));
        assert_eq!(c.tls.key, dir.path().join("state/pki/server.key"));
        assert_eq!(c.topology["example.com/rack"], "r7");
        assert!(!c.format_blank, "off unless asked for");
        let path = write(
            dir.path(),
            "format_blank = true\ndata_dir = \"s\"\ndevices = [\"d\"]\n[nvme]\nadvertise = \"192.0.2.1\"",
        );
        let c = Config::from_args(Args {
            config: Some(path),
            ..Args::default()
        })
        .unwrap();
        assert!(c.format_blank);
    }

    #[test]
    fn bad_files_and_values_give_one_line_naming_the_culprit() {
        let dir = tempfile::tempdir().unwrap();
        let config = |text: &str| {
            let path = write(dir.path(), text);
            Config::from_args(Args {
                config: Some(path),
                dev: true,
                ..Args::default()
            })
            .unwrap_err()
            .0
        };
        let e = config("listen = [");
        assert!(e.contains("edgevold.toml at line 1"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = config("colour = \"blue\"");
        assert!(e.contains("unknown field `colour`"), "{e}");
        let e = config("appliance_id = \"Box_1\"");
        assert!(e.contains("appliance id \"Box_1\""), "{e}");
        let e = config("[topology]\n\"edgevol.io/appliance\" = \"x\"");
        assert!(e.contains("set by the appliance"), "{e}");
        let e = config("[topology]\n\"rack\" = \"-bad\"");
        assert!(e.contains("topology value \"-bad\""), "{e}");

        let missing = dir.path().join("nope.toml");
        let e = Config::from_args(Args {
            config: Some(missing),
            ..Args::default()
        })
        .unwrap_err()
        .0;
        assert!(e.contains("nope.toml") && e.contains("No such file"), "{e}");
    }

    #[test]
    fn authentication_is_required_unless_allowed_by_file_or_flag() {
        let dir = tempfile::tempdir().unwrap();
        let with = |text: &str, flag: Option<bool>| {
            let path = write(dir.path(), text);
            Config::from_args(Args {
                config: Some(path),
                dev: true,
                nvme_allow_unauthenticated_hosts: flag,
                ..Args::default()
            })
            .map(|c| c.host_auth.allow_unauthenticated_hosts)
        };
        let dev = Config::from_args(Args {
            dev: true,
            ..Args::default()
        })
        .unwrap();
        assert_eq!(dev.host_auth, HostAuthPolicy::default());
        assert!(
            !dev.host_auth.allow_unauthenticated_hosts,
            "required by default"
        );
        assert_eq!(dev.host_auth.warning(), None);
        assert_eq!(with("", None), Ok(false));
        assert_eq!(
            with("[nvme]\nallow_unauthenticated_hosts = true\n", None),
            Ok(true)
        );
        assert_eq!(
            with("[nvme]\nallow_unauthenticated_hosts = false\n", None),
            Ok(false)
        );
        assert_eq!(with("", Some(true)), Ok(true));
        // The flag wins both ways: an operator can turn the file's setting off for one start.
        assert_eq!(
            with("[nvme]\nallow_unauthenticated_hosts = true\n", Some(false)),
            Ok(false)
        );
        let e = with("[nvme]\nallow_unauthenticated_hosts = \"yes\"\n", None)
            .unwrap_err()
            .0;
        assert!(e.contains("at line 2") && e.contains("bool"), "{e}");
        let allowed = HostAuthPolicy {
            allow_unauthenticated_hosts: true,
            ..HostAuthPolicy::default()
        };
        assert!(allowed
            .warning()
            .is_some_and(|w| w.contains("nvme.allow_unauthenticated_hosts")));
    }

    #[test]
    fn hashes_and_dh_groups_are_chosen_by_name_in_preference_order() {
        let dir = tempfile::tempdir().unwrap();
        let with = |text: &str| {
            Config::from_args(Args {
                config: Some(write(dir.path(), text)),
                dev: true,
                ..Args::default()
            })
            .map(|c| c.host_auth)
        };
        let p = with(
            "[nvme]\nauth_hashes = [\"sha512\", \"sha256\"]\nauth_dh_groups = [\"ffdhe4096\"]\n",
        )
        .unwrap();
        assert_eq!(p.hashes, [HashId::Sha512, HashId::Sha256]);
        assert_eq!(p.dh_groups, [DhGroup::Ffdhe4096]);
        let d = with("").unwrap();
        assert_eq!(d.hashes, HashId::ALL);
        assert_eq!(d.dh_groups.first(), Some(&DhGroup::Ffdhe2048));
        assert_eq!(d.dh_groups.len(), DhGroup::ALL.len());
        let e = with("[nvme]\nauth_hashes = [\"md5\"]\n").unwrap_err().0;
        assert!(
            e.contains("nvme.auth_hashes: unknown \"md5\"") && e.contains("sha384"),
            "{e}"
        );
        let e = with("[nvme]\nauth_dh_groups = []\n").unwrap_err().0;
        assert!(e.contains("nvme.auth_dh_groups is empty"), "{e}");
    }

    #[test]
    fn the_allow_unauthenticated_flag_takes_a_value() {
        let parse = |args: &[&str]| Args::try_parse_from([&["edgevold"], args].concat());
        let a = parse(&["--nvme-allow-unauthenticated-hosts", "true"]).unwrap();
        assert_eq!(a.nvme_allow_unauthenticated_hosts, Some(true));
        let a = parse(&["--nvme-allow-unauthenticated-hosts=false"]).unwrap();
        assert_eq!(a.nvme_allow_unauthenticated_hosts, Some(false));
        assert!(parse(&["--nvme-allow-unauthenticated-hosts", "maybe"]).is_err());
        assert_eq!(parse(&[]).unwrap().nvme_allow_unauthenticated_hosts, None);
    }

    #[test]
    fn firmware_section_defaults_bounds_and_off() {
        let dir = tempfile::tempdir().unwrap();
        let load = |text: &str| {
            Config::from_args(Args {
                dev: true,
                config: Some(write(dir.path(), text)),
                ..Args::default()
            })
        };
        assert_eq!(load("").unwrap().firmware, None);
        let f = load("[firmware]\n").unwrap().firmware.unwrap();
        assert_eq!(f.boot_dir, PathBuf::from("/boot"));
        assert_eq!(
            f.public_key,
            PathBuf::from("/etc/edgevol/firmware-signing.pub")
        );
        assert_eq!(f.cmdline, PathBuf::from("/proc/cmdline"));
        assert_eq!(f.health_hold, Duration::from_secs(DEFAULT_HEALTH_SECS));
        assert_eq!(f.watchdog, Some(PathBuf::from("/dev/watchdog")));
        assert_eq!(f.reboot_command, ["reboot", "-f"]);
        let f = load("[firmware]\nhealth_secs = 5\nwatchdog = \"off\"\nboot_dir = \"b\"\n")
            .unwrap()
            .firmware
            .unwrap();
        assert_eq!((f.health_hold, f.watchdog), (Duration::from_secs(5), None));
        assert_eq!(f.boot_dir, dir.path().join("b"));
        let e = load("[firmware]\nhealth_secs = 0\n").unwrap_err().0;
        assert!(e.contains("firmware.health_secs = 0"), "{e}");
        let e = load("[firmware]\nreboot_command = []\n").unwrap_err().0;
        assert!(e.contains("reboot_command is empty"), "{e}");
        assert!(load("[firmware]\nbogus = 1\n").is_err());
    }

    #[test]
    fn without_dev_a_data_dir_and_device_are_required() {
        let e = Config::from_args(Args::default()).unwrap_err().0;
        assert!(e.contains("no data dir"), "{e}");
        let e = Config::from_args(Args {
            data_dir: Some("/tmp/x".into()),
            ..Args::default()
        })
        .unwrap_err()
        .0;
        assert!(e.contains("no device"), "{e}");
    }
}
