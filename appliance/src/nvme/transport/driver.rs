//! The connection's loop, as quinn's `ConnectionDriver` drives quinn-proto: feed the queue the
//! socket's bytes, dispatch its events, transmit, then wait for whatever comes first: the
//! socket, finished I/O, controller teardown, async events, a QoS turn or the next timer.

use std::future::Future;

use edgevol_nvmeof::queue::Event;
use tokio::sync::watch;
use tokio::time::Instant;

use super::link::{transmit, Link};
use super::qos_hold::Qos;
use super::ring_io::RingIo;
use super::woken::Woken;
use super::{Conn, End};
use crate::nvme::fabrics::Bound;

/// How [`drive`] returned.
pub(super) enum Exit {
    Ended(End),
    /// An I/O queue was bound: continue on its engine.
    MoveToEngine(u16),
}

/// Runs the connection until it ends, or until a Connect binds an I/O queue that is not on its
/// engine yet.
pub(super) async fn drive(
    conn: &mut Conn,
    link: &mut Link,
    stop: &mut watch::Receiver<bool>,
) -> Exit {
    // The target's stop and the controller's teardown, waited for across passes and looked at
    // only when they woke the task: waiting anew in every pass registered and dropped two
    // waiters, and polling them took their locks, a tenth of a command's user time.
    let mut shut = shut(stop, conn.ctrl_watch.as_ref());
    let mut watching_ctrl = conn.ctrl_watch.is_some();
    loop {
        if !watching_ctrl && conn.ctrl_watch.is_some() {
            // Connect bound a controller in the last pass: watch it from now on.
            shut = self::shut(stop, conn.ctrl_watch.as_ref());
            watching_ctrl = true;
        }
        conn.view = None;
        link.feed(&mut conn.queue);
        while let Some(event) = conn.queue.poll_event() {
            match event {
                Event::Initialized { .. } => {}
                Event::Command(c) => {
                    conn.alone = conn.nothing_in_flight() && received_all(conn, link);
                    conn.dispatch(c).await
                }
                Event::Closed(reason) => conn.end = Some(End::Protocol(reason)),
            }
        }
        // One system call for the batch's device I/O; what the page cache answered at once
        // goes out with this pass's transmit.
        conn.submit_ring(received_all(conn, link));
        if let Err(e) = transmit(conn, link).await {
            return Exit::Ended(End::Socket(e));
        }
        if let Some(end) = conn.end.take() {
            return Exit::Ended(end);
        }
        if let Some(qid) = conn.move_to_engine.take() {
            return Exit::MoveToEngine(qid);
        }
        if link.has_buffered() {
            // Receive budget spent: let other tasks run, then continue with what is buffered.
            tokio::task::yield_now().await;
            continue;
        }
        let deadline = conn.deadline();
        let aen_wanted = !conn.aers.is_empty();
        let ctrl = conn.bound.as_ref().map(|b| b.controller().clone());
        tokio::select! {
            end = &mut shut => return Exit::Ended(end),
            () = conn.handoff.ready(), if conn.handoff.pending() => {
                // Every finished command at once, so that one write carries the whole batch.
                conn.take_replies();
            }
            read = link.receive(&mut conn.queue) => match read {
                Ok(0) => return Exit::Ended(End::PeerClosed),
                Ok(_) => {}
                Err(e) => return Exit::Ended(End::Socket(e)),
            },
            () = or_never(conn.ring.as_ref().map(RingIo::ready)), if conn.ring.as_ref().is_some_and(|r| r.in_flight() > 0) => {
                conn.reap_ring();
            }
            () = or_never(ctrl.as_deref().map(|c| c.aen.notified())), if aen_wanted => conn.deliver_events(),
            () = or_never(conn.qos.as_ref().map(Qos::turn)), if conn.qos.as_ref().is_some_and(Qos::holds) => {
                conn.qos_turn_came();
            }
            () = or_never(deadline.map(tokio::time::sleep_until)) => {
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

/// The queue has acted on everything received: no event waits and no bytes are buffered.
fn received_all(conn: &Conn, link: &Link) -> bool {
    !conn.queue.has_events() && !link.has_buffered()
}

/// Until the target stops or the controller (if any yet) is torn down.
fn shut(
    stop: &watch::Receiver<bool>,
    ctrl: Option<&watch::Receiver<bool>>,
) -> Woken<impl Future<Output = End> + Send> {
    let mut stop = stop.clone();
    let mut ctrl = ctrl.cloned();
    Woken::new(async move {
        loop {
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return End::Stopped;
                    }
                }
                gone = watch_shut(&mut ctrl) => {
                    if gone {
                        return End::ControllerGone;
                    }
                }
            }
        }
    })
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

/// `f`'s output, or never when there is no `f` (a `select!` arm with nothing to wait for).
async fn or_never<F: Future>(f: Option<F>) -> F::Output {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

impl Conn {
    /// The next timer: the queue's, keep-alive's or authentication's.
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

    fn keep_alive_expired(&self) -> bool {
        match &self.bound {
            Some(Bound::Admin(c)) if self.keep_alive_runs() => c.regs().expired(Instant::now()),
            _ => false,
        }
    }
}
