//! Per-volume I/O counters for the metrics exporter: plain atomics, updated once per command.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgevol_core::VolumeId;

/// Upper bounds (microseconds) of the latency histogram buckets; a last bucket holds the rest.
pub const LATENCY_BUCKETS_US: [u64; 12] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 250_000,
];

/// What kind of command a sample belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    /// Read.
    Read,
    /// Write (and Write Zeroes).
    Write,
    /// Flush.
    Flush,
    /// Dataset Management.
    Deallocate,
}

impl IoKind {
    /// The kind as the metrics and messages name it.
    pub fn as_str(self) -> &'static str {
        match self {
            IoKind::Read => "read",
            IoKind::Write => "write",
            IoKind::Flush => "flush",
            IoKind::Deallocate => "deallocate",
        }
    }
}

/// Counters of one direction.
#[derive(Debug, Default)]
pub struct OpCounters {
    /// Commands completed successfully.
    pub ops: AtomicU64,
    /// Bytes moved by them.
    pub bytes: AtomicU64,
    /// Commands that failed.
    pub errors: AtomicU64,
}

/// Counters of one volume's namespace.
#[derive(Debug, Default)]
pub struct VolumeCounters {
    /// Reads.
    pub read: OpCounters,
    /// Writes and Write Zeroes.
    pub write: OpCounters,
    /// Flushes.
    pub flush: OpCounters,
    /// Dataset Management (deallocate).
    pub deallocate: OpCounters,
    /// Latency histogram over every command: bucket `i` counts latencies up to
    /// `LATENCY_BUCKETS_US[i]`, the last one the rest.
    pub latency: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    /// Commands failed by the pool's medium (also counted in their direction's `errors`).
    pub media_errors: AtomicU64,
    /// The latest of them: when (Unix seconds) and what kind of command.
    pub last_media_error: Mutex<Option<(u64, IoKind)>>,
    /// Commands held back by the volume's QoS limits.
    pub qos_delayed: AtomicU64,
    /// The time they waited, in microseconds.
    pub qos_wait_us: AtomicU64,
}

/// The health of one volume's data as its I/O saw it: what CSI's volume condition reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaHealth {
    /// Commands failed by the medium since the daemon started.
    pub errors: u64,
    /// The latest: Unix seconds and command kind.
    pub last: Option<(u64, IoKind)>,
}

impl VolumeCounters {
    /// Records one command.
    pub fn record(&self, kind: IoKind, bytes: u64, ok: bool, latency: Duration) {
        let c = match kind {
            IoKind::Read => &self.read,
            IoKind::Write => &self.write,
            IoKind::Flush => &self.flush,
            IoKind::Deallocate => &self.deallocate,
        };
        if ok {
            c.ops.fetch_add(1, Ordering::Relaxed);
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(LATENCY_BUCKETS_US.len());
        if let Some(slot) = self.latency.get(bucket) {
            slot.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a command that QoS held back for `waited`.
    pub fn qos_delayed(&self, waited: Duration) {
        self.qos_delayed.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.qos_wait_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Records a command failed by the medium (a read or write error of the pool device).
    pub fn media_error(&self, kind: IoKind) {
        self.media_errors.fetch_add(1, Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        *self
            .last_media_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some((now, kind));
    }

    /// Media errors so far and the latest.
    pub fn media_health(&self) -> MediaHealth {
        MediaHealth {
            errors: self.media_errors.load(Ordering::Relaxed),
            last: *self
                .last_media_error
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Total samples in the latency histogram.
    pub fn samples(&self) -> u64 {
        self.latency.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }
}

/// The counters of every volume served since start.
#[derive(Debug, Default, Clone)]
pub struct IoStats {
    volumes: Arc<Mutex<BTreeMap<VolumeId, Arc<VolumeCounters>>>>,
}

impl IoStats {
    /// The counters of `volume`, created on first use.
    pub fn volume(&self, volume: VolumeId) -> Arc<VolumeCounters> {
        let mut map = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(volume).or_default().clone()
    }

    /// The media health of `volume`; clean if it has served no I/O.
    pub fn media_health(&self, volume: VolumeId) -> MediaHealth {
        let map = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&volume).map_or(
            MediaHealth {
                errors: 0,
                last: None,
            },
            |c| c.media_health(),
        )
    }

    /// A snapshot of the map (for exporters).
    pub fn all(&self) -> Vec<(VolumeId, Arc<VolumeCounters>)> {
        let map = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        map.iter().map(|(k, v)| (*k, v.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_counts() {
        let c = VolumeCounters::default();
        c.record(IoKind::Read, 4096, true, Duration::from_micros(7));
        c.record(IoKind::Read, 4096, false, Duration::from_secs(2));
        c.record(IoKind::Write, 8192, true, Duration::from_micros(300));
        assert_eq!(c.read.ops.load(Ordering::Relaxed), 1);
        assert_eq!(c.read.errors.load(Ordering::Relaxed), 1);
        assert_eq!(c.write.bytes.load(Ordering::Relaxed), 8192);
        assert_eq!(c.latency[0].load(Ordering::Relaxed), 1);
        assert_eq!(c.latency[5].load(Ordering::Relaxed), 1);
        assert_eq!(c.latency[12].load(Ordering::Relaxed), 1);
        assert_eq!(c.samples(), 3);
    }
}
