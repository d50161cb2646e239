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
use crate::pool_format::{PoolFormat, PoolInUse, Readability};
use crate::record::{Media, Store, StoreError};
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
    /// The state record was written by newer firmware, in a format this one does not read;
    /// nothing was written over it. Restarting cannot help: the box needs that firmware.
    StoreTooNew(String),
    /// The boot partition failed.
    Boot(BootDirError),
    /// The bundle's firmware cannot read (or could only read, not write) the pool in use;
    /// nothing was written.
    UpdateCannotReadPool {
        /// The bundle's firmware version.
        version: String,
        /// What it would do with the pool.
        readability: Readability,
    },
    /// The pool in use is not known yet (still opening): an update or rollback cannot be
    /// checked against it.
    PoolNotOpen,
    /// The slot a rollback would boot cannot read (or write) the pool in use; nothing changed.
    RollbackCannotReadPool {
        /// The slot.
        slot: SlotId,
        /// Its firmware version.
        version: String,
        /// What it would do with the pool.
        readability: Readability,
    },
}

/// What booting such a slot anyway leads to.
fn forced(readability: &Readability) -> &'static str {
    match readability {
        Readability::ReadOnly { .. } => {
            "it serves the pool read-only (hosts' writes fail) until firmware that writes it runs"
        }
        _ => {
            "its edgevold leaves the pool untouched but does not serve it (without a console, \
             this box stays out of service until it boots firmware that reads the pool)"
        }
    }
}

/// What a firmware that is not fully able to use the pool would do with it, in words.
fn consequence(readability: &Readability) -> String {
    match readability {
        Readability::ReadWrite => "it reads and writes the pool".to_owned(),
        Readability::ReadOnly { bit } => format!(
            "it lacks read-only-compatible feature bit {bit}: it would open the pool read-only \
             and refuse every write and change"
        ),
        Readability::No(why) => format!("{why}: it would refuse the pool"),
    }
}

impl fmt::Display for FirmwareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FirmwareError::Bundle(e) => write!(f, "bundle refused, nothing written: {e}"),
            FirmwareError::Slot(e) => write!(f, "{e}"),
            FirmwareError::Store(e) | FirmwareError::StoreTooNew(e) => write!(f, "{e}"),
            FirmwareError::Boot(e) => write!(f, "boot partition: {e}"),
            FirmwareError::PoolNotOpen => f.write_str(
                "the pool is still opening: updates and rollbacks are checked against it, retry once it is open",
            ),
            FirmwareError::UpdateCannotReadPool {
                version,
                readability,
            } => write!(
                f,
                "firmware {version} cannot use the pool in use ({}); bundle refused, nothing written",
                consequence(readability)
            ),
            FirmwareError::RollbackCannotReadPool {
                slot,
                version,
                readability,
            } => write!(
                f,
                "slot {slot} (version {version}) cannot use the pool in use ({}); rollback \
                 refused, nothing changed. With --force it boots anyway: {}",
                consequence(readability),
                forced(readability)
            ),
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
    /// The pool the appliance runs on, once open: updates and rollbacks are checked against it.
    pool: Option<PoolInUse>,
}

