//! `edgevol firmware fail-trial`: run by the appliance's init when edgevold exits (or never
//! becomes ready) during a trial boot, where the daemon cannot record it itself: the trial slot
//! is marked bad with the reason, and init reboots into the previous slot. Outside a trial it
//! changes nothing.

use std::path::PathBuf;

use edgevol_firmware::boot_dir::BootDir;
use edgevol_firmware::dir_media::DirMedia;
use edgevol_firmware::key::VerifyingKey;
use edgevol_firmware::manager::{Firmware, Identity};
use edgevol_firmware::slots::{Reason, SlotId};

/// The image's firmware files (the daemon's `[firmware]` defaults).
#[derive(Debug, Clone)]
pub struct Paths {
    /// The mounted boot partition.
    pub boot_dir: PathBuf,
    /// The verification key baked into the image.
    pub public_key: PathBuf,
    /// The running version.
    pub version_file: PathBuf,
    /// The kernel command line.
    pub cmdline: PathBuf,
}

/// What happened.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The trial was failed: reboot into this slot.
    RolledBack(SlotId),
    /// Not a trial boot: nothing changed.
    NotOnTrial,
}

/// The reason for a daemon's exit status as the shell reports it (above 128: a signal).
pub fn exit_reason(status: i32) -> Reason {
    if status > 128 {
        Reason::DaemonExited(None)
    } else {
        Reason::DaemonExited(Some(status))
    }
}

/// Fails the running trial, if this boot is one.
pub fn fail_trial(paths: &Paths, reason: Reason) -> Result<Outcome, String> {
    let read =
        |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let key = VerifyingKey::from_hex(&read(&paths.public_key)?)
        .map_err(|e| format!("{}: {e}", paths.public_key.display()))?;
    let running = read(&paths.cmdline)?
        .split_whitespace()
        .find_map(|a| a.strip_prefix("edgevol.slot="))
        .and_then(SlotId::from_letter)
        .ok_or_else(|| format!("no edgevol.slot=a|b in {}", paths.cmdline.display()))?;
    let mut firmware = Firmware::start(
        DirMedia::new(&paths.boot_dir),
        BootDir::new(&paths.boot_dir),
        Identity {
            key,
            arch: std::env::consts::ARCH.to_owned(),
            running,
            version: read(&paths.version_file)?.trim().to_owned(),
        },
    )
    .map_err(|e| e.to_string())?;
    if !firmware.on_trial() {
        return Ok(Outcome::NotOnTrial);
    }
    firmware.fail_trial(reason).map_err(|e| e.to_string())?;
    Ok(Outcome::RolledBack(firmware.status().slots.primary))
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_firmware::bootenv;
    use edgevol_firmware::bundle;
    use edgevol_firmware::key::SigningKey;
    use edgevol_firmware::slots::Status;

    fn setup(dir: &std::path::Path, slot: char, version: &str) -> Paths {
        std::fs::write(dir.join("cmdline"), format!("edgevol.slot={slot}\n")).unwrap();
        std::fs::write(dir.join("version"), version).unwrap();
        Paths {
            boot_dir: dir.join("boot"),
            public_key: dir.join("key.pub"),
            version_file: dir.join("version"),
            cmdline: dir.join("cmdline"),
        }
    }

    #[test]
    fn a_daemon_exit_fails_the_trial_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let boot = dir.path().join("boot");
        crate::boot_files::write_factory(&boot).unwrap();
        let mut ldlinux = vec![0u8; 1024];
        ldlinux.extend_from_slice(&bootenv::adv(None));
        std::fs::write(boot.join("ldlinux.sys"), ldlinux).unwrap();
        let (key, _) = SigningKey::generate().unwrap();
        std::fs::write(dir.path().join("key.pub"), key.verifying_key().to_hex()).unwrap();

        // Not a trial: nothing to do.
        let paths = setup(dir.path(), 'a', "1.0");
        assert_eq!(fail_trial(&paths, exit_reason(1)), Ok(Outcome::NotOnTrial));
        // An update armed, then its trial boot's daemon exits with status 3.
        let mut fw = Firmware::start(
            DirMedia::new(&boot),
            BootDir::new(&boot),
            Identity {
                key: key.verifying_key(),
                arch: std::env::consts::ARCH.into(),
                running: SlotId::A,
                version: "1.0".into(),
            },
        )
        .unwrap();
        let b = bundle::build(&key, std::env::consts::ARCH, "2.0", b"k", b"i").unwrap();
        fw.update(&b).unwrap();
        drop(fw);
        // The trial's daemon started (recording the boot) before it exited.
        let started = Firmware::start(
            DirMedia::new(&boot),
            BootDir::new(&boot),
            Identity {
                key: key.verifying_key(),
                arch: std::env::consts::ARCH.into(),
                running: SlotId::B,
                version: "2.0".into(),
            },
        )
        .unwrap();
        assert!(started.on_trial());
        drop(started);
        let paths = setup(dir.path(), 'b', "2.0");
        assert_eq!(
            fail_trial(&paths, exit_reason(3)),
            Ok(Outcome::RolledBack(SlotId::A))
        );
        let view = BootDir::new(&boot).read_env();
        assert_eq!(view.grub.unwrap().trial, None);
        let paths = setup(dir.path(), 'a', "1.0");
        assert_eq!(fail_trial(&paths, exit_reason(1)), Ok(Outcome::NotOnTrial));
        let (_, state) = edgevol_firmware::record::Store::open(DirMedia::new(&boot)).unwrap();
        let state = state.unwrap();
        assert_eq!(state.slot(SlotId::B).status, Status::Bad);
        assert_eq!(
            state.last_rollback.unwrap().reason,
            Reason::DaemonExited(Some(3))
        );
        assert_eq!(exit_reason(137), Reason::DaemonExited(None));
    }
}
