//! Which clusters a snapshot holds, and which differ between two snapshots of one volume: read
//! from the cluster maps alone, never from data (changed-block tracking for backups).
//!
//! A snapshot's map is frozen when it is taken, and a physical cluster a snapshot maps is shared
//! (reference counted), so a write to the volume copies it instead of changing it. Hence, for two
//! snapshots of one volume, a virtual cluster whose two mappings name the same physical cluster
//! holds the same bytes in both; one mapped differently (or mapped in only one of them: written
//! for the first time, trimmed, zeroed by deallocation, or past the base's end after an
//! expansion) *may* differ. The maps cannot tell a cluster rewritten with identical bytes from a
//! real change, so such a cluster counts as changed: the answer is a superset of the changed
//! bytes, never a subset, and exact to the cluster otherwise.
//!
//! [`ClusterRuns`] walks the maps in order, allocating nothing, and coalesces consecutive
//! clusters into runs. A walk can be bounded ([`ClusterRuns::with_budget`]) and resumed
//! ([`ClusterRuns::resume_at`]), so a caller that shares the pool behind a lock can walk a large
//! map in short holds: the maps of snapshots never change, so the pieces form one consistent walk.

use core::iter::Peekable;

use crate::cluster_map;
use crate::device::BlockDevice;
use crate::error::Result;
use crate::id::SnapshotId;
use crate::pool::Pool;
use crate::volume::ClusterMap;

/// Consecutive virtual clusters `first .. first + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterRun {
    /// The first cluster.
    pub first: u64,
    /// How many (at least one).
    pub count: u64,
}

impl ClusterRun {
    /// The cluster after the last one.
    pub fn end(&self) -> u64 {
        self.first + self.count
    }
}

type Entries<'a> = Peekable<cluster_map::Entries<'a>>;

#[derive(Debug, Clone)]
enum Source<'a> {
    /// Every mapped cluster of one map.
    Allocated(Entries<'a>),
    /// Every cluster mapped differently in the two maps.
    Delta { base: Entries<'a>, target: Entries<'a> },
}

/// Runs of clusters, in ascending order: the allocated clusters of a snapshot
/// ([`Pool::allocated_clusters`]) or those that differ between two
/// ([`Pool::changed_clusters`]). Allocation-free; see the module docs.
#[derive(Debug, Clone)]
pub struct ClusterRuns<'a> {
    source: Source<'a>,
    /// Clusters at and past this one are not reported.
    end: u64,
    /// Every cluster below this one was examined (reported, or held in `carry`).
    pos: u64,
    /// A cluster found in the set but not reported yet (it did not continue the last run).
    carry: Option<u64>,
    /// Map entries examined so far.
    visited: u64,
    /// Entries to examine before stopping (see [`ClusterRuns::with_budget`]).
    budget: u64,
}

impl<'a> ClusterRuns<'a> {
    fn new(source: Source<'a>, from: u64, end: u64) -> Self {
        ClusterRuns {
            source,
            end,
            pos: from.min(end),
            carry: None,
            visited: 0,
            budget: u64::MAX,
        }
    }

    /// Stops the walk once `entries` map entries were examined (at least one run is still
    /// reported if any is left): the last run reported may then be cut short, and the rest
    /// resumes at [`resume_at`](Self::resume_at). Bounds the time one call holds the pool.
    #[must_use]
    pub fn with_budget(mut self, entries: u64) -> Self {
        self.budget = entries.max(1);
        self
    }

    /// Map entries examined so far.
    pub fn visited(&self) -> u64 {
        self.visited
    }

    /// Where a new walk continues this one: every cluster below it was reported.
    pub fn resume_at(&self) -> u64 {
        self.carry.unwrap_or(self.pos)
    }

    /// Whether the walk reached the end (nothing is left to report past `resume_at`).
    pub fn finished(&self) -> bool {
        self.carry.is_none() && self.pos >= self.end
    }

    /// The next cluster in the set, examining as few entries as it can.
    fn next_cluster(&mut self) -> Option<u64> {
        let end = self.end;
        loop {
            let found = match &mut self.source {
                Source::Allocated(map) => {
                    let (vc, _) = map.next().filter(|&(vc, _)| vc < end)?;
                    self.visited += 1;
                    Some(vc)
                }
                Source::Delta { base, target } => {
                    let b = base.peek().copied().filter(|e| e.0 < end);
                    let t = target.peek().copied().filter(|e| e.0 < end);
                    let (vc, differs) = match (b, t) {
                        (None, None) => {
                            self.pos = end;
                            return None;
                        }
                        (Some((bv, bp)), Some((tv, tp))) if bv == tv => {
                            base.next();
                            target.next();
                            (bv, bp != tp)
                        }
                        (Some((bv, _)), Some((tv, _))) if bv < tv => {
                            base.next();
                            (bv, true)
                        }
                        (Some(_), Some((tv, _))) | (None, Some((tv, _))) => {
                            target.next();
                            (tv, true)
                        }
                        (Some((bv, _)), None) => {
                            base.next();
                            (bv, true)
                        }
                    };
                    self.visited += 1;
                    self.pos = vc + 1;
                    if !differs {
                        if self.visited >= self.budget {
                            return None;
                        }
                        continue;
                    }
                    Some(vc)
                }
            };
            if let Some(vc) = found {
                self.pos = vc + 1;
            }
            return found;
        }
    }
}

