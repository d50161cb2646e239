//! Group commit of the control plane: concurrent CSI mutations share one journal write and one
//! flush, and each is answered only after the flush that covers it.
//!
//! A call stages its records under the pool lock (core's group-commit mode: applied in memory,
//! pending in the journal) and takes a [`CommitTicket`]; then it waits here until a hard commit
//! covering that ticket has finished. The first waiter that finds no commit running and nobody
//! left staging becomes the *leader*: one hard commit (`Pool::commit_staged`) for everything
//! staged so far, run by a task of its own so a cancelled call cannot leave the group without a
//! leader. Calls staging meanwhile wait for the next commit, which the first of them leads.
//!
//! Waiting for stagers before leading is what makes the groups large: calls arriving during a
//! commit queue on the pool lock, and leading at once would race them for it. A leader waits at
//! most until [`MAX_GROUP`] tickets are outstanding, so steady arrivals cannot starve it.
//!
//! A failed commit fails every call it covered (every ticket up to the last one it meant to
//! commit) with its error; none of them is answered as done. Core then refuses further work
//! after a device error, so later calls fail too until the daemon restarts and recovers.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use edgevol_core::CommitTicket;
use tokio::sync::Notify;

use crate::state::{PoolUnavailable, State};

/// Most tickets a leader lets pile up before committing even though calls are still staging.
pub const MAX_GROUP: u64 = 256;

/// Why a call's commit did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitFailed {
    /// Core's commit failed (the device, or the metadata area).
    Core(edgevol_core::Error),
    /// The pool could not run the commit.
    Unavailable(PoolUnavailable),
}

/// The leader/follower state shared by every call on one pool.
#[derive(Debug, Default)]
pub struct GroupCommit {
    round: Mutex<Round>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct Round {
    /// Calls between announcing themselves ([`GroupCommit::staging`]) and taking their ticket.
    staging: usize,
    /// A commit is running.
    leading: bool,
    /// Every ticket up to this one is durable.
    committed: CommitTicket,
    /// The last commit that failed: the tickets up to the first value got the second.
    failed: Option<(CommitTicket, CommitFailed)>,
    /// The highest ticket a waiter has shown.
    highest: CommitTicket,
}

/// A call that is staging: counted until dropped (also when the call is cancelled).
#[derive(Debug)]
pub struct Staging<'a>(&'a GroupCommit);

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        let mut round = self.0.round();
        round.staging -= 1;
        if round.staging == 0 {
            drop(round);
            self.0.changed.notify_waiters();
        }
    }
}

impl GroupCommit {
    fn round(&self) -> MutexGuard<'_, Round> {
        // Every update of a round is one assignment: a panic cannot leave one half done.
        self.round.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Announces a call that is about to stage: a leader waits for it.
    pub fn staging(&self) -> Staging<'_> {
        self.round().staging += 1;
        Staging(self)
    }

    /// Returns once a hard commit covering `ticket` has finished, or with the error of the one
    /// that failed for it; leads a commit when it is this call's turn.
    pub async fn wait(&self, state: &Arc<State>, ticket: CommitTicket) -> Result<(), CommitFailed> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check: a change after it still wakes this call.
            changed.as_mut().enable();
            {
                let mut round = self.round();
                if ticket <= round.committed {
                    return Ok(());
                }
                if let Some((upto, error)) = round.failed {
                    if ticket <= upto {
                        return Err(error);
                    }
                }
                round.highest = round.highest.max(ticket);
                let full = round.highest.records_after(round.committed) >= MAX_GROUP;
                if !round.leading && (round.staging == 0 || full) {
                    round.leading = true;
                    tokio::spawn(lead(state.clone()));
                }
            }
            changed.await;
        }
    }

    fn finish(&self, outcome: Result<CommitTicket, (CommitTicket, CommitFailed)>) {
        {
            let mut round = self.round();
            round.leading = false;
            match outcome {
                Ok(upto) => round.committed = round.committed.max(upto),
                Err(failed) => round.failed = Some(failed),
            }
        }
        self.changed.notify_waiters();
    }
}

/// One hard commit of everything staged; wakes every waiter when done.
async fn lead(state: Arc<State>) {
    let highest = state.commits().round().highest;
    let outcome = state
        .on_pool_unobserved(|_, pool| {
            let upto = pool.commit_ticket();
            pool.commit_staged(upto)
                .map(|()| upto)
                .map_err(|e| (upto, CommitFailed::Core(e)))
        })
        .await
        .unwrap_or_else(|e| Err((highest, CommitFailed::Unavailable(e))));
    if let Err((_, error)) = &outcome {
        tracing::error!(?error, "group commit of control operations failed");
    }
    state.commits().finish(outcome);
}
