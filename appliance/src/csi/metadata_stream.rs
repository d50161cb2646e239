//! The ranges of a SnapshotMetadata stream: walked from core's cluster maps in short holds of
//! the pool, turned into byte ranges, and sent in messages through a bounded channel.
//!
//! Memory per stream is bounded whatever the volume's size: one hold collects at most one
//! message's runs, the coalescer keeps at most one message and one range, and the channel holds
//! [`STREAM_DEPTH`] messages; a reader that stops reading stops the walk (the send waits). The
//! pool's lock is taken per hold ([`ENTRIES_PER_HOLD`] map entries at most) and never across an
//! await. The pieces form one consistent walk because a snapshot's map never changes after it
//! is taken: the next hold resumes where the last one stopped ([`edgevol_core::ClusterRuns`]).
//! A snapshot deleted mid-stream ends the stream with NOT_FOUND.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use edgevol_core::{ClusterRun, Pool, SnapshotId};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

use super::error::Error;
use super::ids::Ids;
use super::status;
use crate::pool::PoolDevice;
use crate::state::State;

/// Ranges per message when a request's `max_results` is 0: about 20 KiB encoded, small enough
/// to stream promptly, large enough that a 1 TiB delta of a few thousand extents is one or a few
/// messages.
pub const DEFAULT_MAX_RESULTS: usize = 1024;

/// The most ranges one message carries whatever the request asks (a range encodes in at most 24
/// bytes: well inside gRPC's 4 MiB default message limit). The spec lets the plugin send fewer.
pub const MAX_RESULTS_CAP: usize = 16_384;

/// Messages a stream buffers ahead of its reader.
pub const STREAM_DEPTH: usize = 2;

/// Map entries one hold of the pool examines at most (well under a millisecond of B-tree walk).
pub const ENTRIES_PER_HOLD: u64 = 65_536;

/// What a stream reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    /// The allocated clusters of a snapshot.
    Allocated(SnapshotId),
    /// The clusters mapped differently in two snapshots of one volume.
    Delta {
        /// The older snapshot.
        base: SnapshotId,
        /// The newer one.
        target: SnapshotId,
    },
}

/// Bytes `offset .. offset + len` of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    /// First byte.
    pub offset: u64,
    /// Length, at least 1.
    pub len: u64,
}

impl ByteRange {
    fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// Where a stream starts and how its messages are cut.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The pool's cluster size.
    pub cluster: u64,
    /// `starting_offset`: a range that starts before it is cut to it.
    pub start: u64,
    /// The volume's size: no range passes it.
    pub capacity: u64,
    /// Ranges per message.
    pub max: usize,
}

/// Joins runs of clusters into byte ranges and cuts them into messages of `max` ranges. A
/// range is kept back until the next one shows it does not continue it, so ranges split by the
/// walk's holds are sent joined.
#[derive(Debug)]
pub struct Coalescer {
    shape: Shape,
    pending: Vec<ByteRange>,
}

impl Coalescer {
    /// A coalescer for a stream of `shape`.
    pub fn new(shape: Shape) -> Self {
        let max = shape.max.max(1);
        Coalescer {
            shape: Shape { max, ..shape },
            pending: Vec::with_capacity(max.min(DEFAULT_MAX_RESULTS) + 1),
        }
    }

    /// Adds the next run (runs come in ascending order); a full message, if that completed one.
    pub fn push(&mut self, run: ClusterRun) -> Option<Vec<ByteRange>> {
        let cs = self.shape.cluster;
        let offset = run.first.saturating_mul(cs).max(self.shape.start);
        let end = run.end().saturating_mul(cs).min(self.shape.capacity);
        if end <= offset {
            return None;
        }
        match self.pending.last_mut() {
            Some(last) if last.end() == offset => last.len += end - offset,
            _ => self.pending.push(ByteRange {
                offset,
                len: end - offset,
            }),
        }
        // The last range may still grow: a message goes out once a range follows it.
        (self.pending.len() > self.shape.max).then(|| {
            let rest = self.pending.split_off(self.shape.max);
            std::mem::replace(&mut self.pending, rest)
        })
    }

    /// The last message, if any range is left.
    pub fn finish(self) -> Option<Vec<ByteRange>> {
        (!self.pending.is_empty()).then_some(self.pending)
    }
}

/// The most messages any stream of one service has had waiting for its reader: produced by
/// the walk and not yet taken by the transport.
#[derive(Debug, Default)]
pub struct Buffered {
    peak: AtomicUsize,
}

