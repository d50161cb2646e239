//! One TCP connection = one NVMe queue: a task driving an [`edgevol_nvmeof::queue::Queue`]
//! the way quinn's `ConnectionDriver` drives quinn-proto: feed socket bytes, drain events
//! (parse → execute → complete), transmit, and wait on the socket, finished I/O, controller
//! teardown, async events and the next timer. Work per pass is bounded by the queue's receive
//! budget.
//!
//! A connection starts on the daemon's runtime; once its Connect binds an I/O queue it moves to
//! that queue's engine thread ([`super::engine`]) for the rest of its life. There, Reads and
//! cached Writes run in place, run-to-completion, when that is cheaper than a hand-off: always
//! on a page-cache device, and on an `O_DIRECT` device when the command is alone (nothing in
//! flight or received behind it, so there is no depth to give the drive). Everything else
//! (queued commands on a drive, Flush, FUA, Write Zeroes, Deallocate) runs concurrently, up to
//! the queue's slots: queued Reads and cached Writes on the queue's own io_uring
//! ([`super::device_ring`]), the rest on the target's worker threads ([`super::workers`]), so
//! the engine never waits for a flush. Data buffers are kept per queue and reused.
//!
//! A volume with QoS limits ([`super::throttle`]) holds back I/O commands over its limits: they
//! wait in the queue's own list, in arrival order, and start when the volume's limiter hands
//! them out, while the queue goes on receiving, completing and keeping its timers.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant as StdInstant;

use bytes::BufMut;
use edgevol_core::DeviceError;
use edgevol_hal::uring::Refused;
use edgevol_nvmeof::admin::AdminCommand;
use edgevol_nvmeof::auth::{command, AuthCommand, Outcome};
use edgevol_nvmeof::fabrics::{self as parse, Command, NamespaceInfo, QueueState};
use edgevol_nvmeof::io_cmd::IoCommand;
use edgevol_nvmeof::queue::{self, CommandTag, Completion, Event, Queue, Splice};
use edgevol_nvmeof::status::{Status, StatusCode};
use getrandom::SysRng;
use rand_core::UnwrapErr;
use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::auth::QueueAuth;
use super::controller::{CcEffect, Controller, Kind, MAX_AERS};
use super::device_ring::{DeviceRing, Reaped, Record};
use super::errors::Origin;
use super::fabrics::{self, Bound};
use super::io::{self, DataPath};
use super::stats::{IoKind, VolumeCounters};
use super::status::{from_device, Access, TargetStatus};
use super::subsys::{Subsystems, NSID};
use super::throttle::{self, stored_limits, VolumeQos, Waiter};
use super::workers::{Job, Replies};
use super::{admin, queue_config};
use crate::state::State;

/// Room made in the receive buffer before each socket read.
const READ_CHUNK: usize = 64 * 1024;

/// A command handed out by the queue: its tag, and what the error log records if it fails.
#[derive(Clone, Copy)]
struct Issued {
    tag: CommandTag,
    origin: Origin,
}

/// An I/O command from its start: what completes it, and what the counters record.
#[derive(Clone, Copy)]
struct Begun {
    issued: Issued,
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
    fn done(self, result: Result<(), TargetStatus>, buf: io::ReadBuf, host_data: Vec<u8>) -> Done {
        Done {
            begun: self,
            result,
            buf,
            host_data,
        }
    }
}

/// A finished I/O command.
struct Done {
    begun: Begun,
    result: Result<(), TargetStatus>,
    /// The read's data; a spare buffer again once sent.
    buf: io::ReadBuf,
    /// The write's data, handed back to the queue's decoder for reuse.
    host_data: Vec<u8>,
}

/// Why a connection ended (for the log).
enum End {
    Protocol(queue::CloseReason),
    PeerClosed,
    Socket(std::io::Error),
    ControllerGone,
    KeepAliveExpired,
    Disconnect,
    Stopped,
    /// The queue did not authenticate (why, for the log; the failure itself is logged by
    /// [`HostAuth::failed`](super::auth::HostAuth::failed)).
    Unauthenticated(&'static str),
}

impl std::fmt::Debug for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Protocol(reason) => write!(f, "protocol: {reason:?}"),
            End::PeerClosed => f.write_str("peer closed"),
            End::Socket(e) => write!(f, "socket: {e}"),
            End::ControllerGone => f.write_str("controller torn down"),
            End::KeepAliveExpired => f.write_str("keep-alive expired"),
            End::Disconnect => f.write_str("disconnect"),
            End::Stopped => f.write_str("target stopped"),
            End::Unauthenticated(why) => write!(f, "not authenticated: {why}"),
        }
    }
}

struct Conn {
    subs: Arc<Subsystems>,
    peer: Option<SocketAddr>,
    queue: Queue,
    /// Present when the queue must authenticate (DH-HMAC-CHAP) before other commands run.
    auth: Option<Box<QueueAuth>>,
    epoch: Instant,
    bound: Option<Bound>,
    lba_shift: u8,
    counters: Option<Arc<VolumeCounters>>,
    /// Commands handed to the workers, and where they come back.
    handed_off: usize,
    replies: Arc<Replies<Done>>,
    /// Kept between passes: the finished commands taken from `replies`.
    finished: Vec<Done>,
    aers: Vec<Issued>,
    ctrl_watch: Option<watch::Receiver<bool>>,
    end: Option<End>,
    /// Set by a Connect that bound an I/O queue: move to that queue's engine.
    move_to_engine: Option<u16>,
    /// Which Reads and cached Writes run in place.
    in_place: InPlace,
    /// The command being dispatched is the only one: nothing in flight, nothing else received.
    alone: bool,
    /// Data buffers of finished commands, for the next ones, and their bytes.
    spare: Vec<io::ReadBuf>,
    spare_bytes: usize,
    /// Read buffers whose data the queue's transmit sends from (a splice's token is the index).
    sending: Vec<io::ReadBuf>,
    /// The volume's QoS (I/O queues of a volume).
    qos: Option<Qos>,
    /// Device I/O of Reads and cached Writes on an `O_DIRECT` device that do not run in place.
    ring: Option<DeviceRing<OnRing>>,
    /// Kept between passes: the ring's finished operations.
    reaped: Vec<Reaped<OnRing>>,
}

