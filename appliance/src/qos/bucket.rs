//! A token bucket told the time: one rate (commands or bytes per second), a burst of one time
//! slice, and debt. A command is admitted while the bucket is not in debt and then charged in
//! full, so a command larger than the burst (a 1 MiB write against 5 MiB/s) still passes, and
//! the debt it leaves delays the next ones by exactly its excess: over any long run the admitted
//! units equal the rate times the time, plus at most one burst and one command.

use std::num::NonZeroU64;

/// The burst: what one time slice of the rate allows (100 ms, Linux blk-throttle's slice).
/// Wider than the target's timer jitter on a busy host: a wake-up that comes late must not
/// forfeit what the rate earned meanwhile (with 10 ms, a 300 IOPS volume reached 0.85 of its
/// limit at load 10), while over a 10 s run it is 1 % of the rate.
pub const SLICE_NS: u64 = 100_000_000;

/// Units are kept in nano-units, so a rate of `r` units per second refills `r` nano-units per
/// nanosecond: integer arithmetic, no drift.
const NANO: i128 = 1_000_000_000;

/// One rate's bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    rate: u64,
    /// At most this many nano-units are saved up: one slice.
    cap: i128,
    /// Nano-units available; negative is debt.
    level: i128,
    /// The time `level` was computed for.
    at: u64,
}

impl Bucket {
    /// A full bucket for `rate` units per second at time `now` (nanoseconds).
    pub fn new(rate: NonZeroU64, now: u64) -> Self {
        let cap = cap_of(rate);
        Bucket {
            rate: rate.get(),
            cap,
            level: cap,
            at: now,
        }
    }

    /// The rate, units per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Adds what the time since the last call earned, up to the burst. Time never runs back:
    /// an earlier `now` changes nothing.
    pub fn refill(&mut self, now: u64) {
        if now > self.at {
            let earned = i128::from(self.rate) * i128::from(now - self.at);
            self.level = self.level.saturating_add(earned).min(self.cap);
            self.at = now;
        }
    }

    /// Whether a command may go at `now` (the bucket is not in debt).
    pub fn ready(&mut self, now: u64) -> bool {
        self.refill(now);
        self.level >= 0
    }

    /// Takes `units` (after [`Bucket::ready`] said yes).
    pub fn charge(&mut self, units: u64) {
        self.level = self
            .level
            .saturating_sub(i128::from(units).saturating_mul(NANO));
    }

    /// The earliest time the bucket is out of debt (its last refill time if it is now).
    pub fn ready_at(&self) -> u64 {
        if self.level >= 0 {
            return self.at;
        }
        let rate = i128::from(self.rate);
        let wait = (-self.level + rate - 1) / rate;
        self.at
            .saturating_add(u64::try_from(wait).unwrap_or(u64::MAX))
    }

    /// Changes the rate from `now` on: what was earned until now at the old rate stays (capped
    /// to the new burst), and so does any debt.
    pub fn set_rate(&mut self, rate: NonZeroU64, now: u64) {
        self.refill(now);
        self.rate = rate.get();
        self.cap = cap_of(rate);
        self.level = self.level.min(self.cap);
    }
}

fn cap_of(rate: NonZeroU64) -> i128 {
    i128::from(rate.get()) * i128::from(SLICE_NS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn rate(r: u64) -> NonZeroU64 {
        NonZeroU64::new(r).unwrap()
    }

    /// Admits unit commands as fast as the bucket allows, from `start` to `end`.
    fn drain(b: &mut Bucket, start: u64, end: u64, units: u64) -> u64 {
        let (mut now, mut admitted) = (start, 0);
        while now < end {
            if b.ready(now) {
                b.charge(units);
                admitted += 1;
            } else {
                now = b.ready_at();
            }
        }
        admitted
    }

    #[test]
    fn the_rate_over_many_slices_is_the_limit() {
        for r in [1, 7, 300, 600, 12_345, 1_000_000] {
            // At least 10 s and 10,000 commands: the rate times the time, plus the full bucket
            // it starts with (one slice) and the one command that goes into debt.
            let secs = (10_000 / r).max(10);
            let mut b = Bucket::new(rate(r), 0);
            let admitted = drain(&mut b, 0, secs * SEC, 1);
            let want = secs * r;
            let slice = r * SLICE_NS / SEC;
            assert!(
                (want..=want + slice + 1).contains(&admitted),
                "rate {r}: {admitted} in {secs} s, want {want} + at most {slice} + 1"
            );
        }
    }

    #[test]
    fn a_burst_is_one_slice_after_idling() {
        let mut b = Bucket::new(rate(10_000), 0);
        // Idle for a minute: at most one slice (1,000 commands) is saved, plus the one that goes
        // into debt.
        let at = 60 * SEC;
        let mut burst = 0;
        while b.ready(at) {
            b.charge(1);
            burst += 1;
        }
        assert_eq!(burst, 1_001);
        assert_eq!(b.ready_at(), at + 100_000, "the next is one interval later");
    }

    #[test]
    fn a_command_larger_than_the_burst_passes_and_its_excess_delays_the_next() {
        // 5 MiB/s, 1 MiB commands: a slice is 512 KiB, each command 2 slices.
        let mut b = Bucket::new(rate(5 << 20), 0);
        let admitted = drain(&mut b, 0, 10 * SEC, 1 << 20);
        assert!((50..=51).contains(&admitted), "{admitted} MiB in 10 s");
    }

    #[test]
    fn a_new_rate_applies_from_the_change_on() {
        let mut b = Bucket::new(rate(300), 0);
        assert!((330..=332).contains(&drain(&mut b, 0, SEC, 1)));
        b.set_rate(rate(600), b.ready_at().max(SEC));
        let next = drain(&mut b, SEC, 2 * SEC, 1);
        assert!((594..=606).contains(&next), "{next} in the second after");
        // Lowered: the saved burst shrinks to the new slice at once.
        let mut b = Bucket::new(rate(100_000), 0);
        b.set_rate(rate(100), 0);
        // 100/s saves 10 commands per 100 ms slice: those, and the one that goes into debt.
        for _ in 0..11 {
            assert!(b.ready(0));
            b.charge(1);
        }
        assert!(!b.ready(0));
    }

    #[test]
    fn time_running_back_earns_nothing() {
        let mut b = Bucket::new(rate(1), SEC);
        b.charge(1);
        b.refill(0);
        assert!(!b.ready(SEC / 2));
        assert_eq!(b.ready_at(), SEC + SEC - SEC / 10);
    }
}
