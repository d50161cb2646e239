//! The worker path: I/O commands handed to the target's worker threads
//! ([`crate::nvme::workers`]), one hand-off per command, so that the queue keeps receiving
//! while the drive works. Mapping runs under the pool lock, device I/O outside it where core
//! allows ([`crate::nvme::io`]).

use std::sync::Arc;

use edgevol_nvmeof::status::StatusCode;

use super::in_place::execute;
use super::io_command::{Begun, Done};
use super::Conn;
use crate::nvme::io::{self, DataPath};
use crate::nvme::status::TargetStatus;
use crate::nvme::workers::{Job, Replies};
use crate::state::State;

/// A queue's commands on the worker threads, and where they come back.
#[derive(Default)]
pub(super) struct Handoff {
    /// Handed off and not taken back yet.
    pending: usize,
    replies: Arc<Replies<Done>>,
    /// Kept between passes: the finished commands taken from `replies`.
    finished: Vec<Done>,
}

impl Handoff {
    /// Commands are out on the workers.
    pub(super) fn pending(&self) -> bool {
        self.pending > 0
    }

    /// Until a worker has handed a command back.
    pub(super) async fn ready(&self) {
        self.replies.ready().await;
    }
}

/// An I/O command handed to a worker thread.
pub(crate) struct IoJob {
    state: Arc<State>,
    data: Option<Arc<DataPath>>,
    request: io::Request,
    buf: io::ReadBuf,
    begun: Begun,
    replies: Arc<Replies<Done>>,
    /// Set by [`Job::run`]; until then, the answer to a job that never ran.
    result: Result<(), TargetStatus>,
}

impl Job for IoJob {
    fn run(&mut self) {
        self.result = execute(
            &self.state,
            self.data.as_deref(),
            &self.request,
            &mut self.buf,
        );
    }

    /// A job that panicked outside [`execute`]'s own catch fails with Internal Error too.
    fn reply(self, panicked: bool) {
        let result = match panicked {
            true => Err(StatusCode::InternalError.into()),
            false => self.result,
        };
        let done = self.begun.done(result, self.buf, self.request.data);
        self.replies.push(done);
    }
}

impl Conn {
    /// Queues the command for a worker; it comes back through `replies`.
    pub(super) fn hand_off(&mut self, begun: Begun, request: io::Request, buf: io::ReadBuf) {
        self.handoff.pending += 1;
        self.subs.workers.run(IoJob {
            state: self.subs.state.clone(),
            data: self.subs.data_path(),
            request,
            buf,
            begun,
            replies: self.handoff.replies.clone(),
            result: Err(StatusCode::InternalError.into()),
        });
    }

    /// Completes every command back from the workers at once, so that one write carries the
    /// whole batch.
    pub(super) fn take_replies(&mut self) {
        let mut finished = std::mem::take(&mut self.handoff.finished);
        self.handoff.replies.take(&mut finished);
        self.handoff.pending -= finished.len();
        self.batch_done_at = Some(std::time::Instant::now());
        for done in finished.drain(..) {
            self.finish_io(done);
        }
        self.batch_done_at = None;
        self.handoff.finished = finished;
    }
}
