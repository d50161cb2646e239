//! A queue's io_uring ([`edgevol_hal::uring::Ring`]) in its engine's reactor: the device reads
//! of the queue's Reads run asynchronously on the queue's own thread, with no blocking-pool
//! hand-off and one system call per batch of commands, while the drive still sees the queue's
//! depth.
//!
//! Each operation carries the queue's record of its command (`T`); the ring hands it back with
//! the operation, and dropping the ring waits for the kernel before the records (which unpin
//! their clusters) go.

use std::io;
use std::os::fd::OwnedFd;

use edgevol_hal::uring::{Part, Refused, Ring};
use edgevol_hal::AlignedBuf;
use tokio::io::unix::AsyncFd;

/// A finished operation: the command's record, its buffer, and how it went.
pub type Reaped<T> = (T, AlignedBuf, Result<(), edgevol_hal::Error>);

/// The ring and the eventfd the reactor watches.
#[derive(Debug)]
pub struct DeviceRing<T> {
    ring: Ring<T>,
    ready: AsyncFd<OwnedFd>,
}

impl<T> DeviceRing<T> {
    /// Registers `ring`'s eventfd with the current runtime's reactor.
    pub fn new(ring: Ring<T>) -> io::Result<Self> {
        let event = ring.eventfd().try_clone_to_owned()?;
        // Deprecated for inner types that may close their descriptor while registered; an
        // `OwnedFd` owned by the AsyncFd cannot (tokio#8587), and the replacement is `unsafe`.
        #[allow(deprecated)]
        let ready = AsyncFd::with_interest(event, tokio::io::Interest::READABLE)?;
        Ok(DeviceRing { ring, ready })
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
        self.ring.read(buf, parts, record)
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
        self.ring.reap(|f| done((f.tag, f.buf, f.result)));
    }
}
