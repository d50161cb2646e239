//! A queue's io_uring ([`edgevol_hal::uring::Ring`]) in its engine's reactor: the device reads
//! and writes of the queue's commands run asynchronously on the queue's own thread, with no
//! hand-off and one system call per batch of commands, while the drive still sees the queue's
//! depth.
//!
//! Each operation carries the queue's record of its command (`T`); the ring hands it back with
//! the operation.
//!
//! # Writes and snapshots
//!
//! A write on the ring holds the snapshot gate ([`Gate`]) until its data has landed, and a
//! snapshot waits for the gate while it holds the pool lock. The queue's thread may itself be
//! waiting for that lock, so it cannot be the only one to reap its ring: the ring is shared with
//! the gate, which lands the writes itself ([`Landing`]). It waits for the ring's operations,
//! lets each record leave the gate ([`Record::landed`]) and keeps the finished operations for
//! the queue, which completes them when it next reaps: the gate signals the ring's eventfd, so
//! that a queue idle in its reactor wakes for them. Nothing the gate does needs the pool lock,
//! and the queue never holds the ring's lock while it takes the pool's.
//!
//! # Waking
//!
//! The kernel signals the eventfd on every completion and nothing reads it
//! ([`edgevol_hal::uring`]): the reactor sees each signal as an edge, and whether there is
//! anything to reap is read from the ring's memory ([`DeviceRing::ready`], and the engine's
//! busy polling through [`Pending`]). A pass that submits and reaps costs one system call.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use edgevol_hal::uring::{IoBuf, Part, Refused, Ring};
use tokio::io::unix::AsyncFd;

use super::busy_poll::Pending;
use super::io::{Gate, Landing};

/// A finished operation: the command's record, its buffer, and how it went.
pub type Reaped<T> = (T, IoBuf, Result<(), edgevol_hal::Error>);

/// A queue's record of one operation.
pub trait Record: Send + 'static {
    /// The operation's I/O has ended: leave the snapshot gate, if it holds it. Must not take
    /// the pool lock (the gate calls it under it).
    fn landed(&mut self);
}

/// The ring and the eventfd the reactor watches.
#[derive(Debug)]
pub struct DeviceRing<T: Record> {
    shared: Arc<Shared<T>>,
    ready: AsyncFd<OwnedFd>,
}

#[derive(Debug)]
struct Shared<T> {
    inner: Mutex<Inner<T>>,
}

