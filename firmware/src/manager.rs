//! The appliance's firmware manager: the slot state, its record and the boot partition, kept in
//! step. Every transition is computed on a copy, saved, and only then adopted; the loaders' files
//! follow the saved state, so a cut between the two leaves the loaders behind the state, never
//! ahead of it (the state never arms a trial the record does not know about).
//!
//! Order of an update: verify the bundle (nothing written if it fails) → state `writing` saved
//! and the loaders disarmed → slot files written, synced, read back → state `try-once` saved →
//! loaders armed. A cut anywhere before the last step boots the running slot again.

use std::fmt;

use crate::boot_dir::{BootDir, BootDirError, LoaderView};
use crate::bundle::{self, BundleError, Manifest};
use crate::key::VerifyingKey;
use crate::record::{Media, Store};
use crate::slots::{BootOutcome, Reason, Rollback, SlotError, SlotId, Slots};

/// Why a firmware operation failed.
#[derive(Debug)]
pub enum FirmwareError {
    /// The bundle was refused; nothing was written.
    Bundle(BundleError),
    /// The slot state does not allow it.
    Slot(SlotError),
    /// The state record could not be read or saved.
    Store(String),
    /// The boot partition failed.
    Boot(BootDirError),
}

impl fmt::Display for FirmwareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FirmwareError::Bundle(e) => write!(f, "bundle refused, nothing written: {e}"),
            FirmwareError::Slot(e) => write!(f, "{e}"),
            FirmwareError::Store(e) => write!(f, "{e}"),
            FirmwareError::Boot(e) => write!(f, "boot partition: {e}"),
        }
    }
}

impl std::error::Error for FirmwareError {}

impl From<SlotError> for FirmwareError {
    fn from(e: SlotError) -> Self {
        FirmwareError::Slot(e)
    }
}

impl From<BootDirError> for FirmwareError {
    fn from(e: BootDirError) -> Self {
        FirmwareError::Boot(e)
    }
}

/// What `edgevol firmware status` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirmwareStatus {
    /// The slot running now.
    pub running: SlotId,
    /// What this boot is (normal, trial, fallback from a trial).
    pub boot: BootOutcome,
    /// Both slots, the primary and the last rollback.
    pub slots: Slots,
    /// What the loaders will boot next, from their own files.
    pub loaders: LoaderView,
}

/// Trust and identity of the running firmware.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The key bundles must be signed with (baked into the image).
    pub key: VerifyingKey,
    /// This machine's architecture.
    pub arch: String,
    /// The slot the loader booted (`edgevol.slot=`).
    pub running: SlotId,
    /// The running firmware's version.
    pub version: String,
}

/// The manager.
#[derive(Debug)]
pub struct Firmware<M> {
    store: Store<M>,
    slots: Slots,
    boot: BootDir,
    identity: Identity,
    outcome: BootOutcome,
}

impl<M: Media> Firmware<M> {
    /// At daemon start: read the state (or start one), record what the loader booted, and bring
    /// the loaders' files in line with the state.
    pub fn start(media: M, boot: BootDir, identity: Identity) -> Result<Self, FirmwareError> {
        let (store, saved) = Store::open(media).map_err(|e| FirmwareError::Store(e.to_string()))?;
        let mut slots = match saved {
            Some(slots) => slots,
            None => Slots::first_boot(identity.running, &identity.version)?,
        };
        let outcome = slots.reconcile(identity.running)?;
        let mut firmware = Firmware {
            store,
            slots: slots.clone(),
            boot,
            identity,
            outcome,
        };
        firmware.adopt(slots)?;
        Ok(firmware)
    }

    /// The running firmware's version.
    pub fn running_version(&self) -> &str {
        &self.identity.version
    }

    /// This boot's outcome.
    pub fn outcome(&self) -> &BootOutcome {
        &self.outcome
    }

    /// Whether this boot is a trial still waiting for its health check.
    pub fn on_trial(&self) -> bool {
        self.slots.trial() == Some(self.identity.running)
    }

    /// Verifies `bundle` and writes it into the other slot, armed to boot once.
    pub fn update(&mut self, bundle: &[u8]) -> Result<Manifest, FirmwareError> {
        let verified = bundle::verify(bundle, &self.identity.key, &self.identity.arch)
            .map_err(FirmwareError::Bundle)?;
        let mut next = self.slots.clone();
        let target = next.begin_write(self.identity.running)?;
        self.adopt(next)?;
        self.boot
            .write_slot(target, verified.kernel, verified.initramfs)?;
        let mut next = self.slots.clone();
        next.finish_write(target, &verified.manifest.version)?;
        self.adopt(next)?;
        Ok(verified.manifest)
    }

