//! Allocated and changed clusters of snapshots, on a real pool: what a backup tool rebuilds from
//! them equals the snapshot, and the changed set is exactly the clusters touched in between.
// Host-only test code on 64-bit machines: byte counts of test devices fit in usize.
#![allow(clippy::cast_possible_truncation)]

use crate::common;

use std::collections::BTreeSet;

use common::{ram_pool, read, write, CLUSTER};
use edgevol_core::*;

const CS: u64 = CLUSTER as u64;

/// A small deterministic generator (xorshift): distinct bytes for every write.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn clusters(runs: ClusterRuns<'_>) -> BTreeSet<u64> {
    runs.flat_map(|r| r.first..r.end()).collect()
}

#[test]
fn allocated_clusters_are_the_written_ones() {
    let mut pool = ram_pool(64);
    let v = pool.create_volume(VolumeSpec::new("v", 32 * CS)).unwrap();
    write(&mut pool, v, 0, &[1; 2 * CS as usize]).unwrap();
    write(&mut pool, v, 10 * CS + 512, &[2; 512]).unwrap();
    write(&mut pool, v, 20 * CS, &[3; 3 * CS as usize]).unwrap();
    let s = pool.create_snapshot(v, "s", 1).unwrap();
    let runs: Vec<ClusterRun> = pool.allocated_clusters(s, 0).unwrap().collect();
    assert_eq!(
        runs,
        [
            ClusterRun { first: 0, count: 2 },
            ClusterRun { first: 10, count: 1 },
            ClusterRun { first: 20, count: 3 },
        ]
    );
    let from_21: Vec<ClusterRun> = pool.allocated_clusters(s, 21).unwrap().collect();
    assert_eq!(from_21, [ClusterRun { first: 21, count: 2 }]);
    assert_eq!(
        pool.allocated_clusters(SnapshotId(999), 0).err(),
        Some(Error::NotFound(ObjectRef::Snapshot(SnapshotId(999))))
    );
}

#[test]
fn applying_the_changed_clusters_of_the_target_to_the_base_rebuilds_the_target() {
    for seed in 1..=20u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut pool = ram_pool(512);
        let size = 64 * CS;
        let v = pool.create_volume(VolumeSpec::new("v", size)).unwrap();
        for _ in 0..30 {
            let at = rng.below(size / 512 - 16) * 512;
            let len = (1 + rng.below(16)) * 512;
            let data: Vec<u8> = (0..len).map(|_| rng.next() as u8 | 1).collect();
            write(&mut pool, v, at, &data).unwrap();
        }
        let s1 = pool.create_snapshot(v, "s1", 1).unwrap();
        let base: BTreeSet<u64> = clusters(pool.allocated_clusters(s1, 0).unwrap());
        // The model: whether each cluster's content now differs from the base's.
        let mut differs = [false; 72];
        for _ in 0..10 {
            let first = rng.below(64);
            let count = (1 + rng.below(4)).min(64 - first);
            if rng.below(3) == 0 {
                // Deallocated: a change exactly where the base had data (a hole in both is not).
                pool.trim(v, first * CS, count * CS).unwrap();
                for c in first..first + count {
                    differs[c as usize] = base.contains(&c);
                }
            } else {
                let data: Vec<u8> = (0..count * CS).map(|_| rng.next() as u8 | 1).collect();
                write(&mut pool, v, first * CS, &data).unwrap();
                differs[first as usize..(first + count) as usize].fill(true);
            }
        }
        // Grow, and write past the base's end.
        pool.expand_volume(v, size + 8 * CS).unwrap();
        write(&mut pool, v, size + 2 * CS, &[9; 512]).unwrap();
        differs[64 + 2] = true;
        let s2 = pool.create_snapshot(v, "s2", 2).unwrap();

        let changed = clusters(pool.changed_clusters(s1, s2, 0).unwrap());
        let expected: BTreeSet<u64> = (0..72).filter(|&c| differs[c as usize]).collect();
        assert_eq!(changed, expected, "seed {seed}");

        // The backup: S1 whole, then S2's bytes at the changed clusters only.
        let mut image = read(&mut pool, s1, 0, size);
        image.resize((size + 8 * CS) as usize, 0);
        for run in pool.changed_clusters(s1, s2, 0).unwrap().collect::<Vec<_>>() {
            let bytes = read(&mut pool, s2, run.first * CS, run.count * CS);
            image[(run.first * CS) as usize..(run.end() * CS) as usize].copy_from_slice(&bytes);
        }
        assert_eq!(image, read(&mut pool, s2, 0, size + 8 * CS), "seed {seed}");
    }
}
