//! The config file's format (TOML, unknown keys refused) and reading it. Relative paths in it are
//! relative to the file's directory; resolving them and the values is `mod.rs`'s job.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::firmware::FileFirmware;
use super::ConfigError;

/// The config file. Relative paths are relative to the file's directory.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    pub(super) appliance_id: Option<String>,
    pub(super) listen: Option<SocketAddr>,
    pub(super) metrics: Option<FileMetrics>,
    pub(super) data_dir: Option<PathBuf>,
    #[serde(default)]
    pub(super) devices: Vec<PathBuf>,
    pub(super) tls: Option<FileTls>,
    #[serde(default)]
    pub(super) topology: BTreeMap<String, String>,
    pub(super) nvme: Option<FileNvme>,
    #[serde(default)]
    pub(super) format_blank: bool,
    pub(super) sync_interval_ms: Option<u64>,
    pub(super) firmware: Option<FileFirmware>,
}

/// `[metrics] listen = "ADDR"` or `"off"`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileMetrics {
    pub(super) listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileNvme {
    pub(super) listen: Option<SocketAddr>,
    pub(super) advertise: Option<IpAddr>,
    pub(super) io_threads: Option<usize>,
    pub(super) io_cpus: Option<Vec<usize>>,
    pub(super) busy_poll_us: Option<u64>,
    pub(super) allow_unauthenticated_hosts: Option<bool>,
    pub(super) auth_hashes: Option<Vec<String>>,
    pub(super) auth_dh_groups: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileTls {
    pub(super) ca: Option<PathBuf>,
    pub(super) cert: Option<PathBuf>,
    pub(super) key: Option<PathBuf>,
}

pub(super) fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
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

pub(super) fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}
