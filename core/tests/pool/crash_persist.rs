//! Crash test of the data path's commit protocol: several writers interleave allocating writes and
//! trims (lock: map + data write, take a ticket; lock again: `persist(ticket)`, then acknowledge),
//! with periodic `sync`s, host flushes and control operations. The workload runs once on hal's
//! fault device recording every write, discard and flush (`edgevol_hal::FaultDevice`, each event
//! tagged with the operation that issued it); then, for EVERY write N of that recording, two
//! crashes are rebuilt (`edgevol_hal::Cuts`):
//!
//! - **Process crash** (`Cuts::process_crash`): the device holds everything written up to and
//!   including write N (the page cache survives a killed process). Reopened in the same epoch,
//!   every write acknowledged before the operation in flight reads back exactly.
//! - **Power cut** (`Cuts::power_cut`): everything before the last flush survives, each block
//!   written (or discarded) since survives or not (seeded random, so later blocks may survive where
//!   earlier ones did not), and write N is torn part way through a block, at any byte
//!   (`TearUnit::Byte`). Reopened in another epoch, the pool opens, every write acknowledged before
//!   the last completed sync, flush or control operation reads back, and no block holds bytes its
//!   volume never wrote there (another volume's, or a freed cluster's).
//!
//! Discards leave zeros or the old bytes (`DiscardMode::Random`, decided once per discard for the
//! live run and every rebuilt crash alike), both allowed by the device contract.
//! Seed: `CRASH_SEED=<n>` replays a run; the seed in use is printed.
// Host-only test code on 64-bit machines: byte counts of test devices fit in usize.
#![allow(clippy::cast_possible_truncation)]

use crate::common;

use std::collections::BTreeMap;

use common::{read, FaultyRam, CLUSTER};
use edgevol_core::*;
use edgevol_hal::{DiscardMode, FaultEvent, TearUnit};

const CS: u64 = CLUSTER as u64;
const BS: usize = common::BLOCK as usize;
const PER_CLUSTER: u64 = CS / BS as u64;
const WRITERS: usize = 4;
const LIVE: Epoch = Epoch(*b"boot-of-the-run.");
const AFTER_POWER_CUT: Epoch = Epoch(*b"the-next-boot...");

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

fn block_bytes(stamp: u64) -> Vec<u8> {
    if stamp == 0 {
        return vec![0; BS];
    }
    stamp.to_le_bytes().iter().copied().cycle().take(BS).collect()
}

/// One version of a block: written (or trimmed, stamp 0) by op `issued`, acknowledged to the host
/// by op `acked` (a volume's or snapshot's initial content is acknowledged by its creation).
#[derive(Debug, Clone, Copy)]
struct Version {
    stamp: u64,
    issued: usize,
    acked: Option<usize>,
}

/// Per object (volume or snapshot id, never reused), per block, its versions in issue order.
/// Deleted objects stay: whether an object exists after a crash is the reopened pool's to say.
type Objects = BTreeMap<u64, Vec<Vec<Version>>>;

/// A writer between its two lock sections: mapped and written, waiting to persist.
struct Mapped {
    ticket: PersistTicket,
    /// (object, block, index of the version) to acknowledge once persisted.
    versions: Vec<(u64, usize, usize)>,
}

fn summary<D: BlockDevice>(pool: &Pool<D>) -> String {
    let vols: Vec<_> = pool
        .volumes(None)
        .map(|v| (v.id(), v.name().to_owned(), v.size(), v.provisioning()))
        .collect();
    let snaps: Vec<_> = pool
        .snapshots(None)
        .map(|s| (s.id(), s.name().to_owned(), s.source_volume(), s.size()))
        .collect();
    format!("{vols:?}{snaps:?}")
}

struct OpRecord {
    /// Summary after the op.
    after: String,
    /// Whether the op, once it returned, had made every earlier acknowledged write durable across
    /// a power cut (a sync, a flush, or a control operation that committed).
    durable: bool,
}

struct Workload {
    rng: Rng,
    objects: Objects,
    writers: Vec<Option<Mapped>>,
    stamp: u64,
    names: u64,
    ops: Vec<OpRecord>,
    acknowledged: u64,
    /// Persists that found their ticket covered by an earlier commit.
    covered: u64,
}