impl Iterator for ClusterRuns<'_> {
    type Item = ClusterRun;

    fn next(&mut self) -> Option<ClusterRun> {
        let first = match self.carry.take() {
            Some(vc) => vc,
            None if self.visited >= self.budget => return None,
            None => match self.next_cluster() {
                Some(vc) => vc,
                None => {
                    if self.visited < self.budget {
                        self.pos = self.end;
                    }
                    return None;
                }
            },
        };
        let mut run = ClusterRun { first, count: 1 };
        while self.visited < self.budget {
            match self.next_cluster() {
                Some(vc) if vc == run.end() => run.count += 1,
                Some(vc) => {
                    self.carry = Some(vc);
                    break;
                }
                None => {
                    if self.visited < self.budget {
                        self.pos = self.end;
                    }
                    break;
                }
            }
        }
        Some(run)
    }
}

fn entries(map: &ClusterMap, from: u64) -> Entries<'_> {
    map.entries(from).peekable()
}

impl<D: BlockDevice> Pool<D> {
    /// The runs of clusters `snapshot` maps (written and not deallocated when it was taken), from
    /// cluster `from` on. Clusters are [`Pool::cluster_size`] bytes; the last run ends at the
    /// snapshot's size at most.
    pub fn allocated_clusters(&self, snapshot: SnapshotId, from: u64) -> Result<ClusterRuns<'_>> {
        let s = self.state.snapshot(snapshot)?;
        let end = s.size.div_ceil(u64::from(self.cluster_size()));
        Ok(ClusterRuns::new(Source::Allocated(entries(&s.map, from)), from, end))
    }

    /// The runs of clusters, from cluster `from` on, that `base` and `target` map differently
    /// (see the module docs: a superset of the changed bytes, exact to the cluster), up to the
    /// larger of their sizes. Meaningful for two snapshots of one volume; the caller checks that.
    pub fn changed_clusters(&self, base: SnapshotId, target: SnapshotId, from: u64) -> Result<ClusterRuns<'_>> {
        let b = self.state.snapshot(base)?;
        let t = self.state.snapshot(target)?;
        let end = b.size.max(t.size).div_ceil(u64::from(self.cluster_size()));
        let source = Source::Delta {
            base: entries(&b.map, from),
            target: entries(&t.map, from),
        };
        Ok(ClusterRuns::new(source, from, end))
    }
}

#[cfg(test)]
mod tests {
    use alloc::vec::Vec;

    use super::*;

    fn map(pairs: &[(u64, u64)]) -> ClusterMap {
        pairs.iter().copied().collect()
    }

    fn runs(r: ClusterRuns<'_>) -> Vec<(u64, u64)> {
        r.map(|run| (run.first, run.count)).collect()
    }

    fn delta<'a>(b: &'a ClusterMap, t: &'a ClusterMap, from: u64, end: u64) -> ClusterRuns<'a> {
        let source = Source::Delta {
            base: entries(b, from),
            target: entries(t, from),
        };
        ClusterRuns::new(source, from, end)
    }

    #[test]
    fn allocated_runs_coalesce_consecutive_clusters_only() {
        let m = map(&[(0, 9), (1, 3), (2, 4), (5, 5), (7, 1), (8, 2)]);
        let all = ClusterRuns::new(Source::Allocated(entries(&m, 0)), 0, 10);
        assert_eq!(runs(all), [(0, 3), (5, 1), (7, 2)]);
        let from = ClusterRuns::new(Source::Allocated(entries(&m, 2)), 2, 10);
        assert_eq!(runs(from), [(2, 1), (5, 1), (7, 2)]);
        let cut = ClusterRuns::new(Source::Allocated(entries(&m, 0)), 0, 8);
        assert_eq!(runs(cut), [(0, 3), (5, 1), (7, 1)]);
    }

    #[test]
    fn delta_reports_remaps_trims_and_first_writes_but_not_shared_clusters() {
        // 0 shared, 1 copied on write, 2 trimmed in the target, 3 first written in the target,
        // 4 shared, 6 written past the base's end.
        let b = map(&[(0, 10), (1, 11), (2, 12), (4, 14)]);
        let t = map(&[(0, 10), (1, 21), (3, 23), (4, 14), (6, 26)]);
        assert_eq!(runs(delta(&b, &t, 0, 8)), [(1, 3), (6, 1)]);
        // Base newer than target gives the same clusters: the relation is symmetric.
        assert_eq!(runs(delta(&t, &b, 0, 8)), [(1, 3), (6, 1)]);
        assert_eq!(runs(delta(&b, &b, 0, 8)), []);
    }

    #[test]
    fn a_budgeted_walk_resumes_where_it_stopped_and_finds_the_same_runs() {
        // 1000 clusters, every third one remapped, some runs of two.
        let b: ClusterMap = (0..1000).map(|vc| (vc, vc)).collect();
        let t: ClusterMap = (0..1000)
            .map(|vc| (vc, if vc % 3 == 0 || vc % 7 == 0 { vc + 5000 } else { vc }))
            .collect();
        let whole = runs(delta(&b, &t, 0, 1000));
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        let mut from = 0;
        let mut walks = 0;
        loop {
            let mut walk = delta(&b, &t, from, 1000).with_budget(17);
            for run in walk.by_ref() {
                // A run cut by the budget continues in the next walk: join them.
                match pieces.last_mut() {
                    Some(last) if last.0 + last.1 == run.first => last.1 += run.count,
                    _ => pieces.push((run.first, run.count)),
                }
            }
            assert!(walk.visited() <= 17 + 1, "a walk examined {}", walk.visited());
            walks += 1;
            if walk.finished() {
                break;
            }
            assert!(walk.resume_at() > from, "no progress at {from}");
            from = walk.resume_at();
        }
        assert_eq!(pieces, whole);
        assert!(walks > 1000 / 17);
    }
}
