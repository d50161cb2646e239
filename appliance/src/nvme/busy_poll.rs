//! Busy polling before an engine thread sleeps, as Linux's `net.core.busy_read` does for a
//! socket: a thread that sleeps and is woken again costs tens of µs on small or virtual cores
//! (the scheduler, an inter-processor interrupt, the timer), and a host at low queue depth
//! waits for that on every command. So when the engine was woken soon after it last slept,
//! it first watches its queues' sockets and rings for up to `nvme.busy_poll_us` before it
//! sleeps in its reactor; the reactor then finds what came without sleeping at all.
//!
//! Only a thread whose last sleep was shorter than the budget polls: an idle queue, or a host
//! slower than that, leaves the engine asleep and costs nothing. A poll that finds nothing
//! makes that sleep long, so the next one does not poll, and holds polling back for 1, 2, 4 ...
//! up to 64 sleeps, until a poll finds work again. Polling yields the core between
//! checks, so a thread woken on it (often the host's, on one machine) runs. What polling does
//! not watch (a worker thread's finished Flush, a controller's teardown, a timer) waits at most
//! the budget longer.

use std::cell::RefCell;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use smallvec::SmallVec;

/// When to poll: the budget, what the last sleep says, and how the last polls went.
#[derive(Debug, Default)]
struct Policy {
    budget: Duration,
    /// When the thread last went to sleep (polling included).
    slept_at: Option<Instant>,
    /// The last sleep was shorter than the budget.
    hot: bool,
    /// Sleeps left that do not poll, after polls that found nothing.
    skip: u32,
    /// What `skip` becomes after the next poll that finds nothing (doubling, up to
    /// [`MAX_BACKOFF`]; back to none once a poll finds work).
    backoff: u32,
}

/// Most sleeps a poll that found nothing makes the thread skip polling for.
const MAX_BACKOFF: u32 = 64;

impl Policy {
    /// Going to sleep at `now`: until when to poll first, if at all.
    fn sleeping(&mut self, now: Instant) -> Option<Instant> {
        self.slept_at = Some(now);
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        (self.hot && !self.budget.is_zero()).then(|| now + self.budget)
    }

    /// A poll found work, or found nothing for its whole budget: then the next polls wait
    /// for twice as many sleeps as last time, so a host a little slower than the budget does
    /// not cost a budget of CPU on every other command.
    fn polled(&mut self, found: bool) {
        if found {
            self.backoff = 0;
        } else {
            self.backoff = (self.backoff * 2).clamp(1, MAX_BACKOFF);
            self.skip = self.backoff;
        }
    }

    /// Woken at `now`.
    fn woken(&mut self, now: Instant) {
        if let Some(at) = self.slept_at.take() {
            self.hot = now.saturating_duration_since(at) < self.budget;
        }
    }
}

/// Work a queue has that no descriptor's level shows: its io_uring's completions, read from
/// the ring's memory.
pub(crate) trait Pending {
    /// Whether there is work (cheap: no system call, no waiting for a lock).
    fn pending(&self) -> bool;
}

/// One engine thread's polling state.
#[derive(Default)]
struct Engine {
    policy: Policy,
    /// The sockets of the queues on this thread (their own duplicates), by the queue's key.
    sockets: Vec<(u64, OwnedFd)>,
    /// Their rings, by the queue's key.
    rings: Vec<(u64, Arc<dyn Pending>)>,
    next_key: u64,
    /// Polls that found something to do, for every engine of the target.
    found: Arc<AtomicU64>,
}

thread_local! {
    static ENGINE: RefCell<Engine> = RefCell::default();
}

/// Makes the current thread an engine that polls for up to `budget` (zero: never), counting
/// the polls that found work in `found`.
pub(crate) fn start(budget: Duration, found: Arc<AtomicU64>) {
    ENGINE.with_borrow_mut(|e| {
        e.policy.budget = budget;
        e.found = found;
    });
}

