//! The asynchronous data path: block I/O the appliance's tokio tasks can `.await` without
//! blocking the reactor. Two engines behind one enum, chosen at open:
//!
//! - [`EngineKind::IoUring`]: one thread owns an io_uring; requests arrive over a channel and an
//!   eventfd whose read is kept armed in the ring, so the thread sleeps in a single
//!   `io_uring_enter` for both new requests and completions. In flight is bounded by the ring size;
//!   `REQUIRED_OPS` are probed at setup (like firecracker's `io_uring/mod.rs`).
//! - [`EngineKind::Pool`]: a fixed number of threads doing `pread`/`pwrite`/`fdatasync`
//!   (bounded: at most `depth` requests execute at once, the rest queue).
//!
//! Both complete a future per request; buffers are moved in and handed back ([`AlignedBuf`], so
//! `O_DIRECT` alignment holds and the kernel never sees a buffer the caller can touch).
//!
//! # Which one the data path uses
//! Measured in `hal/BENCHMARKS.md` (hal-bench, one run, same device). On the emulated NVMe in the
//! QEMU guest (2 vCPUs, TCG) io_uring at QD16 beats the raw QD1 baseline on every workload but
//! 128k sequential read (4k random write 1.49x, 128k sequential write 1.38x) while the pool at
//! QD16 collapses on writes (0.28x, 0.50x: 16 threads contending for 2 CPUs). On a host tmpfs
//! file, where a "device" answers in memory time, both async paths lose to plain synchronous
//! calls (the hand-off to another thread costs more than the copy) and the pool is ahead.
//! Choice: [`EngineKind::Auto`] = io_uring (one thread, bounded by the ring, no context switch
//! per request, better on real queues), the pool as fallback where io_uring is missing or
//! forbidden (seccomp, `kernel.io_uring_disabled`, old kernels). Metadata I/O of core stays on the
//! synchronous [`BlockDevice`](edgevol_core::BlockDevice) path, run off the reactor.
// Casts: ring slot indexes < depth <= 4096; buffer lengths fit u32 (checked) .
#![allow(clippy::cast_possible_truncation)]
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::fs::File;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

use crate::buf::AlignedBuf;
use crate::error::Error;

/// Which engine to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// io_uring if available, else the pool.
    Auto,
    /// io_uring (fails to open where unsupported).
    IoUring,
    /// Bounded blocking thread pool.
    Pool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    Sync,
}

#[derive(Debug)]
struct Slot {
    done: Option<(AlignedBuf, io::Result<usize>)>,
    waker: Option<Waker>,
}

type SlotRef = Arc<Mutex<Slot>>;

fn complete(slot: &SlotRef, buf: AlignedBuf, res: io::Result<usize>) {
    let waker = {
        let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
        s.done = Some((buf, res));
        s.waker.take()
    };
    if let Some(w) = waker {
        w.wake();
    }
}

#[derive(Debug)]
struct Request {
    op: Op,
    offset: u64,
    buf: AlignedBuf,
    slot: SlotRef,
}

/// A pending request; resolves to the buffer and the byte count.
#[derive(Debug)]
pub struct Pending {
    slot: SlotRef,
}

impl Future for Pending {
    type Output = (AlignedBuf, io::Result<usize>);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        match s.done.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

#[derive(Debug)]
enum Engine {
    #[cfg(feature = "io-uring")]
    Uring(uring::UringEngine),
    Pool(pool::PoolEngine),
}

/// An open file or block device with an asynchronous engine. Cheap to share by reference.
#[derive(Debug)]
pub struct AsyncDevice {
    engine: Engine,
    block_size: u32,
    block_count: u64,
}

impl AsyncDevice {
    /// Wraps `file` (opened by [`FileDevice`](crate::FileDevice) or
    /// [`LinuxBlockDevice`](crate::LinuxBlockDevice), e.g. via `try_clone_file`) with `depth`
    /// requests in flight at most.
    pub fn open(
        file: File,
        block_size: u32,
        block_count: u64,
        kind: EngineKind,
        depth: u32,
    ) -> Result<Self, Error> {
        let depth = depth.clamp(1, 4096);
        let engine = match kind {
            #[cfg(feature = "io-uring")]
            EngineKind::IoUring => Engine::Uring(uring::UringEngine::new(file, depth)?),
            #[cfg(feature = "io-uring")]
            EngineKind::Auto => match file.try_clone() {
                Ok(f2) => match uring::UringEngine::new(f2, depth) {
                    Ok(e) => Engine::Uring(e),
                    Err(e) => {
                        log::info!("io_uring unavailable ({e}); using the blocking pool");
                        Engine::Pool(pool::PoolEngine::new(file, depth)?)
                    }
                },
                Err(e) => return Err(Error::io("dup", None, e)),
            },
            #[cfg(not(feature = "io-uring"))]
            EngineKind::IoUring => {
                return Err(Error::Unsupported("built without the io-uring feature"))
            }
            #[cfg(not(feature = "io-uring"))]
            EngineKind::Auto => Engine::Pool(pool::PoolEngine::new(file, depth)?),
            EngineKind::Pool => Engine::Pool(pool::PoolEngine::new(file, depth)?),
        };
        Ok(Self {
            engine,
            block_size,
            block_count,
        })
    }

