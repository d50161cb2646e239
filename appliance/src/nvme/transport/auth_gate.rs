//! In-band authentication of a queue (DH-HMAC-CHAP): the AUTH_Send / AUTH_Receive steps, the
//! transaction's timers, and what a failure closes. Which commands may run before the queue has
//! authenticated is decided where every command is routed (`dispatch`, as Linux
//! `nvmet_check_auth_status`).

use std::sync::Arc;

use edgevol_nvmeof::auth::{command, AuthCommand, Outcome};
use edgevol_nvmeof::status::{Status, StatusCode};
use getrandom::SysRng;
use rand_core::UnwrapErr;

use super::{Conn, End, Issued};
use crate::nvme::auth::QueueAuth;
use crate::nvme::controller::Controller;

impl Conn {
    /// AUTH_Send / AUTH_Receive: one step of the queue's DH-HMAC-CHAP transaction. A failure
    /// on the admin queue fails the controller (every queue's connection closes, Linux
    /// `nvmet_ctrl_fatal_error`); on an I/O queue it closes that queue. Either way the
    /// command completes first, so the host reads its AUTH_Failure1.
    pub(super) fn authenticate(
        &mut self,
        issued: Issued,
        ctrl: &Arc<Controller>,
        cmd: AuthCommand,
        data: &[u8],
    ) {
        let sqid = self.sqid();
        let Some(auth) = self.auth.as_mut() else {
            // The Connect did not ask this queue to authenticate.
            return self.fail(issued, StatusCode::CommandSequenceError.into());
        };
        let now = self.epoch.elapsed();
        let mut out = Vec::new();
        let stepped = match cmd {
            AuthCommand::Send { .. } => {
                // A new transaction checks the host against the store's pairs as they are now:
                // a live queue re-authenticates with a rotated pair.
                if QueueAuth::is_negotiate(data) && !self.subs.auth.refresh(auth) {
                    self.subs.auth.failed(
                        auth.host_nqn(),
                        self.peer,
                        &"the host's keys were revoked",
                    );
                    if sqid == 0 {
                        self.subs.remove(ctrl);
                    } else {
                        self.end = Some(End::Unauthenticated("keys revoked"));
                    }
                    return self.complete(issued, command::authentication_required(), 0, &[]);
                }
                auth.authenticator.on_auth_send(&cmd, data, now)
            }
            AuthCommand::Receive { .. } => {
                let mut rng = UnwrapErr(SysRng);
                auth.authenticator
                    .on_auth_receive(&cmd, now, &mut rng, &mut out)
            }
        };
        let outcome = match stepped {
            Ok(outcome) => outcome,
            Err(status) => return self.complete(issued, status, 0, &[]),
        };
        match outcome {
            Outcome::Continue => {}
            Outcome::Authenticated(done) => {
                ctrl.touch();
                self.subs.auth.succeeded(auth, &done, self.peer);
            }
            Outcome::ControllerRejected(rejected) => {
                // The queue stays authenticated and the controller stays (see the variant).
                self.subs
                    .auth
                    .controller_rejected(auth.host_nqn(), self.peer, &rejected);
            }
            Outcome::Failed(failed) => {
                self.subs.auth.failed(auth.host_nqn(), self.peer, &failed);
                if sqid == 0 {
                    self.subs.remove(ctrl);
                } else {
                    self.end = Some(End::Unauthenticated("authentication failed"));
                }
            }
        }
        self.complete(issued, Status::SUCCESS, 0, &out);
    }

    /// Runs the authentication timers; `Some(why)` when the queue must close.
    pub(super) fn auth_expired(&mut self) -> Option<&'static str> {
        let auth = self.auth.as_mut()?;
        let why = auth.on_timer(self.epoch.elapsed())?;
        self.subs.auth.failed(auth.host_nqn(), self.peer, &why);
        Some(why)
    }

    /// Whether this admin queue's keep-alive timer runs: not before the queue's first
    /// authentication completes (which restarts it). Until then the host can send nothing but
    /// Fabrics commands, Keep Alive included, and its side of the DH exchange may take longer
    /// than KATO on a slow CPU (ffdhe8192 in a TCG guest: seconds; Linux's target starts the
    /// timer only when the host enables the controller, which Linux does after authenticating).
    /// The authentication timers bound the wait instead.
    pub(super) fn keep_alive_runs(&self) -> bool {
        self.auth.as_ref().is_none_or(|a| a.is_authenticated())
    }
}
