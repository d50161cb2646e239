//! The A/B slot state machine: which firmware boots, which one is on trial, and why the last
//! update was rolled back. No I/O and no clock: each transition is a method that checks the
//! current state and changes it, or returns a [`SlotError`] and leaves it untouched.
//!
//! The boot loader owns boot-once: it reads a [`BootEnv`] (the primary slot and, at most once, a
//! trial slot), and clears the trial before it boots it. [`Slots::boot_env`] is the only source
//! of that env, and it names a trial slot only while the trial has not been booted yet, so
//! rewriting the env from this state can never arm the same trial twice. The daemon learns which
//! slot the loader picked (`edgevol.slot=` on the kernel command line) and calls
//! [`Slots::reconcile`]: a try-once slot it did *not* boot means the trial boot ended without
//! confirming (a hang the watchdog cut, a panic, a power cut) and is marked bad.
//!
//! Life of an update, from running slot A:
//! `begin_write(A)` B: writing → `finish_write(B, v)` B: try-once, env trial=B → reboot →
//! loader boots B once, `reconcile(B)` B: on trial → health passes, `confirm(B)` B good and
//! primary / health fails, `fail_trial(B, why)` B bad, A stays primary → reboot.

use std::fmt;

/// One of the two slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotId {
    /// Slot A.
    A,
    /// Slot B.
    B,
}

impl SlotId {
    /// The other slot.
    pub fn other(self) -> SlotId {
        match self {
            SlotId::A => SlotId::B,
            SlotId::B => SlotId::A,
        }
    }

    /// 0 for A, 1 for B.
    pub fn index(self) -> usize {
        match self {
            SlotId::A => 0,
            SlotId::B => 1,
        }
    }

    /// Lowercase letter, as on the kernel command line and in file names.
    pub fn letter(self) -> char {
        match self {
            SlotId::A => 'a',
            SlotId::B => 'b',
        }
    }

    /// Parses [`SlotId::letter`] (either case).
    pub fn from_letter(s: &str) -> Option<SlotId> {
        match s {
            "a" | "A" => Some(SlotId::A),
            "b" | "B" => Some(SlotId::B),
            _ => None,
        }
    }
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.letter().to_ascii_uppercase())
    }
}

/// A slot's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Never written.
    Empty,
    /// Being written: a cut here leaves a slot that is never booted.
    Writing,
    /// Written and verified, armed to boot once.
    TryOnce {
        /// The loader has booted it (the one try is used up).
        booted: bool,
    },
    /// Proved healthy: may be primary.
    Good,
    /// Failed its trial (or was cancelled); needs a new update.
    Bad,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Empty => "empty",
            Status::Writing => "writing",
            Status::TryOnce { booted: false } => "try-once",
            Status::TryOnce { booted: true } => "on trial",
            Status::Good => "good",
            Status::Bad => "bad",
        })
    }
}

/// One slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Its state.
    pub status: Status,
    /// The firmware version in it (empty when [`Status::Empty`] or [`Status::Writing`]).
    pub version: String,
    /// How many times the firmware started on it (saturating; a trial counts once).
    pub boots: u32,
}

impl Slot {
    fn empty() -> Slot {
        Slot {
            status: Status::Empty,
            version: String::new(),
            boots: 0,
        }
    }
}

/// Why a trial ended in a rollback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The trial boot ended without confirming: a hang the watchdog reset, a panic, a power cut.
    TrialNotConfirmed,
    /// The daemon exited during the trial (its exit status; `None` when killed by a signal).
    DaemonExited(Option<i32>),
    /// The health check failed (what failed).
    HealthCheckFailed(String),
    /// An admin asked for it.
    Requested,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::TrialNotConfirmed => f.write_str(
                "the trial boot ended before its health check passed (hang, panic or power cut)",
            ),
            Reason::DaemonExited(Some(code)) => write!(f, "edgevold exited with status {code}"),
            Reason::DaemonExited(None) => f.write_str("edgevold was killed by a signal"),
            Reason::HealthCheckFailed(what) => write!(f, "health check failed: {what}"),
            Reason::Requested => f.write_str("rollback requested by an admin"),
        }
    }
}