/// A command whose device I/O is on the queue's ring.
struct OnRing {
    begun: Begun,
    op: RingOp,
    /// The read's length (the buffer's data); 0 for a write.
    len: usize,
}

/// What a ring operation does, with what pins its clusters until it lands.
enum RingOp {
    Read(io::MappedRead),
    /// Holds the snapshot gate until its parts land.
    Write(io::MappedWrite),
}

impl Record for OnRing {
    fn landed(&mut self) {
        if let RingOp::Write(w) = &mut self.op {
            w.leave_gate();
        }
    }
}

/// Operations a queue's ring holds at once: the deepest queue Linux's NVMe/TCP host asks for
/// (128 entries); a Read of more parts than fit now reads in place.
const RING_OPS: u32 = 128;

/// An I/O queue's share of its volume's QoS: its place in the limiter and the commands held
/// back, in arrival order (the first waits in the limiter, the others behind it).
struct Qos {
    volume: Arc<VolumeQos>,
    me: Arc<Waiter>,
    held: VecDeque<Held>,
}

/// An I/O command held back by QoS.
struct Held {
    issued: Issued,
    request: io::Request,
    started: StdInstant,
}

impl Drop for Qos {
    fn drop(&mut self) {
        if !self.held.is_empty() {
            self.volume.cancel(&self.me);
        }
    }
}

/// Which Reads and cached Writes run in place on the queue's thread, with no ring or worker.
#[derive(Clone, Copy, PartialEq, Eq)]
enum InPlace {
    /// Not on an engine (admin and discovery queues).
    Never,
    /// `O_DIRECT` device: only a command with nothing to overlap (the drive's latency would
    /// otherwise hold back the commands queued behind it; alone, the hand-off is pure cost).
    WhenAlone,
    /// Page-cache device: a copy is cheaper than any hand-off.
    Always,
}

/// Bytes of spare data buffers a queue keeps (a full queue of 4 KiB commands, or 16 of
/// 128 KiB), and the largest buffer it keeps.
const SPARE_BYTES: usize = 2 << 20;
const SPARE_MAX: usize = 128 * 1024;

/// Read data at least this long is sent from its own buffer (spliced into a vectored write);
/// shorter data is copied into the transmit buffer, which costs less than an iovec of its own
/// in every write.
const SPLICE_MIN: usize = 16 * 1024;

/// The socket side of a connection and its buffers.
struct Link {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    /// Received bytes not yet consumed start at `rx_start`.
    rx: Vec<u8>,
    rx_start: usize,
    out: Vec<u8>,
    /// Where the read data the queue did not copy goes in `out`.
    splices: Vec<Splice>,
    /// Bytes were received straight into a PDU's buffer: the queue must look at them.
    sunk: bool,
}

/// How [`drive`] returned.
enum Exit {
    Ended(End),
    /// An I/O queue was bound: continue on its engine.
    MoveToEngine(u16),
}

/// Serves one accepted connection until it closes, the controller goes, or the target stops.
pub async fn serve(
    subs: Arc<Subsystems>,
    stream: TcpStream,
    epoch: Instant,
    mut stop: watch::Receiver<bool>,
) {
    let peer = stream.peer_addr().ok();
    let _ = stream.set_nodelay(true);
    let queue = match Queue::new(queue_config(), epoch.elapsed()) {
        Ok(q) => q,
        Err(e) => {
            tracing::error!(%e, "NVMe/TCP queue configuration refused");
            return;
        }
    };
    let mut conn = Conn {
        subs,
        peer,
        queue,
        auth: None,
        epoch,
        bound: None,
        lba_shift: 12,
        counters: None,
        handed_off: 0,
        replies: Arc::default(),
        finished: Vec::new(),
        aers: Vec::new(),
        ctrl_watch: None,
        end: None,
        move_to_engine: None,
        in_place: InPlace::Never,
        alone: false,
        spare: Vec::new(),
        spare_bytes: 0,
        sending: Vec::new(),
        qos: None,
        ring: None,
        reaped: Vec::new(),
    };
    let (rd, wr) = stream.into_split();
    let mut link = Link {
        rd,
        wr,
        rx: Vec::new(),
        rx_start: 0,
        out: Vec::new(),
        splices: Vec::new(),
        sunk: false,
    };
    let qid = match drive(&mut conn, &mut link, &mut stop).await {
        Exit::Ended(end) => return finish(conn, link, end).await,
        Exit::MoveToEngine(qid) => qid,
    };
    // The socket is re-registered with the engine's reactor: tokio streams belong to the
    // runtime they were made on.
    let std_stream = match link.rd.reunite(link.wr).map(TcpStream::into_std) {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return conn.moving_failed(e),
        Err(e) => return conn.moving_failed(std::io::Error::other(e)),
    };
    let (rx, rx_start, out, splices) = (link.rx, link.rx_start, link.out, link.splices);
    let engines = conn.subs.engines.clone();
    let moved = engines.spawn(qid, async move {
        let (rd, wr) = match TcpStream::from_std(std_stream) {
            Ok(s) => s.into_split(),
            Err(e) => return conn.moving_failed(e),
        };
        let mut link = Link {
            rd,
            wr,
            rx,
            rx_start,
            out,
            splices,
            sunk: false,
        };
        conn.in_place = match conn.subs.data_path() {
            Some(data) if data.is_direct() => {
                // On this engine's reactor: the ring's eventfd is registered where it is polled.
                conn.ring = data.ring(RING_OPS).and_then(|r| match DeviceRing::new(r, data.gate()) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        tracing::debug!(%e, "device ring not registered: I/O on the worker threads");
                        None
                    }
                });
                InPlace::WhenAlone
            }
            // Without a second handle every command takes the pool lock: that wait is short.
            _ => InPlace::Always,
        };
        let end = match drive(&mut conn, &mut link, &mut stop).await {
            Exit::Ended(end) => end,
            // A queue binds once; `dispatch` refuses a second Connect.
            Exit::MoveToEngine(_) => End::Stopped,
        };
        finish(conn, link, end).await;
    });
    let _ = moved.await;
}

