//! The ring path: the device I/O of Reads and cached Writes on an `O_DIRECT` device that do
//! not run in place goes on the queue's own io_uring ([`crate::nvme::device_ring`]), submitted
//! once per pass and reaped in the queue's loop. Mapping runs under the pool lock first; a
//! command the ring cannot take now runs in place.

use std::sync::Arc;

use edgevol_core::DeviceError;
use edgevol_hal::uring::{IoBuf, IoBufParts, Refused};
use edgevol_nvmeof::data_buf::DataBuf;
use edgevol_nvmeof::status::StatusCode;

use super::in_place::caught;
use super::io_command::Begun;
use super::Conn;
use crate::nvme::busy_poll::Pending;
use crate::nvme::device_ring::{DeviceRing, Reaped, Record};
use crate::nvme::io::{self, DataPath};
use crate::nvme::status::{from_device, Access, TargetStatus};

/// Operations a queue's ring holds at once: the deepest queue Linux's NVMe/TCP host asks for
/// (128 entries); a Read of more parts than fit now reads in place.
const RING_OPS: u32 = 128;

/// A command whose device I/O is on the queue's ring.
pub(super) struct OnRing {
    begun: Begun,
    op: RingOp,
    /// The read's length (the buffer's data); 0 for a write.
    len: usize,
    /// A write's spare read buffer, the queue's again when the write is done.
    spare: Option<io::ReadBuf>,
}

// A record moves into the ring and back out with every command: a build fails if it grows
// past this (it was 1,224 bytes while it carried the command's parts and 32-run tickets).
const _: () = assert!(std::mem::size_of::<OnRing>() <= 512);

/// What a ring operation does, with what pins its clusters until it lands. The parts went to
/// the ring: a record stays small, since it moves into the ring and back out per command.
enum RingOp {
    Read(io::ReadPin),
    /// Holds the snapshot gate until its parts land.
    Write(io::WriteHold),
}

impl Record for OnRing {
    fn landed(&mut self) {
        if let RingOp::Write(w) = &mut self.op {
            w.leave_gate();
        }
    }
}

/// A queue's ring.
pub(super) struct RingIo {
    ring: DeviceRing<OnRing>,
    /// Kept between passes: the ring's finished operations.
    reaped: Vec<Reaped<OnRing>>,
    /// Where a command is mapped to before its parts go to the ring, kept between commands.
    parts: io::Parts,
}

impl RingIo {
    /// A ring on `data`'s device, registered with this thread's reactor; `None` where there is
    /// none (the queue then uses the worker threads).
    pub(super) fn open(data: &DataPath) -> Option<Self> {
        let ring = data.ring(RING_OPS)?;
        match DeviceRing::new(ring, data.gate()) {
            Ok(ring) => Some(RingIo {
                ring,
                reaped: Vec::new(),
                parts: io::Parts::new(),
            }),
            Err(e) => {
                tracing::debug!(%e, "device ring not registered: I/O on the worker threads");
                None
            }
        }
    }

    /// Operations on the ring.
    pub(super) fn in_flight(&self) -> usize {
        self.ring.in_flight()
    }

    /// What busy polling asks whether the ring has finished operations.
    pub(super) fn pending(&self) -> Arc<dyn Pending> {
        self.ring.pending()
    }

    /// Until the ring has finished operations.
    pub(super) async fn ready(&self) {
        self.ring.ready().await;
    }
}

impl Conn {
    /// Maps a Read under the pool lock and starts its device reads on the ring.
    pub(super) fn read_on_ring(
        &mut self,
        begun: Begun,
        request: io::Request,
        mut buf: io::ReadBuf,
    ) {
        let r = self.ring.as_mut().expect("checked by run_io");
        let mapped = caught(|| io::map_read(&self.subs.state, &request, &mut buf, &mut r.parts));
        let pin = match mapped {
            Ok(pin) => pin,
            // A Read carries no host data.
            Err(s) => return self.finish_io(begun.done(Err(s), buf, DataBuf::default())),
        };
        if r.parts.is_empty() || !r.ring.has_room(r.parts.len()) {
            // Only holes, or more parts than the ring takes now: read here.
            let result = match self.subs.data_path() {
                Some(data) => caught(|| io::read_parts(&data, &r.parts, &mut buf)),
                None => Err(StatusCode::InternalError.into()),
            };
            drop(pin);
            return self.finish_io(begun.done(result, buf, DataBuf::default()));
        }
        let (abuf, len) = buf.into_parts();
        let record = OnRing {
            begun,
            op: RingOp::Read(pin),
            len,
            spare: None,
        };
        let started = r.ring.read(abuf.into(), &r.parts, record);
        self.on_ring(started);
    }