/// The last rollback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollback {
    /// The slot rolled back from.
    pub slot: SlotId,
    /// Its version.
    pub version: String,
    /// Why.
    pub reason: Reason,
}

/// What the boot loader needs: the primary slot, and a trial slot to boot once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootEnv {
    /// Booted unless a trial is armed.
    pub primary: SlotId,
    /// Booted once, cleared by the loader before it boots.
    pub trial: Option<SlotId>,
}

/// What [`Slots::reconcile`] found about this boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootOutcome {
    /// The primary slot, nothing pending.
    Normal,
    /// A trial boot: run the health check, then [`Slots::confirm`] or [`Slots::fail_trial`].
    Trial,
    /// The loader fell back from a trial: the trial slot is now bad.
    RolledBack(Rollback),
}

/// A transition that the state does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotError {
    /// An update is on trial: confirm or roll it back first.
    TrialInProgress,
    /// The slot is not in the state the transition needs.
    WrongState {
        /// The slot.
        slot: SlotId,
        /// Its state.
        status: Status,
        /// What was asked.
        action: &'static str,
    },
    /// The loader booted a slot that holds no usable firmware.
    BootedUnusable {
        /// The slot.
        slot: SlotId,
        /// Its state.
        status: Status,
    },
    /// No other good slot to roll back to.
    NothingToRollBackTo,
    /// The version is not acceptable (see [`crate::bundle::check_version`]).
    BadVersion,
}

impl fmt::Display for SlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlotError::TrialInProgress => {
                f.write_str("an update is on trial: wait for it to be confirmed or roll back")
            }
            SlotError::WrongState {
                slot,
                status,
                action,
            } => write!(f, "cannot {action}: slot {slot} is {status}"),
            SlotError::BootedUnusable { slot, status } => {
                write!(f, "booted slot {slot}, which is {status}")
            }
            SlotError::NothingToRollBackTo => f.write_str("no other good slot to roll back to"),
            SlotError::BadVersion => f.write_str("invalid firmware version"),
        }
    }
}

impl std::error::Error for SlotError {}

/// Both slots and the history the status shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slots {
    /// The slot the loader boots when no trial is armed; always [`Status::Good`].
    pub primary: SlotId,
    /// Slot A, slot B.
    pub slots: [Slot; 2],
    /// The last rollback, kept until the next one.
    pub last_rollback: Option<Rollback>,
}

impl Slots {
    /// A factory image: `version` in slot A, good and primary; slot B empty.
    pub fn factory(version: &str) -> Result<Slots, SlotError> {
        Slots::first_boot(SlotId::A, version)
    }

    /// No state recorded yet and `running` booted: it holds `version`, good and primary; the
    /// other slot is empty.
    pub fn first_boot(running: SlotId, version: &str) -> Result<Slots, SlotError> {
        crate::bundle::check_version(version).map_err(|_| SlotError::BadVersion)?;
        let mut slots = [Slot::empty(), Slot::empty()];
        slots[running.index()] = Slot {
            status: Status::Good,
            version: version.to_owned(),
            boots: 0,
        };
        Ok(Slots {
            primary: running,
            slots,
            last_rollback: None,
        })
    }

    /// One slot.
    pub fn slot(&self, id: SlotId) -> &Slot {
        &self.slots[id.index()]
    }

    fn slot_mut(&mut self, id: SlotId) -> &mut Slot {
        &mut self.slots[id.index()]
    }

    /// The slot on trial or armed for one, if any.
    pub fn trial(&self) -> Option<SlotId> {
        [SlotId::A, SlotId::B]
            .into_iter()
            .find(|&id| matches!(self.slot(id).status, Status::TryOnce { .. }))
    }

    /// What the boot loader's env must say.
    pub fn boot_env(&self) -> BootEnv {
        let trial = self
            .trial()
            .filter(|&id| self.slot(id).status == Status::TryOnce { booted: false });
        BootEnv {
            primary: self.primary,
            trial,
        }
    }

