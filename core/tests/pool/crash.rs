//! Crash test: a workload of 2,000+ operations runs once on hal's fault device recording every
//! write, discard and flush (`edgevol_hal::FaultDevice::start_recording`, each event tagged with
//! the operation that issued it). Then, for EVERY write N of that recording, the device is rebuilt
//! as a power cut during write N would leave it (`Cuts::power_cut`): everything before the last
//! flush survives, each block written or discarded since survives or not (seeded random, so out
//! of order), and write N is torn part way through a block, at any byte (`TearUnit::Byte`: a
//! 512-byte block is one sector, so sector tears would never split one). Recovery must then
//! mount, hold exactly the acknowledged metadata (plus, possibly, the operation in flight, whole),
//! and return the last durable data of every block not written since.
//!
//! Seed: `CRASH_SEED=<n>` replays a run; the seed in use is printed.
// Host-only test code on 64-bit machines: byte counts of test devices fit in usize.
#![allow(clippy::cast_possible_truncation)]

use crate::common;

use std::collections::BTreeMap;
use std::rc::Rc;

use common::{read, write, FaultyRam, BLOCK, CLUSTER};
use edgevol_core::*;
use edgevol_hal::TearUnit;

const CS: u64 = CLUSTER as u64;
const BS: usize = BLOCK as usize;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Per object (volume or snapshot id), the stamp of the write each block last got (0: zeros).
type Data = BTreeMap<u64, Rc<Vec<u64>>>;

fn block_bytes(stamp: u64) -> Vec<u8> {
    if stamp == 0 {
        return vec![0; BS];
    }
    stamp.to_le_bytes().iter().copied().cycle().take(BS).collect()
}

/// Everything acknowledged metadata consists of, in a comparable form.
fn summary<D: BlockDevice>(pool: &Pool<D>) -> String {
    let vols: Vec<_> = pool
        .volumes(None)
        .map(|v| {
            (
                v.id(),
                v.name().to_owned(),
                v.size(),
                v.provisioning(),
                v.group(),
                v.publications().to_vec(),
            )
        })
        .collect();
    let snaps: Vec<_> = pool
        .snapshots(None)
        .map(|s| (s.id(), s.name().to_owned(), s.source_volume(), s.size()))
        .collect();
    let groups: Vec<_> = pool.groups(None).map(|g| g.id()).collect();
    let gsnaps: Vec<_> = pool
        .group_snapshots(None)
        .map(|g| (g.id(), g.snapshots().to_vec()))
        .collect();
    format!("{vols:?}{snaps:?}{groups:?}{gsnaps:?}")
}

struct OpRecord {
    /// Summary after the op.
    after: String,
    /// Data model when the op started.
    data_before: Data,
    /// Whether the op ends with a journal commit (and so flushes data first).
    commits: bool,
    /// Whether the op, once acknowledged, made all earlier data durable (a commit or a flush).
    durable: bool,
    /// (object, block, stamp) written by the op; trims write stamp 0.
    written: Vec<(u64, u64, u64)>,
}

struct Workload {
    rng: Rng,
    data: Data,
    stamp: u64,
    ops: Vec<OpRecord>,
    names: u64,
}