    /// Maps a cached Write under the pool lock (writing what it allocates there) and starts
    /// the rest on the ring, from the host's own buffer (page-aligned as the decoder receives
    /// it: no copy), which goes back to the decoder when the ring hands it back.
    pub(super) fn write_on_ring(
        &mut self,
        begun: Begun,
        request: io::Request,
        mut buf: io::ReadBuf,
    ) {
        let Some(data) = self.subs.data_path() else {
            return self.fail(begun.issued, StatusCode::InternalError.into());
        };
        let r = self.ring.as_mut().expect("checked by run_io");
        let mapped =
            caught(|| io::map_write(&self.subs.state, &data, &request, &mut buf, &mut r.parts));
        let hold = match mapped {
            Ok(hold) => hold,
            Err(s) => return self.finish_io(begun.done(Err(s), buf, request.data)),
        };
        if r.parts.is_empty() || !r.ring.has_room(r.parts.len()) {
            // All written under the lock, or more parts than the ring takes now: here.
            let result = caught(|| io::land_write(&data, &r.parts, hold, &request.data, &mut buf));
            return self.finish_io(begun.done(result, buf, request.data));
        }
        let host = if r.ring.takes(&request.data) {
            let (bytes, start, len) = request.data.into_parts();
            IoBuf::region(bytes, start, len).map_err(|bytes| DataBuf::from_parts(bytes, start, len))
        } else {
            Err(request.data)
        };
        let (iobuf, spare) = match host {
            Ok(region) => (region, Some(buf)),
            // Host data not page-aligned (the decoder's buffers always are): a copy, and the
            // host's buffer back to the decoder at once.
            Err(host_data) => {
                buf.copy_from(&host_data);
                self.queue.recycle(host_data);
                (buf.into_parts().0.into(), None)
            }
        };
        let record = OnRing {
            begun,
            op: RingOp::Write(hold),
            len: 0,
            spare,
        };
        let r = self.ring.as_mut().expect("checked above");
        let started = r.ring.write(iobuf, &r.parts, record);
        self.on_ring(started);
    }

    fn on_ring(&mut self, started: Result<(), Refused<OnRing>>) {
        match started {
            Ok(()) => self.subs.engines.count_ring_operation(),
            Err(Refused {
                tag: record,
                buf,
                error,
            }) => {
                // Room and parts were checked: a bug, not the host's.
                tracing::error!(%error, "device ring refused an operation");
                self.ring_done(
                    (record, buf, Ok(())),
                    Some(StatusCode::InternalError.into()),
                );
            }
        }
    }

    /// Submits the ring's queued operations and completes those already done. When one
    /// operation is all the queue has to do (`idle`: nothing received and not taken, and nothing
    /// on the workers), it waits for it here, as a Read alone runs in place: the drive has no
    /// depth to gain, and the wait costs no wake-up.
    pub(super) fn submit_ring(&mut self, idle: bool) {
        let alone = idle && !self.handoff.pending();
        let Some(r) = self.ring.as_mut() else {
            return;
        };
        let mut reaped = std::mem::take(&mut r.reaped);
        let submitted = if alone && r.ring.in_flight() == 1 {
            r.ring.submit_and_wait(&mut reaped)
        } else {
            r.ring.submit(&mut reaped)
        };
        if let Err(e) = submitted {
            // Nothing was submitted; the operations stay queued for the next pass.
            tracing::warn!(%e, "io_uring submit failed");
        }
        self.complete_reaped(reaped);
    }

    pub(super) fn reap_ring(&mut self) {
        let Some(r) = self.ring.as_mut() else {
            return;
        };
        let mut reaped = std::mem::take(&mut r.reaped);
        r.ring.reap(&mut reaped);
        self.complete_reaped(reaped);
    }

    /// Completes the ring's finished operations (outside the ring's lock: completing takes the
    /// pool lock), and keeps the list's memory.
    fn complete_reaped(&mut self, mut reaped: Vec<Reaped<OnRing>>) {
        if !reaped.is_empty() {
            self.batch_done_at = Some(std::time::Instant::now());
        }
        for r in reaped.drain(..) {
            self.ring_done(r, None);
        }
        self.batch_done_at = None;
        if let Some(r) = &mut self.ring {
            r.reaped = reaped;
        }
    }

    /// A command's device I/O finished on the ring (or never started: `failed`): unpin its
    /// clusters; a write is made durable as its mapping requires. Then complete it.
    fn ring_done(&mut self, (record, abuf, landed): Reaped<OnRing>, failed: Option<TargetStatus>) {
        let access = match record.op {
            RingOp::Read(_) => Access::Read,
            RingOp::Write(_) => Access::Write,
        };
        let landed = match failed {
            Some(s) => Err(s),
            None => landed.map_err(|e| from_device(e.kind(), access)),
        };
        let result = match record.op {
            RingOp::Read(read) => {
                drop(read);
                landed
            }
            RingOp::Write(write) => caught(|| write.finish(landed)),
        };
        let (buf, host_data) = match abuf.into_parts() {
            IoBufParts::Aligned(abuf) => (
                io::ReadBuf::from_parts(abuf, record.len),
                DataBuf::default(),
            ),
            // The host's buffer, written from: back to the decoder now that the ring is done.
            IoBufParts::Region { bytes, start, len } => (
                record.spare.unwrap_or_default(),
                DataBuf::from_parts(bytes, start, len),
            ),
        };
        self.finish_io(record.begun.done(result, buf, host_data));
    }
}