    /// The health check passed on a trial boot: this slot becomes primary.
    pub fn confirm(&mut self) -> Result<(), FirmwareError> {
        let mut next = self.slots.clone();
        next.confirm(self.identity.running)?;
        self.adopt(next)
    }

    /// The trial failed while running: the previous slot boots next.
    pub fn fail_trial(&mut self, reason: Reason) -> Result<Rollback, FirmwareError> {
        let mut next = self.slots.clone();
        let rollback = next.fail_trial(self.identity.running, reason)?;
        self.adopt(next)?;
        Ok(rollback)
    }

    /// An admin's rollback; returns the slot the next boot runs.
    pub fn rollback(&mut self) -> Result<SlotId, FirmwareError> {
        let mut next = self.slots.clone();
        let slot = next.rollback(self.identity.running)?;
        self.adopt(next)?;
        Ok(slot)
    }

    /// Whether a reboot now would boot something else than what runs (an armed trial, a
    /// rollback): what `activate` needs.
    pub fn reboot_changes_slot(&self) -> bool {
        let env = self.slots.boot_env();
        env.trial.unwrap_or(env.primary) != self.identity.running
    }

    /// Status for the operator.
    pub fn status(&self) -> FirmwareStatus {
        FirmwareStatus {
            running: self.identity.running,
            boot: self.outcome.clone(),
            slots: self.slots.clone(),
            loaders: self.boot.read_env(),
        }
    }

