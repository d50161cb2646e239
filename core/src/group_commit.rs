//! Group commit of control operations: many operations, one journal write and one flush.
//!
//! By default a control operation is durable when it returns: it commits hard (flush, frames,
//! flush) on its own. With [`Pool::set_group_commit`] on, it instead validates, applies its record
//! in memory and *stages* it with the pending data-path records, and returns at once; whoever
//! holds the pool then calls [`Pool::commit_staged`] once for everything staged, by any number of
//! operations: one hard commit covers them all. The caller hands out a [`CommitTicket`] per
//! operation ([`Pool::commit_ticket`], taken after it) and answers the operation only once
//! [`Pool::is_committed`] holds for it, i.e. after the flush that covers it.
//!
//! What changes for everyone else:
//!
//! - Later operations see staged state at once (a create then a publish of the new volume need
//!   no commit in between). Anything answered from that state must wait for the ticket too: the
//!   ticket taken after an operation covers every record staged before it, its own or not, so a
//!   call that read or refused based on another's staged record waits for that record's flush.
//! - A staged record can reach the journal earlier, in a soft frame ([`Pool::persist`]) or a hard
//!   commit of the data path ([`Pool::flush`], [`Pool::sync`]): that is allowed (nothing was
//!   answered yet; after a crash the operation may or may not have happened, as CSI allows for a
//!   call that got no answer). Only a hard commit makes a ticket committed.
//! - A commit that fails leaves its records applied in memory and pending. After a device error
//!   the pool refuses all work until it is reopened, and recovery shows at most a prefix of the
//!   staged records, whole ones only (frames carry whole records and replay stops at the first
//!   damaged one): never an operation without one staged before it. Every operation waiting on
//!   that commit must be failed; none was answered.
//! - Clusters freed by staged records are reused only after the hard commit, as always.
//!
//! The on-media format is unchanged: a group commit is an ordinary hard commit with many records.

use crate::device::BlockDevice;
use crate::error::Result;
use crate::pool::{Commit, Pool};
use crate::record::Record;

/// Covers the control records staged up to some point ([`Pool::commit_ticket`]). Tickets are
/// ordered; a later one covers everything an earlier one does. A ticket belongs to the mounted
/// pool that issued it (counting restarts at every open).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommitTicket(pub(crate) u64);

impl<D: BlockDevice> Pool<D> {
    /// Turns group commit of control operations on or off (see the module docs). Records staged
    /// while it was on stay staged until the next hard commit.
    pub fn set_group_commit(&mut self, on: bool) {
        self.group_commit = on;
    }

    /// Whether control operations stage their records instead of committing them.
    pub fn group_commit(&self) -> bool {
        self.group_commit
    }

    /// The ticket covering every control record staged so far.
    pub fn commit_ticket(&self) -> CommitTicket {
        CommitTicket(self.staged)
    }

    /// Whether a hard commit has made every record `ticket` covers durable.
    pub fn is_committed(&self, ticket: CommitTicket) -> bool {
        ticket.0 <= self.hardened
    }

    /// Makes every staged record durable, if `upto` is not committed yet: one hard commit (flush
    /// data, write the frames of every pending record, flush) whatever the number of records.
    /// On a device error the pool refuses further work until reopened, and no operation the
    /// commit covered may be answered as done.
    pub fn commit_staged(&mut self, upto: CommitTicket) -> Result<()> {
        if self.is_committed(upto) {
            return Ok(());
        }
        self.check_usable()?;
        self.commit(None, 0, Commit::Hard)?;
        self.state.alloc.release_pending();
        Ok(())
    }

    /// Applies a validated control record and stages it for the next hard commit. `growth`
    /// counts at once: the check of later operations must see the tables as they will be.
    pub(crate) fn stage(&mut self, rec: Record, growth: u64) {
        self.meta_estimate += growth;
        self.record_pending(rec.clone());
        self.state.apply(rec);
        self.staged += 1;
    }
}
