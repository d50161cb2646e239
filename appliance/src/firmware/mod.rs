//! The appliance's firmware life cycle (issue 19): the [`Firmware`] manager of the
//! `edgevol-firmware` crate over the mounted boot partition, started with the daemon; the
//! `edgevol.v1.Firmware` gRPC service ([`service`], admin role only by [`crate::auth`]); the
//! health check that confirms a trial boot and feeds the watchdog ([`health`]).

pub mod health;
pub mod service;
pub mod watchdog;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use edgevol_firmware::boot_dir::BootDir;
use edgevol_firmware::dir_media::DirMedia;
use edgevol_firmware::key::VerifyingKey;
use edgevol_firmware::manager::{Firmware, FirmwareError, Identity};
use edgevol_firmware::slots::{BootOutcome, SlotId};

use crate::config::FirmwareConfig;

/// The manager, shared by the service and the health check.
pub type Shared = Arc<Mutex<Firmware<DirMedia>>>;

/// Why firmware management could not start.
#[derive(Debug)]
pub enum StartError {
    /// A file could not be read.
    Read(PathBuf, std::io::Error),
    /// The verification key file is not a key.
    Key(PathBuf, String),
    /// The kernel command line names no slot (`edgevol.slot=a|b`).
    NoSlot(PathBuf),
    /// The manager refused to start.
    Manager(FirmwareError),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Read(path, e) => write!(f, "firmware: {}: {e}", path.display()),
            StartError::Key(path, e) => write!(f, "firmware: {}: {e}", path.display()),
            StartError::NoSlot(path) => {
                write!(f, "firmware: no edgevol.slot=a|b in {}", path.display())
            }
            StartError::Manager(e) => write!(f, "firmware: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

fn read(path: &Path) -> Result<String, StartError> {
    std::fs::read_to_string(path).map_err(|e| StartError::Read(path.to_path_buf(), e))
}

/// The slot the loader booted, from a kernel command line.
pub fn slot_from_cmdline(cmdline: &str) -> Option<SlotId> {
    cmdline
        .split_whitespace()
        .find_map(|arg| arg.strip_prefix("edgevol.slot="))
        .and_then(SlotId::from_letter)
}

/// Opens the manager: which slot runs, what it is, the key it trusts; records this boot.
pub fn start(config: &FirmwareConfig) -> Result<Shared, StartError> {
    let key_text = read(&config.public_key)?;
    let key = VerifyingKey::from_hex(&key_text)
        .map_err(|e| StartError::Key(config.public_key.clone(), e.to_string()))?;
    let version = read(&config.version_file)?.trim().to_owned();
    let running = slot_from_cmdline(&read(&config.cmdline)?)
        .ok_or_else(|| StartError::NoSlot(config.cmdline.clone()))?;
    let firmware = Firmware::start(
        DirMedia::new(&config.boot_dir),
        BootDir::new(&config.boot_dir),
        Identity {
            key,
            arch: std::env::consts::ARCH.to_owned(),
            running,
            version,
        },
    )
    .map_err(StartError::Manager)?;
    match firmware.outcome() {
        BootOutcome::Normal => tracing::info!(slot = %running, "firmware: running"),
        BootOutcome::Trial => tracing::info!(slot = %running, "firmware: trial boot of an update"),
        BootOutcome::RolledBack(rb) => tracing::warn!(
            slot = %running,
            from = %rb.slot,
            version = %rb.version,
            reason = %rb.reason,
            "firmware: update rolled back"
        ),
    }
    Ok(Arc::new(Mutex::new(firmware)))
}

/// How the daemon reboots the box (`firmware.reboot_command`; busybox `reboot -f` syncs first).
#[derive(Debug, Clone)]
pub struct Reboot {
    command: Vec<String>,
}

impl Reboot {
    /// Runs `command` (program and arguments) to reboot.
    pub fn new(command: Vec<String>) -> Reboot {
        Reboot { command }
    }

    /// Reboots now. If the command fails, the watchdog (no longer petted once the daemon goes)
    /// or an operator has to.
    pub fn now(&self) {
        let Some((program, args)) = self.command.split_first() else {
            tracing::error!("firmware: no reboot command configured");
            return;
        };
        tracing::warn!(command = ?self.command, "firmware: rebooting");
        match Command::new(program).args(args).status() {
            Ok(status) if status.success() => {}
            Ok(status) => tracing::error!(%status, "firmware: reboot command failed"),
            Err(e) => tracing::error!(error = %e, "firmware: reboot command failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_comes_from_the_command_line() {
        let line = "console=ttyS0 panic=10 edgevol.slot=b edgevol.boot=uefi\n";
        assert_eq!(slot_from_cmdline(line), Some(SlotId::B));
        assert_eq!(slot_from_cmdline("console=ttyS0"), None);
        assert_eq!(slot_from_cmdline("edgevol.slot=c"), None);
    }

    #[test]
    fn reboot_runs_its_command() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("rebooted");
        Reboot::new(vec!["touch".into(), marker.to_string_lossy().into_owned()]).now();
        assert!(marker.exists());
    }
}