    /// Which engine runs.
    pub fn engine(&self) -> EngineKind {
        match self.engine {
            #[cfg(feature = "io-uring")]
            Engine::Uring(_) => EngineKind::IoUring,
            Engine::Pool(_) => EngineKind::Pool,
        }
    }

    fn submit(&self, op: Op, offset: u64, buf: AlignedBuf) -> Result<Pending, (AlignedBuf, Error)> {
        let slot = Arc::new(Mutex::new(Slot {
            done: None,
            waker: None,
        }));
        let req = Request {
            op,
            offset,
            buf,
            slot: slot.clone(),
        };
        let sent = match &self.engine {
            #[cfg(feature = "io-uring")]
            Engine::Uring(e) => e.send(req),
            Engine::Pool(e) => e.send(req),
        };
        match sent {
            Ok(()) => Ok(Pending { slot }),
            Err(req) => Err((req.buf, Error::EngineStopped)),
        }
    }

    fn check(&self, block: u64, len: usize) -> Result<(), Error> {
        crate::error::check_blocks(self.block_size, self.block_count, block, len).map(drop)
    }

    async fn run(&self, op: Op, block: u64, buf: AlignedBuf) -> (AlignedBuf, Result<(), Error>) {
        if op != Op::Sync {
            if let Err(e) = self.check(block, buf.len()) {
                return (buf, Err(e));
            }
        }
        let want = if op == Op::Sync { 0 } else { buf.len() };
        let pending = match self.submit(op, block * u64::from(self.block_size), buf) {
            Ok(p) => p,
            Err((buf, e)) => return (buf, Err(e)),
        };
        let (buf, res) = pending.await;
        let what = match op {
            Op::Read => "read",
            Op::Write => "write",
            Op::Sync => "fdatasync",
        };
        let res = match res {
            Ok(n) if n == want => Ok(()),
            Ok(n) => Err(Error::io(
                what,
                None,
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("short {what}: {n} of {want}"),
                ),
            )),
            Err(e) => Err(Error::io(what, None, e)),
        };
        (buf, res)
    }

    /// Reads whole blocks into `buf` from `block`.
    pub async fn read(&self, block: u64, buf: AlignedBuf) -> (AlignedBuf, Result<(), Error>) {
        self.run(Op::Read, block, buf).await
    }

    /// Writes whole blocks of `buf` at `block`.
    pub async fn write(&self, block: u64, buf: AlignedBuf) -> (AlignedBuf, Result<(), Error>) {
        self.run(Op::Write, block, buf).await
    }

    /// `fdatasync` through the engine.
    pub async fn flush(&self) -> Result<(), Error> {
        self.run(Op::Sync, 0, AlignedBuf::zeroed(0)).await.1
    }
}

fn pread_pwrite(fd: RawFd, req: &mut Request) -> io::Result<usize> {
    use std::os::fd::BorrowedFd;
    // SAFETY: the engine owns the File behind fd for as long as its threads run.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    let off = i64::try_from(req.offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let r = match req.op {
        Op::Read => nix::sys::uio::pread(bfd, &mut req.buf, off),
        Op::Write => nix::sys::uio::pwrite(bfd, &req.buf, off),
        Op::Sync => nix::unistd::fdatasync(bfd).map(|()| 0),
    };
    r.map_err(|e| io::Error::from_raw_os_error(e as i32))
}

mod pool {
    use super::*;

    #[derive(Debug)]
    pub(super) struct PoolEngine {
        tx: Option<mpsc::Sender<Request>>,
        threads: Vec<JoinHandle<()>>,
        _file: Arc<File>,
    }

