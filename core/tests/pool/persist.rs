//! Soft commits of the data path (`Pool::persist`), the periodic hard sync, and the replay rules
//! that tell a process crash (same epoch) from a power cut (another epoch).
//!
//! A "process crash" here is the device image as the pool left it (nothing lost: the page cache
//! survives), reopened in the same epoch; a "power cut" reopens in another epoch, with the journal
//! damaged by hand where a test needs un-flushed blocks lost. The device is hal's fault device over
//! hal's RAM device (`common::FaultyRam`): its recording lists the writes, its counters the
//! flushes, and `DiscardMode::KeepOld` leaves stale frames past the journal's tail.
// Host-only test code on 64-bit machines: byte counts of test devices fit in usize.
#![allow(clippy::cast_possible_truncation)]

use crate::common;

use common::{options, read, write, FaultyRam, BLOCK, CLUSTER};
use edgevol_core::*;
use edgevol_hal::{DiscardMode, FaultEvent};

const CS: u64 = CLUSTER as u64;
const BS: usize = BLOCK as usize;
/// Where the journal starts with `common::options`: two superblocks, two 128-block slots.
const JOURNAL: u64 = 2 + 2 * 128;
const JOURNAL_BLOCKS: u64 = 64;
const A: Epoch = Epoch([0xA; 16]);
const B: Epoch = Epoch([0xB; 16]);

type Dev = FaultyRam;

/// A device for `data_clusters` data clusters (plus metadata) recording every write from the
/// start. Discards zero until a test makes them keep the old bytes.
fn new_dev(data_clusters: u64) -> Dev {
    let blocks = JOURNAL + JOURNAL_BLOCKS + 8 + data_clusters * CS / BS as u64;
    let mut dev = common::faulty_ram(blocks, 0);
    dev.start_recording();
    dev
}

/// What the tests ask of the device about the pool's I/O.
trait Observed {
    /// Writes so far.
    fn writes(&self) -> usize;
    /// Flushes so far.
    fn flushes(&self) -> u64;
    /// Journal blocks written by the writes after the first `from`, as (journal-relative block,
    /// blocks).
    fn journal_writes(&self, from: usize) -> Vec<(u64, u64)>;
    /// Flips the first payload byte of the frame at journal block `at` (its CRC then fails).
    fn damage_frame(&mut self, at: u64);
}

impl Observed for Dev {
    fn writes(&self) -> usize {
        self.stats().writes as usize
    }

    fn flushes(&self) -> u64 {
        self.stats().flushes
    }

    fn journal_writes(&self, from: usize) -> Vec<(u64, u64)> {
        let recording = self.recording().expect("new_dev records");
        recording
            .events()
            .iter()
            .filter_map(|r| match &r.event {
                FaultEvent::Write { block, data } => Some((*block, (data.len() / BS) as u64)),
                _ => None,
            })
            .skip(from)
            .filter(|(b, _)| (JOURNAL..JOURNAL + JOURNAL_BLOCKS).contains(b))
            .map(|(b, n)| (b - JOURNAL, n))
            .collect()
    }

    fn damage_frame(&mut self, at: u64) {
        let ram = self.inner_mut();
        let mut block = vec![0; BS];
        ram.read_blocks(JOURNAL + at, &mut block).unwrap();
        block[56] ^= 0x10;
        ram.write_blocks(JOURNAL + at, &block).unwrap();
    }
}

/// A pool in epoch A with one thin volume of `clusters` clusters (created durably).
fn pool(clusters: u64) -> (Pool<Dev>, VolumeId) {
    let mut pool = Pool::format(new_dev(clusters + 4), options(3)).unwrap();
    pool.set_epoch(A).unwrap();
    let v = pool.create_volume(VolumeSpec::new("v", clusters * CS)).unwrap();
    (pool, v)
}

/// A whole-cluster write of `byte` at cluster `c`, persisted as the data path does it.
fn write_persisted(pool: &mut Pool<Dev>, v: VolumeId, c: u64, byte: u8) {
    write(pool, v, c * CS, &data(byte)).unwrap();
    let t = pool.persist_ticket();
    pool.persist(t).unwrap();
    assert!(pool.is_persisted(t));
}

fn reopen(pool: Pool<Dev>, epoch: Option<Epoch>) -> Result<Pool<Dev>> {
    Pool::open_with(pool.into_device(), OpenOptions { epoch })
}

/// The content of cluster `c` of `v`, in short: `Some(byte)` if every byte is `byte`.
fn cluster(pool: &mut Pool<Dev>, v: VolumeId, c: u64) -> Option<u8> {
    let bytes = read(pool, v, c * CS, CS);
    bytes.iter().all(|&b| b == bytes[0]).then_some(bytes[0])
}

fn filled(byte: u8) -> Option<u8> {
    Some(byte)
}