    /// First thing after boot: record that the loader booted `booted`, and find out whether
    /// this is a trial or a fallback from one.
    pub fn reconcile(&mut self, booted: SlotId) -> Result<BootOutcome, SlotError> {
        let status = self.slot(booted).status;
        match status {
            Status::TryOnce { booted: false } => {
                let slot = self.slot_mut(booted);
                slot.status = Status::TryOnce { booted: true };
                slot.boots = slot.boots.saturating_add(1);
                Ok(BootOutcome::Trial)
            }
            // Recorded already in this boot: a second start (the daemon restarted, or init
            // recording why it exited). No loader boots a trial twice (boot_env never re-arms a
            // booted one), so this is still the same trial.
            Status::TryOnce { booted: true } => Ok(BootOutcome::Trial),
            Status::Good => {
                let slot = self.slot_mut(booted);
                slot.boots = slot.boots.saturating_add(1);
                // An admin rollback points the env at the other good slot before rebooting; the
                // loader's choice is what runs.
                self.primary = booted;
                // Any boot after arming boots the trial first (the loader clears it as it goes),
                // so a try-once slot we did not boot had its try: it ended before confirming,
                // possibly before the daemon could even record it (a kernel panic). If a cut fell
                // between arming here and arming the loader's env, the trial never ran; it is
                // marked bad the same way (safe: the running slot stays primary).
                match self.trial() {
                    Some(id) => Ok(BootOutcome::RolledBack(
                        self.mark_bad(id, Reason::TrialNotConfirmed),
                    )),
                    None => Ok(BootOutcome::Normal),
                }
            }
            Status::Empty | Status::Writing | Status::Bad => Err(SlotError::BootedUnusable {
                slot: booted,
                status,
            }),
        }
    }

    /// Before writing an update into the slot that is not running. A cut after this leaves that
    /// slot [`Status::Writing`], which no env ever boots.
    pub fn begin_write(&mut self, running: SlotId) -> Result<SlotId, SlotError> {
        if self.slot(running).status != Status::Good {
            return Err(self.wrong(running, "write an update while running"));
        }
        let target = running.other();
        match self.slot(target).status {
            Status::TryOnce { booted: true } => return Err(SlotError::TrialInProgress),
            Status::Writing | Status::Empty | Status::Good | Status::Bad => {}
            // An armed, unbooted update is replaced by the new one.
            Status::TryOnce { booted: false } => {}
        }
        if self.primary != running {
            return Err(self.wrong(target, "overwrite the primary slot"));
        }
        let slot = self.slot_mut(target);
        slot.status = Status::Writing;
        slot.version.clear();
        Ok(target)
    }

    /// After the slot was written, synced and read back equal: arm it to boot once.
    pub fn finish_write(&mut self, target: SlotId, version: &str) -> Result<(), SlotError> {
        crate::bundle::check_version(version).map_err(|_| SlotError::BadVersion)?;
        if self.slot(target).status != Status::Writing {
            return Err(self.wrong(target, "finish writing"));
        }
        let slot = self.slot_mut(target);
        slot.status = Status::TryOnce { booted: false };
        slot.version = version.to_owned();
        Ok(())
    }

    /// The trial slot passed its health check: it becomes good and primary. The previous slot
    /// stays good, for a manual rollback.
    pub fn confirm(&mut self, running: SlotId) -> Result<(), SlotError> {
        if self.slot(running).status != (Status::TryOnce { booted: true }) {
            return Err(self.wrong(running, "confirm"));
        }
        self.slot_mut(running).status = Status::Good;
        self.primary = running;
        Ok(())
    }

    /// The trial failed while running (daemon exit, failed health check): the slot is bad and
    /// the primary, untouched, boots next.
    pub fn fail_trial(&mut self, running: SlotId, reason: Reason) -> Result<Rollback, SlotError> {
        if self.slot(running).status != (Status::TryOnce { booted: true }) {
            return Err(self.wrong(running, "fail a trial"));
        }
        Ok(self.mark_bad(running, reason))
    }

