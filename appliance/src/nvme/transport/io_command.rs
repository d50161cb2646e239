//! An I/O command from its start to its completion: held by QoS or started, run on one of the
//! three paths (`in_place`, `ring_io`, `handoff`), then counted and completed, its buffers
//! kept for the next commands.

use std::time::Instant as StdInstant;

use edgevol_nvmeof::data_buf::DataBuf;
use edgevol_nvmeof::io_cmd::IoCommand;
use edgevol_nvmeof::status::{Status, StatusCode};

use super::buffers::SPLICE_MIN;
use super::qos_hold::Held;
use super::{Conn, Issued};
use crate::nvme::controller::{Controller, Kind};
use crate::nvme::io;
use crate::nvme::stats::IoKind;
use crate::nvme::status::TargetStatus;

/// An I/O command from its start: what completes it, and what the counters record.
#[derive(Clone, Copy)]
pub(super) struct Begun {
    pub(super) issued: Issued,
    kind: IoKind,
    bytes: u64,
    started: StdInstant,
}

impl Begun {
    fn new(issued: Issued, request: &io::Request, started: StdInstant) -> Self {
        let (kind, bytes) = request.accounting();
        Begun {
            issued,
            kind,
            bytes,
            started,
        }
    }

    /// Finished with `result`: `buf` holds a read's data, `host_data` is a write's buffer back.
    pub(super) fn done(
        self,
        result: Result<(), TargetStatus>,
        buf: io::ReadBuf,
        host_data: DataBuf,
    ) -> Done {
        Done {
            begun: self,
            result,
            buf,
            host_data,
        }
    }
}

/// A finished I/O command.
pub(super) struct Done {
    begun: Begun,
    result: Result<(), TargetStatus>,
    /// The read's data; a spare buffer again once sent.
    buf: io::ReadBuf,
    /// The write's data, handed back to the queue's decoder for reuse.
    host_data: DataBuf,
}

/// Which Reads and cached Writes run in place on the queue's thread, with no ring or worker.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum InPlace {
    /// Not on an engine (admin and discovery queues).
    Never,
    /// A drive (`O_DIRECT`, not memory): only a Read with nothing to overlap (the drive's
    /// latency would otherwise hold back the commands queued behind it; alone, the hand-off is
    /// pure cost). Writes always take the ring: Linux submits a block device's `pwrite` inside a
    /// plug that is released only when the thread sleeps for the I/O, and then by the block
    /// layer's worker thread (kblockd), a second thread woken for every write; the ring's
    /// submission releases its plug at once.
    WhenAlone,
    /// Page cache or memory (a pool on tmpfs): a copy is cheaper than any hand-off.
    Always,
}

impl Conn {
    /// Starts an I/O command, unless its volume's QoS holds it back.
    pub(super) fn start_io(
        &mut self,
        issued: Issued,
        ctrl: &Controller,
        cmd: IoCommand,
        data: DataBuf,
    ) {
        let Kind::Volume { id, readonly } = ctrl.kind else {
            return self.fail(issued, StatusCode::InvalidOpcode.into());
        };
        let view = self.io_view(ctrl);
        let request = io::Request {
            volume: id,
            readonly,
            wce: view.wce,
            lba_shift: self.lba_shift,
            cmd,
            data,
        };
        let started = view.at;
        if let Some(q) = &mut self.qos {
            if !q.passes(&request) {
                return q.hold(Held {
                    issued,
                    request,
                    started,
                });
            }
        }
        self.run_io(issued, request, started);
    }

    /// Starts an I/O command: in place, on the queue's ring, or on a worker thread.
    pub(super) fn run_io(&mut self, issued: Issued, request: io::Request, started: StdInstant) {
        let begun = Begun::new(issued, &request, started);
        let quick = match request.cmd {
            IoCommand::Read { .. } => true,
            // Flush, FUA and write-through wait for the drive's cache; those always move.
            IoCommand::Write { fua, .. } => !fua && request.wce,
            _ => false,
        };
        let buf = self.buffers.take();
        let in_place = quick
            && match self.in_place {
                InPlace::Never => false,
                InPlace::WhenAlone => self.alone && matches!(request.cmd, IoCommand::Read { .. }),
                InPlace::Always => true,
            };
        if !in_place && self.ring.is_some() {
            match request.cmd {
                IoCommand::Read { .. } => return self.read_on_ring(begun, request, buf),
                IoCommand::Write { .. } if quick && !request.readonly => {
                    return self.write_on_ring(begun, request, buf)
                }
                _ => {}
            }
        }
        if in_place {
            return self.run_in_place(begun, request, buf);
        }
        self.hand_off(begun, request, buf);
    }

    /// Nothing in flight on the workers or the ring.
    pub(super) fn nothing_in_flight(&self) -> bool {
        !self.handoff.pending() && self.ring.as_ref().is_none_or(|r| r.in_flight() == 0)
    }

    /// Counts and completes a finished I/O command, and keeps its buffers.
    pub(super) fn finish_io(&mut self, done: Done) {
        let Begun {
            issued,
            kind,
            bytes,
            started,
        } = done.begun;
        if let Some(c) = &self.counters {
            let now = self.batch_done_at.unwrap_or_else(StdInstant::now);
            c.record(
                kind,
                bytes,
                done.result.is_ok(),
                now.saturating_duration_since(started),
            );
            if let Err(s) = &done.result {
                if s.status().sct == edgevol_nvmeof::status::sct::MEDIA {
                    c.media_error(kind);
                }
            }
        }
        self.queue.recycle(done.host_data);
        match done.result {
            Ok(()) if done.buf.data().len() >= SPLICE_MIN => {
                // Sent from this buffer; it is a spare again once the transmit is written.
                let token = self.buffers.next_token();
                let data = done.buf.data();
                if self.complete_with(issued, Status::SUCCESS, 0, data, Some(token)) {
                    return self.buffers.send_from(done.buf);
                }
            }
            Ok(()) => self.complete(issued, Status::SUCCESS, 0, done.buf.data()),
            Err(s) => self.fail(issued, s),
        }
        self.buffers.keep(done.buf);
    }
}