fn data(byte: u8) -> Vec<u8> {
    vec![byte; CS as usize]
}

#[test]
fn a_persisted_write_survives_a_process_crash_and_the_reopen_seals_it() {
    let (mut pool, v) = pool(4);
    let flushes = pool.device_mut().flushes();
    write_persisted(&mut pool, v, 0, 0x11);
    assert_eq!(pool.device_mut().flushes(), flushes, "a soft commit flushes nothing");
    assert!(pool.needs_sync());
    let mut pool = reopen(pool, Some(A)).unwrap();
    assert_eq!(cluster(&mut pool, v, 0), filled(0x11));
    assert!(!pool.needs_sync(), "open sealed the soft tail it trusted");
    // A power cut right after the reopen keeps it: the tail was sealed by a hard commit.
    let mut pool = reopen(pool, Some(B)).unwrap();
    assert_eq!(cluster(&mut pool, v, 0), filled(0x11));
    common::check_accounting(&pool);
}

#[test]
fn unsealed_soft_frames_are_dropped_in_another_epoch_or_without_one() {
    for epoch in [Some(B), None] {
        let (mut pool, v) = pool(4);
        write_persisted(&mut pool, v, 0, 0x22);
        write_persisted(&mut pool, v, 1, 0x23);
        let before = pool.capacity();
        let mut pool = reopen(pool, epoch).unwrap();
        assert_eq!(cluster(&mut pool, v, 0), filled(0), "{epoch:?}");
        assert_eq!(cluster(&mut pool, v, 1), filled(0), "{epoch:?}");
        assert_eq!(
            pool.capacity().used,
            before.used - 2 * CS,
            "the clusters are free again"
        );
        common::check_accounting(&pool);
    }
}

#[test]
fn soft_frames_sealed_by_sync_flush_or_a_control_op_are_kept_across_epochs() {
    let seals: [fn(&mut Pool<Dev>); 3] = [
        |p| p.sync().unwrap(),
        |p| p.flush().unwrap(),
        |p| assert!(p.create_volume(VolumeSpec::new("w", CS)).is_ok()),
    ];
    for (i, seal) in seals.iter().enumerate() {
        let (mut pool, v) = pool(4);
        write_persisted(&mut pool, v, 0, 0x31);
        write_persisted(&mut pool, v, 2, 0x32);
        seal(&mut pool);
        // After the seal, a further soft frame: dropped by a power cut, the sealed ones are not.
        write_persisted(&mut pool, v, 3, 0x33);
        let mut pool = reopen(pool, Some(B)).unwrap();
        assert_eq!(cluster(&mut pool, v, 0), filled(0x31), "seal {i}");
        assert_eq!(cluster(&mut pool, v, 2), filled(0x32), "seal {i}");
        assert_eq!(cluster(&mut pool, v, 3), filled(0), "seal {i}");
    }
}

#[test]
fn a_damaged_soft_frame_followed_by_intact_soft_frames_is_a_torn_tail() {
    let (mut pool, v) = pool(4);
    let from = pool.device_mut().writes();
    for c in 0..3 {
        write_persisted(&mut pool, v, c, 0x40 + c as u8);
    }
    let frames = pool.device_mut().journal_writes(from);
    assert_eq!(frames.len(), 3, "one frame per persist: {frames:?}");
    let mut dev = pool.into_device();
    // A power cut lost the first frame and kept the two after it.
    dev.damage_frame(frames[0].0);
    for epoch in [Some(A), Some(B), None] {
        let mut pool = Pool::open_with(dev.clone(), OpenOptions { epoch }).unwrap();
        for c in 0..3 {
            assert_eq!(cluster(&mut pool, v, c), filled(0), "{epoch:?}: cluster {c}");
        }
        common::check_accounting(&pool);
    }
}

#[test]
fn a_damaged_soft_frame_followed_by_an_intact_hard_frame_refuses_to_mount() {
    let (mut pool, v) = pool(4);
    let from = pool.device_mut().writes();
    write_persisted(&mut pool, v, 0, 0x51);
    write_persisted(&mut pool, v, 1, 0x52);
    pool.create_volume(VolumeSpec::new("w", CS)).unwrap();
    let frames = pool.device_mut().journal_writes(from);
    assert_eq!(frames.len(), 3, "{frames:?}");
    let mut dev = pool.into_device();
    dev.damage_frame(frames[0].0);
    // Format: checkpoint of sequence 0; "v" is frame 1, the soft frames 2 and 3, the create 4.
    for epoch in [Some(A), Some(B)] {
        assert_eq!(
            Pool::open_with(dev.clone(), OpenOptions { epoch }).err(),
            Some(Error::Corrupt(Corruption::JournalGap(2))),
            "the hard commit flushed the soft frame before it: its damage is corruption"
        );
    }
    // Damage to the second soft frame only: the first is replayed, the gap is at the second.
    dev.damage_frame(frames[0].0);
    dev.damage_frame(frames[1].0);
    assert_eq!(
        Pool::open_with(dev, OpenOptions { epoch: Some(B) }).err(),
        Some(Error::Corrupt(Corruption::JournalGap(3)))
    );
}