    /// An admin's rollback from the running slot. An armed update not yet booted is cancelled;
    /// on a trial the trial fails; otherwise the other slot, if good, becomes primary. Returns
    /// the slot the next boot runs.
    pub fn rollback(&mut self, running: SlotId) -> Result<SlotId, SlotError> {
        let other = running.other();
        match (self.slot(running).status, self.slot(other).status) {
            (Status::TryOnce { booted: true }, _) => {
                self.mark_bad(running, Reason::Requested);
                Ok(self.primary)
            }
            (_, Status::TryOnce { booted: false }) => {
                self.mark_bad(other, Reason::Requested);
                Ok(self.primary)
            }
            (Status::Good, Status::Good) => {
                self.last_rollback = Some(Rollback {
                    slot: running,
                    version: self.slot(running).version.clone(),
                    reason: Reason::Requested,
                });
                self.primary = other;
                Ok(other)
            }
            _ => Err(SlotError::NothingToRollBackTo),
        }
    }

    fn mark_bad(&mut self, id: SlotId, reason: Reason) -> Rollback {
        self.slot_mut(id).status = Status::Bad;
        let rollback = Rollback {
            slot: id,
            version: self.slot(id).version.clone(),
            reason,
        };
        self.last_rollback = Some(rollback.clone());
        rollback
    }

