//! One volume's limiter: its buckets, and the commands waiting for them in arrival order.
//!
//! Every queue of the volume, on every controller and host, asks the same limiter. A queue has
//! at most one command waiting here (the transport keeps the rest behind it, in order), so
//! queues take turns whatever their depth: a QD1 queue is not starved by a QD32 neighbour.
//! Waiting commands are handed out in arrival order; one that waits for a bucket does not hold
//! back a later one that needs only other buckets (a read at its read limit does not stop
//! writes), and it cannot be overtaken on a bucket it waits for: that bucket stays in debt until
//! it is this command's turn, and the scan reaches it first.

use std::collections::VecDeque;

use super::bucket::Bucket;
use super::limits::{units, Cost, Limits, KEYS};

/// One volume's limits and waiting commands. `W` names a waiter (a queue).
#[derive(Debug)]
pub struct Limiter<W> {
    limits: Limits,
    /// One bucket per set limit, in [`KEYS`] order.
    buckets: [Option<Bucket>; 6],
    waiting: VecDeque<(W, Cost)>,
}

impl<W: PartialEq> Limiter<W> {
    /// A limiter enforcing `limits` from `now` (nanoseconds).
    pub fn new(limits: Limits, now: u64) -> Self {
        let mut l = Limiter {
            limits: Limits::default(),
            buckets: Default::default(),
            waiting: VecDeque::new(),
        };
        l.set_limits(limits, now);
        l
    }

    /// The limits enforced.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Enforces `limits` from `now` on: a changed rate keeps its bucket's savings (capped to
    /// the new burst) and debt, a removed one stops counting. Call [`Limiter::poll`] after it:
    /// waiters may go now, or later than they were told.
    pub fn set_limits(&mut self, limits: Limits, now: u64) {
        for (slot, rate) in self.buckets.iter_mut().zip(limits.rates()) {
            *slot = match (slot.take(), rate) {
                (Some(mut b), Some(r)) => {
                    b.set_rate(r, now);
                    Some(b)
                }
                (None, Some(r)) => Some(Bucket::new(r, now)),
                (_, None) => None,
            };
        }
        self.limits = limits;
    }

    /// A command of `who` costing `cost` arrives at `now`. Hands out (to `go`) the waiting
    /// commands whose turn has come, then returns true if this one may go now (it is charged),
    /// or false if it waits until a later [`Limiter::poll`] hands it to `go`.
    pub fn admit(&mut self, who: W, cost: Cost, now: u64, go: impl FnMut(W)) -> bool {
        self.poll(now, go);
        if self.charge(cost, now) {
            return true;
        }
        self.waiting.push_back((who, cost));
        false
    }

    /// Hands out, in arrival order, every waiting command whose buckets are all out of debt at
    /// `now`, charging each.
    pub fn poll(&mut self, now: u64, mut go: impl FnMut(W)) {
        let mut i = 0;
        while i < self.waiting.len() {
            let cost = self.waiting[i].1;
            if self.charge(cost, now) {
                if let Some((who, _)) = self.waiting.remove(i) {
                    go(who);
                }
            } else {
                i += 1;
            }
        }
    }

    /// When the next waiting command can go (`None`: nothing waits). A time in the past means
    /// now.
    pub fn next_ready(&self) -> Option<u64> {
        self.waiting
            .iter()
            .map(|(_, cost)| self.ready_at(*cost))
            .min()
    }

    /// Forgets `who`'s waiting command (its queue went away).
    pub fn cancel(&mut self, who: &W) {
        self.waiting.retain(|(w, _)| w != who);
    }

    /// The waiters with a command waiting, in arrival order.
    pub fn waiting(&self) -> impl Iterator<Item = &W> {
        self.waiting.iter().map(|(w, _)| w)
    }

    /// The buckets `cost` is charged to, with the units.
    fn charged(&mut self, cost: Cost) -> impl Iterator<Item = (&mut Bucket, u64)> {
        self.buckets
            .iter_mut()
            .zip(KEYS)
            .filter_map(move |(b, (_, kind, dir))| Some((b.as_mut()?, units(cost, kind, dir)?)))
    }