#[derive(Debug)]
struct Inner<T> {
    ring: Ring<T>,
    /// Operations the gate saw finish, for the queue.
    landed: Vec<Reaped<T>>,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T> Inner<T> {
    /// Finished operations wait for the queue.
    fn has_finished(&mut self) -> bool {
        !self.landed.is_empty() || self.ring.has_completions()
    }
}

impl<T: Send> Pending for Shared<T> {
    fn pending(&self) -> bool {
        match self.inner.try_lock() {
            Ok(mut inner) => inner.has_finished(),
            Err(TryLockError::Poisoned(p)) => p.into_inner().has_finished(),
            // The gate is landing the ring's writes: it signals the eventfd when done.
            Err(TryLockError::WouldBlock) => false,
        }
    }
}

impl<T: Record> Landing for Shared<T> {
    fn land(&self) {
        let mut inner = self.lock();
        let Inner { ring, landed } = &mut *inner;
        let before = landed.len();
        let waited = ring.wait_all(|f| {
            let mut record = f.tag;
            record.landed();
            landed.push((record, f.buf, f.result));
        });
        if let Err(e) = waited {
            tracing::error!(%e, "io_uring wait for a snapshot failed");
        }
        // Wake the queue for what landed: it may have looked at the ring before the kernel
        // posted these, and they are no longer there for it to find.
        if landed.len() > before {
            if let Err(e) = ring.notify() {
                tracing::error!(%e, "io_uring eventfd signal failed");
            }
        }
    }
}

impl<T: Record> DeviceRing<T> {
    /// Registers `ring`'s eventfd with the current runtime's reactor, and the ring with `gate`.
    pub fn new(ring: Ring<T>, gate: &Gate) -> io::Result<Self> {
        let event = ring.eventfd().try_clone_to_owned()?;
        // Deprecated for inner types that may close their descriptor while registered; an
        // `OwnedFd` owned by the AsyncFd cannot (tokio#8587), and the replacement is `unsafe`.
        #[allow(deprecated)]
        let ready = AsyncFd::with_interest(event, tokio::io::Interest::READABLE)?;
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                ring,
                landed: Vec::new(),
            }),
        });
        let as_landing: Arc<dyn Landing> = shared.clone();
        gate.register(Arc::downgrade(&as_landing));
        Ok(DeviceRing { shared, ready })
    }

    /// Operations not handed back yet (in flight, or finished and not reaped).
    pub fn in_flight(&self) -> usize {
        let inner = self.shared.lock();
        inner.ring.in_flight() + inner.landed.len()
    }

    /// Whether an operation of `parts` parts can start now.
    pub fn has_room(&self, parts: usize) -> bool {
        self.shared.lock().ring.has_room(parts)
    }

    /// Whether the ring writes from (or reads into) `buf` as it is: on an `O_DIRECT` device,
    /// only page-aligned memory.
    pub fn takes(&self, buf: &[u8]) -> bool {
        self.shared.lock().ring.takes(buf)
    }

    /// Starts reading `parts` into `buf`; on refusal everything comes back.
    pub fn read(&mut self, buf: IoBuf, parts: &[Part], record: T) -> Result<(), Refused<T>> {
        self.shared.lock().ring.read(buf, parts, record)
    }

    /// Starts writing `parts` of `buf`; on refusal everything comes back.
    pub fn write(&mut self, buf: IoBuf, parts: &[Part], record: T) -> Result<(), Refused<T>> {
        self.shared.lock().ring.write(buf, parts, record)
    }

    /// Hands the queued operations to the kernel and moves what finished already (a read from
    /// the page cache completes inside the submission) to `done`.
    pub fn submit(&mut self, done: &mut Vec<Reaped<T>>) -> io::Result<()> {
        self.shared.lock().ring.submit()?;
        self.reap(done);
        Ok(())
    }

    /// Hands the queued operations to the kernel and waits on this thread until every
    /// operation in flight has finished, moving them to `done` with no signal on the eventfd:
    /// for a queue with nothing else to do, one system call and no wake-up through the reactor.
    /// The gate may wait for the ring's lock meanwhile; the kernel alone decides how long.
    pub fn submit_and_wait(&mut self, done: &mut Vec<Reaped<T>>) -> io::Result<()> {
        let mut inner = self.shared.lock();
        done.append(&mut inner.landed);
        inner
            .ring
            .run_to_completion(|f| done.push((f.tag, f.buf, f.result)))
    }

    /// What the engine's busy polling asks whether the ring has finished operations.
    pub(crate) fn pending(&self) -> Arc<dyn Pending> {
        self.shared.clone()
    }

    /// Until the ring has finished operations to reap.
    pub async fn ready(&self) {
        while !self.shared.lock().has_finished() {
            match self.ready.readable().await {
                // A signal since the last wait (perhaps for what was reaped since): look again.
                // A completion posted after this signals again.
                Ok(mut guard) => guard.clear_ready(),
                // The reactor is gone (runtime shutting down): nothing will complete through it.
                Err(_) => std::future::pending().await,
            }
        }
    }

    /// Moves every finished operation to `done`, to be completed after the ring's lock is
    /// released (completing takes the pool lock).
    pub fn reap(&mut self, done: &mut Vec<Reaped<T>>) {
        let mut inner = self.shared.lock();
        done.append(&mut inner.landed);
        inner.ring.reap(|f| done.push((f.tag, f.buf, f.result)));
    }
}