#[test]
fn group_commit_writes_one_frame_for_all_writers() {
    const WRITERS: u64 = 8;
    let (mut pool, v) = pool(WRITERS);
    // Each writer: (lock) map + data write, take its ticket (unlock). No journal I/O yet.
    let from = pool.device_mut().writes();
    let tickets: Vec<PersistTicket> = (0..WRITERS)
        .map(|c| {
            write(&mut pool, v, c * CS, &data(0x60 + c as u8)).unwrap();
            pool.persist_ticket()
        })
        .collect();
    assert!(pool.device_mut().journal_writes(from).is_empty());
    assert!(tickets.windows(2).all(|w| w[0] < w[1]));
    assert!(tickets.iter().all(|&t| !pool.is_persisted(t)));
    // Then each (lock) persist(ticket) (unlock), in any order: the first one writes everyone's.
    let (writes, flushes) = (pool.device_mut().writes(), pool.device_mut().flushes());
    for &t in tickets.iter().rev() {
        pool.persist(t).unwrap();
    }
    assert_eq!(pool.device_mut().writes() - writes, 1, "one journal append for all");
    assert_eq!(pool.device_mut().journal_writes(writes).len(), 1);
    assert_eq!(pool.device_mut().flushes(), flushes, "and no flush");
    assert!(tickets.iter().all(|&t| pool.is_persisted(t)));
    let mut pool = reopen(pool, Some(A)).unwrap();
    for c in 0..WRITERS {
        assert_eq!(cluster(&mut pool, v, c), filled(0x60 + c as u8));
    }
}

#[test]
fn an_in_place_write_into_a_cluster_another_write_allocated_persists_that_allocation() {
    let (mut pool, v) = pool(2);
    // Writer 1 allocates the cluster (its first half), writer 2 then writes the second half in
    // place: nothing new to record, but its data lives in writer 1's unpersisted allocation.
    write(&mut pool, v, 0, &vec![1; CS as usize / 2]).unwrap();
    let t1 = pool.persist_ticket();
    write(&mut pool, v, CS / 2, &vec![2; CS as usize / 2]).unwrap();
    let t2 = pool.persist_ticket();
    assert_eq!(t1, t2, "the in-place write recorded nothing");
    // Writer 2 acknowledges first: its ticket covers writer 1's allocation.
    pool.persist(t2).unwrap();
    let mut pool = reopen(pool, Some(A)).unwrap();
    assert!(
        read(&mut pool, v, 0, CS) == [vec![1; CS as usize / 2], vec![2; CS as usize / 2]].concat(),
        "both halves are back"
    );
}

#[test]
fn persist_without_an_epoch_commits_hard() {
    let (pool, v) = pool(2);
    let mut pool = reopen(pool, None).unwrap();
    assert_eq!(pool.current_epoch(), None);
    let flushes = pool.device_mut().flushes();
    write_persisted(&mut pool, v, 0, 0x71);
    assert!(pool.device_mut().flushes() > flushes);
    assert!(!pool.needs_sync());
    let mut pool = reopen(pool, Some(B)).unwrap();
    assert_eq!(cluster(&mut pool, v, 0), filled(0x71));
}

#[test]
fn trims_persist_softly_and_their_clusters_wait_for_a_hard_commit() {
    // Two volumes sharing two clusters of space: once both are written, `a`'s cluster is the only
    // one a trim can give back.
    let mut pool = Pool::format(new_dev(2), options(4)).unwrap();
    pool.set_epoch(A).unwrap();
    let a = pool.create_volume(VolumeSpec::new("a", CS)).unwrap();
    let b = pool.create_volume(VolumeSpec::new("b", 2 * CS)).unwrap();
    assert_eq!(pool.capacity().total, 2 * CS);
    write_persisted(&mut pool, a, 0, 0x81);
    write_persisted(&mut pool, b, 0, 0x82);
    pool.sync().unwrap();
    assert_eq!(pool.trim(a, 0, CS).unwrap(), CS);
    let t = pool.persist_ticket();
    pool.persist(t).unwrap();
    assert_eq!(pool.capacity().pending_free, CS, "soft: the free is not durable yet");
    assert!(
        matches!(write(&mut pool, b, CS, &data(0x83)), Err(Error::ResourceExhausted(_))),
        "a cluster whose free a power cut may revert is not handed to another volume"
    );
    // A process crash keeps the trim; a power cut may revert it, with a's data intact.
    let image = pool.device_mut().clone();
    let mut crashed = Pool::open_with(image.clone(), OpenOptions { epoch: Some(A) }).unwrap();
    assert_eq!(cluster(&mut crashed, a, 0), filled(0));
    let mut cut = Pool::open_with(image, OpenOptions { epoch: Some(B) }).unwrap();
    assert_eq!(cluster(&mut cut, a, 0), filled(0x81));
    // The hard sync makes the free durable and the cluster allocatable.
    pool.sync().unwrap();
    assert_eq!(pool.capacity().pending_free, 0);
    write_persisted(&mut pool, b, 1, 0x83);
    pool.sync().unwrap();
    let mut pool = reopen(pool, Some(B)).unwrap();
    assert_eq!(cluster(&mut pool, a, 0), filled(0));
    assert_eq!(cluster(&mut pool, b, 1), filled(0x83));
}

