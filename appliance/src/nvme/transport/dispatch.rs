//! Every command of the queue, as Linux nvmet's `core.c` takes a request: parse it against the
//! queue's state, route it (Connect, authentication, Fabrics, admin, I/O) and complete it.
//! Completion is one function, which also records failures in the controller's error log.

use std::sync::Arc;

use edgevol_nvmeof::admin::AdminCommand;
use edgevol_nvmeof::auth::command;
use edgevol_nvmeof::fabrics::{self as parse, Command, NamespaceInfo, QueueState};
use edgevol_nvmeof::queue::{self, Completion};
use edgevol_nvmeof::status::{Status, StatusCode};

use super::qos_hold::Qos;
use super::{Conn, End, IoView, Issued};
use crate::nvme::admin;
use crate::nvme::controller::{CcEffect, Controller, MAX_AERS};
use crate::nvme::errors::Origin;
use crate::nvme::fabrics::{self, Bound};
use crate::nvme::status::TargetStatus;
use crate::nvme::subsys::NSID;
use crate::nvme::throttle::stored_limits;

impl Conn {
    fn queue_state(&self) -> QueueState {
        match &self.bound {
            None => QueueState::Unconnected,
            Some(Bound::Admin(_)) => QueueState::Admin,
            Some(Bound::Io(c, _)) => QueueState::Io {
                namespace: c.volume().map(|_| NamespaceInfo {
                    nsid: NSID,
                    lba_shift: self.lba_shift,
                }),
            },
        }
    }

    /// Submission queue id of this connection (0 also before Connect: nothing is recorded
    /// then, there is no controller yet).
    pub(super) fn sqid(&self) -> u16 {
        match &self.bound {
            Some(Bound::Io(_, qid)) => *qid,
            Some(Bound::Admin(_)) | None => 0,
        }
    }

    /// The bound controller; parse routes only Connect to unconnected queues, so every other
    /// command has one.
    fn controller(&self) -> Option<Arc<Controller>> {
        self.bound.as_ref().map(|b| b.controller().clone())
    }

    /// What this pass's I/O commands read of their controller, read (and the controller
    /// touched) at the pass's first one: the registers are shared by every queue of the
    /// controller, so a batch takes their lock and reads the clock once, not per command. I/O
    /// commands change neither; what an admin command changes reaches the next pass, as it
    /// would reach a command already received on another queue's thread.
    pub(super) fn io_view(&mut self, ctrl: &Controller) -> IoView {
        *self.view.get_or_insert_with(|| {
            let mut regs = ctrl.regs();
            regs.last_activity = tokio::time::Instant::now();
            IoView {
                ready: regs.ready(),
                wce: regs.wce,
                at: std::time::Instant::now(),
            }
        })
    }

    /// Every completion goes through here: a failure is recorded in the controller's error log
    /// and flagged More (the log has its details), as Linux `nvmet_set_error` does.
    pub(super) fn complete(&mut self, issued: Issued, status: Status, result: u64, data: &[u8]) {
        self.complete_with(issued, status, result, data, None);
    }

    /// [`Conn::complete`]; with a `splice` token the data is not copied but sent from the
    /// queue's buffer under that token (`Buffers::send_from`). Returns whether the completion
    /// was queued.
    pub(super) fn complete_with(
        &mut self,
        issued: Issued,
        mut status: Status,
        result: u64,
        data: &[u8],
        splice: Option<u32>,
    ) -> bool {
        if !status.is_success() {
            if let Some(ctrl) = self.controller() {
                ctrl.errors().record(&issued.origin, status);
                status.more = true;
            }
        }
        let c = Completion {
            status,
            result,
            data,
        };
        let queued = match splice {
            None => self.queue.complete(issued.tag, c),
            Some(token) => self.queue.complete_spliced(issued.tag, c, token),
        };
        if let Err(e) = &queued {
            tracing::debug!(%e, "completion dropped");
        }
        queued.is_ok()
    }

    pub(super) fn fail(&mut self, issued: Issued, status: TargetStatus) {
        self.complete(issued, status.status(), 0, &[]);
    }

