//! A lock-free latency histogram: fixed bucket bounds in microseconds, atomic counts and sum.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use crate::nvme::stats::LATENCY_BUCKETS_US;

/// Counts of latencies per bucket, and their sum.
#[derive(Debug)]
pub struct Histogram {
    bounds_us: &'static [u64],
    /// `bounds_us.len() + 1` buckets: the last holds what exceeds every bound.
    counts: Box<[AtomicU64]>,
    sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new(&LATENCY_BUCKETS_US)
    }
}

/// What a histogram held at one moment (per-bucket counts, not cumulative).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Upper bounds, microseconds.
    pub bounds_us: Vec<u64>,
    /// One more count than bounds.
    pub counts: Vec<u64>,
    /// Sum of the samples, microseconds, if recorded.
    pub sum_us: Option<u64>,
}

impl HistogramSnapshot {
    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

impl Histogram {
    /// A histogram with these bucket bounds (ascending).
    pub fn new(bounds_us: &'static [u64]) -> Self {
        Histogram {
            bounds_us,
            counts: (0..=bounds_us.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }

    /// Records one sample.
    pub fn observe(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = self
            .bounds_us
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(self.bounds_us.len());
        if let Some(slot) = self.counts.get(bucket) {
            slot.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// The current counts.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds_us: self.bounds_us.to_vec(),
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum_us: Some(self.sum_us.load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_land_in_their_bucket() {
        let h = Histogram::new(&[10, 100]);
        h.observe(Duration::from_micros(10));
        h.observe(Duration::from_micros(11));
        h.observe(Duration::from_secs(1));
        let s = h.snapshot();
        assert_eq!(s.counts, vec![1, 1, 1]);
        assert_eq!(s.sum_us, Some(1_000_021));
        assert_eq!(s.count(), 3);
    }
}