impl<T: Record> Drop for DeviceRing<T> {
    /// Waits for the kernel, and drops the records here, on the queue's thread: dropping one
    /// unpins its clusters under the pool lock, which the gate may be holding.
    fn drop(&mut self) {
        let mut left = Vec::new();
        {
            let mut inner = self.shared.lock();
            let Inner { ring, landed } = &mut *inner;
            left.append(landed);
            if let Err(e) = ring.wait_all(|f| left.push((f.tag, f.buf, f.result))) {
                tracing::error!(%e, "io_uring wait at queue end failed");
            }
        }
        drop(left);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use std::os::fd::AsFd;

    use edgevol_core::Quiesce;
    use edgevol_hal::AlignedBuf;

    use super::*;

    /// A write's record: holds the gate until it lands.
    #[derive(Debug)]
    struct Held(Option<super::super::io::gate::GateGuard>, Arc<AtomicUsize>);

    impl Record for Held {
        fn landed(&mut self) {
            self.0 = None;
            self.1.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What busy polling and `ready` see: nothing before an operation finishes, its completion
    /// once the kernel posted it (read from memory: nothing reads the eventfd), nothing once
    /// reaped.
    #[tokio::test]
    async fn finished_operations_show_until_reaped_without_reading_the_eventfd() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        std::fs::write(&path, vec![3u8; 1 << 16]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let gate = Arc::new(Gate::default());
        let mut ring = DeviceRing::new(Ring::new(file, 8).unwrap(), &gate).unwrap();
        let pending = ring.pending();
        assert!(!pending.pending());
        let part = Part {
            device_offset: 4096,
            at: 0,
            len: 4096,
        };
        let record = Held(None, Arc::new(AtomicUsize::new(0)));
        ring.read(AlignedBuf::zeroed(4096).into(), &[part], record)
            .unwrap();
        // Submitted without reaping (a page-cache read may complete inside the submission).
        ring.shared.lock().ring.submit().unwrap();
        tokio::time::timeout(Duration::from_secs(5), ring.ready())
            .await
            .expect("the read completes");
        assert!(
            pending.pending(),
            "a posted completion shows before it is reaped"
        );
        let mut done = Vec::new();
        ring.reap(&mut done);
        assert_eq!(done.len(), 1);
        assert!(done[0].2.is_ok());
        assert!(!pending.pending(), "nothing once reaped");
        // The eventfd still holds the kernel's signal: nothing read it.
        let mut fds = [nix::poll::PollFd::new(
            ring.ready.get_ref().as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        assert_eq!(
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap(),
            1
        );
    }

    /// A device file of `len` zero bytes in `dir`, open for reading and writing.
    fn zeroed_device(dir: &tempfile::TempDir, len: usize) -> (std::path::PathBuf, std::fs::File) {
        let path = dir.path().join("dev");
        std::fs::write(&path, vec![0u8; len]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        (path, file)
    }

    /// A queue with nothing else to do waits for its operations on its own thread: they come
    /// back whole, and the eventfd has no signal that would wake the reactor for nothing.
    #[tokio::test]
    async fn submit_and_wait_returns_the_operations_without_a_signal() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = zeroed_device(&dir, 1 << 16);
        let gate = Arc::new(Gate::default());
        let mut ring = DeviceRing::new(Ring::new(file, 8).unwrap(), &gate).unwrap();
        let part = Part {
            device_offset: 8192,
            at: 0,
            len: 4096,
        };
        let mut buf = AlignedBuf::zeroed(4096);
        buf.fill(0x6b);
        let record = Held(None, Arc::new(AtomicUsize::new(0)));
        ring.write(buf.into(), &[part], record).unwrap();
        let mut done = Vec::new();
        ring.submit_and_wait(&mut done).unwrap();
        assert_eq!(done.len(), 1);
        assert!(done[0].2.is_ok());
        assert_eq!(ring.in_flight(), 0);
        assert_eq!(std::fs::read(&path).unwrap()[8192..12288], [0x6b; 4096]);
        let mut fds = [nix::poll::PollFd::new(
            ring.ready.get_ref().as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        assert_eq!(
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap(),
            0,
            "no eventfd signal"
        );
    }

    /// A snapshot's wait ends although the queue never reaps (its thread waits for the pool
    /// lock the snapshot holds): the gate lands the ring's writes itself, and the queue still
    /// gets every operation back, whole, when it reaps.
    #[tokio::test]
    async fn the_gate_lands_ring_writes_the_queue_cannot_reap() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = zeroed_device(&dir, 1 << 20);
        let gate = Arc::new(Gate::default());
        let landed = Arc::new(AtomicUsize::new(0));
        let mut ring = DeviceRing::new(Ring::new(file, 8).unwrap(), &gate).unwrap();
        for i in 0..4u8 {
            let mut buf = AlignedBuf::zeroed(4096);
            buf.fill(i + 1);
            let part = Part {
                device_offset: u64::from(i) * 8192,
                at: 0,
                len: 4096,
            };
            let record = Held(Some(gate.enter()), landed.clone());
            ring.write(buf.into(), &[part], record).unwrap();
        }
        // Queued, not even submitted: the queue's thread went to take the pool lock.
        assert_eq!(gate.running(), 4);
        let waiter = {
            let gate = gate.clone();
            std::thread::spawn(move || gate.wait_writes_landed())
        };
        for _ in 0..500 {
            if waiter.is_finished() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(waiter.is_finished(), "the snapshot's wait ended");
        waiter.join().unwrap();
        assert_eq!((gate.running(), landed.load(Ordering::Relaxed)), (0, 4));
        // The gate took the completions and the eventfd's count with them: the queue, idle in
        // its reactor, must still be woken to complete what landed.
        tokio::time::timeout(Duration::from_secs(5), ring.ready())
            .await
            .expect("the queue is woken for what the gate landed");
        let mut done = Vec::new();
        ring.reap(&mut done);
        assert_eq!(done.len(), 4, "every operation comes back to the queue");
        assert!(done.iter().all(|(_, _, r)| r.is_ok()));
        let bytes = std::fs::read(&path).unwrap();
        for (i, fill) in (1..=4u8).enumerate() {
            assert!(bytes[i * 8192..i * 8192 + 4096].iter().all(|&b| b == fill));
        }
    }
}
