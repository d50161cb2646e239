//! The in-place path: an I/O command run to completion on the queue's own thread. A worker
//! thread runs a handed-off command the same way.

use std::sync::Arc;

use edgevol_nvmeof::status::StatusCode;

use super::io_command::Begun;
use super::Conn;
use crate::nvme::io::{self, DataPath};
use crate::nvme::status::TargetStatus;
use crate::state::State;

/// Runs one I/O command; a Read's data goes to `buf`.
pub(super) fn execute(
    state: &Arc<State>,
    data: Option<&DataPath>,
    request: &io::Request,
    buf: &mut io::ReadBuf,
) -> Result<(), TargetStatus> {
    caught(|| match data {
        Some(data) => io::run(state, data, request, buf),
        None => state
            .lock_pool()
            .map_err(TargetStatus::from)
            .and_then(|mut pool| io::execute(&mut pool, request, buf)),
    })
}

/// Runs `f`, the work of one I/O command: a panic fails the command with Internal Error, not
/// the connection (the crate docs say why edgevold unwinds).
pub(super) fn caught<R>(f: impl FnOnce() -> Result<R, TargetStatus>) -> Result<R, TargetStatus> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(StatusCode::InternalError.into()))
}

impl Conn {
    /// Runs the command here and completes it.
    pub(super) fn run_in_place(
        &mut self,
        begun: Begun,
        request: io::Request,
        mut buf: io::ReadBuf,
    ) {
        let data = self.subs.data_path();
        let result = execute(&self.subs.state, data.as_deref(), &request, &mut buf);
        self.finish_io(begun.done(result, buf, request.data));
    }
}