#[test]
fn sync_does_no_io_on_an_idle_pool() {
    let (mut pool, v) = pool(2);
    write_persisted(&mut pool, v, 0, 1);
    assert!(pool.needs_sync());
    pool.sync().unwrap();
    assert!(!pool.needs_sync());
    let (writes, flushes) = (pool.device_mut().writes(), pool.device_mut().flushes());
    pool.sync().unwrap();
    assert_eq!(
        (pool.device_mut().writes(), pool.device_mut().flushes()),
        (writes, flushes)
    );
    // An in-place overwrite records nothing but dirties data: the next sync flushes it.
    write(&mut pool, v, 0, &data(2)).unwrap();
    assert!(pool.is_persisted(pool.persist_ticket()));
    assert!(pool.needs_sync());
    pool.sync().unwrap();
    assert_eq!(
        pool.device_mut().flushes(),
        flushes + 1,
        "a data flush, no journal frame"
    );
    assert_eq!(pool.device_mut().writes(), writes + 1, "the data write only");
}

#[test]
fn changing_the_epoch_seals_the_old_epochs_frames() {
    let (mut pool, v) = pool(2);
    write_persisted(&mut pool, v, 0, 0x91);
    pool.set_epoch(B).unwrap();
    assert!(!pool.needs_sync());
    write_persisted(&mut pool, v, 1, 0x92);
    let mut pool = reopen(pool, Some(Epoch([0xC; 16]))).unwrap();
    assert_eq!(cluster(&mut pool, v, 0), filled(0x91), "sealed when the epoch changed");
    assert_eq!(cluster(&mut pool, v, 1), filled(0), "written in B, not sealed");
}

#[test]
fn a_full_journal_turns_a_soft_commit_into_a_checkpoint() {
    let (mut pool, v) = pool(2);
    let mut rounds = 0;
    loop {
        // Trim and rewrite: each round allocates, so each persist appends a frame.
        pool.trim(v, 0, CS).unwrap();
        let flushes = pool.device_mut().flushes();
        write_persisted(&mut pool, v, 0, rounds as u8);
        rounds += 1;
        if pool.device_mut().flushes() > flushes {
            break;
        }
        assert!(rounds < 1000, "the journal never filled");
        // Release the trimmed cluster so the next round can allocate.
        pool.sync().unwrap();
    }
    assert!(!pool.needs_sync(), "the checkpoint made everything durable");
    let mut pool = reopen(pool, Some(B)).unwrap();
    assert_eq!(cluster(&mut pool, v, 0), filled(rounds as u8 - 1));
    common::check_accounting(&pool);
}

#[test]
fn a_stale_frame_left_past_the_tail_is_never_replayed() {
    let (mut pool, v) = pool(4);
    pool.device_mut().config_mut().discard = DiscardMode::KeepOld;
    let from = pool.device_mut().writes();
    write_persisted(&mut pool, v, 0, 0xA1);
    write_persisted(&mut pool, v, 1, 0xA2);
    let frames = pool.device_mut().journal_writes(from);
    let mut dev = pool.into_device();
    // The first soft frame torn, the second intact: the tail ends before both. The discard past
    // it leaves the second in place.
    dev.damage_frame(frames[0].0);
    let mut pool = Pool::open_with(dev, OpenOptions { epoch: Some(A) }).unwrap();
    assert_eq!(cluster(&mut pool, v, 1), filled(0));
    // The next frame lands where the torn one was, same epoch, same size, next sequence number:
    // the stale frame after it has the right sequence number and epoch, but not the link.
    let from = pool.device_mut().writes();
    write_persisted(&mut pool, v, 2, 0xA3);
    assert_eq!(pool.device_mut().journal_writes(from), vec![frames[0]]);
    let mut pool = reopen(pool, Some(A)).unwrap();
    assert_eq!(cluster(&mut pool, v, 2), filled(0xA3));
    assert_eq!(cluster(&mut pool, v, 1), filled(0), "a dropped frame came back");
    common::check_accounting(&pool);
}
