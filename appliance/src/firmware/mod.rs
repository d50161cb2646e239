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
use std::sync::{Arc, Mutex, MutexGuard};

use edgevol_core::Pool;
use edgevol_firmware::boot_dir::BootDir;
use edgevol_firmware::dir_media::DirMedia;
use edgevol_firmware::key::VerifyingKey;
use edgevol_firmware::manager::{Firmware, FirmwareError, Identity};
use edgevol_firmware::slots::{BootOutcome, SlotId};

use crate::config::FirmwareConfig;
use crate::pool::PoolDevice;
use crate::state::{PoolUnavailable, State};

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

/// How the daemon reboots the box (`firmware.reboot_command`).
///
/// A reboot is a new boot, and the pool's soft journal frames of this boot are not replayed in
/// the next (`crate::sync`): writes acknowledged since the last periodic sync would be lost,
/// although a host's Flush that was in flight at the reboot is retried after it and succeeds.
/// So the pool is flushed first and held until the box goes down: no write is acknowledged
/// after that flush.
#[derive(Debug, Clone)]
pub struct Reboot {
    command: Vec<String>,
    state: Arc<State>,
}

impl Reboot {
    /// Runs `command` (program and arguments) to reboot, after flushing `state`'s pool.
    pub fn new(command: Vec<String>, state: Arc<State>) -> Reboot {
        Reboot { command, state }
    }

    /// Flushes the pool and reboots now (a blocking call). If the command fails, the pool serves
    /// again, and the watchdog (no longer petted once the daemon goes) or an operator has to.
    pub fn now(&self) {
        let Some((program, args)) = self.command.split_first() else {
            tracing::error!("firmware: no reboot command configured");
            return;
        };
        let held = self.flush_and_hold();
        tracing::warn!(command = ?self.command, "firmware: rebooting");
        match Command::new(program).args(args).status() {
            Ok(status) if status.success() => {}
            Ok(status) => tracing::error!(%status, "firmware: reboot command failed"),
            Err(e) => tracing::error!(error = %e, "firmware: reboot command failed"),
        }
        drop(held);
    }

    /// The pool, flushed and locked; `None` when it is not open (nothing acknowledged yet) or
    /// poisoned (every call on it already fails).
    fn flush_and_hold(&self) -> Option<MutexGuard<'_, Pool<PoolDevice>>> {
        let mut pool = match self.state.lock_pool() {
            Ok(pool) => pool,
            Err(PoolUnavailable::NotReady) => return None,
            Err(e) => {
                tracing::error!(error = %e, "firmware: the pool cannot be flushed before the reboot");
                return None;
            }
        };
        match pool.flush() {
            Ok(()) => tracing::info!("firmware: pool flushed, held until the reboot"),
            // A failed metadata write has stopped the pool; the reboot is what recovers it.
            Err(e) => tracing::error!(error = ?e, "firmware: pool flush before the reboot failed"),
        }
        Some(pool)
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
        let state = Arc::new(State::new("box".into(), Default::default()));
        let command = vec!["touch".into(), marker.to_string_lossy().into_owned()];
        Reboot::new(command, state).now();
        assert!(marker.exists());
    }

    /// A write acknowledged (persisted to the journal, no flush yet) just before Activate
    /// reboots the box is found by the next boot. The reboot command copies the pool file (what
    /// the device holds when the box goes down); the copy is opened in another epoch, as the
    /// next boot opens it.
    #[test]
    fn a_write_acknowledged_before_the_reboot_survives_it() {
        use edgevol_core::{
            BlockDevice, Epoch, OpenOptions, Prepare, ReadSegment, VolumeSpec, WriteSegment,
        };

        let dir = tempfile::tempdir().unwrap();
        let (image, copy) = (dir.path().join("pool.img"), dir.path().join("rebooted.img"));
        let state = Arc::new(State::new("box".into(), Default::default()));
        state.set_pool(crate::pool::open(std::slice::from_ref(&image), true).unwrap());
        let data = vec![0x5a_u8; 64 << 10];
        let vol = {
            let mut pool = state.lock_pool().unwrap();
            let vol = pool.create_volume(VolumeSpec::new("v", 16 << 20)).unwrap();
            pool.flush().unwrap();
            // The data path's write: map, write the data, persist the mapping, acknowledge.
            let mut segs = [WriteSegment::EMPTY; 16];
            let n = pool
                .map_write(vol, 0, data.len() as u64, &mut segs)
                .unwrap();
            let block = u64::from(pool.device_mut().block_size());
            for seg in &segs[..n] {
                assert!(matches!(seg.prepare, Prepare::None | Prepare::Zero { .. }));
                if let Prepare::Zero { device_offset } = seg.prepare {
                    let zeros = vec![0; pool.cluster_size() as usize];
                    pool.device_mut()
                        .write(device_offset / block, &zeros)
                        .unwrap();
                }
                let at = |o: u64| usize::try_from(o).unwrap();
                let part = &data[at(seg.offset)..at(seg.offset + seg.len)];
                pool.device_mut()
                    .write(seg.device_offset / block, part)
                    .unwrap();
            }
            let ticket = pool.persist_ticket();
            pool.persist(ticket).unwrap();
            assert!(
                pool.needs_sync(),
                "the write must not be durable yet for this test"
            );
            vol
        };

        let command = ["cp", "--sparse=always"]
            .into_iter()
            .map(String::from)
            .chain([&image, &copy].map(|p| p.to_string_lossy().into_owned()))
            .collect();
        Reboot::new(command, state).now();

        let device = crate::pool::open_device(&copy).unwrap();
        let next_boot = OpenOptions {
            epoch: Some(Epoch(*b"the-next-boot...")),
        };
        let pool = Pool::open_with(device, next_boot).unwrap();
        let segs: Vec<ReadSegment> = pool.map_read(vol, 0, data.len() as u64).unwrap().collect();
        assert!(
            segs.iter().all(|s| matches!(s, ReadSegment::Data { .. })),
            "the acknowledged write is unmapped after the reboot: {segs:?}"
        );
    }
}