    /// Saves `next`, adopts it, and makes the loaders follow it.
    fn adopt(&mut self, next: Slots) -> Result<(), FirmwareError> {
        self.store
            .save(&next)
            .map_err(|e| FirmwareError::Store(e.to_string()))?;
        self.slots = next;
        self.boot.write_env(&self.slots.boot_env())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boot_dir::{self, INITRAMFS, KERNEL};
    use crate::dir_media::DirMedia;
    use crate::key::SigningKey;
    use crate::slots::{BootEnv, Status};
    use std::path::Path;

    struct Box_ {
        dir: tempfile::TempDir,
        key: SigningKey,
    }

    impl Box_ {
        fn new() -> Box_ {
            let dir = tempfile::tempdir().unwrap();
            boot_dir::tests::factory(dir.path());
            Box_ {
                dir,
                key: SigningKey::generate().unwrap().0,
            }
        }

        fn path(&self) -> &Path {
            self.dir.path()
        }

        /// The loader picks a slot, as GRUB does from grubenv: the trial once (cleared in its
        /// env first), else the primary. Then the daemon starts on it.
        fn boot(&self, version_of: impl Fn(SlotId) -> String) -> Firmware<DirMedia> {
            let boot = BootDir::new(self.path());
            let mut env = boot.read_env().grub.unwrap();
            let slot = match env.trial.take() {
                Some(trial) => trial,
                None => env.primary,
            };
            std::fs::write(self.path().join("grubenv"), crate::bootenv::grubenv(&env)).unwrap();
            Firmware::start(
                DirMedia::new(self.path()),
                boot,
                Identity {
                    key: self.key.verifying_key(),
                    arch: "x86_64".into(),
                    running: slot,
                    version: version_of(slot),
                },
            )
            .unwrap()
        }

        fn bundle(&self, version: &str) -> Vec<u8> {
            bundle::build(
                &self.key,
                "x86_64",
                version,
                format!("kernel {version}").as_bytes(),
                b"initramfs",
            )
            .unwrap()
        }
    }

    fn versions(slot: SlotId) -> String {
        match slot {
            SlotId::A => "1.0".into(),
            SlotId::B => "2.0".into(),
        }
    }

    #[test]
    fn good_update_boots_once_then_becomes_primary() {
        let b = Box_::new();
        let mut fw = b.boot(versions);
        assert_eq!(fw.outcome(), &BootOutcome::Normal);
        let manifest = fw.update(&b.bundle("2.0")).unwrap();
        assert_eq!(manifest.version, "2.0");
        assert_eq!(
            std::fs::read(b.path().join("slot-b").join(KERNEL)).unwrap(),
            b"kernel 2.0"
        );
        let armed = BootEnv {
            primary: SlotId::A,
            trial: Some(SlotId::B),
        };
        assert_eq!(fw.status().loaders.grub, Ok(armed));
        assert_eq!(fw.status().loaders.syslinux, Ok(armed));
        assert!(fw.reboot_changes_slot());
        drop(fw);

        let mut fw = b.boot(versions);
        assert_eq!(fw.status().running, SlotId::B);
        assert_eq!(fw.outcome(), &BootOutcome::Trial);
        assert!(fw.on_trial());
        fw.confirm().unwrap();
        assert!(!fw.on_trial());
        let status = fw.status();
        assert_eq!(status.slots.primary, SlotId::B);
        assert_eq!(
            status.loaders.syslinux,
            Ok(BootEnv {
                primary: SlotId::B,
                trial: None
            })
        );
        drop(fw);
        let fw = b.boot(versions);
        assert_eq!(
            (fw.status().running, fw.outcome()),
            (SlotId::B, &BootOutcome::Normal)
        );
    }

    #[test]
    fn trial_that_never_confirms_rolls_back_by_itself() {
        let b = Box_::new();
        let mut fw = b.boot(versions);
        fw.update(&b.bundle("2.0")).unwrap();
        drop(fw);
        let fw = b.boot(versions);
        assert!(fw.on_trial());
        // Hang: the watchdog resets the box before any confirm.
        drop(fw);
        let fw = b.boot(versions);
        let status = fw.status();
        assert_eq!(status.running, SlotId::A);
        assert!(matches!(fw.outcome(), BootOutcome::RolledBack(_)));
        let rb = status.slots.last_rollback.clone().unwrap();
        assert_eq!((rb.slot, rb.reason), (SlotId::B, Reason::TrialNotConfirmed));
        assert_eq!(status.slots.slot(SlotId::B).status, Status::Bad);
    }

    #[test]
    fn failed_trial_keeps_its_reason_across_the_fallback_boot() {
        let b = Box_::new();
        let mut fw = b.boot(versions);
        fw.update(&b.bundle("2.0")).unwrap();
        drop(fw);
        let mut fw = b.boot(versions);
        fw.fail_trial(Reason::DaemonExited(Some(1))).unwrap();
        assert!(fw.reboot_changes_slot());
        drop(fw);
        let fw = b.boot(versions);
        assert_eq!(fw.status().running, SlotId::A);
        assert_eq!(
            fw.status().slots.last_rollback.unwrap().reason,
            Reason::DaemonExited(Some(1))
        );
    }

    #[test]
    fn refused_bundles_write_nothing() {
        let b = Box_::new();
        let mut fw = b.boot(versions);
        let before = fw.status();
        let good = b.bundle("2.0");
        let other_key = SigningKey::generate().unwrap().0;
        let foreign = bundle::build(&other_key, "x86_64", "2.0", b"k", b"i").unwrap();
        let arm = bundle::build(&b.key, "aarch64", "2.0", b"k", b"i").unwrap();
        let mut forged = good.clone();
        forged[20] ^= 1;
        for bad in [&good[..good.len() - 1], &foreign[..], &arm[..], &forged[..]] {
            assert!(matches!(fw.update(bad), Err(FirmwareError::Bundle(_))));
        }
        assert_eq!(fw.status(), before);
        assert!(!b.path().join("slot-b").exists(), "nothing written");
    }

    #[test]
    fn a_cut_while_writing_the_slot_boots_the_old_one() {
        let b = Box_::new();
        let mut fw = b.boot(versions);
        fw.update(&b.bundle("2.0")).unwrap();
        drop(fw);
        // A second update, cut after the state said "writing" and half the kernel went down:
        // simulated by replaying its first half by hand.
        let mut fw = b.boot(versions);
        fw.confirm().unwrap();
        let mut next = fw.slots.clone();
        next.begin_write(SlotId::B).unwrap();
        fw.adopt(next).unwrap();
        std::fs::write(b.path().join("slot-a").join(KERNEL), b"kern").unwrap();
        drop(fw);
        let fw = b.boot(versions);
        assert_eq!(fw.status().running, SlotId::B);
        assert_eq!(fw.status().slots.slot(SlotId::A).status, Status::Writing);
        assert!(!fw.reboot_changes_slot());
    }

    #[test]
    fn admin_rollback_and_updates_are_refused_during_a_trial() {
        let b = Box_::new();
        let mut fw = b.boot(versions);
        assert!(matches!(
            fw.rollback(),
            Err(FirmwareError::Slot(SlotError::NothingToRollBackTo))
        ));
        fw.update(&b.bundle("2.0")).unwrap();
        drop(fw);
        let mut fw = b.boot(versions);
        assert!(matches!(
            fw.update(&b.bundle("3.0")),
            Err(FirmwareError::Slot(_))
        ));
        assert_eq!(fw.rollback().unwrap(), SlotId::A);
        assert!(fw.reboot_changes_slot());
        let slot_b = std::fs::read(b.path().join("slot-b").join(INITRAMFS)).unwrap();
        assert_eq!(slot_b, b"initramfs");
    }
}