/// Runs the connection until it ends, or until a Connect binds an I/O queue that is not on its
/// engine yet.
async fn drive(conn: &mut Conn, link: &mut Link, stop: &mut watch::Receiver<bool>) -> Exit {
    loop {
        if link.rx_start < link.rx.len() || std::mem::take(&mut link.sunk) {
            let n = conn.queue.handle_input(&link.rx[link.rx_start..]);
            link.rx_start += n;
            if link.rx_start == link.rx.len() {
                link.rx.clear();
                link.rx_start = 0;
            }
        }
        while let Some(event) = conn.queue.poll_event() {
            match event {
                Event::Initialized { .. } => {}
                Event::Command(c) => {
                    conn.alone = conn.nothing_in_flight()
                        && !conn.queue.has_events()
                        && link.rx_start == link.rx.len();
                    conn.dispatch(c).await
                }
                Event::Closed(reason) => conn.end = Some(End::Protocol(reason)),
            }
        }
        // One system call for the batch's device I/O; what the page cache answered at once
        // goes out with this pass's transmit.
        conn.submit_ring();
        if let Err(e) = transmit(conn, link).await {
            return Exit::Ended(End::Socket(e));
        }
        if let Some(end) = conn.end.take() {
            return Exit::Ended(end);
        }
        if let Some(qid) = conn.move_to_engine.take() {
            return Exit::MoveToEngine(qid);
        }
        if link.rx_start < link.rx.len() {
            // Receive budget spent: let other tasks run, then continue with what is buffered.
            tokio::task::yield_now().await;
            continue;
        }
        let deadline = conn.deadline();
        let aen_wanted = !conn.aers.is_empty();
        let ctrl = conn.bound.as_ref().map(|b| b.controller().clone());
        tokio::select! {
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return Exit::Ended(End::Stopped);
                }
            }
            gone = watch_shut(&mut conn.ctrl_watch) => {
                if gone {
                    return Exit::Ended(End::ControllerGone);
                }
            }
            () = conn.replies.ready(), if conn.handed_off > 0 => {
                // Every finished command at once, so that one write carries the whole batch.
                conn.take_replies();
            }
            read = receive(&mut link.rd, &mut link.rx, &mut conn.queue) => match read {
                Ok((0, _)) => return Exit::Ended(End::PeerClosed),
                Ok((_, sunk)) => link.sunk = sunk,
                Err(e) => return Exit::Ended(End::Socket(e)),
            },
            () = ring_ready(conn.ring.as_ref()), if conn.ring.as_ref().is_some_and(|r| r.in_flight() > 0) => {
                conn.reap_ring();
            }
            () = notified(ctrl.as_deref()), if aen_wanted => conn.deliver_events(),
            () = qos_turn(conn.qos.as_ref()), if conn.qos.as_ref().is_some_and(|q| !q.held.is_empty()) => {
                conn.qos_turn_came();
            }
            () = sleep_until(deadline) => {
                conn.queue.handle_timeout(conn.epoch.elapsed());
                if conn.keep_alive_expired() {
                    return Exit::Ended(End::KeepAliveExpired);
                }
                if let Some(why) = conn.auth_expired() {
                    return Exit::Ended(End::Unauthenticated(why));
                }
            }
        }
    }
}

/// The rest of a PDU's data at least this long is received straight into its buffer; a shorter
/// rest comes with what follows it, in one read into the receive buffer.
const SINK_MIN: usize = 8 * 1024;

/// Receives from the socket (one copy from the kernel): the rest of a large PDU's data straight
/// into the buffer the command will own, anything else into the buffer the queue parses from.
/// Returns the bytes read and whether they went to the PDU's buffer.
async fn receive(
    rd: &mut OwnedReadHalf,
    rx: &mut Vec<u8>,
    queue: &mut Queue,
) -> std::io::Result<(usize, bool)> {
    if let Some((data, lacking)) = queue.data_sink() {
        if lacking >= SINK_MIN {
            let n = rd.read_buf(&mut data.limit(lacking)).await?;
            return Ok((n, true));
        }
    }
    rx.reserve(READ_CHUNK);
    Ok((rd.read_buf(rx).await?, false))
}

/// Tears the queue down, logs why it ended and closes the socket.
async fn finish(mut conn: Conn, mut link: Link, end: End) {
    conn.teardown(&end);
    let peer = conn.peer;
    match &end {
        End::PeerClosed | End::Disconnect | End::Stopped => {
            tracing::debug!(?peer, ?end, "NVMe/TCP connection closed")
        }
        _ => tracing::info!(?peer, ?end, "NVMe/TCP connection closed"),
    }
    // Flush what the queue still has (a TermReq) before the socket closes.
    let _ = transmit(&mut conn, &mut link).await;
    let _ = link.wr.shutdown().await;
}