/// Runs right before the engine's runtime sleeps: polls if the last sleep was short.
pub(crate) fn before_sleep() {
    ENGINE.with_borrow_mut(|e| {
        let poll_until = e.policy.sleeping(Instant::now());
        if let Some(until) = poll_until.filter(|_| !e.sockets.is_empty()) {
            let found = spin(&e.sockets, &e.rings, until);
            e.policy.polled(found);
            if found {
                e.found.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
}

/// Runs when the engine's runtime wakes up.
pub(crate) fn after_wake() {
    ENGINE.with_borrow_mut(|e| e.policy.woken(Instant::now()));
}

/// Polls until a ring has completions or a socket is readable (true), or `until` passes.
fn spin(sockets: &[(u64, OwnedFd)], rings: &[(u64, Arc<dyn Pending>)], until: Instant) -> bool {
    let mut fds: SmallVec<[PollFd<'_>; 16]> = sockets
        .iter()
        .map(|(_, fd)| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
        .collect();
    let mut yielded = Instant::now();
    loop {
        let now = Instant::now();
        if now >= until {
            return false;
        }
        if rings.iter().any(|(_, r)| r.pending()) {
            return true;
        }
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => {}
            Ok(_) => return true,
            // The reactor reports what failed.
            Err(_) => return false,
        }
        if now.duration_since(yielded) >= YIELD_EVERY {
            std::thread::yield_now();
            yielded = Instant::now();
        }
    }
}

/// How often a polling engine yields its core, so that a thread woken there (the host's, or
/// the kernel's softirq thread) runs within that long. Not between every two checks: each
/// yield is a trip through the scheduler, and a check after one comes that much later (a
/// pinned engine answered 4 KiB reads at QD1 a third slower when it yielded after each).
const YIELD_EVERY: Duration = Duration::from_micros(10);

/// A queue's descriptors, watched by its engine's polling while it lives. Drop it on the
/// thread that made it (the queue's engine).
#[derive(Debug)]
pub(crate) struct Watched {
    key: u64,
}

/// Watches a queue's socket, and its ring if it has one, from the current engine thread.
pub(crate) fn watch(
    socket: BorrowedFd<'_>,
    ring: Option<Arc<dyn Pending>>,
) -> std::io::Result<Watched> {
    let socket = socket.try_clone_to_owned()?;
    Ok(ENGINE.with_borrow_mut(|e| {
        let key = e.next_key;
        e.next_key += 1;
        e.sockets.push((key, socket));
        e.rings.extend(ring.map(|r| (key, r)));
        Watched { key }
    }))
}

impl Drop for Watched {
    fn drop(&mut self) {
        let key = self.key;
        // A thread being torn down has no state left to clean.
        let _ = ENGINE.try_with(|e| {
            if let Ok(mut e) = e.try_borrow_mut() {
                e.sockets.retain(|(k, _)| *k != key);
                e.rings.retain(|(k, _)| *k != key);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn only_a_thread_whose_last_sleep_was_short_polls_and_never_past_the_budget() {
        let mut p = Policy {
            budget: 50 * US,
            ..Policy::default()
        };
        let t = Instant::now();
        // The first sleep: nothing known yet.
        assert_eq!(p.sleeping(t), None);
        p.woken(t + 20 * US);
        // Woken soon: poll next time, for the budget; it finds work.
        assert_eq!(p.sleeping(t + 30 * US), Some(t + 80 * US));
        p.polled(true);
        p.woken(t + 40 * US);
        assert_eq!(p.sleeping(t + 50 * US), Some(t + 100 * US));
        // That poll found nothing and the thread slept on: a long sleep, no poll next time.
        p.polled(false);
        p.woken(t + 500 * US);
        assert_eq!(p.sleeping(t + 510 * US), None);
        p.woken(t + 10_000 * US);
        assert_eq!(p.sleeping(t + 10_010 * US), None);
        // A short sleep again.
        p.woken(t + 10_040 * US);
        assert_eq!(p.sleeping(t + 10_050 * US), Some(t + 10_100 * US));
    }

    /// Sleeps that poll, of `n` short ones, after each poll found `found`.
    fn polls(p: &mut Policy, n: u32, found: bool) -> u32 {
        let t = Instant::now();
        let mut polled = 0;
        for i in 0..n {
            let at = t + i * 100 * US;
            if p.sleeping(at).is_some() {
                polled += 1;
                p.polled(found);
            }
            // Woken soon after every sleep.
            p.woken(at + 10 * US);
        }
        polled
    }

    #[test]
    fn polls_that_find_nothing_back_off_and_one_that_finds_work_ends_it() {
        let mut p = Policy {
            budget: 50 * US,
            hot: true,
            ..Policy::default()
        };
        // Every poll finds work: every sleep polls.
        assert_eq!(polls(&mut p, 100, true), 100);
        // None does: each poll is followed by 1, 2, 4 ... 64 sleeps that do not (polls at
        // sleeps 0, 2, 5, 10, 19, 36, 69, 134), then every 65th sleep polls.
        assert_eq!(polls(&mut p, 128, false), 7);
        assert_eq!(polls(&mut p, 650, false), 10);
        // The next poll finds work: from then on every sleep polls again.
        let until_next = p.skip;
        assert_eq!(polls(&mut p, until_next + 1, true), 1);
        assert_eq!(polls(&mut p, 50, true), 50);
    }

    #[test]
    fn a_zero_budget_never_polls() {
        let mut p = Policy::default();
        let t = Instant::now();
        for i in 0..4u32 {
            assert_eq!(p.sleeping(t + i * US), None);
            p.woken(t + i * US);
        }
    }
}
