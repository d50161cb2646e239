//! I/O commands held back by their volume's QoS limits ([`crate::nvme::throttle`]): they wait
//! in the queue's own list, in arrival order, and start when the volume's limiter hands them
//! out, while the queue goes on receiving, completing and keeping its timers.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant as StdInstant;

use super::{Conn, Issued};
use crate::nvme::io;
use crate::nvme::throttle::{self, VolumeQos, Waiter};
use crate::qos::Cost;

/// An I/O queue's share of its volume's QoS: its place in the limiter and the commands held
/// back, in arrival order (the first waits in the limiter, the others behind it).
pub(super) struct Qos {
    volume: Arc<VolumeQos>,
    me: Arc<Waiter>,
    held: VecDeque<Held>,
}

/// An I/O command held back by QoS.
pub(super) struct Held {
    pub(super) issued: Issued,
    pub(super) request: io::Request,
    pub(super) started: StdInstant,
}

impl Drop for Qos {
    fn drop(&mut self) {
        if !self.held.is_empty() {
            self.volume.cancel(&self.me);
        }
    }
}

impl Qos {
    pub(super) fn new(volume: Arc<VolumeQos>) -> Self {
        Qos {
            me: volume.waiter(),
            volume,
            held: VecDeque::new(),
        }
    }

    /// Commands are held.
    pub(super) fn holds(&self) -> bool {
        !self.held.is_empty()
    }

    /// Whether `request` may start now: nothing is held before it and it is within the limits
    /// (which it then uses up).
    pub(super) fn passes(&self, request: &io::Request) -> bool {
        self.held.is_empty() && self.volume.pass(&self.me, cost(request))
    }

    /// Holds `cmd` back, behind those held before it.
    pub(super) fn hold(&mut self, cmd: Held) {
        self.held.push_back(cmd);
    }

    /// Until the volume's limiter hands out the queue's first held command.
    pub(super) async fn turn(&self) {
        self.volume.turn(&self.me).await;
    }
}

/// What `request` takes from the volume's limits.
fn cost(request: &io::Request) -> Cost {
    throttle::cost(&request.cmd, request.lba_shift)
}

impl Conn {
    /// The first held command's turn came: it starts, and so does every one behind it that the
    /// limits let through now; the next waits in the limiter.
    pub(super) fn qos_turn_came(&mut self) {
        while let Some(q) = &mut self.qos {
            let Some(held) = q.held.pop_front() else {
                return;
            };
            let next_passes = q
                .held
                .front()
                .is_some_and(|next| q.volume.pass(&q.me, cost(&next.request)));
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
}