impl<M: Media> Firmware<M> {
    /// At daemon start: read the state (or start one), record what the loader booted, and bring
    /// the loaders' files in line with the state.
    pub fn start(media: M, boot: BootDir, identity: Identity) -> Result<Self, FirmwareError> {
        let (store, saved) = Store::open(media).map_err(|e| match e {
            StoreError::TooNew { .. } => FirmwareError::StoreTooNew(e.to_string()),
            e => FirmwareError::Store(e.to_string()),
        })?;
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
            pool: None,
        };
        firmware.adopt(slots)?;
        Ok(firmware)
    }

    /// The pool the appliance runs on (its format version and features, once open; again after
    /// a feature is enabled): [`Firmware::update`] and [`Firmware::rollback`] refuse firmware
    /// that cannot read and write it. `None` (no pool opened yet) checks nothing.
    pub fn set_pool_in_use(&mut self, pool: Option<PoolInUse>) {
        self.pool = pool;
    }

    /// Records in the running slot which pools its firmware reads (`reads`: this build's), if
    /// the slot says otherwise: a slot written from a format-1 bundle, or by the factory image,
    /// has no record and counts as reading format version 3 only until it has run once.
    pub fn describe_running_slot(&mut self, reads: &PoolFormat) -> Result<(), FirmwareError> {
        if self.boot.read_pool_format(self.identity.running) != *reads {
            self.boot.write_pool_format(self.identity.running, reads)?;
        }
        Ok(())
    }

    /// Whether the pool may be given a new format feature now: only once the running slot is
    /// committed (good), never on a trial boot, so a failing trial rolls back to a slot that
    /// still reads the pool.
    pub fn may_enable_pool_features(&self) -> bool {
        self.slots.slot(self.identity.running).status == crate::slots::Status::Good
    }

    /// The pool in use, once told ([`Firmware::set_pool_in_use`]).
    pub fn pool_in_use(&self) -> Option<PoolInUse> {
        self.pool
    }

    /// What the firmware of `slot` would do with the pool in use (`None`: no pool known).
    pub fn slot_reads_pool(&self, slot: SlotId) -> Option<Readability> {
        self.pool
            .map(|pool| self.boot.read_pool_format(slot).reads(&pool))
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

    /// Verifies `bundle` and writes it into the other slot, armed to boot once. Refused, with
    /// nothing written, when the bundle's firmware (by its signed pool format) could not read
    /// and write the pool in use.
    pub fn update(&mut self, bundle: &[u8]) -> Result<Manifest, FirmwareError> {
        let verified = bundle::verify(bundle, &self.identity.key, &self.identity.arch)
            .map_err(FirmwareError::Bundle)?;
        let reads = verified.manifest.pool_format();
        if let Some(pool) = self.pool {
            let readability = reads.reads(&pool);
            if readability != Readability::ReadWrite {
                return Err(FirmwareError::UpdateCannotReadPool {
                    version: verified.manifest.version,
                    readability,
                });
            }
        }
        let mut next = self.slots.clone();
        let target = next.begin_write(self.identity.running)?;
        self.adopt(next)?;
        self.boot
            .write_slot(target, verified.kernel, verified.initramfs)?;
        // Still `writing`: a cut before this leaves a slot that is never booted.
        self.boot.write_pool_format(target, &reads)?;
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

    /// An admin's rollback; returns the slot the next boot runs. Refused, with nothing changed,
    /// when that slot's firmware could not read and write the pool in use, unless `force`.
    pub fn rollback(&mut self, force: bool) -> Result<SlotId, FirmwareError> {
        let mut next = self.slots.clone();
        let slot = next.rollback(self.identity.running)?;
        if slot != self.identity.running && !force {
            if let Some(readability) = self.slot_reads_pool(slot) {
                if readability != Readability::ReadWrite {
                    return Err(FirmwareError::RollbackCannotReadPool {
                        slot,
                        version: self.slots.slot(slot).version.clone(),
                        readability,
                    });
                }
            }
        }
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
            fw.rollback(false),
            Err(FirmwareError::Slot(SlotError::NothingToRollBackTo))
        ));
        fw.update(&b.bundle("2.0")).unwrap();
        drop(fw);
        let mut fw = b.boot(versions);
        assert!(matches!(
            fw.update(&b.bundle("3.0")),
            Err(FirmwareError::Slot(_))
        ));
        assert_eq!(fw.rollback(false).unwrap(), SlotId::A);
        assert!(fw.reboot_changes_slot());
        let slot_b = std::fs::read(b.path().join("slot-b").join(INITRAMFS)).unwrap();
        assert_eq!(slot_b, b"initramfs");
    }

    /// The pool after test-feature-x (incompatible bit 63) was enabled: format version 4.
    const POOL_V4: PoolInUse = PoolInUse {
        version: 4,
        compatible: 0,
        read_only_compatible: 0,
        incompatible: 1 << 63,
    };
    const POOL_V3: PoolInUse = PoolInUse {
        version: 3,
        compatible: 0,
        read_only_compatible: 0,
        incompatible: 0,
    };
    /// What a build with test-feature-x reads.
    const READS_X: PoolFormat = PoolFormat {
        oldest: 3,
        newest: 4,
        compatible: 0,
        read_only_compatible: 0,
        incompatible: 1 << 63,
    };

    fn declaring(b: &Box_, version: &str, reads: PoolFormat) -> Vec<u8> {
        bundle::build_declaring(&b.key, "x86_64", version, reads, b"k", b"i").unwrap()
    }

    #[test]
    fn an_update_that_cannot_read_the_pool_is_refused_before_anything_is_written() {
        let b = Box_::new();
        let mut fw = b.boot(versions);
        fw.set_pool_in_use(Some(POOL_V4));
        let before = fw.status();
        // A format-1 bundle: firmware that reads exactly version 3.
        let e = fw.update(&b.bundle("2.0")).unwrap_err();
        assert!(
            matches!(e, FirmwareError::UpdateCannotReadPool { .. }),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "firmware 2.0 cannot use the pool in use (the pool's format version 4 is newer than \
             it supports (3): it would refuse the pool); bundle refused, nothing written"
        );
        let only_v4 = PoolFormat {
            incompatible: 0,
            ..READS_X
        };
        let e = fw.update(&declaring(&b, "2.1", only_v4)).unwrap_err();
        assert!(
            e.to_string()
                .contains("incompatible feature bit 63 (test-feature-x)"),
            "{e}"
        );
        let ro = PoolInUse {
            read_only_compatible: 1 << 4,
            ..POOL_V4
        };
        fw.set_pool_in_use(Some(ro));
        let e = fw.update(&declaring(&b, "2.2", READS_X)).unwrap_err();
        assert!(e.to_string().contains("open the pool read-only"), "{e}");
        assert_eq!(fw.status(), before, "state and loaders unchanged");
        assert!(
            !b.path().join("slot-b").join(KERNEL).exists(),
            "nothing written"
        );
        // One that reads it is written, and its slot records what it reads.
        fw.set_pool_in_use(Some(POOL_V4));
        fw.update(&declaring(&b, "2.3", READS_X)).unwrap();
        assert_eq!(fw.boot.read_pool_format(SlotId::B), READS_X);
    }

    #[test]
    fn a_rollback_to_a_slot_that_cannot_read_the_pool_needs_force() {
        let b = Box_::new();
        let mut fw = b.boot(versions);
        // Slot A runs 1.0 (factory: no pool-format record, so version 3 only); B gets 2.0,
        // which reads test-feature-x, and is committed.
        fw.update(&declaring(&b, "2.0", READS_X)).unwrap();
        drop(fw);
        let mut fw = b.boot(versions);
        assert!(!fw.may_enable_pool_features(), "never on a trial boot");
        fw.confirm().unwrap();
        assert!(fw.may_enable_pool_features(), "once committed");
        fw.describe_running_slot(&READS_X).unwrap();
        // Before the feature is enabled, slot A reads the (version-3) pool.
        fw.set_pool_in_use(Some(POOL_V3));
        assert_eq!(fw.slot_reads_pool(SlotId::A), Some(Readability::ReadWrite));
        // After: refused, nothing changed; forced, it goes through.
        fw.set_pool_in_use(Some(POOL_V4));
        let before = fw.status();
        let e = fw.rollback(false).unwrap_err();
        assert!(
            matches!(
                e,
                FirmwareError::RollbackCannotReadPool {
                    slot: SlotId::A,
                    ..
                }
            ),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.starts_with("slot A (version 1.0) cannot use the pool in use (the pool's format version 4 is newer than it supports (3)"),
            "{text}"
        );
        assert!(text.contains("With --force it boots anyway"), "{text}");
        assert_eq!(fw.status(), before, "nothing changed");
        assert_eq!(fw.rollback(true).unwrap(), SlotId::A);
        assert_eq!(fw.status().slots.primary, SlotId::A);
    }

    #[test]
    fn a_good_rollback_before_a_feature_is_enabled_works_as_before() {
        let b = Box_::new();
        let mut fw = b.boot(versions);
        fw.update(&declaring(&b, "2.0", READS_X)).unwrap();
        drop(fw);
        let mut fw = b.boot(versions);
        fw.confirm().unwrap();
        fw.set_pool_in_use(Some(POOL_V3));
        assert_eq!(fw.rollback(false).unwrap(), SlotId::A);
    }
}