impl Buffered {
    /// The peak so far.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

/// One hold of the pool: up to `max` runs from cluster `from`, where the next hold resumes,
/// and whether the walk is done.
fn hold(
    pool: &Pool<PoolDevice>,
    walk: Walk,
    from: u64,
    max: usize,
) -> Result<(Vec<ClusterRun>, u64, bool), Error> {
    let runs = match walk {
        Walk::Allocated(s) => pool.allocated_clusters(s, from)?,
        Walk::Delta { base, target } => pool.changed_clusters(base, target, from)?,
    };
    let mut runs = runs.with_budget(ENTRIES_PER_HOLD);
    let mut out = Vec::with_capacity(max.min(DEFAULT_MAX_RESULTS));
    for run in runs.by_ref() {
        out.push(run);
        if out.len() == max {
            break;
        }
    }
    Ok((out, runs.resume_at(), runs.finished()))
}

/// Streams `walk`'s ranges from `shape.start` on, in messages of at most `shape.max` ranges,
/// each made into a response by `message`. The walk runs in its own task; it ends when the walk
/// does, on the first error (sent as the stream's last item), or when the reader goes away.
pub fn stream<M, F>(
    state: &Arc<State>,
    walk: Walk,
    shape: Shape,
    buffered: Arc<Buffered>,
    message: F,
) -> impl Stream<Item = Result<M, Status>> + Send + 'static
where
    M: Send + 'static,
    F: Fn(Vec<ByteRange>) -> M + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<M, Status>>(STREAM_DEPTH);
    let waiting = Arc::new(AtomicUsize::new(0));
    let state = state.clone();
    let ids = state.appliance_id.clone();
    let produced = waiting.clone();
    let peak = buffered.clone();
    tokio::spawn(async move {
        let send = |m: Result<M, Status>| {
            let now = produced.fetch_add(1, Ordering::Relaxed) + 1;
            peak.peak.fetch_max(now, Ordering::Relaxed);
            let tx = tx.clone();
            async move { tx.send(m).await }
        };
        let mut coalescer = Coalescer::new(shape);
        let mut from = shape.start / shape.cluster;
        let max = coalescer.shape.max;
        loop {
            let held = state
                .with_pool(move |_, pool| hold(pool, walk, from, max))
                .await;
            let (runs, resume, finished) = match held {
                Ok(h) => h,
                Err(e) => {
                    let _ = send(Err(status::from_error(Ids::new(&ids), e))).await;
                    return;
                }
            };
            for run in runs {
                if let Some(ranges) = coalescer.push(run) {
                    if send(Ok(message(ranges))).await.is_err() {
                        return;
                    }
                }
            }
            if finished {
                if let Some(ranges) = coalescer.finish() {
                    let _ = send(Ok(message(ranges))).await;
                }
                return;
            }
            from = resume;
        }
    });
    ReceiverStream::new(rx).map(move |item| {
        waiting.fetch_sub(1, Ordering::Relaxed);
        item
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first: u64, count: u64) -> ClusterRun {
        ClusterRun { first, count }
    }

    fn r(offset: u64, len: u64) -> ByteRange {
        ByteRange { offset, len }
    }

    #[test]
    fn runs_become_byte_ranges_cut_to_the_start_and_joined_across_holds() {
        let shape = Shape {
            cluster: 4096,
            start: 4096 + 100,
            capacity: 10 * 4096,
            max: 2,
        };
        let mut c = Coalescer::new(shape);
        // Starts before the offset: cut to it.
        assert_eq!(c.push(run(0, 2)), None);
        // Continues it (a walk's hold ended mid-run): joined.
        assert_eq!(c.push(run(2, 1)), None);
        assert_eq!(c.push(run(5, 1)), None);
        // A third range completes a message of two; the third may still grow.
        assert_eq!(
            c.push(run(7, 1)),
            Some(vec![r(4196, 3 * 4096 - 4196), r(5 * 4096, 4096)])
        );
        assert_eq!(c.push(run(8, 5)), None);
        // Cut to the capacity.
        assert_eq!(c.finish(), Some(vec![r(7 * 4096, 3 * 4096)]));
    }

    #[test]
    fn nothing_left_is_no_message() {
        let shape = Shape {
            cluster: 4096,
            start: 8192,
            capacity: 8192,
            max: 4,
        };
        let mut c = Coalescer::new(shape);
        assert_eq!(c.push(run(0, 2)), None);
        assert_eq!(c.finish(), None);
    }
}
