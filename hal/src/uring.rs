//! A queue's own io_uring for its data-path I/O on a [`DataHandle`](crate::DataHandle): reads and
//! writes run asynchronously with no thread of their own and no hand-off, and many are submitted
//! with one system call.
//!
//! One [`Ring`] belongs to one NVMe queue, on the thread that runs it (SPDK's qpair-per-thread
//! shape). The queue submits an operation (one command's buffer and its parts on the device),
//! waits on the ring's eventfd with the rest of its events, and [`Ring::reap`]s whole
//! operations: every part done, the buffer handed back.
//!
//! The kernel signals the eventfd on every completion and the ring never reads it back (that
//! would be a system call per reap, most of them finding nothing): wait on it edge-triggered,
//! as tokio's reactor does, and ask [`Ring::has_completions`] (a look at the completion queue's
//! memory) whether there is anything to reap before sleeping, never the eventfd's level.
//!
//! Buffers are moved into the ring and owned by it until the kernel has finished with them: the
//! caller cannot touch or free memory the kernel writes. Dropping a ring waits for what is in
//! flight for the same reason. A buffer is an [`AlignedBuf`] or a region of a `Vec<u8>`
//! ([`IoBuf::region`]: a received write's data, which the device writes from without a copy);
//! either way its heap memory does not move while the ring holds it.
//!
//! Short transfers and `EAGAIN`/`EINTR` resubmit the rest; any other error fails the operation
//! (after its other parts finished: the buffer is not returned while the kernel still uses it).
// Casts: part indexes < PARTS_MAX, slot indexes < ring entries; lengths fit u32 (checked).
#![allow(clippy::cast_possible_truncation)]
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use io_uring::{opcode, types, IoUring};

use crate::buf::{is_aligned, AlignedBuf, IO_ALIGN};
use crate::error::Error;

/// A buffer the ring owns while the kernel uses it.
#[derive(Debug)]
pub struct IoBuf(Owned);

#[derive(Debug)]
enum Owned {
    Aligned(AlignedBuf),
    /// `bytes[start..start + len]`; the `Vec` is never resized here, so its memory stays put.
    Region {
        bytes: Vec<u8>,
        start: usize,
        len: usize,
    },
}

impl IoBuf {
    /// The bytes `start..start + len` of `bytes`; `bytes` back when that is not inside it.
    pub fn region(bytes: Vec<u8>, start: usize, len: usize) -> Result<Self, Vec<u8>> {
        if start.checked_add(len).is_none_or(|end| end > bytes.len()) {
            return Err(bytes);
        }
        Ok(IoBuf(Owned::Region { bytes, start, len }))
    }

    /// What it was made from.
    pub fn into_parts(self) -> IoBufParts {
        match self.0 {
            Owned::Aligned(b) => IoBufParts::Aligned(b),
            Owned::Region { bytes, start, len } => IoBufParts::Region { bytes, start, len },
        }
    }
}

/// What an [`IoBuf`] was made from, back from the ring.
#[derive(Debug)]
pub enum IoBufParts {
    /// An aligned buffer.
    Aligned(AlignedBuf),
    /// A region of a `Vec` ([`IoBuf::region`]).
    Region {
        /// The `Vec`, unchanged but for what a read put in the region.
        bytes: Vec<u8>,
        /// Where the region starts.
        start: usize,
        /// Its length.
        len: usize,
    },
}

impl From<AlignedBuf> for IoBuf {
    fn from(b: AlignedBuf) -> Self {
        IoBuf(Owned::Aligned(b))
    }
}

impl std::ops::Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Owned::Aligned(b) => b,
            Owned::Region { bytes, start, len } => &bytes[*start..*start + *len],
        }
    }
}

impl std::ops::DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Owned::Aligned(b) => b,
            Owned::Region { bytes, start, len } => &mut bytes[*start..*start + *len],
        }
    }
}

/// Parts of one operation (device extents). A command over more clusters than this is not
/// given to the ring.
pub const PARTS_MAX: usize = 16;

/// Where one part of an operation's buffer goes on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// Byte offset on the device.
    pub device_offset: u64,
    /// Byte offset in the operation's buffer.
    pub at: usize,
    /// Bytes.
    pub len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Read,
    Write,
}

