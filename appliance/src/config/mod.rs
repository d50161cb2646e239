//! The daemon's configuration: a TOML file (`--config`) overridden by flags, resolved once at
//! start into a [`Config`] whose every path and value has been checked.
//!
//! | file | what |
//! |---|---|
//! | `flags.rs` | the command line: [`Args`], [`Command`], [`MetricsListen`] |
//! | `file.rs` | the TOML file's format and reading it |
//! | `checks.rs` | names that end up on the wire: appliance ids, topology segments |
//! | `host_auth.rs` | the DH-HMAC-CHAP policy of the data path: [`HostAuthPolicy`] |
//! | `firmware.rs` | `[firmware]`: [`FirmwareConfig`] |
//! | `mod.rs` | the resolved [`Config`]: flags over the file over defaults, checked |

use edgevol_nvmeof::auth::{DhGroup, HashId};
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

mod checks;
mod file;
mod firmware;
mod flags;
mod host_auth;

pub use checks::check_appliance_id;
pub use firmware::{FirmwareConfig, DEFAULT_HEALTH_SECS};
pub use flags::{Args, Command, MetricsListen};
pub use host_auth::HostAuthPolicy;

use checks::check_segment;
use file::{parent_dir, read_file, FileConfig};
use flags::parse_metrics_listen;
use host_auth::parse_names;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeConfig {
    /// Listen address (port 0 picks a free port: tests).
    pub listen: SocketAddr,
    /// Address for publish_context and discovery log pages.
    pub advertise: IpAddr,
    /// Threads I/O queues run on (`nvme.io_threads`); 0: one per core, or one per CPU of
    /// `io_cpus`.
    pub io_threads: usize,
    /// CPUs the I/O threads are pinned to, one thread each (`nvme.io_cpus`); empty: not pinned.
    pub io_cpus: Vec<usize>,
    /// How long an engine thread polls its queues before it sleeps, when it was woken soon
    /// after its last sleep (`nvme.busy_poll_us`); zero: never.
    pub busy_poll: Duration,
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

/// Default of `sync_interval_ms`: a power cut takes at most one second of unflushed writes,
/// like dm-thin's commit period.
pub const DEFAULT_SYNC_INTERVAL_MS: u64 = 1000;
/// Bounds of `sync_interval_ms`: below 10 ms the syncs cost more than they save; above a
/// minute the window is no longer a bound an operator can reason about.
const SYNC_INTERVAL_MS: std::ops::RangeInclusive<u64> = 10..=60_000;

/// Default of `nvme.busy_poll_us`: longer than a host at queue depth 1 takes to send its next
/// command over a fast link, shorter than the sleep and wake-up it saves (see
/// [`crate::nvme::busy_poll`]).
pub const DEFAULT_BUSY_POLL_US: u64 = 50;
/// Bound of `nvme.busy_poll_us`: past a millisecond an engine that polls delays its other
/// queues' timers and teardowns more than any host gains.
const BUSY_POLL_US_MAX: u64 = 1000;

/// Highest CPU number `nvme.io_cpus` may name (Linux's default `CPU_SETSIZE` is 1024).
const IO_CPU_MAX: usize = 1023;

/// `nvme.io_cpus`: distinct CPU numbers, one thread each, which `nvme.io_threads` (when set)
/// must agree with. Whether the process may run on them is known only when the threads start.
fn check_io_cpus(cpus: &[usize], io_threads: Option<usize>) -> Result<(), ConfigError> {
    if cpus.is_empty() {
        return Ok(());
    }
    if let Some(&cpu) = cpus.iter().find(|&&c| c > IO_CPU_MAX) {
        return Err(ConfigError(format!(
            "nvme.io_cpus names CPU {cpu}, above {IO_CPU_MAX}"
        )));
    }
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(ConfigError(format!(
            "nvme.io_cpus names CPU {} twice (one I/O thread per CPU)",
            w[0]
        )));
    }
    match io_threads {
        Some(n) if n != 0 && n != cpus.len() => Err(ConfigError(format!(
            "nvme.io_threads {n} disagrees with nvme.io_cpus ({} CPUs, one thread each): set one",
            cpus.len()
        ))),
        _ => Ok(()),
    }
}

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
        let mut file_nvme = file.nvme.unwrap_or_default();
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
        let busy_poll_us = file_nvme.busy_poll_us.unwrap_or(DEFAULT_BUSY_POLL_US);
        if busy_poll_us > BUSY_POLL_US_MAX {
            return Err(ConfigError(format!(
                "nvme.busy_poll_us {busy_poll_us} is above {BUSY_POLL_US_MAX} (0 turns polling off)"
            )));
        }
        let io_cpus = file_nvme.io_cpus.take().unwrap_or_default();
        check_io_cpus(&io_cpus, file_nvme.io_threads)?;
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
                io_cpus,
                busy_poll: Duration::from_micros(busy_poll_us),
            },
            format_blank: args.format_blank || file.format_blank,
            sync_interval: Duration::from_millis(sync_ms),
            host_auth,
            firmware: firmware_config,
        })
    }
}

#[cfg(test)]
mod tests;
