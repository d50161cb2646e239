//! One TCP connection = one NVMe queue: a task driving an [`edgevol_nvmeof::queue::Queue`]
//! the way quinn's `ConnectionDriver` drives quinn-proto: feed socket bytes, drain events
//! (parse → execute → complete), transmit, and wait on the socket, finished I/O, controller
//! teardown, async events and the next timer. Work per pass is bounded by the queue's receive
//! budget.
//!
//! A connection starts on the daemon's runtime; once its Connect binds an I/O queue it moves to
//! that queue's engine thread ([`super::engine`]) for the rest of its life. There, Reads and
//! cached Writes run in place, run-to-completion, when that is cheaper than a hand-off: always
//! on the page cache or memory (a pool file on tmpfs), and on a drive (`O_DIRECT`) when a Read
//! is alone (nothing in flight or received behind it, so there is no depth to give the drive).
//! Everything else (queued Reads and every cached Write on a drive, Flush, FUA, Write Zeroes,
//! Deallocate) runs concurrently, up to the queue's slots: Reads and cached Writes on the
//! queue's own io_uring
//! ([`super::device_ring`]), the rest on the target's worker threads ([`super::workers`]), so
//! the engine never waits for a flush. Data buffers are kept per queue and reused.
//!
//! A volume with QoS limits ([`super::throttle`]) holds back I/O commands over its limits: they
//! wait in the queue's own list, in arrival order, and start when the volume's limiter hands
//! them out, while the queue goes on receiving, completing and keeping its timers.
//!
//! Files, as Linux nvmet splits `tcp.c`, `core.c` and `io-cmd-bdev.c`:
//! - this one: a connection's state (`Conn`) and life: start, the move to its engine, end;
//! - `driver`: the loop and its timers (`woken`: its rare events, polled only once they fire);
//!   `link`: the socket's bytes (`tcp.c`);
//! - `dispatch`: parse, route and complete every command, Connect's binding, async events
//!   (`core.c`); `auth_gate`: the queue's DH-HMAC-CHAP steps and timers;
//! - `io_command`: an I/O command's start, the choice of its path, its completion; the paths
//!   (`io-cmd-bdev.c` is [`super::io`]): `in_place`, `ring_io` (the queue's io_uring) and
//!   `handoff` (the worker threads); `qos_hold`: commands held back by the volume's limits;
//!   `buffers`: data buffers reused across commands.

mod auth_gate;
mod buffers;
mod dispatch;
mod driver;
mod handoff;
mod in_place;
mod io_command;
mod link;
mod qos_hold;
mod ring_io;
#[cfg(test)]
mod tests;
mod woken;

pub(crate) use handoff::IoJob;

use std::net::SocketAddr;
use std::sync::Arc;

use edgevol_nvmeof::queue::{self, CommandTag, Queue};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use self::buffers::Buffers;
use self::driver::{drive, Exit};
use self::handoff::Handoff;
use self::io_command::InPlace;
use self::link::{transmit, Link};
use self::qos_hold::Qos;
use self::ring_io::RingIo;
use super::auth::QueueAuth;
use super::busy_poll;
use super::errors::Origin;
use super::fabrics::Bound;
use super::queue_config;
use super::stats::VolumeCounters;
use super::subsys::Subsystems;

/// A command handed out by the queue: its tag, and what the error log records if it fails.
#[derive(Clone, Copy)]
struct Issued {
    tag: CommandTag,
    origin: Origin,
}

/// An I/O queue's view of its controller for one pass ([`Conn::io_view`]).
#[derive(Clone, Copy)]
struct IoView {
    ready: bool,
    /// Volatile write cache enabled.
    wce: bool,
    /// When the pass's first I/O command came: the start of its commands' latency.
    at: std::time::Instant,
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

/// One connection's queue and what its commands share.
struct Conn {
    subs: Arc<Subsystems>,
    peer: Option<SocketAddr>,
    queue: Queue,
    epoch: Instant,
    /// Present when the queue must authenticate (DH-HMAC-CHAP) before other commands run.
    auth: Option<Box<QueueAuth>>,
    /// What Connect bound; with it the namespace's block size, counters and QoS.
    bound: Option<Bound>,
    lba_shift: u8,
    counters: Option<Arc<VolumeCounters>>,
    /// The volume's QoS (I/O queues of a volume).
    qos: Option<Qos>,
    /// Parked Async Event Requests.
    aers: Vec<Issued>,
    ctrl_watch: Option<watch::Receiver<bool>>,
    end: Option<End>,
    /// Set by a Connect that bound an I/O queue: move to that queue's engine.
    move_to_engine: Option<u16>,
    /// Which Reads and cached Writes run in place.
    in_place: InPlace,
    /// The command being dispatched is the only one: nothing in flight, nothing else received.
    alone: bool,
    /// This pass's view of the controller, once an I/O command read it.
    view: Option<IoView>,
    /// When a batch of commands that finished elsewhere (the ring, the workers) is being
    /// completed: one clock read for their latencies, not one each.
    batch_done_at: Option<std::time::Instant>,
    /// Device I/O of Reads and cached Writes on an `O_DIRECT` device that do not run in place.
    ring: Option<RingIo>,
    /// Commands on the worker threads.
    handoff: Handoff,
    buffers: Buffers,
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
        epoch,
        auth: None,
        bound: None,
        lba_shift: 12,
        counters: None,
        qos: None,
        aers: Vec::new(),
        ctrl_watch: None,
        end: None,
        move_to_engine: None,
        in_place: InPlace::Never,
        alone: false,
        view: None,
        batch_done_at: None,
        ring: None,
        handoff: Handoff::default(),
        buffers: Buffers::default(),
    };
    let mut link = Link::new(stream);
    let qid = match drive(&mut conn, &mut link, &mut stop).await {
        Exit::Ended(end) => return finish(conn, link, end).await,
        Exit::MoveToEngine(qid) => qid,
    };
    let moving = match link.unregister() {
        Ok(moving) => moving,
        Err(e) => return conn.moving_failed(e),
    };
    let engines = conn.subs.engines.clone();
    let moved = engines.spawn(qid, async move {
        let mut link = match moving.register() {
            Ok(link) => link,
            Err(e) => return conn.moving_failed(e),
        };
        conn.in_place = match conn.subs.data_path() {
            Some(data) if data.device_waits() => {
                // On this engine's reactor: the ring's eventfd is registered where it is polled.
                conn.ring = RingIo::open(&data);
                InPlace::WhenAlone
            }
            // Memory, or no second handle (every command takes the pool lock: that wait is
            // short): a copy in place costs less than any hand-off.
            _ => InPlace::Always,
        };
        let _polled = busy_poll::watch(link.socket(), conn.ring.as_ref().map(RingIo::pending))
            .inspect_err(|e| tracing::debug!(%e, "queue not busy-polled"))
            .ok();
        let end = match drive(&mut conn, &mut link, &mut stop).await {
            Exit::Ended(end) => end,
            // A queue binds once; `dispatch` refuses a second Connect.
            Exit::MoveToEngine(_) => End::Stopped,
        };
        finish(conn, link, end).await;
    });
    let _ = moved.await;
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
    link.shutdown().await;
}

impl Conn {
    /// The socket could not move to the queue's engine: the queue ends as if it had failed.
    fn moving_failed(mut self, e: std::io::Error) {
        tracing::warn!(peer = ?self.peer, %e, "NVMe/TCP queue could not move to its engine");
        self.teardown(&End::Socket(e));
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