/// An operation in flight. Its parts live in the slot's [`Extents`], so that what moves in and
/// out of a slot per operation is small (a command's record and its buffer).
struct Op<T> {
    tag: T,
    dir: Dir,
    buf: IoBuf,
    /// Parts whose SQE is in the kernel.
    pending: u32,
    error: Option<io::Error>,
}

/// The parts of a slot's operation, kept with the slot and written in place.
#[derive(Clone, Copy)]
struct Extents {
    parts: [Part; PARTS_MAX],
    /// Bytes of each part already transferred.
    moved: [usize; PARTS_MAX],
}

impl Extents {
    const EMPTY: Extents = Extents {
        parts: [Part {
            device_offset: 0,
            at: 0,
            len: 0,
        }; PARTS_MAX],
        moved: [0; PARTS_MAX],
    };
}

/// A finished operation.
#[derive(Debug)]
pub struct Finished<T> {
    /// What it was submitted with (the caller's record of it).
    pub tag: T,
    /// Its buffer, back.
    pub buf: IoBuf,
    /// Every part transferred, or the first error.
    pub result: Result<(), Error>,
}

/// An operation the ring did not take (parts outside the buffer, too many, no room), handed
/// back whole.
#[derive(Debug)]
pub struct Refused<T> {
    /// Its tag.
    pub tag: T,
    /// Its buffer.
    pub buf: IoBuf,
    /// Why.
    pub error: io::Error,
}

/// An io_uring over one device file, with an eventfd the kernel signals on each completion.
pub struct Ring<T> {
    ring: IoUring,
    file: File,
    event: OwnedFd,
    ops: Vec<Option<Op<T>>>,
    /// The parts of `ops[i]`, at the same index.
    extents: Vec<Extents>,
    free: Vec<u32>,
    /// SQEs submitted and not completed: never above the CQ's size, so none is lost.
    in_kernel: u32,
    cq_entries: u32,
    /// The file bypasses the page cache: buffers must start at an [`IO_ALIGN`] boundary.
    direct: bool,
}

impl<T> std::fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("ops", &(self.ops.len() - self.free.len()))
            .field("in_kernel", &self.in_kernel)
            .finish_non_exhaustive()
    }
}

fn user_data(slot: u32, part: usize) -> u64 {
    (u64::from(slot) << 8) | part as u64
}