/// Sends what the queue has to send, read data from the buffers it was read into (one vectored
/// write, no copy), then keeps those buffers for the next commands.
async fn transmit(conn: &mut Conn, link: &mut Link) -> std::io::Result<()> {
    if !conn
        .queue
        .poll_transmit_vectored(&mut link.out, &mut link.splices)
    {
        return Ok(());
    }
    let sent = send(&mut link.wr, &link.out, &link.splices, &conn.sending).await;
    link.out.clear();
    link.splices.clear();
    conn.sent();
    sent
}

/// Slices per `writev`: enough for a batch of 32 reads with their headers.
const SLICES: usize = 72;

/// Writes `bytes` with each splice's data put in at its offset.
async fn send(
    wr: &mut OwnedWriteHalf,
    bytes: &[u8],
    splices: &[Splice],
    bufs: &[io::ReadBuf],
) -> std::io::Result<()> {
    let mut slices = SmallVec::<[IoSlice<'_>; SLICES]>::new();
    let mut from = 0;
    for s in splices {
        let data = usize::try_from(s.token)
            .ok()
            .and_then(|t| bufs.get(t))
            .and_then(|b| b.data().get(s.start..s.start + s.len))
            .ok_or_else(|| std::io::Error::other("spliced data out of range"))?;
        if s.at > from {
            slices.push(IoSlice::new(&bytes[from..s.at]));
        }
        slices.push(IoSlice::new(data));
        from = s.at;
        if slices.len() >= SLICES - 2 {
            write_all_vectored(wr, &mut slices).await?;
            slices.clear();
        }
    }
    if from < bytes.len() {
        slices.push(IoSlice::new(&bytes[from..]));
    }
    write_all_vectored(wr, &mut slices).await
}

async fn write_all_vectored(
    wr: &mut OwnedWriteHalf,
    mut slices: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
    while !slices.is_empty() {
        let n = wr.write_vectored(slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

async fn watch_shut(w: &mut Option<watch::Receiver<bool>>) -> bool {
    match w {
        Some(w) => {
            if *w.borrow_and_update() {
                return true;
            }
            w.changed().await.is_err() || *w.borrow()
        }
        None => std::future::pending().await,
    }
}

async fn notified(ctrl: Option<&Controller>) {
    match ctrl {
        Some(c) => c.aen.notified().await,
        None => std::future::pending().await,
    }
}

async fn ring_ready(ring: Option<&DeviceRing<OnRing>>) {
    match ring {
        Some(r) => r.ready().await,
        None => std::future::pending().await,
    }
}

/// Until the volume's limiter hands out the queue's first held command.
async fn qos_turn(qos: Option<&Qos>) {
    match qos {
        Some(q) => q.volume.turn(&q.me).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Runs one I/O command; a Read's data goes to `buf`.
fn execute(
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

/// An I/O command handed to a worker thread.
pub(crate) struct IoJob {
    state: Arc<State>,
    data: Option<Arc<DataPath>>,
    request: io::Request,
    buf: io::ReadBuf,
    begun: Begun,
    replies: Arc<Replies<Done>>,
}

impl Job for IoJob {
    fn run(mut self) {
        let result = execute(
            &self.state,
            self.data.as_deref(),
            &self.request,
            &mut self.buf,
        );
        let done = self.begun.done(result, self.buf, self.request.data);
        self.replies.push(done);
    }
}

/// Runs `f`, the work of one I/O command: a panic fails the command with Internal Error, not
/// the connection (the crate docs say why edgevold unwinds).
fn caught<R>(f: impl FnOnce() -> Result<R, TargetStatus>) -> Result<R, TargetStatus> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(StatusCode::InternalError.into()))
}

impl Conn {
    /// The socket could not move to the queue's engine: the queue ends as if it had failed.
    fn moving_failed(mut self, e: std::io::Error) {
        tracing::warn!(peer = ?self.peer, %e, "NVMe/TCP queue could not move to its engine");
        self.teardown(&End::Socket(e));
    }

    fn queue_state(&self) -> QueueState {
        match &self.bound {
            None => QueueState::Unconnected,
            Some(Bound::Admin(_)) => QueueState::Admin,
            Some(Bound::Io(c, _)) => QueueState::Io {
                namespace: c.volume().map(|_| NamespaceInfo {
                    nsid: NSID,
                    lba_shift: self.lba_shift,
                }),
            },
        }
    }

    fn deadline(&self) -> Option<Instant> {
        let ic = self.queue.poll_timeout().map(|d| self.epoch + d);
        let ka = match &self.bound {
            Some(Bound::Admin(c)) if self.keep_alive_runs() => c.regs().deadline(),
            _ => None,
        };
        let auth = self
            .auth
            .as_ref()
            .and_then(|a| a.poll_timeout())
            .map(|d| self.epoch + d);
        [ic, ka, auth].into_iter().flatten().min()
    }

    /// Runs the authentication timers; `Some(why)` when the queue must close.
    fn auth_expired(&mut self) -> Option<&'static str> {
        let auth = self.auth.as_mut()?;
        let why = auth.on_timer(self.epoch.elapsed())?;
        self.subs.auth.failed(auth.host_nqn(), self.peer, &why);
        Some(why)
    }

    fn keep_alive_expired(&self) -> bool {
        match &self.bound {
            Some(Bound::Admin(c)) if self.keep_alive_runs() => c.regs().expired(Instant::now()),
            _ => false,
        }
    }

    /// Whether this admin queue's keep-alive timer runs: not before the queue's first
    /// authentication completes (which restarts it). Until then the host can send nothing but
    /// Fabrics commands, Keep Alive included, and its side of the DH exchange may take longer
    /// than KATO on a slow CPU (ffdhe8192 in a TCG guest: seconds; Linux's target starts the
    /// timer only when the host enables the controller, which Linux does after authenticating).
    /// The authentication timers bound the wait instead.
    fn keep_alive_runs(&self) -> bool {
        self.auth.as_ref().is_none_or(|a| a.is_authenticated())
    }

    /// Submission queue id of this connection (0 also before Connect: nothing is recorded
    /// then, there is no controller yet).
    fn sqid(&self) -> u16 {
        match &self.bound {
            Some(Bound::Io(_, qid)) => *qid,
            Some(Bound::Admin(_)) | None => 0,
        }
    }

    /// Every completion goes through here: a failure is recorded in the controller's error log
    /// and flagged More (the log has its details), as Linux `nvmet_set_error` does.
    fn complete(&mut self, issued: Issued, status: Status, result: u64, data: &[u8]) {
        self.complete_with(issued, status, result, data, None);
    }

    /// [`Conn::complete`]; with a `splice` token the data is not copied but sent from the
    /// buffer `sending[token]`. Returns whether the completion was queued.
    fn complete_with(
        &mut self,
        issued: Issued,
        mut status: Status,
        result: u64,
        data: &[u8],
        splice: Option<u32>,
    ) -> bool {
        if !status.is_success() {
            if let Some(ctrl) = self.controller() {
                ctrl.errors().record(&issued.origin, status);
                status.more = true;
            }
        }
        let c = Completion {
            status,
            result,
            data,
        };
        let queued = match splice {
            None => self.queue.complete(issued.tag, c),
            Some(token) => self.queue.complete_spliced(issued.tag, c, token),
        };
        if let Err(e) = &queued {
            tracing::debug!(%e, "completion dropped");
        }
        queued.is_ok()
    }

    fn fail(&mut self, issued: Issued, status: TargetStatus) {
        self.complete(issued, status.status(), 0, &[]);
    }

    async fn dispatch(&mut self, c: queue::Command) {
        let issued = Issued {
            tag: c.tag,
            origin: Origin::new(self.sqid(), &c.sqe),
        };
        let read_len = usize::try_from(c.read_len).unwrap_or(0);
        let cmd = match parse::parse(&c.sqe, &c.data, &self.queue_state()) {
            Ok(cmd) => cmd,
            Err(rejected) => return self.complete(issued, rejected.status, rejected.result, &[]),
        };
        if let Command::Connect { cmd, data } = cmd {
            return match fabrics::connect(&self.subs, &mut self.queue, cmd, data, self.peer).await {
                Ok(connected) => {
                    self.auth = connected.auth;
                    if let Some(auth) = &mut self.auth {
                        auth.start(self.epoch.elapsed());
                    }
                    self.bind(connected.bound).await;
                    self.complete(issued, Status::SUCCESS, connected.result, &[]);
                }
                Err(r) => self.complete(issued, r.status, r.result, &[]),
            };
        }
        let Some(ctrl) = self.controller() else {
            return self.fail(issued, StatusCode::CommandSequenceError.into());
        };
        if let Command::Auth(auth_cmd) = cmd {
            return self.authenticate(issued, &ctrl, auth_cmd, &c.data);
        }
        let fabrics_cmd = matches!(
            cmd,
            Command::PropertyGet(_) | Command::PropertySet(_) | Command::Disconnect
        );
        // Linux `nvmet_check_auth_status`, before the controller-ready check: only Fabrics
        // commands run on a queue that has yet to authenticate, and they do not count as
        // keep-alive traffic.
        if self.auth.as_ref().is_some_and(|a| !a.is_authenticated()) {
            if !fabrics_cmd {
                return self.complete(issued, command::authentication_required(), 0, &[]);
            }
        } else {
            ctrl.touch();
        }
        // Linux `nvmet_check_ctrl_status`: admin and I/O commands need an enabled, ready
        // controller.
        if !fabrics_cmd && !ctrl.regs().ready() {
            return self.fail(issued, StatusCode::CommandSequenceError.into());
        }
        match cmd {
            Command::Connect { .. } | Command::Auth(_) => {}
            Command::PropertyGet(get) => match fabrics::property_get(&ctrl, get) {
                Ok(v) => self.complete(issued, Status::SUCCESS, v, &[]),
                Err(s) => self.fail(issued, s),
            },
            Command::PropertySet(set) => match fabrics::property_set(&ctrl, set) {
                Ok(CcEffect::Shutdown) => {
                    // Shutdown notification: make every acknowledged write durable first.
                    let flushed = self.subs.state.on_pool(|_, pool| pool.flush()).await;
                    match flushed {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::error!(
                            cntlid = ctrl.cntlid,
                            error = ?e,
                            "flush at controller shutdown failed"
                        ),
                        Err(e) => tracing::error!(
                            cntlid = ctrl.cntlid,
                            error = %e,
                            "flush at controller shutdown failed"
                        ),
                    }
                    self.complete(issued, Status::SUCCESS, 0, &[]);
                }
                Ok(CcEffect::None) => self.complete(issued, Status::SUCCESS, 0, &[]),
                Err(s) => self.fail(issued, s),
            },
            Command::Disconnect => {
                self.complete(issued, Status::SUCCESS, 0, &[]);
                self.end = Some(End::Disconnect);
            }
            Command::Admin(AdminCommand::AsyncEventRequest) => {
                if self.aers.len() >= MAX_AERS {
                    return self.fail(issued, TargetStatus::AerLimitExceeded);
                }
                self.aers.push(issued);
                self.deliver_events();
            }
            Command::Admin(admin_cmd) => match admin::execute(&self.subs, &ctrl, admin_cmd).await {
                Ok(mut reply) => {
                    reply.data.resize(read_len, 0);
                    self.complete(issued, Status::SUCCESS, reply.result, &reply.data);
                }
                Err(s) => self.fail(issued, s),
            },
            Command::Io(io_cmd) => self.start_io(issued, &ctrl, io_cmd, c.data),
        }
    }

    /// AUTH_Send / AUTH_Receive: one step of the queue's DH-HMAC-CHAP transaction. A failure
    /// on the admin queue fails the controller (every queue's connection closes, Linux
    /// `nvmet_ctrl_fatal_error`); on an I/O queue it closes that queue. Either way the
    /// command completes first, so the host reads its AUTH_Failure1.
    fn authenticate(
        &mut self,
        issued: Issued,
        ctrl: &Arc<Controller>,
        cmd: AuthCommand,
        data: &[u8],
    ) {
        let sqid = self.sqid();
        let Some(auth) = self.auth.as_mut() else {
            // The Connect did not ask this queue to authenticate.
            return self.fail(issued, StatusCode::CommandSequenceError.into());
        };
        let now = self.epoch.elapsed();
        let mut out = Vec::new();
        let stepped = match cmd {
            AuthCommand::Send { .. } => {
                // A new transaction checks the host against the store's pairs as they are now:
                // a live queue re-authenticates with a rotated pair.
                if QueueAuth::is_negotiate(data) && !self.subs.auth.refresh(auth) {
                    self.subs.auth.failed(
                        auth.host_nqn(),
                        self.peer,
                        &"the host's keys were revoked",
                    );
                    if sqid == 0 {
                        self.subs.remove(ctrl);
                    } else {
                        self.end = Some(End::Unauthenticated("keys revoked"));
                    }
                    return self.complete(issued, command::authentication_required(), 0, &[]);
                }
                auth.authenticator.on_auth_send(&cmd, data, now)
            }
            AuthCommand::Receive { .. } => {
                let mut rng = UnwrapErr(SysRng);
                auth.authenticator
                    .on_auth_receive(&cmd, now, &mut rng, &mut out)
            }
        };
        let outcome = match stepped {
            Ok(outcome) => outcome,
            Err(status) => return self.complete(issued, status, 0, &[]),
        };
        match outcome {
            Outcome::Continue => {}
            Outcome::Authenticated(done) => {
                ctrl.touch();
                self.subs.auth.succeeded(auth, &done, self.peer);
            }
            Outcome::ControllerRejected(rejected) => {
                // The queue stays authenticated and the controller stays (see the variant).
                self.subs
                    .auth
                    .controller_rejected(auth.host_nqn(), self.peer, &rejected);
            }
            Outcome::Failed(failed) => {
                self.subs.auth.failed(auth.host_nqn(), self.peer, &failed);
                if sqid == 0 {
                    self.subs.remove(ctrl);
                } else {
                    self.end = Some(End::Unauthenticated("authentication failed"));
                }
            }
        }
        self.complete(issued, Status::SUCCESS, 0, &out);
    }

    /// The bound controller; parse routes only Connect to unconnected queues, so every other
    /// command has one.
    fn controller(&self) -> Option<Arc<Controller>> {
        self.bound.as_ref().map(|b| b.controller().clone())
    }

    async fn bind(&mut self, bound: Bound) {
        let ctrl = bound.controller().clone();
        self.ctrl_watch = Some(ctrl.watch());
        if let Some(volume) = ctrl.volume() {
            self.counters = Some(self.subs.stats.volume(volume));
            let subs = self.subs.clone();
            let io_queue = matches!(bound, Bound::Io(..));
            let looked_up = self
                .subs
                .state
                .on_pool(move |_, pool| {
                    // The limiter is found or made under the pool lock: see `Throttles::volume`.
                    let qos = io_queue.then(|| {
                        subs.throttles.volume(volume, || {
                            let stored = pool.volume(volume).map(|v| v.mutable_parameters());
                            stored.map_or_else(|_| Default::default(), |p| stored_limits(volume, p))
                        })
                    });
                    (admin::lba_shift(pool.device_mut()), qos)
                })
                .await;
            if let Ok((shift, qos)) = looked_up {
                self.lba_shift = shift;
                self.qos = qos.map(|volume| Qos {
                    me: volume.waiter(),
                    volume,
                    held: VecDeque::new(),
                });
            }
        }
        if let Bound::Io(_, qid) = &bound {
            self.move_to_engine = Some(*qid);
        }
        self.bound = Some(bound);
    }

    fn start_io(&mut self, issued: Issued, ctrl: &Controller, cmd: IoCommand, data: Vec<u8>) {
        let Kind::Volume { id, readonly } = ctrl.kind else {
            return self.fail(issued, StatusCode::InvalidOpcode.into());
        };
        let request = io::Request {
            volume: id,
            readonly,
            wce: ctrl.regs().wce,
            lba_shift: self.lba_shift,
            cmd,
            data,
        };
        let started = StdInstant::now();
        if let Some(q) = &mut self.qos {
            // Behind a held command, or over the limits: held, in order.
            if !q.held.is_empty()
                || !q
                    .volume
                    .pass(&q.me, throttle::cost(&request.cmd, request.lba_shift))
            {
                q.held.push_back(Held {
                    issued,
                    request,
                    started,
                });
                return;
            }
        }
        self.run_io(issued, request, started);
    }

    /// The first held command's turn came: it starts, and so does every one behind it that the
    /// limits let through now; the next waits in the limiter.
    fn qos_turn_came(&mut self) {
        while let Some(q) = &mut self.qos {
            let Some(held) = q.held.pop_front() else {
                return;
            };
            let next_passes = q.held.front().is_some_and(|next| {
                let cost = throttle::cost(&next.request.cmd, next.request.lba_shift);
                q.volume.pass(&q.me, cost)
            });
            self.alone = self.nothing_in_flight() && !next_passes;
            if let Some(c) = &self.counters {
                c.qos_delayed(held.started.elapsed());
            }
            self.run_io(held.issued, held.request, held.started);
            if !next_passes {
                return;
            }
        }
    }

    /// Starts an I/O command: in place, on the queue's ring, or on a worker thread.
    fn run_io(&mut self, issued: Issued, request: io::Request, started: StdInstant) {
        let begun = Begun::new(issued, &request, started);
        let quick = match request.cmd {
            IoCommand::Read { .. } => true,
            // Flush, FUA and write-through wait for the drive's cache; those always move.
            IoCommand::Write { fua, .. } => !fua && request.wce,
            _ => false,
        };
        let mut buf = self.spare.pop().unwrap_or_default();
        self.spare_bytes -= buf.capacity();
        let in_place = quick
            && match self.in_place {
                InPlace::Never => false,
                InPlace::WhenAlone => self.alone,
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
            let data = self.subs.data_path();
            let result = execute(&self.subs.state, data.as_deref(), &request, &mut buf);
            return self.finish_io(begun.done(result, buf, request.data));
        }
        // To a worker: one hand-off per command, so the queue keeps receiving while the drive
        // works. Mapping under the pool lock, device I/O outside it where core allows (io.rs).
        self.handed_off += 1;
        self.subs.workers.run(IoJob {
            state: self.subs.state.clone(),
            data: self.subs.data_path(),
            request,
            buf,
            begun,
            replies: self.replies.clone(),
        });
    }

    fn take_replies(&mut self) {
        let mut finished = std::mem::take(&mut self.finished);
        self.replies.take(&mut finished);
        self.handed_off -= finished.len();
        for done in finished.drain(..) {
            self.finish_io(done);
        }
        self.finished = finished;
    }

    fn nothing_in_flight(&self) -> bool {
        self.handed_off == 0 && self.ring.as_ref().is_none_or(|r| r.in_flight() == 0)
    }

    /// Maps a Read under the pool lock and starts its device reads on the ring.
    fn read_on_ring(&mut self, begun: Begun, request: io::Request, mut buf: io::ReadBuf) {
        let mapped = caught(|| io::map_read(&self.subs.state, &request, &mut buf));
        let read = match mapped {
            Ok(read) => read,
            // A Read carries no host data.
            Err(s) => return self.finish_io(begun.done(Err(s), buf, Vec::new())),
        };
        let ring = self.ring.as_mut().expect("checked by run_io");
        if read.parts.is_empty() || !ring.has_room(read.parts.len()) {
            // Only holes, or more parts than the ring takes now: read here.
            let result = match self.subs.data_path() {
                Some(data) => caught(|| io::read_parts(&data, &read.parts, &mut buf)),
                None => Err(StatusCode::InternalError.into()),
            };
            drop(read);
            return self.finish_io(begun.done(result, buf, Vec::new()));
        }
        let parts = read.parts.clone();
        let (abuf, len) = buf.into_parts();
        let record = OnRing {
            begun,
            op: RingOp::Read(read),
            len,
        };
        let started = ring.read(abuf, &parts, record);
        self.on_ring(started);
    }

    /// Maps a cached Write under the pool lock (writing what it allocates there) and starts
    /// the rest on the ring, from a copy in an aligned buffer; the host's buffer goes back to
    /// the decoder at once.
    fn write_on_ring(&mut self, begun: Begun, request: io::Request, mut buf: io::ReadBuf) {
        let Some(data) = self.subs.data_path() else {
            return self.fail(begun.issued, StatusCode::InternalError.into());
        };
        let mapped = caught(|| io::map_write(&self.subs.state, &data, &request));
        let write = match mapped {
            Ok(write) => write,
            Err(s) => return self.finish_io(begun.done(Err(s), buf, request.data)),
        };
        let ring = self.ring.as_mut().expect("checked by run_io");
        if write.parts.is_empty() || !ring.has_room(write.parts.len()) {
            // All written under the lock, or more parts than the ring takes now: here.
            let result = caught(|| io::land_write(&data, write, &request.data, &mut buf));
            return self.finish_io(begun.done(result, buf, request.data));
        }
        buf.copy_from(&request.data);
        self.queue.recycle(request.data);
        let parts = write.parts.clone();
        let (abuf, _) = buf.into_parts();
        let record = OnRing {
            begun,
            op: RingOp::Write(write),
            len: 0,
        };
        let started = ring.write(abuf, &parts, record);
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

    /// Submits the ring's queued operations and completes those already done.
    fn submit_ring(&mut self) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let mut reaped = std::mem::take(&mut self.reaped);
        if let Err(e) = ring.submit(&mut reaped) {
            // Nothing was submitted; the operations stay queued for the next pass.
            tracing::warn!(%e, "io_uring submit failed");
        }
        self.complete_reaped(reaped);
    }

    fn reap_ring(&mut self) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let mut reaped = std::mem::take(&mut self.reaped);
        ring.reap(&mut reaped);
        self.complete_reaped(reaped);
    }

    /// Completes the ring's finished operations (outside the ring's lock: completing takes the
    /// pool lock), and keeps the list's memory.
    fn complete_reaped(&mut self, mut reaped: Vec<Reaped<OnRing>>) {
        for r in reaped.drain(..) {
            self.ring_done(r, None);
        }
        self.reaped = reaped;
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
        let buf = io::ReadBuf::from_parts(abuf, record.len);
        self.finish_io(record.begun.done(result, buf, Vec::new()));
    }

    fn finish_io(&mut self, done: Done) {
        let Begun {
            issued,
            kind,
            bytes,
            started,
        } = done.begun;
        if let Some(c) = &self.counters {
            c.record(kind, bytes, done.result.is_ok(), started.elapsed());
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
                let token = u32::try_from(self.sending.len()).unwrap_or(u32::MAX);
                let data = done.buf.data();
                if self.complete_with(issued, Status::SUCCESS, 0, data, Some(token)) {
                    return self.sending.push(done.buf);
                }
            }
            Ok(()) => self.complete(issued, Status::SUCCESS, 0, done.buf.data()),
            Err(s) => self.fail(issued, s),
        }
        self.keep_spare(done.buf);
    }

    /// Keeps `buf` for a later command, within the spare bounds.
    fn keep_spare(&mut self, mut buf: io::ReadBuf) {
        let size = buf.capacity();
        if size <= SPARE_MAX && self.spare_bytes + size <= SPARE_BYTES {
            buf.clear();
            self.spare_bytes += size;
            self.spare.push(buf);
        }
    }

    /// The transmit that sent from `sending` was written: its buffers are spares again.
    fn sent(&mut self) {
        let mut sending = std::mem::take(&mut self.sending);
        for buf in sending.drain(..) {
            self.keep_spare(buf);
        }
        self.sending = sending;
    }

    /// Completes parked Async Event Requests with queued events.
    fn deliver_events(&mut self) {
        let Some(Bound::Admin(ctrl)) = &self.bound else {
            return;
        };
        let ctrl = ctrl.clone();
        while !self.aers.is_empty() {
            let Some(event) = ctrl.regs().events.pop_front() else {
                break;
            };
            let issued = self.aers.remove(0);
            self.complete(issued, Status::SUCCESS, u64::from(event), &[]);
        }
    }

    fn teardown(&mut self, end: &End) {
        match &self.bound {
            // The admin queue going away (or keep-alive expiry) ends the controller and so
            // every I/O queue of it (Linux `nvmet_sq_destroy` on qid 0).
            Some(Bound::Admin(ctrl)) => {
                if matches!(end, End::KeepAliveExpired) {
                    tracing::warn!(
                        cntlid = ctrl.cntlid,
                        "keep-alive expired: controller torn down"
                    );
                }
                self.subs.remove(ctrl);
            }
            Some(Bound::Io(ctrl, qid)) => {
                ctrl.regs().connected.remove(qid);
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use edgevol_core::{ReadSegment, VolumeSpec};
    use edgevol_nvmeof::pdu::Digests;

    use crate::config::NvmeConfig;
    use crate::state::State;

    use crate::nvme::test_host::{io as host_io, ok, status, Admin};

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0badc0de-2222-3333-4444-555555555555";
    const LBA: u64 = 77;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_in_one_io_command_fails_only_that_command() {
        let dir = tempfile::tempdir().unwrap();
        let mut pool = crate::pool::open(&[dir.path().join("pool.img")], true).unwrap();
        let id = pool
            .create_volume(VolumeSpec::new("panics", 1 << 20))
            .unwrap();
        pool.publish(id, HOST, false).unwrap();
        let state = Arc::new(State::new("box".into(), Default::default()));
        state.set_pool(pool);
        let target = super::super::start(
            state.clone(),
            &NvmeConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                advertise: "127.0.0.1".parse().unwrap(),
                io_threads: 0,
            },
            super::super::auth::HostAuth::new(
                Arc::new(crate::hostkeys::HostKeys::open(dir.path()).unwrap()),
                crate::config::HostAuthPolicy {
                    allow_unauthenticated_hosts: true,
                    ..Default::default()
                },
            ),
        )
        .await
        .unwrap();
        let (addr, nqn) = (target.endpoint, crate::naming::subsystem_nqn("box", id));
        let admin = Admin::connect(addr, &nqn, HOST, 0).await.unwrap();
        let mut q = admin
            .io_queue(addr, 1, &nqn, HOST, Digests::NONE)
            .await
            .unwrap();
        let data = vec![0x5au8; 4096];
        let (sqe, d) = host_io::write(LBA, &data, false);
        ok(&q.cmd(sqe, d).await);

        // The device read of LBA's data panics (the test build's data path handle, see
        // `nvme::test_device`): outside the pool lock, with its cluster pinned.
        let offset = {
            let pool = state.lock_pool().unwrap();
            match pool.map_read(id, LBA << 12, 4096).unwrap().next().unwrap() {
                ReadSegment::Data { device_offset, .. } => device_offset,
                ReadSegment::Zero { .. } => panic!("LBA {LBA} was written"),
            }
        };
        let device = target
            .subsystems
            .data_path()
            .expect("a second handle on a file pool");
        device.handle().panic_on_read_of(Some(offset));
        let (sqe, d) = host_io::read(LBA, 1);
        assert_eq!(
            status(&q.cmd(sqe, d).await),
            (0, 0x06, false),
            "the panicking command fails with Internal Error"
        );
        // The same connection keeps serving, reads and writes, and so does a second queue.
        let (sqe, d) = host_io::write(LBA + 1, &data, false);
        ok(&q.cmd(sqe, d).await);
        let (sqe, d) = host_io::read(LBA + 1, 1);
        let read = q.cmd(sqe, d).await;
        ok(&read);
        assert_eq!(read.data, data);
        let mut q2 = admin
            .io_queue(addr, 2, &nqn, HOST, Digests::NONE)
            .await
            .unwrap();
        device.handle().panic_on_read_of(None);
        let (sqe, d) = host_io::read(LBA, 1);
        let read = q2.cmd(sqe, d).await;
        ok(&read);
        assert_eq!(read.data, data, "the failed read changed nothing");
        // The panic happened outside the pool lock: the pool is not poisoned.
        assert!(state.lock_pool().is_ok());
        drop((q, q2, admin));
        target.stop().await;
    }
}