    pub(super) async fn dispatch(&mut self, c: queue::Command) {
        let issued = Issued {
            tag: c.tag,
            origin: Origin::new(self.sqid(), &c.sqe),
        };
        let read_len = usize::try_from(c.read_len).unwrap_or(0);
        let cmd = match parse::parse(&c.sqe, &c.data, &self.queue_state()) {
            Ok(cmd) => cmd,
            Err(rejected) => return self.complete(issued, rejected.status, rejected.result, &[]),
        };
        if let Command::Connect { cmd, data } = cmd {
            return match fabrics::connect(&self.subs, &mut self.queue, cmd, data, self.peer).await {
                Ok(connected) => {
                    self.auth = connected.auth;
                    if let Some(auth) = &mut self.auth {
                        auth.start(self.epoch.elapsed());
                    }
                    self.bind(connected.bound).await;
                    self.complete(issued, Status::SUCCESS, connected.result, &[]);
                }
                Err(r) => self.complete(issued, r.status, r.result, &[]),
            };
        }
        let Some(ctrl) = self.controller() else {
            return self.fail(issued, StatusCode::CommandSequenceError.into());
        };
        if let Command::Auth(auth_cmd) = cmd {
            return self.authenticate(issued, &ctrl, auth_cmd, &c.data);
        }
        let fabrics_cmd = matches!(
            cmd,
            Command::PropertyGet(_) | Command::PropertySet(_) | Command::Disconnect
        );
        // Linux `nvmet_check_auth_status`, before the controller-ready check: only Fabrics
        // commands run on a queue that has yet to authenticate, and they do not count as
        // keep-alive traffic.
        // Readiness as this pass's I/O view saw it (I/O is touched once per pass with it).
        let io_ready = if self.auth.as_ref().is_some_and(|a| !a.is_authenticated()) {
            if !fabrics_cmd {
                return self.complete(issued, command::authentication_required(), 0, &[]);
            }
            None
        } else if matches!(cmd, Command::Io(_)) {
            Some(self.io_view(&ctrl).ready)
        } else {
            ctrl.touch();
            None
        };
        // Linux `nvmet_check_ctrl_status`: admin and I/O commands need an enabled, ready
        // controller.
        if !fabrics_cmd && !io_ready.unwrap_or_else(|| ctrl.regs().ready()) {
            return self.fail(issued, StatusCode::CommandSequenceError.into());
        }
        match cmd {
            Command::Connect { .. } | Command::Auth(_) => {}
            Command::PropertyGet(get) => match fabrics::property_get(&ctrl, get) {
                Ok(v) => self.complete(issued, Status::SUCCESS, v, &[]),
                Err(s) => self.fail(issued, s),
            },
            Command::PropertySet(set) => match fabrics::property_set(&ctrl, set) {
                Ok(CcEffect::Shutdown) => {
                    // Shutdown notification: make every acknowledged write durable first.
                    let flushed = self.subs.state.on_pool(|_, pool| pool.flush()).await;
                    match flushed {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::error!(
                            cntlid = ctrl.cntlid,
                            error = ?e,
                            "flush at controller shutdown failed"
                        ),
                        Err(e) => tracing::error!(
                            cntlid = ctrl.cntlid,
                            error = %e,
                            "flush at controller shutdown failed"
                        ),
                    }
                    self.complete(issued, Status::SUCCESS, 0, &[]);
                }
                Ok(CcEffect::None) => self.complete(issued, Status::SUCCESS, 0, &[]),
                Err(s) => self.fail(issued, s),
            },
            Command::Disconnect => {
                self.complete(issued, Status::SUCCESS, 0, &[]);
                self.end = Some(End::Disconnect);
            }
            Command::Admin(AdminCommand::AsyncEventRequest) => {
                if self.aers.len() >= MAX_AERS {
                    return self.fail(issued, TargetStatus::AerLimitExceeded);
                }
                self.aers.push(issued);
                self.deliver_events();
            }
            Command::Admin(admin_cmd) => match admin::execute(&self.subs, &ctrl, admin_cmd).await {
                Ok(mut reply) => {
                    reply.data.resize(read_len, 0);
                    self.complete(issued, Status::SUCCESS, reply.result, &reply.data);
                }
                Err(s) => self.fail(issued, s),
            },
            Command::Io(io_cmd) => self.start_io(issued, &ctrl, io_cmd, c.data),
        }
    }

    async fn bind(&mut self, bound: Bound) {
        let ctrl = bound.controller().clone();
        self.ctrl_watch = Some(ctrl.watch());
        if let Some(volume) = ctrl.volume() {
            self.counters = Some(self.subs.stats.volume(volume));
            let subs = self.subs.clone();
            let io_queue = matches!(bound, Bound::Io(..));
            let looked_up = self
                .subs
                .state
                .on_pool(move |_, pool| {
                    // The limiter is found or made under the pool lock: see `Throttles::volume`.
                    let qos = io_queue.then(|| {
                        subs.throttles.volume(volume, || {
                            let stored = pool.volume(volume).map(|v| v.mutable_parameters());
                            stored.map_or_else(|_| Default::default(), |p| stored_limits(volume, p))
                        })
                    });
                    (admin::lba_shift(pool.device_mut()), qos)
                })
                .await;
            if let Ok((shift, qos)) = looked_up {
                self.lba_shift = shift;
                self.qos = qos.map(Qos::new);
            }
        }
        if let Bound::Io(_, qid) = &bound {
            self.move_to_engine = Some(*qid);
        }
        self.bound = Some(bound);
    }

    /// Completes parked Async Event Requests with queued events.
    pub(super) fn deliver_events(&mut self) {
        let Some(Bound::Admin(ctrl)) = &self.bound else {
            return;
        };
        let ctrl = ctrl.clone();
        while !self.aers.is_empty() {
            let Some(event) = ctrl.regs().events.pop_front() else {
                break;
            };
            let issued = self.aers.remove(0);
            self.complete(issued, Status::SUCCESS, u64::from(event), &[]);
        }
    }
}
