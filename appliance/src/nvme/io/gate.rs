//! The snapshot gate: detached writes counted in while the pool lock is held, so that a
//! snapshot (which holds the lock) waits until they have landed.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use edgevol_core::Quiesce;

/// Detached writes whose device I/O has not ended: the pool's [`Quiesce`] hook.
#[derive(Debug, Default)]
pub struct Gate {
    count: Mutex<Count>,
    idle: Condvar,
    /// Queues' io_uring rings, which may hold detached writes that only the gate can reap
    /// while their queue waits for the pool lock (`device_ring` module docs).
    rings: Mutex<Vec<Weak<dyn Landing>>>,
}

#[derive(Debug, Default)]
struct Count {
    /// Detached writes whose I/O has not ended.
    running: u64,
    /// Snapshots waiting for `running` to drop to zero: only then does the last write leave
    /// with a wake-up (a system call on every write otherwise).
    waiting: u32,
}

/// Something holding detached writes that the gate can see to the end of by itself.
pub trait Landing: Send + Sync {
    /// Returns once every operation in flight has ended and left the gate; takes no pool lock.
    fn land(&self);
}

/// How long the gate waits for a count to drop before landing the rings' writes again: a write
/// may be mapped (in the gate) just before its queue puts it on its ring.
const LAND_AGAIN: Duration = Duration::from_millis(1);

impl Gate {
    fn count(&self) -> MutexGuard<'_, Count> {
        self.count.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a detached write in; call with the pool lock held, before releasing it.
    pub(crate) fn enter(self: &Arc<Self>) -> GateGuard {
        self.count().running += 1;
        GateGuard(self.clone())
    }

    /// Detached writes running now.
    pub fn running(&self) -> u64 {
        self.count().running
    }

    /// Lets the gate land `ring`'s writes itself (until the ring is gone).
    pub(crate) fn register(&self, ring: Weak<dyn Landing>) {
        let mut rings = self.rings.lock().unwrap_or_else(|p| p.into_inner());
        rings.retain(|r| r.strong_count() > 0);
        rings.push(ring);
    }

    fn land_rings(&self) {
        let rings: Vec<Arc<dyn Landing>> = self
            .rings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        rings.iter().for_each(|r| r.land());
    }
}

impl Quiesce for Gate {
    fn wait_writes_landed(&self) {
        while self.running() > 0 {
            self.land_rings();
            let mut n = self.count();
            if n.running > 0 {
                n.waiting += 1;
                let (mut n, _) = self
                    .idle
                    .wait_timeout(n, LAND_AGAIN)
                    .unwrap_or_else(|p| p.into_inner());
                n.waiting -= 1;
            }
        }
    }
}

/// A detached write in the gate; leaves it when dropped (the write's I/O has ended).
#[derive(Debug)]
pub(crate) struct GateGuard(Arc<Gate>);

impl Drop for GateGuard {
    fn drop(&mut self) {
        let mut n = self.0.count();
        n.running -= 1;
        if n.running == 0 && n.waiting > 0 {
            self.0.idle.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot waits while writes run and is counted as waiting (so the last write wakes
    /// it); once they have landed it returns and is no longer counted.
    #[test]
    fn a_snapshot_waits_for_the_last_write_and_is_counted_only_while_it_waits() {
        let gate = Arc::new(Gate::default());
        let writes = [gate.enter(), gate.enter()];
        let waiter = {
            let gate = gate.clone();
            std::thread::spawn(move || gate.wait_writes_landed())
        };
        while gate.count().waiting == 0 {
            std::thread::yield_now();
        }
        assert!(!waiter.is_finished());
        drop(writes);
        waiter.join().unwrap();
        let count = gate.count();
        assert_eq!((count.running, count.waiting), (0, 0));
    }
}
