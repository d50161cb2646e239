//! `[firmware]`: where the A/B firmware slots, their verification key and the watchdog are.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;

/// `[firmware]`: present on an appliance image, absent elsewhere (no firmware service then).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileFirmware {
    pub(super) boot_dir: Option<PathBuf>,
    pub(super) public_key: Option<PathBuf>,
    pub(super) version_file: Option<PathBuf>,
    pub(super) cmdline: Option<PathBuf>,
    pub(super) health_secs: Option<u64>,
    pub(super) watchdog: Option<String>,
    pub(super) reboot_command: Option<Vec<String>>,
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
    pub(super) fn resolve(
        self,
        rel: impl Fn(PathBuf) -> PathBuf,
    ) -> Result<FirmwareConfig, ConfigError> {
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