impl Workload {
    fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.rng.below(items.len() as u64) as usize])
    }

    /// A new object whose blocks start as `initial`, acknowledged by op `k`.
    fn create(&mut self, id: u64, initial: &[u64], k: usize) {
        let blocks = initial
            .iter()
            .map(|&stamp| {
                vec![Version {
                    stamp,
                    issued: k,
                    acked: Some(k),
                }]
            })
            .collect();
        self.objects.insert(id, blocks);
    }

    /// The content an object has now: the last version of each block.
    fn current(&self, id: u64) -> Vec<u64> {
        self.objects[&id].iter().map(|b| b.last().unwrap().stamp).collect()
    }

    fn run_op(&mut self, pool: &mut Pool<FaultyRam>, k: usize) {
        let before = summary(pool);
        let durable = match self.rng.below(100) {
            0..=59 => {
                self.writer_step(pool, k);
                false
            }
            60..=69 => {
                pool.sync().unwrap();
                assert!(!pool.needs_sync());
                true
            }
            70..=74 => {
                pool.flush().unwrap();
                true
            }
            _ => {
                self.control(pool, k);
                summary(pool) != before
            }
        };
        self.ops.push(OpRecord {
            after: summary(pool),
            durable,
        });
    }

    /// One lock section of one writer: either map + write (or trim) and take a ticket, or persist
    /// its ticket and acknowledge.
    fn writer_step(&mut self, pool: &mut Pool<FaultyRam>, k: usize) {
        let w = self.rng.below(WRITERS as u64) as usize;
        if let Some(job) = self.writers[w].take() {
            // Another writer's commit may have covered this one already (group commit).
            self.covered += u64::from(pool.is_persisted(job.ticket));
            pool.persist(job.ticket).unwrap();
            assert!(pool.is_persisted(job.ticket));
            for (id, b, i) in job.versions {
                self.objects.get_mut(&id).unwrap()[b][i].acked = Some(k);
                self.acknowledged += 1;
            }
            return;
        }
        let vols: Vec<(VolumeId, u64, Provisioning)> = pool
            .volumes(None)
            .map(|v| (v.id(), v.size(), v.provisioning()))
            .collect();
        let Some((v, size, provisioning)) = self.pick(&vols) else {
            return;
        };
        let blocks = size / BS as u64;
        let mut versions = Vec::new();
        if provisioning == Provisioning::Thin && self.rng.below(6) == 0 {
            let c = self.rng.below(size / CS);
            pool.trim(v, c * CS, CS).unwrap();
            for b in c * PER_CLUSTER..(c + 1) * PER_CLUSTER {
                versions.push(self.issue(v.0, b as usize, 0, k));
            }
        } else {
            let n = 1 + self.rng.below(12.min(blocks));
            let start = self.rng.below(blocks - n + 1);
            let stamps: Vec<u64> = (0..n)
                .map(|_| {
                    self.stamp += 1;
                    self.stamp
                })
                .collect();
            let data: Vec<u8> = stamps.iter().flat_map(|&s| block_bytes(s)).collect();
            let (done, result) = write_data(pool, v, start * BS as u64, &data);
            for (i, &stamp) in stamps.iter().enumerate().take(done / BS) {
                versions.push(self.issue(v.0, start as usize + i, stamp, k));
            }
            if result.is_err() {
                // Out of space: the command fails, nothing is acknowledged. What it wrote stays
                // (unacknowledged versions).
                return;
            }
        }
        let ticket = pool.persist_ticket();
        self.writers[w] = Some(Mapped { ticket, versions });
    }

    fn issue(&mut self, id: u64, b: usize, stamp: u64, k: usize) -> (u64, usize, usize) {
        let block = &mut self.objects.get_mut(&id).unwrap()[b];
        block.push(Version {
            stamp,
            issued: k,
            acked: None,
        });
        (id, b, block.len() - 1)
    }

    fn control(&mut self, pool: &mut Pool<FaultyRam>, k: usize) {
        self.names += 1;
        let name = format!("o{}", self.names);
        let vols: Vec<VolumeId> = pool.volumes(None).map(|v| v.id()).collect();
        let snaps: Vec<SnapshotId> = pool.snapshots(None).map(|s| s.id()).collect();
        match self.rng.below(10) {
            0..=2 => {
                let clusters = 1 + self.rng.below(4);
                let mut spec = VolumeSpec::new(name, clusters * CS);
                if self.rng.below(4) == 0 {
                    spec.provisioning = Provisioning::Thick;
                }
                if let Ok(v) = pool.create_volume(spec) {
                    self.create(v.0, &vec![0; (clusters * PER_CLUSTER) as usize], k);
                }
            }
            3 | 4 => {
                if let Some(v) = self.pick(&vols) {
                    if let Ok(s) = pool.create_snapshot(v, &name, 0) {
                        let content = self.current(v.0);
                        self.create(s.0, &content, k);
                    }
                }
            }
            5 => {
                if let Some(s) = self.pick(&snaps) {
                    pool.delete_snapshot(s).unwrap();
                }
            }
            6 => {
                if let Some(s) = self.pick(&snaps) {
                    let mut spec = VolumeSpec::new(name, pool.snapshot(s).unwrap().size());
                    spec.source = Some(ContentSource::Snapshot(s));
                    if let Ok(v) = pool.create_volume(spec) {
                        let content = self.current(s.0);
                        self.create(v.0, &content, k);
                    }
                }
            }
            7 | 8 => {
                if let Some(v) = self.pick(&vols) {
                    pool.delete_volume(v).unwrap();
                }
            }
            _ => {
                if let Some(v) = self.pick(&vols) {
                    let size = pool.volume(v).unwrap().size() + CS;
                    if pool.expand_volume(v, size).is_ok() {
                        let blocks = self.objects.get_mut(&v.0).unwrap();
                        let zero = Version {
                            stamp: 0,
                            issued: k,
                            acked: Some(k),
                        };
                        blocks.resize(size as usize / BS, vec![zero]);
                    }
                }
            }
        }
    }
}