impl Workload {
    fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.rng.below(items.len() as u64) as usize])
    }

    fn run_op(&mut self, pool: &mut Pool<FaultyRam>) {
        let data_before = self.data.clone();
        let mut written = Vec::new();
        let vols: Vec<VolumeId> = pool.volumes(None).map(|v| v.id()).collect();
        let snaps: Vec<SnapshotId> = pool
            .snapshots(None)
            .filter(|s| s.group_snapshot().is_none())
            .map(|s| s.id())
            .collect();
        let groups: Vec<GroupId> = pool.groups(None).map(|g| g.id()).collect();
        let before = summary(pool);
        self.names += 1;
        let name = format!("o{}", self.names);
        let roll = self.rng.below(100);
        let commits = match roll {
            0..=44 => {
                // Data write of 1..=6 blocks.
                let Some(v) = self.pick(&vols) else {
                    return self.record(pool, data_before, false, written);
                };
                let size = pool.volume(v).unwrap().size();
                let blocks = 1 + self.rng.below(6);
                let start = self.rng.below(size / BS as u64 - blocks + 1);
                let mut buf = Vec::new();
                let entry = Rc::make_mut(self.data.get_mut(&v.0).unwrap());
                for b in start..start + blocks {
                    self.stamp += 1;
                    buf.extend(block_bytes(self.stamp));
                    entry[b as usize] = self.stamp;
                    written.push((v.0, b, self.stamp));
                }
                if write(pool, v, start * BS as u64, &buf).is_err() {
                    // Out of space: the pool maps all or none of a prefix; the test helper may
                    // have written part. Treat the blocks as unknown from now on.
                    for b in start..start + blocks {
                        Rc::make_mut(self.data.get_mut(&v.0).unwrap())[b as usize] = u64::MAX;
                    }
                }
                false
            }
            45..=54 => {
                pool.flush().unwrap();
                self.ops.push(OpRecord {
                    after: summary(pool),
                    data_before,
                    commits: false,
                    durable: true,
                    written,
                });
                return;
            }
            55..=64 => {
                let thick = self.rng.below(4) == 0;
                let clusters = 1 + self.rng.below(4);
                let mut spec = VolumeSpec::new(name, clusters * CS);
                if thick {
                    spec.provisioning = Provisioning::Thick;
                }
                if let Ok(v) = pool.create_volume(spec) {
                    self.data.insert(v.0, Rc::new(vec![0; (clusters * CS) as usize / BS]));
                }
                true
            }
            65..=71 => {
                if let Some(v) = self.pick(&vols) {
                    if pool.create_snapshot(v, &name, 0).is_ok() {
                        let s = pool.snapshot_by_name(&name).unwrap().id();
                        self.data.insert(s.0, self.data[&v.0].clone());
                    }
                }
                true
            }
            72..=76 => {
                if let Some(s) = self.pick(&snaps) {
                    pool.delete_snapshot(s).unwrap();
                    self.data.remove(&s.0);
                }
                true
            }
            77..=80 => {
                let src = if self.rng.below(2) == 0 {
                    self.pick(&snaps)
                        .map(|s| (ContentSource::Snapshot(s), s.0, pool.snapshot(s).unwrap().size()))
                } else {
                    self.pick(&vols)
                        .map(|v| (ContentSource::Volume(v), v.0, pool.volume(v).unwrap().size()))
                };
                if let Some((source, from, size)) = src {
                    let mut spec = VolumeSpec::new(name, size);
                    spec.source = Some(source);
                    let v = pool.create_volume(spec).unwrap();
                    self.data.insert(v.0, self.data[&from].clone());
                }
                true
            }
            81..=86 => {
                if let Some(v) = self.pick(&vols) {
                    if pool.volume(v).unwrap().group().is_none() && pool.delete_volume(v).is_ok() {
                        self.data.remove(&v.0);
                    }
                }
                true
            }
            87..=89 => {
                // Trim whole clusters of a thin volume.
                let thin: Vec<VolumeId> = vols
                    .iter()
                    .copied()
                    .filter(|&v| pool.volume(v).unwrap().provisioning() == Provisioning::Thin)
                    .collect();
                if let Some(v) = self.pick(&thin) {
                    let clusters = pool.volume(v).unwrap().size() / CS;
                    let c = self.rng.below(clusters);
                    pool.trim(v, c * CS, CS).unwrap();
                    let per = CS / BS as u64;
                    for b in c * per..(c + 1) * per {
                        Rc::make_mut(self.data.get_mut(&v.0).unwrap())[b as usize] = 0;
                        written.push((v.0, b, 0));
                    }
                }
                false
            }
            90..=91 => {
                if let Some(v) = self.pick(&vols) {
                    let size = pool.volume(v).unwrap().size() + CS;
                    if pool.expand_volume(v, size).is_ok() {
                        Rc::make_mut(self.data.get_mut(&v.0).unwrap()).resize(size as usize / BS, 0);
                    }
                }
                true
            }
            92..=94 => {
                if let Some(v) = self.pick(&vols) {
                    let host = format!("nqn.host{}", self.rng.below(2));
                    let _ = if self.rng.below(2) == 0 {
                        pool.publish(v, &host, false)
                    } else {
                        pool.unpublish(v, &host)
                    };
                }
                true
            }
            95..=96 => {
                match self.pick(&groups) {
                    Some(g) if groups.len() > 1 || self.rng.below(2) == 0 => {
                        let free: Vec<VolumeId> = vols
                            .iter()
                            .copied()
                            .filter(|&v| pool.volume(v).unwrap().group().is_none_or(|x| x == g))
                            .collect();
                        let members: Vec<VolumeId> = free
                            .iter()
                            .copied()
                            .filter(|_| self.rng.below(2) == 0)
                            .take(3)
                            .collect();
                        pool.set_group_members(g, &members).unwrap();
                    }
                    _ => drop(pool.create_group(&name, vec![]).unwrap()),
                }
                true
            }
            _ => {
                if let Some(g) = self.pick(&groups) {
                    if let Ok(gs) = pool.create_group_snapshot(g, &name, 0) {
                        for &s in pool.group_snapshot(gs).unwrap().snapshots() {
                            let src = pool.snapshot(s).unwrap().source_volume();
                            self.data.insert(s.0, self.data[&src.0].clone());
                        }
                    }
                }
                true
            }
        };
        // An op that changed nothing committed nothing.
        let commits = commits && summary(pool) != before;
        self.record(pool, data_before, commits, written)
    }

    fn record(&mut self, pool: &Pool<FaultyRam>, data_before: Data, commits: bool, written: Vec<(u64, u64, u64)>) {
        self.ops.push(OpRecord {
            after: summary(pool),
            data_before,
            commits,
            durable: commits,
            written,
        });
    }
}

