//! The firmware life cycle as metrics: whether this boot is the trial of an update still waiting
//! for its health check, and whether the last update was rolled back (its slot left bad until
//! another update replaces it). A daemon without firmware management (dev mode, tests) serves
//! both families with no sample.

use std::sync::PoisonError;

use edgevol_firmware::slots::Status;

use super::text::{Exposition, Kind};
use crate::firmware::Shared;

/// What a scrape reports of the firmware manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirmwareView {
    /// This boot runs an update on trial: the health check has neither confirmed it nor failed
    /// it yet.
    pub trial: bool,
    /// The last update was rolled back (its trial failed or never confirmed, or an admin rolled
    /// it back during its trial) and no update has replaced its slot since.
    pub rolled_back: bool,
}

impl FirmwareView {
    /// Reads the manager (blocking: an update holds it while it writes a slot, and the status
    /// reads the loaders' files). A lock poisoned by a panic still holds a readable state.
    pub fn read(firmware: &Shared) -> FirmwareView {
        let f = firmware.lock().unwrap_or_else(PoisonError::into_inner);
        let slots = f.status().slots;
        let rolled_back = slots
            .last_rollback
            .as_ref()
            .is_some_and(|rb| slots.slot(rb.slot).status == Status::Bad);
        FirmwareView {
            trial: f.on_trial(),
            rolled_back,
        }
    }
}

/// Renders the firmware families; samples only when the daemon manages firmware.
pub fn render(e: &mut Exposition, view: Option<FirmwareView>) {
    e.family(
        "edgevol_firmware_trial",
        Kind::Gauge,
        "1 while this boot is the trial of a firmware update that its health check has not confirmed yet (a failed check rolls back to the previous slot), else 0.",
    );
    if let Some(v) = view {
        e.sample("edgevol_firmware_trial", &[], u8::from(v.trial));
    }
    e.family(
        "edgevol_firmware_rolled_back",
        Kind::Gauge,
        "1 if the last firmware update was rolled back (its trial failed or was never confirmed) and no update has replaced it since (edgevol firmware status says why), else 0.",
    );
    if let Some(v) = view {
        e.sample("edgevol_firmware_rolled_back", &[], u8::from(v.rolled_back));
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    use edgevol_firmware::boot_dir::BootDir;
    use edgevol_firmware::bootenv;
    use edgevol_firmware::bundle;
    use edgevol_firmware::dir_media::DirMedia;
    use edgevol_firmware::key::SigningKey;
    use edgevol_firmware::manager::{Firmware, Identity};
    use edgevol_firmware::slots::{BootEnv, Reason, SlotId};

    use super::*;

    /// The daemon starting on `running` from the boot partition `boot`, as it records the boot.
    fn boot(boot: &Path, key: &SigningKey, running: SlotId, version: &str) -> Shared {
        let fw = Firmware::start(
            DirMedia::new(boot),
            BootDir::new(boot),
            Identity {
                key: key.verifying_key(),
                arch: std::env::consts::ARCH.into(),
                running,
                version: version.into(),
            },
        )
        .unwrap();
        Arc::new(Mutex::new(fw))
    }

    #[test]
    fn a_trial_its_failure_and_the_next_update_read_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let env = BootEnv {
            primary: SlotId::A,
            trial: None,
        };
        std::fs::write(root.join("grubenv"), bootenv::grubenv(&env)).unwrap();
        std::fs::write(root.join("syslinux.cfg"), bootenv::syslinux_cfg(SlotId::A)).unwrap();
        let mut ldlinux = vec![0x90u8; 4096];
        ldlinux.extend_from_slice(&bootenv::adv(None));
        std::fs::write(root.join("ldlinux.sys"), ldlinux).unwrap();
        BootDir::new(root)
            .write_slot(SlotId::A, b"kernel-a", b"initramfs-a")
            .unwrap();
        let (key, _) = SigningKey::generate().unwrap();

        let factory = boot(root, &key, SlotId::A, "1.0");
        let quiet = FirmwareView {
            trial: false,
            rolled_back: false,
        };
        assert_eq!(FirmwareView::read(&factory), quiet);
        let update = bundle::build(&key, std::env::consts::ARCH, "2.0", b"k", b"i").unwrap();
        factory.lock().unwrap().update(&update).unwrap();
        drop(factory);

        let trial = boot(root, &key, SlotId::B, "2.0");
        let on_trial = FirmwareView {
            trial: true,
            rolled_back: false,
        };
        assert_eq!(FirmwareView::read(&trial), on_trial);
        trial
            .lock()
            .unwrap()
            .fail_trial(Reason::DaemonExited(Some(3)))
            .unwrap();
        let rolled_back = FirmwareView {
            trial: false,
            rolled_back: true,
        };
        assert_eq!(
            FirmwareView::read(&trial),
            rolled_back,
            "failed, not a trial"
        );
        drop(trial);

        // Back on the previous slot, until another update replaces the bad one.
        let fallback = boot(root, &key, SlotId::A, "1.0");
        assert_eq!(FirmwareView::read(&fallback), rolled_back);
        let next = bundle::build(&key, std::env::consts::ARCH, "2.1", b"k", b"i").unwrap();
        fallback.lock().unwrap().update(&next).unwrap();
        assert_eq!(FirmwareView::read(&fallback), quiet);
    }

    fn rendered(view: Option<FirmwareView>) -> String {
        let mut e = Exposition::new();
        render(&mut e, view);
        e.finish()
    }

    #[test]
    fn a_trial_and_a_rollback_are_ones() {
        let text = rendered(Some(FirmwareView {
            trial: true,
            rolled_back: false,
        }));
        assert!(text.contains("\nedgevol_firmware_trial 1\n"), "{text}");
        assert!(
            text.contains("\nedgevol_firmware_rolled_back 0\n"),
            "{text}"
        );
        let text = rendered(Some(FirmwareView {
            trial: false,
            rolled_back: true,
        }));
        assert!(text.contains("\nedgevol_firmware_trial 0\n"), "{text}");
        assert!(
            text.contains("\nedgevol_firmware_rolled_back 1\n"),
            "{text}"
        );
    }

    #[test]
    fn without_firmware_management_the_families_have_no_sample() {
        let text = rendered(None);
        assert!(
            text.contains("# TYPE edgevol_firmware_trial gauge\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE edgevol_firmware_rolled_back gauge\n"),
            "{text}"
        );
        assert!(
            !text.lines().any(|l| l.starts_with("edgevol_firmware")),
            "{text}"
        );
    }
}
