//! Per-volume QoS in the target: the sans-I/O [`Limiter`] of [`crate::qos`] shared by every
//! queue of a volume, whatever engine thread it runs on, with the clock and the wake-ups.
//!
//! A queue asks [`VolumeQos::pass`] before it starts an I/O command. A volume without limits
//! answers from one atomic load, so the fast path pays nothing else. A command that must wait
//! stays in its queue's own list, in order, holding no device slot and no lock; the queue
//! waits in [`VolumeQos::turn`] next to its socket and timers. Whoever polls the limiter hands
//! out every command whose turn has come and wakes its queue, so one timer per waiting queue
//! is enough and none polls for another.
//!
//! The limits come from the volume's durable mutable parameters when its first queue binds
//! ([`Throttles::volume`]) and from ControllerModifyVolume afterwards ([`Throttles::set`]),
//! reaching connected queues at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use edgevol_core::VolumeId;
use edgevol_nvmeof::io_cmd::IoCommand;
use tokio::sync::Notify;

use crate::qos::limits::parse_value;
use crate::qos::{Cost, Direction, Limiter, Limits};

/// One queue as the limiter knows it.
#[derive(Debug)]
pub struct Waiter {
    id: u64,
    /// Set (and `wake` notified) when the queue's waiting command was handed out.
    admitted: AtomicBool,
    wake: Notify,
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

type Shared = Arc<Waiter>;

/// One volume's limiter, shared by its queues.
#[derive(Debug)]
pub struct VolumeQos {
    /// Any limit set: without one, [`VolumeQos::pass`] takes no lock.
    limited: AtomicBool,
    epoch: Instant,
    limiter: Mutex<Limiter<Shared>>,
    next_waiter: AtomicU64,
}

impl VolumeQos {
    fn new(limits: Limits) -> Self {
        VolumeQos {
            limited: AtomicBool::new(!limits.is_unlimited()),
            epoch: Instant::now(),
            limiter: Mutex::new(Limiter::new(limits, 0)),
            next_waiter: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, Limiter<Shared>> {
        self.limiter.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new queue of this volume.
    pub fn waiter(&self) -> Shared {
        Arc::new(Waiter {
            id: self.next_waiter.fetch_add(1, Ordering::Relaxed),
            admitted: AtomicBool::new(false),
            wake: Notify::new(),
        })
    }

    /// Whether `who`'s command costing `cost` may start now. If not, it waits in the limiter
    /// until [`VolumeQos::turn`] returns; the queue must send no other command there before.
    pub fn pass(&self, who: &Shared, cost: Cost) -> bool {
        if !self.limited.load(Ordering::Relaxed) {
            return true;
        }
        let now = self.now();
        self.lock().admit(who.clone(), cost, now, hand_out)
    }

    /// Waits until `who`'s waiting command is handed out.
    pub async fn turn(&self, who: &Shared) {
        loop {
            let next = {
                let mut limiter = self.lock();
                limiter.poll(self.now(), hand_out);
                limiter.next_ready()
            };
            if who.admitted.swap(false, Ordering::AcqRel) {
                return;
            }
            let Some(at) = next else {
                // Not waiting (cancelled): nothing will hand it out.
                return std::future::pending().await;
            };
            let deadline = self.epoch + std::time::Duration::from_nanos(at);
            tokio::select! {
                () = who.wake.notified() => {}
                () = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }

    /// Forgets `who`'s waiting command, if any (its queue is going away).
    pub fn cancel(&self, who: &Shared) {
        self.lock().cancel(who);
        who.admitted.store(false, Ordering::Release);
    }

    fn set(&self, limits: Limits) {
        let mut limiter = self.lock();
        let now = self.now();
        limiter.set_limits(limits, now);
        self.limited
            .store(!limits.is_unlimited(), Ordering::Relaxed);
        limiter.poll(now, hand_out);
        // The others wait for a time computed under the old limits: they look again.
        for w in limiter.waiting() {
            w.wake.notify_one();
        }
    }
}

fn hand_out(w: Shared) {
    w.admitted.store(true, Ordering::Release);
    w.wake.notify_one();
}

/// The limiters of the volumes with live queues.
#[derive(Debug, Default)]
pub struct Throttles {
    volumes: Mutex<HashMap<VolumeId, Weak<VolumeQos>>>,
}

impl Throttles {
    fn map(&self) -> MutexGuard<'_, HashMap<VolumeId, Weak<VolumeQos>>> {
        self.volumes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `volume`'s limiter, made with `stored()` (the volume's durable limits) if it has no
    /// live queue. Call it under the pool lock that `stored` reads under: a
    /// ControllerModifyVolume committed before then is in `stored()`, one after finds the
    /// limiter in [`Throttles::set`].
    pub fn volume(&self, volume: VolumeId, stored: impl FnOnce() -> Limits) -> Arc<VolumeQos> {
        let mut map = self.map();
        if let Some(live) = map.get(&volume).and_then(Weak::upgrade) {
            return live;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let qos = Arc::new(VolumeQos::new(stored()));
        map.insert(volume, Arc::downgrade(&qos));
        qos
    }

    /// `volume`'s limits changed (ControllerModifyVolume): its live queues enforce `limits`
    /// from now on. Without a live queue there is nothing to do: the next one reads them.
    pub fn set(&self, volume: VolumeId, limits: Limits) {
        let live = self.map().get(&volume).and_then(Weak::upgrade);
        if let Some(qos) = live {
            qos.set(limits);
        }
    }
}

/// What an I/O command costs against its volume's limits.
pub fn cost(cmd: &IoCommand, lba_shift: u8) -> Cost {
    match *cmd {
        IoCommand::Read { blocks, .. } => Cost {
            direction: Direction::Read,
            bytes: u64::from(blocks) << lba_shift,
        },
        IoCommand::Write { blocks, .. } => Cost {
            direction: Direction::Write,
            bytes: u64::from(blocks) << lba_shift,
        },
        // No data crosses the wire: a command, in the write direction.
        IoCommand::WriteZeroes { .. }
        | IoCommand::Flush { .. }
        | IoCommand::DatasetManagement { .. } => Cost {
            direction: Direction::Write,
            bytes: 0,
        },
    }
}

/// The limits a volume's stored mutable parameters set. Core keeps only what the CSI
/// controller validated, so a pair that is not a limit is skipped with a warning.
pub fn stored_limits(volume: VolumeId, parameters: &[(String, String)]) -> Limits {
    let mut kept = Vec::with_capacity(parameters.len());
    for (k, v) in parameters {
        match parse_value(k, v) {
            Ok(_) => kept.push((k.as_str(), v.as_str())),
            Err(e) => tracing::warn!(volume = volume.0, %e, "stored mutable parameter ignored"),
        }
    }
    Limits::from_parameters(kept).unwrap_or_default()
}