#[test]
fn recovery_after_a_power_cut_at_every_write() {
    let seeds = match std::env::var("CRASH_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => vec![seed],
        None => vec![0x5eed_c0de, 2, 12345],
    };
    for seed in seeds {
        run(seed);
    }
}

fn run(seed: u64) {
    println!("CRASH_SEED={seed}");
    let data_clusters = 160u64;
    let blocks = 2 + 2 * 128 + 64 + 8 + data_clusters * CS / BS as u64;
    let mut pool = Pool::format(common::faulty_ram(blocks, seed), common::options(9)).unwrap();
    // Format flushed: what the device holds now is the durable base of every cut.
    pool.device_mut().start_recording();
    let empty = summary(&pool);

    let mut w = Workload {
        rng: Rng(seed | 1),
        data: Data::new(),
        stamp: 0,
        ops: Vec::new(),
        names: 0,
    };
    const OPS: usize = 2500;
    for k in 0..OPS {
        pool.device_mut().set_tag(k as u64);
        w.run_op(&mut pool);
    }
    let recording = pool.device_mut().take_recording().unwrap();
    let writes = common::recorded_writes(&recording);
    println!("{OPS} operations, {} events, {writes} writes", recording.events().len());
    assert!(writes >= OPS / 2, "workload too small to mean anything");

    let mut cuts = recording.cuts(seed.rotate_left(17), TearUnit::Byte);
    let mut checked_blocks = 0u64;
    let mut cut_count = 0;
    while let Some(cut) = cuts.next_cut().unwrap() {
        let image = cuts.power_cut().unwrap();
        checked_blocks += check_cut(cut.event, cut.tag as usize, image, &w.ops, &empty);
        cut_count += 1;
    }
    assert_eq!(cut_count, writes, "a cut at every write");
    println!("{writes} cuts recovered, {checked_blocks} durable blocks verified");
}

/// Opens the image of a cut during op `k` and checks it against what was acknowledged.
fn check_cut(event: usize, k: usize, image: edgevol_hal::RamDevice, ops: &[OpRecord], empty: &str) -> u64 {
    let mut pool = Pool::open(image).unwrap_or_else(|e| panic!("cut at event {event} (op {k}): open failed: {e:?}"));
    let got = summary(&pool);
    let acked = if k == 0 { empty } else { &ops[k - 1].after };
    let in_flight_landed = got == ops[k].after && got != *acked;
    assert!(
        got == *acked || got == ops[k].after,
        "cut at event {event} (op {k}): metadata is neither before nor after the op\n got {got}\n acked {acked}"
    );
    // Last op before k that made data durable.
    let j = (0..k).rev().find(|&j| ops[j].durable);
    let (reference, since) = if in_flight_landed && ops[k].commits {
        (&ops[k].data_before, k)
    } else {
        match j {
            Some(j) => (&ops[j].data_before, j),
            None => return 0,
        }
    };
    // Blocks written since may hold any of the stamps written to them (or a tear of two).
    let mut since_written: std::collections::HashMap<(u64, u64), Vec<u64>> = Default::default();
    for &(id, b, stamp) in ops[since..=k].iter().flat_map(|o| &o.written) {
        since_written.entry((id, b)).or_default().push(stamp);
    }
    let images: Vec<(ImageId, u64, u64)> = pool
        .volumes(None)
        .map(|v| (ImageId::from(v.id()), v.id().0, v.size()))
        .chain(
            pool.snapshots(None)
                .map(|s| (ImageId::from(s.id()), s.id().0, s.size())),
        )
        .collect();
    let mut checked = 0;
    for (image, id, size) in images {
        let Some(stamps) = reference.get(&id) else { continue };
        let bytes = read(&mut pool, image, 0, size);
        for (b, &stamp) in stamps.iter().enumerate() {
            let block = &bytes[b * BS..(b + 1) * BS];
            if stamp == u64::MAX {
                continue;
            }
            if let Some(allowed) = since_written.get(&(id, b as u64)) {
                // Each byte comes from the durable stamp or one written since (a torn block mixes
                // two); another object's data would not fit.
                let fits = |i: usize, byte: &u8| {
                    allowed
                        .iter()
                        .chain([&stamp])
                        .any(|s| s.to_le_bytes()[i % 8] == *byte || *s == 0 && *byte == 0)
                };
                assert!(
                    block.iter().enumerate().all(|(i, byte)| fits(i, byte)),
                    "cut at event {event} (op {k}): object {id} block {b} holds data never written there"
                );
                continue;
            }
            assert!(
                block == &block_bytes(stamp)[..],
                "cut at event {event} (op {k}): object {id} block {b} lost durable data (stamp {stamp}): got {:x} since {since} landed {in_flight_landed} j {j:?}", u64::from_le_bytes(block[..8].try_into().unwrap())
            );
            checked += 1;
        }
    }
    common::check_accounting(&pool);
    checked
}