/// The data path's write: map, prepare fresh clusters, write the data (all under the lock).
/// Returns the bytes written from the start, and whether all were.
fn write_data(pool: &mut Pool<FaultyRam>, vol: VolumeId, offset: u64, data: &[u8]) -> (usize, Result<()>) {
    let mut done = 0usize;
    while done < data.len() {
        let mut segs = [WriteSegment::EMPTY; 4];
        let n = match pool.map_write(vol, offset + done as u64, (data.len() - done) as u64, &mut segs) {
            Ok(n) => n,
            Err(e) => return (done, Err(e)),
        };
        for s in &segs[..n] {
            let dev = pool.device_mut();
            match s.prepare {
                Prepare::None => {}
                Prepare::Zero { device_offset } => dev.write(device_offset / BS as u64, &vec![0; CS as usize]).unwrap(),
                Prepare::Copy { from, to } => {
                    let mut buf = vec![0; CS as usize];
                    dev.read(from / BS as u64, &mut buf).unwrap();
                    dev.write(to / BS as u64, &buf).unwrap();
                }
            }
            let at = (s.offset - offset) as usize;
            dev.write(s.device_offset / BS as u64, &data[at..at + s.len as usize])
                .unwrap();
            done += s.len as usize;
        }
    }
    (done, Ok(()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    Process,
    PowerCut,
}

#[test]
fn acknowledged_writes_survive_a_process_crash_and_synced_ones_a_power_cut_at_every_write() {
    let seeds = match std::env::var("CRASH_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => vec![seed],
        None => vec![0x9e37_79b9, 77],
    };
    for seed in seeds {
        run(seed);
    }
}

fn run(seed: u64) {
    println!("CRASH_SEED={seed}");
    let data_clusters = 96u64;
    let blocks = 2 + 2 * 128 + 64 + 8 + data_clusters * PER_CLUSTER;
    let mut dev = common::faulty_ram(blocks, seed.rotate_left(7));
    dev.config_mut().discard = DiscardMode::Random;
    let mut pool = Pool::format(dev, common::options(5)).unwrap();
    pool.set_epoch(LIVE).unwrap();
    // Format flushed: what the device holds now is the durable base of every crash.
    pool.device_mut().start_recording();
    let empty = summary(&pool);

    let mut w = Workload {
        rng: Rng(seed | 1),
        objects: Objects::new(),
        writers: (0..WRITERS).map(|_| None).collect(),
        stamp: 0,
        names: 0,
        ops: Vec::new(),
        acknowledged: 0,
        covered: 0,
    };
    const OPS: usize = 1500;
    for k in 0..OPS {
        pool.device_mut().set_tag(k as u64);
        w.run_op(&mut pool, k);
    }
    let recording = pool.device_mut().take_recording().unwrap();
    let events = recording.events();
    let writes = common::recorded_writes(&recording);
    let flushes = events.iter().filter(|r| r.event == FaultEvent::Flush).count();
    let kept_discards = events
        .iter()
        .filter(|r| matches!(r.event, FaultEvent::Discard { forwarded: false, .. }))
        .count();
    println!(
        "{OPS} operations, {} acknowledged block versions, {} persists covered by another's commit, {} events, \
         {writes} writes, {flushes} flushes, {kept_discards} discards that kept the old bytes",
        w.acknowledged,
        w.covered,
        events.len()
    );
    assert!(
        writes >= OPS / 2 && w.acknowledged > OPS as u64,
        "workload too small to mean anything"
    );
    assert!(w.covered > 0, "no group commit happened");
    assert!(kept_discards > 0, "no discard left stale bytes");

    let mut cuts = recording.cuts(seed.rotate_left(17), TearUnit::Byte);
    let mut checked = [0u64; 2];
    let mut cut_count = 0;
    while let Some(cut) = cuts.next_cut().unwrap() {
        let (event, k) = (cut.event, cut.tag as usize);
        checked[0] += check_cut(event, k, cuts.process_crash(), Crash::Process, &w, &empty);
        checked[1] += check_cut(event, k, cuts.power_cut().unwrap(), Crash::PowerCut, &w, &empty);
        cut_count += 1;
    }
    assert_eq!(cut_count, writes, "two crashes at every write");
    println!(
        "{writes} writes x 2 crashes recovered; acknowledged blocks verified: {} after process crashes, {} after power cuts",
        checked[0], checked[1]
    );
    assert!(checked[0] > checked[1] && checked[1] > 0);
}

/// Opens the image of a crash during op `k` and checks it against what was acknowledged. Returns
/// how many blocks had to keep a version that a write or trim acknowledged.
fn check_cut(event: usize, k: usize, dev: edgevol_hal::RamDevice, crash: Crash, w: &Workload, empty: &str) -> u64 {
    let at = format!("{crash:?} at event {event} (op {k})");
    let epoch = match crash {
        Crash::Process => LIVE,
        Crash::PowerCut => AFTER_POWER_CUT,
    };
    let options = OpenOptions { epoch: Some(epoch) };
    let mut pool = Pool::open_with(dev, options).unwrap_or_else(|e| panic!("{at}: open failed: {e:?}"));
    assert!(!pool.needs_sync(), "{at}: open left something to seal");
    let got = summary(&pool);
    let acked = if k == 0 { empty } else { &w.ops[k - 1].after };
    assert!(
        got == *acked || got == w.ops[k].after,
        "{at}: metadata is neither before nor after the op\n got   {got}\n acked {acked}"
    );
    let landed = got == w.ops[k].after && got != *acked;
    // Versions acknowledged before this op must be there: all of them after a process crash;
    // after a power cut, those acknowledged before the last op that made them durable.
    let keep_before = match crash {
        Crash::Process => k,
        Crash::PowerCut if landed && w.ops[k].durable => k,
        Crash::PowerCut => (0..k).rev().find(|&j| w.ops[j].durable).unwrap_or(0),
    };
    let objects: Vec<(ImageId, u64, u64)> = pool
        .volumes(None)
        .map(|v| (ImageId::from(v.id()), v.id().0, v.size()))
        .chain(
            pool.snapshots(None)
                .map(|s| (ImageId::from(s.id()), s.id().0, s.size())),
        )
        .collect();
    let mut kept = 0;
    for (image, id, size) in objects {
        let model = &w.objects[&id];
        let bytes = read(&mut pool, image, 0, size);
        for (b, block) in bytes.chunks(BS).enumerate() {
            // Versions that exist at the cut; the last one acknowledged early enough, and any
            // later ones, may be there (the oldest version is the object's durable creation).
            let versions: Vec<&Version> = model[b].iter().filter(|v| v.issued <= k).collect();
            let floor = versions
                .iter()
                .rposition(|v| v.acked.is_some_and(|a| a < keep_before))
                .unwrap_or(0);
            kept += u64::from(floor > 0);
            let allowed: Vec<u64> = versions[floor..].iter().map(|v| v.stamp).collect();
            let fits = match crash {
                Crash::Process => allowed.iter().any(|&s| block == block_bytes(s)),
                // A block being written at the cut may mix two versions.
                Crash::PowerCut => block.iter().enumerate().all(|(i, byte)| {
                    allowed.iter().any(|&s| {
                        if s == 0 {
                            *byte == 0
                        } else {
                            s.to_le_bytes()[i % 8] == *byte
                        }
                    })
                }),
            };
            assert!(
                fits,
                "{at}: object {id} block {b} holds {:#x}.., allowed {allowed:?} (versions {:?})",
                u64::from_le_bytes(block[..8].try_into().unwrap()),
                versions
            );
        }
    }
    common::check_accounting(&pool);
    kept
}
