//! The fault device's discard outcomes, tear units and recordings: what core's crash tests rely on
//! (`core/tests/pool/crash.rs`, `crash_persist.rs`, `persist.rs` run on `FaultDevice<RamDevice>`).
// Test sizes are small constants.
#![allow(clippy::cast_possible_truncation)]

use edgevol_core::{BlockDevice, DeviceError, DeviceErrorKind};
use edgevol_hal::{
    DiscardMode, FaultConfig, FaultDevice, FaultEvent, RamDevice, Recording, TearUnit,
};

const BS: usize = 512;

fn dev(cfg: FaultConfig) -> FaultDevice<RamDevice> {
    FaultDevice::new(RamDevice::new(BS as u32, 16), cfg)
}

fn block(d: &mut impl BlockDevice, b: u64) -> Vec<u8> {
    let mut buf = vec![0u8; d.block_size() as usize];
    d.read(b, &mut buf).unwrap();
    buf
}

/// A block whose every byte differs from its neighbours' and from other stamps' bytes at the same
/// offset, so a tear point can be located to the byte.
fn stamped(stamp: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| stamp.wrapping_mul(37) ^ (i as u8))
        .collect()
}

#[test]
fn discards_forward_keep_old_or_pick_per_discard() {
    let mut d = dev(FaultConfig::default());
    d.write(0, &[7; 2 * BS]).unwrap();
    d.discard(0, 1).unwrap();
    assert_eq!(
        block(&mut d, 0),
        vec![0; BS],
        "forwarded: hal's RAM device reads zeros"
    );
    assert_eq!(block(&mut d, 1), vec![7; BS]);

    d.config_mut().discard = DiscardMode::KeepOld;
    d.discard(1, 1).unwrap();
    assert_eq!(block(&mut d, 1), vec![7; BS], "dropped: the old bytes stay");
    assert_eq!(d.stats().discards, 2);
    // Dropped or not, a bad range is refused with the inner device's error.
    assert_eq!(
        d.discard(15, 2).unwrap_err().kind(),
        DeviceErrorKind::OutOfBounds
    );

    d.config_mut().discard = DiscardMode::Random;
    d.start_recording();
    let (mut zeroed, mut kept) = (0, 0);
    for round in 0..64u8 {
        d.write(2, &[round | 1; BS]).unwrap();
        d.discard(2, 1).unwrap();
        let zero = block(&mut d, 2) == vec![0; BS];
        let Some(FaultEvent::Discard { forwarded, .. }) = d
            .recording()
            .unwrap()
            .events()
            .last()
            .map(|r| r.event.clone())
        else {
            panic!("the discard was not recorded last");
        };
        assert_eq!(forwarded, zero, "the recording says what the discard did");
        if zero {
            zeroed += 1;
        } else {
            kept += 1;
        }
    }
    assert!(zeroed > 10 && kept > 10, "zeroed {zeroed} kept {kept}");
}

#[test]
fn a_live_cut_tears_unflushed_blocks_at_the_tear_unit() {
    // 512-byte blocks: sector tears never split one; byte tears do, at any byte.
    for (tear, expect_torn) in [(TearUnit::Sector, false), (TearUnit::Byte, true)] {
        let mut torn = 0;
        for seed in 0..100 {
            let cfg = FaultConfig {
                seed,
                lose_unflushed: true,
                tear,
                ..Default::default()
            };
            let mut d = dev(cfg);
            d.write(0, &[0xAA; BS]).unwrap();
            d.cut_power().unwrap();
            d.power_on();
            let b = block(&mut d, 0);
            let new = b.iter().filter(|&&x| x == 0xAA).count();
            assert!(
                b.iter().all(|&x| x == 0xAA || x == 0),
                "{tear:?}: foreign bytes"
            );
            // New bytes form one run (a prefix or a suffix): the block was split once.
            let first = b.iter().position(|&x| x == 0xAA).unwrap_or(0);
            assert!(
                b[first..first + new].iter().all(|&x| x == 0xAA),
                "{tear:?} seed {seed}"
            );
            torn += u32::from(new != 0 && new != BS);
        }
        assert_eq!(torn > 0, expect_torn, "{tear:?}: {torn} torn blocks");
    }
}

/// A small run (tag = step): blocks 0 and 1 written, block 5 discarded, a flush; then block 0
/// rewritten, blocks 2 and 3 written, unflushed; then a write of `tear_blocks` blocks at block 4.
fn run(tear_blocks: u64) -> (Recording<RamDevice>, Vec<RamDevice>) {
    let mut d = FaultDevice::new(RamDevice::new(BS as u32, 8), FaultConfig::default());
    d.write(0, &vec![1; 8 * BS]).unwrap();
    d.flush().unwrap();
    d.start_recording();
    // The live device after each write, to compare with process-crash images.
    let mut after_writes = Vec::new();
    let steps: Vec<(u64, u8)> = vec![(0, 2), (1, 3), (0, 4), (2, 5), (3, 6)];
    for (tag, &(b, stamp)) in steps.iter().enumerate() {
        d.set_tag(tag as u64);
        d.write(b, &stamped(stamp, BS)).unwrap();
        after_writes.push(d.inner_mut().clone());
        if tag == 1 {
            d.discard(5, 1).unwrap();
            d.flush().unwrap();
        }
    }
    d.set_tag(9);
    d.write(4, &stamped(7, tear_blocks as usize * BS)).unwrap();
    after_writes.push(d.inner_mut().clone());
    (d.take_recording().unwrap(), after_writes)
}