    /// Charges `cost` if every bucket it needs is out of debt at `now`.
    fn charge(&mut self, cost: Cost, now: u64) -> bool {
        if !self.charged(cost).all(|(b, _)| b.ready(now)) {
            return false;
        }
        for (b, n) in self.charged(cost) {
            b.charge(n);
        }
        true
    }

    fn ready_at(&self, cost: Cost) -> u64 {
        self.buckets
            .iter()
            .zip(KEYS)
            .filter_map(|(b, (_, kind, dir))| {
                units(cost, kind, dir)?;
                Some(b.as_ref()?.ready_at())
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use super::super::limits::Direction;
    use super::*;

    const SEC: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn read(bytes: u64) -> Cost {
        Cost {
            direction: Direction::Read,
            bytes,
        }
    }

    fn write(bytes: u64) -> Cost {
        Cost {
            direction: Direction::Write,
            bytes,
        }
    }

    fn nz(v: u64) -> Option<NonZeroU64> {
        NonZeroU64::new(v)
    }

    /// Queues that always have another command (each at most one in the limiter, as the
    /// transport does), run in virtual time; `plan(now)` may change the limits. Returns each
    /// queue's admission times.
    fn run(
        limiter: &mut Limiter<usize>,
        costs: &[Cost],
        end: u64,
        mut plan: impl FnMut(&mut Limiter<usize>, u64),
    ) -> Vec<Vec<u64>> {
        let mut admitted = vec![Vec::new(); costs.len()];
        let mut now = 0;
        // Every queue asks at once; an admitted queue asks again immediately.
        let mut asking: Vec<usize> = (0..costs.len()).collect();
        while now < end {
            plan(limiter, now);
            let mut went = Vec::new();
            limiter.poll(now, |q| went.push(q));
            for q in asking.drain(..) {
                if limiter.admit(q, costs[q], now, |w| went.push(w)) {
                    went.push(q);
                }
            }
            if went.is_empty() {
                now = limiter.next_ready().unwrap_or(end).max(now + 1);
                continue;
            }
            for q in went {
                admitted[q].push(now);
                asking.push(q);
            }
        }
        admitted
    }

    fn within(got: usize, want: u64, tolerance: f64) -> bool {
        (got as f64 - want as f64).abs() <= want as f64 * tolerance
    }

    #[test]
    fn the_rate_over_many_slices_is_the_limit() {
        for iops in [300u64, 600, 5_000, 50_000] {
            let limits = Limits {
                iops: nz(iops),
                ..Default::default()
            };
            let mut l = Limiter::new(limits, 0);
            let got = run(&mut l, &[read(4096)], 10 * SEC, |_, _| {});
            assert!(
                within(got[0].len(), 10 * iops, 0.01),
                "{iops}: {}",
                got[0].len()
            );
        }
        // Bandwidth, 128 KiB commands at 5 MiB/s: 40 per second.
        let limits = Limits {
            bandwidth: nz(5 << 20),
            ..Default::default()
        };
        let mut l = Limiter::new(limits, 0);
        let got = run(&mut l, &[write(128 << 10)], 20 * SEC, |_, _| {});
        assert!(within(got[0].len(), 800, 0.01), "{}", got[0].len());
    }

    #[test]
    fn a_burst_is_bounded_by_one_slice() {
        let limits = Limits {
            iops: nz(1_000),
            ..Default::default()
        };
        let mut l = Limiter::new(limits, 0);
        let got = run(&mut l, &[read(4096); 4], 2 * SEC, |_, _| {});
        // In any 100 ms window: one slice (100) plus the command that goes into debt, plus what
        // the window itself earns (100).
        let mut all: Vec<u64> = got.concat();
        all.sort_unstable();
        for (i, &t) in all.iter().enumerate() {
            let in_window = all[i..].iter().take_while(|&&u| u < t + 100 * MS).count();
            assert!(in_window <= 201, "{in_window} commands in 100 ms from {t}");
        }
    }

    #[test]
    fn per_direction_and_combined_limits_hold_together() {
        // 1000 IOPS in all, reads at most 300: reads get 300, writes the other 700.
        let limits = Limits {
            iops: nz(1_000),
            read_iops: nz(300),
            ..Default::default()
        };
        let mut l = Limiter::new(limits, 0);
        let got = run(&mut l, &[read(4096), write(4096)], 10 * SEC, |_, _| {});
        assert!(within(got[0].len(), 3_000, 0.01), "reads {}", got[0].len());
        assert!(within(got[1].len(), 7_000, 0.01), "writes {}", got[1].len());
        // Per-direction bandwidth next to a command limit: each bound by its tighter limit.
        let limits = Limits {
            iops: nz(2_000),
            write_bandwidth: nz(1 << 20),
            ..Default::default()
        };
        let mut l = Limiter::new(limits, 0);
        let got = run(&mut l, &[read(4096), write(64 << 10)], 10 * SEC, |_, _| {});
        // 2 %: the full bucket it starts with (a 100 ms slice) is 1 % of 10 s, plus one command.
        assert!(within(got[1].len(), 160, 0.02), "writes {}", got[1].len());
        assert!(
            within(got[0].len() + got[1].len(), 20_000, 0.01),
            "all {}",
            got[0].len() + got[1].len()
        );
    }

    #[test]
    fn a_changed_limit_takes_effect_at_the_next_slice() {
        let limits = |iops| Limits {
            iops: nz(iops),
            ..Default::default()
        };
        let mut l = Limiter::new(limits(300), 0);
        let got = run(&mut l, &[read(4096); 2], 4 * SEC, |l, now| {
            if now >= 2 * SEC && l.limits() == limits(300) {
                l.set_limits(limits(600), now);
            }
        });
        let all: Vec<u64> = got.concat();
        let count = |from: u64, to: u64| all.iter().filter(|&&t| t >= from && t < to).count();
        assert!(
            within(count(SEC, 2 * SEC), 300, 0.02),
            "{}",
            count(SEC, 2 * SEC)
        );
        assert!(
            within(count(2 * SEC + 10 * MS, 3 * SEC + 10 * MS), 600, 0.02),
            "{}",
            count(2 * SEC + 10 * MS, 3 * SEC + 10 * MS)
        );
        // Removing every limit lets the waiting commands go at once.
        let mut l = Limiter::new(limits(1), 0);
        assert!(l.admit(1, read(1), 0, |_| {}));
        assert!(!l.admit(2, read(1), 0, |_| {}));
        l.set_limits(Limits::default(), 1);
        let mut went = Vec::new();
        l.poll(1, |w| went.push(w));
        assert_eq!(went, [2]);
        assert_eq!(l.next_ready(), None);
    }

    #[test]
    fn queues_of_one_volume_share_its_limit_fairly() {
        let limits = Limits {
            iops: nz(900),
            ..Default::default()
        };
        let mut l = Limiter::new(limits, 0);
        let got = run(
            &mut l,
            &[read(4096), read(512), write(1 << 20)],
            10 * SEC,
            |_, _| {},
        );
        let total: usize = got.iter().map(Vec::len).sum();
        assert!(within(total, 9_000, 0.01), "{total}");
        for (q, times) in got.iter().enumerate() {
            assert!(
                within(times.len(), 3_000, 0.01),
                "queue {q}: {}",
                times.len()
            );
        }
    }

    #[test]
    fn waiting_commands_go_in_arrival_order_and_cancel_forgets_one() {
        let limits = Limits {
            iops: nz(100),
            ..Default::default()
        };
        let mut l = Limiter::new(limits, 0);
        // 100/s saves 10 commands: those and one more go, the rest wait.
        for q in 0..11 {
            assert!(l.admit(q, read(1), 0, |_| {}));
        }
        for q in 11..15 {
            assert!(!l.admit(q, read(1), 0, |_| {}));
        }
        l.cancel(&12);
        assert_eq!(l.waiting().copied().collect::<Vec<_>>(), [11, 13, 14]);
        let mut went = Vec::new();
        let mut now = 0;
        while let Some(at) = l.next_ready() {
            now = at.max(now);
            l.poll(now, |w| went.push(w));
        }
        assert_eq!(went, [11, 13, 14]);
        assert_eq!(now, 30 * MS, "one every 10 ms");
    }
}
