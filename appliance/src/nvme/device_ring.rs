//! A queue's io_uring ([`edgevol_hal::uring::Ring`]) in its engine's reactor: the device reads
//! of the queue's Reads run asynchronously on the queue's own thread, with no blocking-pool
//! hand-off and one system call per batch of commands, while the drive still sees the queue's
//! depth.
//!
//! Each operation carries the queue's record of its command (`T`), kept here until the kernel
//! hands the operation back. The ring is dropped before the records: it waits for the kernel,
//! and only then do the records unpin their clusters.

use std::io;
use std::os::fd::OwnedFd;

use edgevol_hal::uring::{Part, Ring};
use edgevol_hal::AlignedBuf;
use tokio::io::unix::AsyncFd;

/// A finished operation: the command's record, its buffer, and how it went.
pub type Reaped<T> = (T, AlignedBuf, Result<(), edgevol_hal::Error>);

/// The ring, the eventfd the reactor watches, and the records of what is in flight.
#[derive(Debug)]
pub struct DeviceRing<T> {
    // Field order matters: dropped first, the ring waits for the kernel.
    ring: Ring,
    ready: AsyncFd<OwnedFd>,
    records: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> DeviceRing<T> {
    /// Registers `ring`'s eventfd with the current runtime's reactor.
    pub fn new(ring: Ring) -> io::Result<Self> {
        let event = ring.eventfd().try_clone_to_owned()?;
        // Deprecated for inner types that may close their descriptor while registered; an
        // `OwnedFd` owned by the AsyncFd cannot (tokio#8587), and the replacement is `unsafe`.
        #[allow(deprecated)]
        let ready = AsyncFd::with_interest(event, tokio::io::Interest::READABLE)?;
        Ok(DeviceRing {
            ready,
            ring,
            records: Vec::new(),
            free: Vec::new(),
        })
    }

    /// Operations in flight.
    pub fn in_flight(&self) -> usize {
        self.ring.in_flight()
    }

    /// Whether an operation of `parts` parts can start now.
    pub fn has_room(&self, parts: usize) -> bool {
        self.ring.has_room(parts)
    }

    /// Starts reading `parts` into `buf`; on refusal everything comes back.
    pub fn read(&mut self, buf: AlignedBuf, parts: &[Part], record: T) -> Result<(), Refused<T>> {
        let slot = self.keep(record);
        self.ring
            .read(buf, parts, slot as u64)
            .map_err(|(buf, e)| self.refused(slot, buf, e))
    }

    fn keep(&mut self, record: T) -> usize {
        match self.free.pop() {
            Some(slot) => {
                self.records[slot] = Some(record);
                slot
            }
            None => {
                self.records.push(Some(record));
                self.records.len() - 1
            }
        }
    }

    fn refused(&mut self, slot: usize, buf: AlignedBuf, error: io::Error) -> Refused<T> {
        self.free.push(slot);
        let record = self.records[slot].take().expect("kept just now");
        Refused { record, buf, error }
    }

    /// Hands the queued operations to the kernel and collects what finished already (a read
    /// from the page cache completes inside the submission).
    pub fn submit(&mut self, done: impl FnMut(Reaped<T>)) -> io::Result<()> {
        self.ring.submit()?;
        self.reap(done);
        Ok(())
    }

    /// Until the kernel may have posted a completion.
    pub async fn ready(&self) {
        match self.ready.readable().await {
            // Cleared before reaping: a completion posted after this signals the eventfd again.
            Ok(mut guard) => guard.clear_ready(),
            // The reactor is gone (runtime shutting down): nothing will complete through it.
            Err(_) => std::future::pending().await,
        }
    }

    /// Every finished operation, with its record.
    pub fn reap(&mut self, mut done: impl FnMut(Reaped<T>)) {
        let (records, free) = (&mut self.records, &mut self.free);
        self.ring.reap(|f| {
            let Ok(slot) = usize::try_from(f.tag) else {
                return;
            };
            if let Some(record) = records.get_mut(slot).and_then(Option::take) {
                free.push(slot);
                done((record, f.buf, f.result));
            }
        });
    }
}

/// An operation the ring did not take: no room, or parts it refused.
#[derive(Debug)]
pub struct Refused<T> {
    /// The command's record.
    pub record: T,
    /// Its buffer.
    pub buf: AlignedBuf,
    /// Why.
    pub error: io::Error,
}