impl<T> Ring<T> {
    /// A ring for at most `ops` operations in flight on `file` (a duplicate of the device's
    /// descriptor, with its `O_DIRECT` policy). Fails where io_uring is unavailable (old
    /// kernels, seccomp, `kernel.io_uring_disabled`).
    pub fn new(file: File, ops: u32) -> io::Result<Self> {
        let entries = (ops.max(1) * 2).next_power_of_two().min(4096);
        let ring = IoUring::new(entries)?;
        // SAFETY: eventfd has no memory arguments; a negative return is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor owned by nothing else.
        let event = unsafe { OwnedFd::from_raw_fd(fd) };
        ring.submitter().register_eventfd(event.as_raw_fd())?;
        let cq_entries = ring.params().cq_entries();
        // SAFETY: F_GETFL takes no memory arguments; a negative return is an error.
        let fl = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        if fl < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Ring {
            ring,
            file,
            event,
            ops: Vec::with_capacity(ops as usize),
            extents: Vec::with_capacity(ops as usize),
            free: Vec::new(),
            in_kernel: 0,
            cq_entries,
            direct: fl & libc::O_DIRECT != 0,
        })
    }

    /// Signalled on every completion and never reset (module docs): an edge, not a level.
    pub fn eventfd(&self) -> BorrowedFd<'_> {
        self.event.as_fd()
    }

    /// Completions wait to be reaped (read from the ring's memory, no system call).
    pub fn has_completions(&mut self) -> bool {
        !self.ring.completion().is_empty()
    }

    /// Operations in flight.
    pub fn in_flight(&self) -> usize {
        self.ops.len() - self.free.len()
    }

    /// Whether an operation of `parts` parts fits now.
    pub fn has_room(&self, parts: usize) -> bool {
        parts <= PARTS_MAX && self.in_kernel as usize + parts <= self.cq_entries as usize
    }

    /// Reads each part from the device into `buf`; `tag` comes back with it.
    pub fn read(
        &mut self,
        buf: impl Into<IoBuf>,
        parts: &[Part],
        tag: T,
    ) -> Result<(), Refused<T>> {
        self.start(Dir::Read, buf.into(), parts, tag)
    }

    /// Writes each part of `buf` to the device; `tag` comes back with it.
    pub fn write(
        &mut self,
        buf: impl Into<IoBuf>,
        parts: &[Part],
        tag: T,
    ) -> Result<(), Refused<T>> {
        self.start(Dir::Write, buf.into(), parts, tag)
    }

    /// Whether the ring takes `buf` for its file: on an `O_DIRECT` file only memory that starts
    /// at an [`IO_ALIGN`] boundary (the kernel would fail the I/O with `EINVAL`).
    pub fn takes(&self, buf: &[u8]) -> bool {
        !self.direct || is_aligned(buf, IO_ALIGN)
    }

    fn start(&mut self, dir: Dir, buf: IoBuf, parts: &[Part], tag: T) -> Result<(), Refused<T>> {
        let fits = parts
            .iter()
            .all(|p| p.at.checked_add(p.len).is_some_and(|end| end <= buf.len()) && p.len > 0);
        if !fits || parts.is_empty() || !self.takes(&buf) {
            return Err(Refused {
                tag,
                buf,
                error: io::Error::from(io::ErrorKind::InvalidInput),
            });
        }
        if !self.has_room(parts.len()) {
            return Err(Refused {
                tag,
                buf,
                error: io::Error::from(io::ErrorKind::WouldBlock),
            });
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.ops.push(None);
                self.extents.push(Extents::EMPTY);
                (self.ops.len() - 1) as u32
            }
        };
        let extents = &mut self.extents[slot as usize];
        extents.parts[..parts.len()].copy_from_slice(parts);
        extents.moved[..parts.len()].fill(0);
        self.ops[slot as usize] = Some(Op {
            tag,
            dir,
            buf,
            pending: 0,
            error: None,
        });
        for i in 0..parts.len() {
            if let Err(e) = self.push(slot, i) {
                // Parts already queued still complete; the rest never start.
                let op = self.ops[slot as usize].as_mut().expect("slot just filled");
                op.error.get_or_insert(e);
                if op.pending == 0 {
                    let op = self.ops[slot as usize].take().expect("slot just filled");
                    self.free.push(slot);
                    return Err(Refused {
                        tag: op.tag,
                        buf: op.buf,
                        error: op.error.expect("set above"),
                    });
                }
                break;
            }
        }
        Ok(())
    }

    /// Queues the SQE for what is left of part `i` of the operation in `slot`.
    fn push(&mut self, slot: u32, i: usize) -> io::Result<()> {
        let op = self.ops[slot as usize].as_mut().expect("live slot");
        let extents = &self.extents[slot as usize];
        let (part, done) = (extents.parts[i], extents.moved[i]);
        let len = u32::try_from(part.len - done)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let ptr = op.buf[part.at + done..].as_mut_ptr();
        let fd = types::Fd(self.file.as_raw_fd());
        let offset = part.device_offset + done as u64;
        let entry = match op.dir {
            Dir::Read => opcode::Read::new(fd, ptr, len).offset(offset).build(),
            Dir::Write => opcode::Write::new(fd, ptr, len).offset(offset).build(),
        }
        .user_data(user_data(slot, i));
        // SAFETY: the buffer is owned by `self.ops[slot]` until this SQE's completion is reaped
        // (the op is taken out only when `pending` is back to zero, and `Drop` waits for every
        // SQE), and the descriptor by `self.file`, so both outlive the kernel's use.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            // The SQ is full: hand it to the kernel, then there is room.
            self.ring.submit()?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&entry) }
                .map_err(|_| io::Error::from(io::ErrorKind::WouldBlock))?;
        }
        op.pending += 1;
        self.in_kernel += 1;
        Ok(())
    }

    /// Hands queued SQEs to the kernel (one system call for all of them).
    pub fn submit(&mut self) -> io::Result<()> {
        if !self.ring.submission().is_empty() {
            self.ring.submit()?;
        }
        Ok(())
    }

    /// Collects completions: every operation whose parts all finished goes to `done`.
    pub fn reap(&mut self, mut done: impl FnMut(Finished<T>)) {
        loop {
            let Some(cqe) = self.ring.completion().next() else {
                break;
            };
            self.in_kernel -= 1;
            let (slot, i) = (
                (cqe.user_data() >> 8) as u32,
                (cqe.user_data() & 0xff) as usize,
            );
            let res = cqe.result();
            let Some(op) = self.ops.get_mut(slot as usize).and_then(Option::as_mut) else {
                continue;
            };
            op.pending -= 1;
            let extents = &mut self.extents[slot as usize];
            let again = match res {
                n if n > 0 => {
                    extents.moved[i] += n as usize;
                    extents.moved[i] < extents.parts[i].len
                }
                0 => {
                    // End of file before the part: the device is smaller than the mapping says.
                    op.error
                        .get_or_insert_with(|| io::Error::from(io::ErrorKind::UnexpectedEof));
                    false
                }
                e if -e == libc::EAGAIN || -e == libc::EINTR => true,
                e => {
                    op.error.get_or_insert(io::Error::from_raw_os_error(-e));
                    false
                }
            };
            if again && op.error.is_none() {
                if let Err(e) = self.push(slot, i) {
                    let op = self.ops[slot as usize].as_mut().expect("live slot");
                    op.error.get_or_insert(e);
                }
            }
            let op = self.ops[slot as usize].as_ref().expect("live slot");
            if op.pending == 0 {
                let op = self.ops[slot as usize].take().expect("live slot");
                self.free.push(slot);
                let what = match op.dir {
                    Dir::Read => "io_uring read",
                    Dir::Write => "io_uring write",
                };
                done(Finished {
                    tag: op.tag,
                    buf: op.buf,
                    result: op.error.map_or(Ok(()), |e| Err(Error::io(what, None, e))),
                });
            }
        }
        // Resubmitted remainders.
        let _ = self.submit();
    }
}