    impl PoolEngine {
        pub(super) fn new(file: File, depth: u32) -> Result<Self, Error> {
            let file = Arc::new(file);
            let (tx, rx) = mpsc::channel::<Request>();
            let rx = Arc::new(Mutex::new(rx));
            let mut threads = Vec::new();
            for i in 0..depth {
                let rx = rx.clone();
                let f = file.clone();
                let t = std::thread::Builder::new()
                    .name(format!("hal-pool-{i}"))
                    .spawn(move || loop {
                        let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        let Ok(mut req) = next else { return };
                        let res = pread_pwrite(f.as_raw_fd(), &mut req);
                        complete(&req.slot, req.buf, res);
                    })
                    .map_err(|e| Error::io("spawn", None, e))?;
                threads.push(t);
            }
            Ok(Self {
                tx: Some(tx),
                threads,
                _file: file,
            })
        }

        pub(super) fn send(&self, req: Request) -> Result<(), Request> {
            match &self.tx {
                Some(tx) => tx.send(req).map_err(|e| e.0),
                None => Err(req),
            }
        }
    }

    impl Drop for PoolEngine {
        fn drop(&mut self) {
            self.tx.take();
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

#[cfg(feature = "io-uring")]
mod uring {
    use super::*;
    use io_uring::{opcode, types, IoUring, Probe};
    use nix::sys::eventfd::{EfdFlags, EventFd};

    const WAKE: u64 = u64::MAX;
    const REQUIRED_OPS: [u8; 3] = [opcode::Read::CODE, opcode::Write::CODE, opcode::Fsync::CODE];

    #[derive(Debug)]
    pub(super) struct UringEngine {
        tx: Option<mpsc::Sender<Request>>,
        wake: Arc<EventFd>,
        thread: Option<JoinHandle<()>>,
    }

    impl UringEngine {
        pub(super) fn new(file: File, depth: u32) -> Result<Self, Error> {
            let ring = IoUring::new(depth.next_power_of_two().max(2))
                .map_err(|e| Error::io("io_uring_setup", None, e))?;
            let mut probe = Probe::new();
            ring.submitter()
                .register_probe(&mut probe)
                .map_err(|e| Error::io("io_uring probe", None, e))?;
            if let Some(&op) = REQUIRED_OPS.iter().find(|&&op| !probe.is_supported(op)) {
                log::info!("io_uring lacks opcode {op}");
                return Err(Error::Unsupported("io_uring without read/write/fsync"));
            }
            let wake = Arc::new(
                EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)
                    .map_err(|e| Error::errno("eventfd", None, e))?,
            );
            let (tx, rx) = mpsc::channel();
            let w = wake.clone();
            let thread = std::thread::Builder::new()
                .name("hal-uring".into())
                .spawn(move || ring_thread(ring, file, w, rx, depth as usize))
                .map_err(|e| Error::io("spawn", None, e))?;
            Ok(Self {
                tx: Some(tx),
                wake,
                thread: Some(thread),
            })
        }

        pub(super) fn send(&self, req: Request) -> Result<(), Request> {
            let Some(tx) = &self.tx else { return Err(req) };
            tx.send(req).map_err(|e| e.0)?;
            // A failed eventfd write would only delay the ring thread until the next one.
            let _ = self.wake.write(1);
            Ok(())
        }
    }

    impl Drop for UringEngine {
        fn drop(&mut self) {
            self.tx.take();
            let _ = self.wake.write(1);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    fn ring_thread(
        mut ring: IoUring,
        file: File,
        wake: Arc<EventFd>,
        rx: mpsc::Receiver<Request>,
        depth: usize,
    ) {
        let fd = types::Fd(file.as_raw_fd());
        let mut slots: Vec<Option<Request>> = (0..depth).map(|_| None).collect();
        let mut free: Vec<usize> = (0..depth).rev().collect();
        let mut queued: VecDeque<Request> = VecDeque::new();
        let mut wake_buf = Box::new(0u64);
        let mut wake_armed = false;
        let mut closed = false;
        loop {
            if !wake_armed && !closed {
                let sqe = opcode::Read::new(
                    types::Fd(wake.as_raw_fd()),
                    (&mut *wake_buf as *mut u64).cast(),
                    8,
                )
                .build()
                .user_data(WAKE);
                // SAFETY: wake_buf is a heap u64 that lives until this function returns, after
                // the ring (and so the read) is gone; only this thread touches it.
                if unsafe { ring.submission().push(&sqe) }.is_ok() {
                    wake_armed = true;
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(r) => queued.push_back(r),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            }
            while let (Some(_), Some(&idx)) = (queued.front(), free.last()) {
                let mut req = queued.pop_front().expect("front checked");
                let len = u32::try_from(req.buf.len()).unwrap_or(u32::MAX);
                let sqe = match req.op {
                    Op::Read => opcode::Read::new(fd, req.buf.as_mut_ptr(), len)
                        .offset(req.offset)
                        .build(),
                    Op::Write => opcode::Write::new(fd, req.buf.as_ptr(), len)
                        .offset(req.offset)
                        .build(),
                    Op::Sync => opcode::Fsync::new(fd)
                        .flags(types::FsyncFlags::DATASYNC)
                        .build(),
                }
                .user_data(idx as u64);
                // SAFETY: the buffer is heap memory owned by `req`, which stays in `slots[idx]`
                // (not moved out or dropped) until its completion is reaped below.
                if unsafe { ring.submission().push(&sqe) }.is_err() {
                    queued.push_front(req);
                    break;
                }
                free.pop();
                slots[idx] = Some(req);
            }
            let inflight = depth - free.len();
            if closed && inflight == 0 && queued.is_empty() {
                return;
            }
            if let Err(e) = ring.submit_and_wait(1) {
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                log::error!("io_uring_enter: {e}");
                for r in slots
                    .iter_mut()
                    .filter_map(Option::take)
                    .chain(queued.drain(..))
                {
                    complete(&r.slot, r.buf, Err(io::Error::other("io_uring failed")));
                }
                return;
            }
            let done: Vec<(u64, i32)> = ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (ud, res) in done {
                if ud == WAKE {
                    wake_armed = false;
                    continue;
                }
                let idx = ud as usize;
                if let Some(r) = slots.get_mut(idx).and_then(Option::take) {
                    free.push(idx);
                    let res = if res < 0 {
                        Err(io::Error::from_raw_os_error(-res))
                    } else {
                        Ok(res as usize)
                    };
                    complete(&r.slot, r.buf, res);
                }
            }
        }
    }
}

/// Runs futures to completion on the current thread (for tools and tests; the appliance awaits
/// these futures on tokio).
pub fn block_on_all<F: Future<Output = ()>>(futs: Vec<F>) {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut futs: Vec<Option<Pin<Box<F>>>> = futs.into_iter().map(|f| Some(Box::pin(f))).collect();
    loop {
        let mut live = 0;
        for slot in futs.iter_mut() {
            if let Some(f) = slot {
                if f.as_mut().poll(&mut cx).is_ready() {
                    *slot = None;
                } else {
                    live += 1;
                }
            }
        }
        if live == 0 {
            return;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileDevice;

    fn roundtrip(kind: EngineKind) {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::create(dir.path().join("d.img"), 4 << 20).unwrap();
        let a = AsyncDevice::open(
            dev.try_clone_file().unwrap(),
            4096,
            dev.block_count(),
            kind,
            8,
        )
        .unwrap();
        if kind != EngineKind::Auto {
            assert_eq!(a.engine(), kind);
        }
        let a = &a;
        let futs: Vec<_> = (0..32u64)
            .map(|i| async move {
                let buf = AlignedBuf::from_slice(&vec![i as u8 + 1; 8192]);
                let (_, r) = a.write(i * 2, buf).await;
                r.unwrap();
            })
            .collect();
        block_on_all(futs);
        block_on_all(vec![async { a.flush().await.unwrap() }]);
        let futs: Vec<_> = (0..32u64)
            .map(|i| async move {
                let (buf, r) = a.read(i * 2, AlignedBuf::zeroed(8192)).await;
                r.unwrap();
                assert!(buf.iter().all(|&b| b == i as u8 + 1), "block {}", i * 2);
            })
            .collect();
        block_on_all(futs);
        block_on_all(vec![async {
            let (_, r) = a.read(1023, AlignedBuf::zeroed(8192)).await;
            assert!(matches!(r, Err(Error::OutOfBounds { .. })));
        }]);
    }

    #[test]
    fn pool_roundtrip() {
        roundtrip(EngineKind::Pool);
    }

    #[test]
    fn auto_roundtrip() {
        roundtrip(EngineKind::Auto);
    }

    #[cfg(feature = "io-uring")]
    #[test]
    fn uring_roundtrip_or_skip() {
        match IoUringCheck::available() {
            true => roundtrip(EngineKind::IoUring),
            false => println!("SKIP io_uring test: io_uring_setup refused on this host"),
        }
    }

    #[cfg(feature = "io-uring")]
    struct IoUringCheck;
    #[cfg(feature = "io-uring")]
    impl IoUringCheck {
        fn available() -> bool {
            io_uring::IoUring::new(2).is_ok()
        }
    }
}