#[test]
fn a_recording_logs_every_mutation_with_its_tag() {
    let (rec, _) = run(2);
    let kinds: Vec<(u64, &str)> = rec
        .events()
        .iter()
        .map(|r| {
            let kind = match r.event {
                FaultEvent::Write { .. } => "write",
                FaultEvent::Discard {
                    forwarded: true, ..
                } => "discard",
                FaultEvent::Discard { .. } => "dropped discard",
                FaultEvent::Flush => "flush",
            };
            (r.tag, kind)
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (0, "write"),
            (1, "write"),
            (1, "discard"),
            (1, "flush"),
            (2, "write"),
            (3, "write"),
            (4, "write"),
            (9, "write")
        ]
    );
    assert_eq!(
        block(&mut rec.base().clone(), 0),
        vec![1; BS],
        "the base is the content at the start"
    );
}

#[test]
fn process_crash_images_hold_every_write_up_to_the_cut() {
    let (rec, live) = run(2);
    let mut cuts = rec.cuts(1, TearUnit::Byte);
    let mut n = 0;
    while let Some(cut) = cuts.next_cut().unwrap() {
        assert!(matches!(
            rec.events()[cut.event].event,
            FaultEvent::Write { .. }
        ));
        assert_eq!(cuts.process_crash(), live[n], "cut {n}");
        n += 1;
    }
    assert_eq!(n, live.len());
    assert!(
        cuts.next_cut().unwrap().is_none(),
        "the walk stays at its end"
    );
}

#[test]
fn power_cut_images_keep_flushed_data_and_any_unflushed_versions_out_of_order() {
    let old = vec![1u8; BS];
    // Versions blocks 1 to 3 may hold at the last cut (the write of blocks 4 and 5).
    let allowed: [Vec<Vec<u8>>; 3] = [
        vec![stamped(3, BS)],              // flushed
        vec![stamped(5, BS), old.clone()], // unflushed: new or old
        vec![stamped(6, BS), old],
    ];
    let mut seen_out_of_order = false;
    let mut split_points = std::collections::BTreeSet::new();
    for seed in 0..300 {
        let (rec, _) = run(2);
        let mut cuts = rec.cuts(seed, TearUnit::Byte);
        let mut last = None;
        while cuts.next_cut().unwrap().is_some() {
            last = Some(cuts.power_cut().unwrap());
        }
        let mut image = last.unwrap();
        // Flushed and unflushed blocks.
        let b0 = block(&mut image, 0);
        assert!(
            b0 == stamped(4, BS) || b0 == stamped(2, BS),
            "seed {seed}: block 0 is neither its flushed version nor the one written since"
        );
        for (b, versions) in (1..).zip(&allowed) {
            assert!(
                versions.contains(&block(&mut image, b)),
                "seed {seed}: block {b}"
            );
        }
        // Block 3 (written after block 0's second version) survived where block 0's did not.
        seen_out_of_order |= b0 == stamped(2, BS) && block(&mut image, 3) == stamped(6, BS);
        // The write in flight: new bytes up to one split point, old after it.
        let mut flight = block(&mut image, 4);
        flight.extend(block(&mut image, 5));
        let new = stamped(7, 2 * BS);
        let split = flight
            .iter()
            .zip(&new)
            .position(|(a, b)| a != b)
            .unwrap_or(2 * BS);
        let before = [vec![1; BS], vec![0; BS]].concat();
        assert_eq!(
            flight[split..],
            before[split..],
            "seed {seed}: not a prefix"
        );
        split_points.insert(split);
    }
    assert!(
        seen_out_of_order,
        "no later version survived an earlier loss"
    );
    assert!(
        split_points.first() < Some(&BS) && split_points.contains(&(2 * BS)),
        "the write in flight landed whole and was cut in its first block: {split_points:?}"
    );
    assert!(
        split_points.iter().any(|s| s % BS != 0),
        "byte tears split a block"
    );
}

#[test]
fn sector_tears_split_only_at_sector_boundaries_and_intermediate_versions_survive() {
    // 4 KiB blocks: eight sectors each.
    const B: usize = 4096;
    let mut splits = std::collections::BTreeSet::new();
    let mut middle = 0;
    for seed in 0..200 {
        let mut d = FaultDevice::new(RamDevice::new(B as u32, 4), FaultConfig::default());
        d.start_recording();
        d.write(0, &stamped(1, B)).unwrap();
        d.write(0, &stamped(2, B)).unwrap();
        d.write(0, &stamped(3, B)).unwrap();
        d.write(1, &stamped(4, B)).unwrap();
        let rec = d.take_recording().unwrap();
        let mut cuts = rec.cuts(seed, TearUnit::Sector);
        let mut image = None;
        while cuts.next_cut().unwrap().is_some() {
            image = Some(cuts.power_cut().unwrap());
        }
        let mut image = image.unwrap();
        let b0 = block(&mut image, 0);
        assert!(
            [vec![0; B], stamped(1, B), stamped(2, B), stamped(3, B)].contains(&b0),
            "seed {seed}: block 0 is no version"
        );
        middle += u32::from(b0 == stamped(2, B));
        let b1 = block(&mut image, 1);
        let split = b1
            .iter()
            .zip(stamped(4, B))
            .position(|(a, b)| *a != b)
            .unwrap_or(B);
        assert!(b1[split..].iter().all(|&x| x == 0), "seed {seed}");
        splits.insert(split);
    }
    assert!(middle > 0, "an intermediate version never survived");
    assert!(splits.iter().all(|s| s % 512 == 0), "{splits:?}");
    assert!(splits.len() > 4, "{splits:?}");
}