    fn wrong(&self, slot: SlotId, action: &'static str) -> SlotError {
        SlotError::WrongState {
            slot,
            status: self.slot(slot).status,
            action,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loader's side of boot-once, as GRUB's script and the BIOS path implement it: boot the
    /// armed trial once (clearing it first), else the primary.
    pub(crate) fn loader_boot(env: &mut BootEnv) -> SlotId {
        match env.trial.take() {
            Some(trial) => trial,
            None => env.primary,
        }
    }

    /// Factory A=1.0 running, update to 2.0 written into B and armed.
    fn armed() -> Slots {
        let mut s = Slots::factory("1.0").unwrap();
        assert_eq!(s.reconcile(SlotId::A), Ok(BootOutcome::Normal));
        assert_eq!(s.begin_write(SlotId::A), Ok(SlotId::B));
        s.finish_write(SlotId::B, "2.0").unwrap();
        s
    }

    #[test]
    fn factory_state_boots_a() {
        let s = Slots::factory("1.0").unwrap();
        assert_eq!(
            s.boot_env(),
            BootEnv {
                primary: SlotId::A,
                trial: None
            }
        );
        assert_eq!(s.slot(SlotId::B).status, Status::Empty);
        assert_eq!(Slots::factory("1 0"), Err(SlotError::BadVersion));
    }

    #[test]
    fn writing_slot_is_never_booted() {
        let mut s = Slots::factory("1.0").unwrap();
        s.begin_write(SlotId::A).unwrap();
        assert_eq!(s.slot(SlotId::B).status, Status::Writing);
        let mut env = s.boot_env();
        assert_eq!(loader_boot(&mut env), SlotId::A);
        assert_eq!(s.reconcile(SlotId::A), Ok(BootOutcome::Normal));
        // And a loader that booted it anyway is caught.
        assert_eq!(
            s.reconcile(SlotId::B),
            Err(SlotError::BootedUnusable {
                slot: SlotId::B,
                status: Status::Writing
            })
        );
    }

    #[test]
    fn good_update_is_tried_once_then_confirmed() {
        let mut s = armed();
        let mut env = s.boot_env();
        assert_eq!(env.trial, Some(SlotId::B));
        assert_eq!(loader_boot(&mut env), SlotId::B);
        assert_eq!(s.reconcile(SlotId::B), Ok(BootOutcome::Trial));
        // The env rewritten from the state during the trial never re-arms it.
        assert_eq!(s.boot_env().trial, None);
        assert_eq!(s.boot_env().primary, SlotId::A);
        s.confirm(SlotId::B).unwrap();
        assert_eq!(s.primary, SlotId::B);
        assert_eq!(s.slot(SlotId::B).status, Status::Good);
        assert_eq!(s.slot(SlotId::A).status, Status::Good);
        assert_eq!(s.slot(SlotId::B).boots, 1);
        assert_eq!(s.last_rollback, None);
        let mut env = s.boot_env();
        assert_eq!(loader_boot(&mut env), SlotId::B);
        assert_eq!(s.reconcile(SlotId::B), Ok(BootOutcome::Normal));
    }

    #[test]
    fn trial_boot_that_never_confirms_falls_back_next_boot() {
        let mut s = armed();
        let mut env = s.boot_env();
        assert_eq!(loader_boot(&mut env), SlotId::B);
        s.reconcile(SlotId::B).unwrap();
        // Hang: the watchdog resets the box. The loader's env has no trial left.
        assert_eq!(loader_boot(&mut env), SlotId::A);
        let outcome = s.reconcile(SlotId::A).unwrap();
        let expected = Rollback {
            slot: SlotId::B,
            version: "2.0".into(),
            reason: Reason::TrialNotConfirmed,
        };
        assert_eq!(outcome, BootOutcome::RolledBack(expected.clone()));
        assert_eq!(s.slot(SlotId::B).status, Status::Bad);
        assert_eq!(s.primary, SlotId::A);
        assert_eq!(s.last_rollback, Some(expected));
    }

    #[test]
    fn trial_that_dies_before_the_daemon_records_it_also_falls_back() {
        let mut s = armed();
        let mut env = s.boot_env();
        assert_eq!(loader_boot(&mut env), SlotId::B);
        // Kernel panic before reconcile: the state still says "armed", the env is spent.
        assert_eq!(loader_boot(&mut env), SlotId::A);
        assert!(matches!(
            s.reconcile(SlotId::A),
            Ok(BootOutcome::RolledBack(Rollback {
                slot: SlotId::B,
                ..
            }))
        ));
        // The env rewritten from the state does not arm the failed trial again.
        assert_eq!(
            s.boot_env(),
            BootEnv {
                primary: SlotId::A,
                trial: None
            }
        );
    }

    #[test]
    fn failed_health_check_rolls_back_with_its_reason() {
        let mut s = armed();
        s.reconcile(SlotId::B).unwrap();
        let why = Reason::HealthCheckFailed("NVMe target not listening after 60 s".into());
        let rb = s.fail_trial(SlotId::B, why.clone()).unwrap();
        assert_eq!(rb.reason, why);
        assert_eq!(
            s.boot_env(),
            BootEnv {
                primary: SlotId::A,
                trial: None
            }
        );
        assert_eq!(s.reconcile(SlotId::A), Ok(BootOutcome::Normal));
        assert_eq!(s.last_rollback.as_ref().unwrap().reason, why);
        assert_eq!(s.slot(SlotId::B).status, Status::Bad);
    }

    #[test]
    fn daemon_exit_reason_survives_the_fallback_boot() {
        let mut s = armed();
        s.reconcile(SlotId::B).unwrap();
        s.fail_trial(SlotId::B, Reason::DaemonExited(Some(3)))
            .unwrap();
        s.reconcile(SlotId::A).unwrap();
        let rb = s.last_rollback.clone().unwrap();
        assert_eq!(rb.reason, Reason::DaemonExited(Some(3)));
        assert_eq!(rb.reason.to_string(), "edgevold exited with status 3");
    }

    #[test]
    fn only_the_running_trial_can_be_confirmed_or_failed() {
        let mut s = armed();
        assert!(matches!(
            s.confirm(SlotId::B),
            Err(SlotError::WrongState { .. })
        ));
        assert!(matches!(
            s.confirm(SlotId::A),
            Err(SlotError::WrongState { .. })
        ));
        assert!(s.fail_trial(SlotId::A, Reason::Requested).is_err());
        s.reconcile(SlotId::B).unwrap();
        s.confirm(SlotId::B).unwrap();
        assert!(s.confirm(SlotId::B).is_err(), "confirm twice");
    }

    #[test]
    fn no_update_while_on_trial() {
        let mut s = armed();
        s.reconcile(SlotId::B).unwrap();
        assert!(matches!(
            s.begin_write(SlotId::B),
            Err(SlotError::WrongState { .. })
        ));
    }

    #[test]
    fn a_new_update_replaces_an_armed_one() {
        let mut s = armed();
        assert_eq!(s.begin_write(SlotId::A), Ok(SlotId::B));
        s.finish_write(SlotId::B, "3.0").unwrap();
        assert_eq!(s.slot(SlotId::B).version, "3.0");
        assert_eq!(s.boot_env().trial, Some(SlotId::B));
    }

    #[test]
    fn finish_write_needs_a_write_in_progress() {
        let mut s = Slots::factory("1.0").unwrap();
        assert!(s.finish_write(SlotId::B, "2.0").is_err());
        s.begin_write(SlotId::A).unwrap();
        assert_eq!(s.finish_write(SlotId::B, ""), Err(SlotError::BadVersion));
        assert_eq!(s.slot(SlotId::B).status, Status::Writing);
    }

    #[test]
    fn admin_rollback_cancels_an_armed_update() {
        let mut s = armed();
        assert_eq!(s.rollback(SlotId::A), Ok(SlotId::A));
        assert_eq!(s.slot(SlotId::B).status, Status::Bad);
        assert_eq!(s.boot_env().trial, None);
        assert_eq!(s.last_rollback.unwrap().reason, Reason::Requested);
    }

    #[test]
    fn admin_rollback_during_a_trial_fails_it() {
        let mut s = armed();
        s.reconcile(SlotId::B).unwrap();
        assert_eq!(s.rollback(SlotId::B), Ok(SlotId::A));
        assert_eq!(s.slot(SlotId::B).status, Status::Bad);
    }

    #[test]
    fn admin_rollback_to_the_previous_good_slot_and_back() {
        let mut s = armed();
        s.reconcile(SlotId::B).unwrap();
        s.confirm(SlotId::B).unwrap();
        assert_eq!(s.rollback(SlotId::B), Ok(SlotId::A));
        assert_eq!(s.boot_env().primary, SlotId::A);
        let rb = s.last_rollback.clone().unwrap();
        assert_eq!((rb.slot, rb.version.as_str()), (SlotId::B, "2.0"));
        assert_eq!(s.reconcile(SlotId::A), Ok(BootOutcome::Normal));
        assert_eq!(s.rollback(SlotId::A), Ok(SlotId::B));
    }

    #[test]
    fn no_rollback_without_another_good_slot() {
        let mut s = Slots::factory("1.0").unwrap();
        assert_eq!(s.rollback(SlotId::A), Err(SlotError::NothingToRollBackTo));
        s.begin_write(SlotId::A).unwrap();
        assert_eq!(s.rollback(SlotId::A), Err(SlotError::NothingToRollBackTo));
    }

    #[test]
    fn a_bad_slot_is_rewritable() {
        let mut s = armed();
        s.reconcile(SlotId::B).unwrap();
        s.fail_trial(SlotId::B, Reason::DaemonExited(None)).unwrap();
        s.reconcile(SlotId::A).unwrap();
        assert_eq!(s.begin_write(SlotId::A), Ok(SlotId::B));
        // The rollback record stays until the next one.
        assert!(s.last_rollback.is_some());
    }

    #[test]
    fn a_second_start_in_a_trial_boot_is_the_same_trial_and_a_bad_slot_is_unusable() {
        let mut s = armed();
        s.reconcile(SlotId::B).unwrap();
        assert_eq!(s.reconcile(SlotId::B), Ok(BootOutcome::Trial));
        assert_eq!(s.slot(SlotId::B).boots, 1, "one boot, two starts");
        assert_eq!(s.boot_env().trial, None);
        s.fail_trial(SlotId::B, Reason::Requested).unwrap();
        assert!(matches!(
            s.reconcile(SlotId::B),
            Err(SlotError::BootedUnusable { .. })
        ));
    }
}