impl<T> Ring<T> {
    /// Signals the eventfd: for whoever reaped on the owner's behalf ([`Ring::wait_all`] from
    /// another thread) and took the completions, so that the owner, waiting on the eventfd,
    /// still looks.
    pub fn notify(&self) -> io::Result<()> {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live 8-byte buffer.
        let n = unsafe { libc::write(self.event.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Submits what is queued and waits on this thread until every operation in flight has
    /// finished; finished operations go to `done`. The eventfd is not signalled for them (a
    /// waiter on it would wake for nothing): for an owner with nothing else to do meanwhile, one
    /// system call and no wake-up through its reactor.
    pub fn run_to_completion(&mut self, done: impl FnMut(Finished<T>)) -> io::Result<()> {
        self.ring.completion().disable_eventfd();
        let waited = self.wait_all(done);
        self.ring.completion().enable_eventfd();
        waited
    }

    /// Waits until the kernel has finished every submitted part; finished operations go to
    /// `done`.
    pub fn wait_all(&mut self, mut done: impl FnMut(Finished<T>)) -> io::Result<()> {
        while self.in_kernel > 0 {
            match self.ring.submit_and_wait(1) {
                // A signal ended the wait: nothing was lost, wait again.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                waited => waited?,
            };
            self.reap(&mut done);
        }
        Ok(())
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // The kernel may still write into owned buffers: wait until every SQE has completed.
        if self.wait_all(drop).is_err() {
            // Cannot wait (should not happen): leak the buffers rather than free memory the
            // kernel may still write.
            for op in self.ops.drain(..).flatten() {
                std::mem::forget(op.buf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn file_with(bytes: &[u8]) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        std::fs::write(&path, bytes).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        (dir, f)
    }

    fn ring_or_skip(f: &File) -> Option<Ring<u64>> {
        match Ring::new(f.try_clone().unwrap(), 8) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("io_uring unavailable here ({e}): skipped");
                None
            }
        }
    }

    fn wait_one(ring: &mut Ring<u64>) -> Finished<u64> {
        ring.submit().unwrap();
        loop {
            let mut got = None;
            ring.reap(|f| got = Some(f));
            if let Some(f) = got {
                return f;
            }
            ring.ring.submit_and_wait(1).unwrap();
        }
    }

    /// Readiness comes from the completion queue's memory: a posted completion shows before it
    /// is reaped and not after, and each one signals the eventfd, which reaping leaves as is.
    #[test]
    fn completions_show_in_memory_and_each_signals_the_eventfd() {
        let (_dir, f) = file_with(&[7u8; 8192]);
        let Some(mut ring) = ring_or_skip(&f) else {
            return;
        };
        assert!(!ring.has_completions());
        for round in 1..=2u64 {
            let part = Part {
                device_offset: 0,
                at: 0,
                len: 4096,
            };
            ring.read(AlignedBuf::zeroed(4096), &[part], round).unwrap();
            ring.ring.submit_and_wait(1).unwrap();
            assert!(ring.has_completions(), "a posted completion shows");
            let mut got = Vec::new();
            ring.reap(|f| got.push(f.tag));
            assert_eq!(got, [round]);
            assert!(!ring.has_completions(), "nothing left once reaped");
        }
        // Two completions, two signals; reaping read none of them.
        assert_eq!(signals(&ring), 2);
    }

    /// Reads and resets the eventfd's counter: the signals since the last call.
    fn signals(ring: &Ring<u64>) -> u64 {
        let mut c = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live 8-byte buffer.
        let n = unsafe { libc::read(ring.event.as_raw_fd(), c.as_mut_ptr().cast(), 8) };
        if n == 8 {
            u64::from_ne_bytes(c)
        } else {
            0
        }
    }

    /// An owner with nothing else to do waits in the submission: its operations come back,
    /// with no signal for them, and a completion waited for elsewhere signals again after.
    #[test]
    fn run_to_completion_returns_the_operations_without_a_signal() {
        let (_dir, f) = file_with(&[7u8; 8192]);
        let Some(mut ring) = ring_or_skip(&f) else {
            return;
        };
        let part = |device_offset| Part {
            device_offset,
            at: 0,
            len: 4096,
        };
        ring.write(AlignedBuf::zeroed(4096), &[part(4096)], 3)
            .unwrap();
        ring.read(AlignedBuf::zeroed(4096), &[part(0)], 4).unwrap();
        let mut got = Vec::new();
        ring.run_to_completion(|f| {
            f.result.unwrap();
            got.push(f.tag);
        })
        .unwrap();
        got.sort_unstable();
        assert_eq!(got, [3, 4]);
        assert_eq!(
            (ring.in_flight(), signals(&ring)),
            (0, 0),
            "no signal for them"
        );
        ring.read(AlignedBuf::zeroed(4096), &[part(0)], 5).unwrap();
        ring.ring.submit_and_wait(1).unwrap();
        assert_eq!(signals(&ring), 1, "signals again after");
    }

    #[test]
    fn reads_and_writes_parts_of_one_buffer_at_their_device_offsets() {
        let image: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 253) as u8).collect();
        let (_dir, f) = file_with(&image);
        let Some(mut ring) = ring_or_skip(&f) else {
            return;
        };
        // Two extents into one 12 KiB buffer: 8 KiB from 40 KiB, then 4 KiB from 4 KiB.
        let parts = [
            Part {
                device_offset: 40 << 10,
                at: 0,
                len: 8 << 10,
            },
            Part {
                device_offset: 4 << 10,
                at: 8 << 10,
                len: 4 << 10,
            },
        ];
        ring.read(AlignedBuf::zeroed(12 << 10), &parts, 7).unwrap();
        assert_eq!(ring.in_flight(), 1);
        let f1 = wait_one(&mut ring);
        assert_eq!(f1.tag, 7);
        f1.result.unwrap();
        assert_eq!(&f1.buf[..8 << 10], &image[40 << 10..48 << 10]);
        assert_eq!(&f1.buf[8 << 10..], &image[4 << 10..8 << 10]);
        assert_eq!(ring.in_flight(), 0);

        let data = AlignedBuf::from_slice(&[0xa5; 4096]);
        let part = Part {
            device_offset: 60 << 10,
            at: 0,
            len: 4096,
        };
        ring.write(data, &[part], 9).unwrap();
        let f2 = wait_one(&mut ring);
        assert_eq!(f2.tag, 9);
        f2.result.unwrap();
        let mut back = vec![0u8; 4096];
        f.read_exact_at(&mut back, 60 << 10).unwrap();
        assert!(back.iter().all(|&b| b == 0xa5));
    }

    #[test]
    fn a_read_past_the_end_fails_and_returns_its_buffer() {
        let (_dir, f) = file_with(&[1u8; 8192]);
        let Some(mut ring) = ring_or_skip(&f) else {
            return;
        };
        let part = Part {
            device_offset: 1 << 20,
            at: 0,
            len: 4096,
        };
        ring.read(AlignedBuf::zeroed(4096), &[part], 1).unwrap();
        let done = wait_one(&mut ring);
        let e = done.result.unwrap_err();
        assert!(
            matches!(&e, Error::Io { source, .. } if source.kind() == io::ErrorKind::UnexpectedEof),
            "{e}"
        );
        assert_eq!(done.buf.len(), 4096);
    }

    #[test]
    fn parts_outside_the_buffer_or_too_many_are_refused_before_anything_starts() {
        let (_dir, f) = file_with(&[0u8; 8192]);
        let Some(mut ring) = ring_or_skip(&f) else {
            return;
        };
        let outside = Part {
            device_offset: 0,
            at: 4096,
            len: 8192,
        };
        let refused = ring
            .read(AlignedBuf::zeroed(8192), &[outside], 1)
            .unwrap_err();
        assert_eq!(refused.error.kind(), io::ErrorKind::InvalidInput);
        assert_eq!((refused.tag, refused.buf.len()), (1, 8192));
        let small = Part {
            device_offset: 0,
            at: 0,
            len: 512,
        };
        let many = [small; PARTS_MAX + 1];
        assert!(ring.read(AlignedBuf::zeroed(8192), &many, 2).is_err());
        assert_eq!(ring.in_flight(), 0);
    }

    #[test]
    fn wait_all_returns_every_operation_in_flight() {
        let (_dir, f) = file_with(&[3u8; 1 << 20]);
        let Some(mut ring) = ring_or_skip(&f) else {
            return;
        };
        for tag in 0..4 {
            let part = Part {
                device_offset: tag << 18,
                at: 0,
                len: 1 << 18,
            };
            ring.read(AlignedBuf::zeroed(1 << 18), &[part], tag)
                .unwrap();
        }
        assert_eq!(ring.in_flight(), 4);
        let mut tags = Vec::new();
        ring.wait_all(|f| {
            f.result.unwrap();
            assert!(f.buf.iter().all(|&b| b == 3));
            tags.push(f.tag);
        })
        .unwrap();
        tags.sort_unstable();
        assert_eq!(tags, [0, 1, 2, 3]);
        assert_eq!(ring.in_flight(), 0);
    }

    /// A page-aligned region of a `Vec` (how a received write's data arrives) is written from
    /// where it lies, on an `O_DIRECT` file too, and comes back whole; a region that does not
    /// start at a page boundary is refused on an `O_DIRECT` file, before anything starts.
    #[test]
    fn a_vec_region_is_written_in_place_and_an_unaligned_one_refused_on_o_direct() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let path = dir.path().join("dev");
        std::fs::write(&path, vec![0u8; 64 * 1024]).unwrap();
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path);
        let Ok(f) = opened else {
            eprintln!("no O_DIRECT on this file system: skipped");
            return;
        };
        let Some(mut ring) = ring_or_skip(&f) else {
            return;
        };
        let mut bytes = vec![0u8; 3 * 4096];
        let start = (IO_ALIGN - bytes.as_ptr().addr() % IO_ALIGN) % IO_ALIGN;
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        bytes[start..start + 8192].copy_from_slice(&data);
        let at = bytes[start..].as_ptr();
        let part = Part {
            device_offset: 16 << 10,
            at: 0,
            len: 8192,
        };
        let region = IoBuf::region(bytes, start, 8192).unwrap();
        ring.write(region, &[part], 1).unwrap();
        let done = wait_one(&mut ring);
        done.result.unwrap();
        assert_eq!(done.buf.as_ptr(), at, "written from its own memory");
        let IoBufParts::Region {
            bytes,
            start: back_start,
            len,
        } = done.buf.into_parts()
        else {
            panic!("a region comes back as a region");
        };
        assert_eq!((back_start, len), (start, 8192));
        let mut on_disk = vec![0u8; 8192];
        std::fs::File::open(&path)
            .unwrap()
            .read_exact_at(&mut on_disk, 16 << 10)
            .unwrap();
        assert_eq!(on_disk, data);

        let skewed = IoBuf::region(bytes, start + 512, 4096).unwrap();
        let refused = ring
            .write(skewed, &[Part { len: 4096, ..part }], 2)
            .unwrap_err();
        assert_eq!(refused.error.kind(), io::ErrorKind::InvalidInput);
        assert!(matches!(
            refused.buf.into_parts(),
            IoBufParts::Region { start: s, .. } if s == start + 512
        ));
        assert_eq!(ring.in_flight(), 0);

        // Outside its Vec: no region at all.
        assert!(IoBuf::region(vec![0; 10], 8, 4).is_err());
    }
}
