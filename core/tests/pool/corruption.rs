//! Corruption: damaged metadata gives a clean `Err` from `open`, or a mount from the intact copy
//! holding a state the pool really had; never a panic.
// Host-only test code on 64-bit machines: byte counts of test devices fit in usize.
#![allow(clippy::cast_possible_truncation)]

use crate::common;

use common::{read, write, BLOCK, CLUSTER};
use edgevol_core::*;

const CS: u64 = CLUSTER as u64;

/// A pool with some history (enough commits for several checkpoints), the summaries of every
/// state it went through, and the end of its metadata area in bytes.
fn fixture() -> (RamDevice, Vec<String>, usize) {
    let mut pool = common::ram_pool(64);
    let mut states = vec![summary(&pool)];
    let g = pool.create_group("g", vec![]).unwrap();
    for i in 0..60u64 {
        let mut spec = VolumeSpec::new(format!("vol-{i}"), (1 + i % 3) * CS);
        spec.parameters = vec![("fs".into(), "ext4".into())];
        let v = pool.create_volume(spec).unwrap();
        states.push(summary(&pool));
        write(&mut pool, v, 0, &[i as u8 + 1; 512]).unwrap();
        if i % 5 == 0 {
            pool.create_snapshot(v, &format!("snap-{i}"), i).unwrap();
            states.push(summary(&pool));
        }
        if i % 7 == 0 {
            pool.set_group_members(g, &[v]).unwrap();
            states.push(summary(&pool));
        }
        if i % 4 == 3 {
            pool.delete_volume(VolumeId(v.0 - 1)).ok();
            states.push(summary(&pool));
        }
    }
    pool.flush().unwrap();
    let metadata_end = (2 + 2 * 128 + 64) * BLOCK as usize;
    (pool.into_device(), states, metadata_end)
}

fn summary<D: BlockDevice>(pool: &Pool<D>) -> String {
    let vols: Vec<_> = pool
        .volumes(None)
        .map(|v| (v.id(), v.name().to_owned(), v.size(), v.group()))
        .collect();
    let snaps: Vec<_> = pool
        .snapshots(None)
        .map(|s| (s.id(), s.name().to_owned(), s.source_volume()))
        .collect();
    format!("{vols:?}{snaps:?}")
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn random_flips_in_metadata_never_panic_nor_invent_a_state() {
    let (dev, states, end) = fixture();
    let last = states.last().unwrap().clone();
    let (mut errors, mut intact, mut older) = (0, 0, 0);
    let mut rng = Rng(0xC0FFEE);
    for _ in 0..3000 {
        let mut d = dev.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(end as u64) as usize;
            d.as_bytes_mut()[at] ^= 1 << rng.below(8);
        }
        match Pool::open(d) {
            Err(Error::Corrupt(_)) => errors += 1,
            Err(e) => panic!("unexpected error {e:?}"),
            Ok(mut pool) => {
                let s = summary(&pool);
                assert!(states.contains(&s), "mounted a state the pool never had");
                if s == last {
                    intact += 1
                } else {
                    older += 1
                }
                common::check_accounting(&pool);
                for v in pool.volumes(None).map(|v| (v.id(), v.size())).collect::<Vec<_>>() {
                    read(&mut pool, v.0, 0, v.1);
                }
            }
        }
    }
    println!("{errors} refused, {intact} recovered intact, {older} recovered an earlier state (damaged tail)");
    assert!(intact > errors, "most flips land in redundant or unused metadata");
}

#[test]
fn one_bad_superblock_uses_the_other_two_refuse() {
    let (dev, states, _) = fixture();
    let bs = BLOCK as usize;
    for copy in 0..2 {
        let mut d = dev.clone();
        d.as_bytes_mut()[copy * bs + 20] ^= 0x40;
        assert_eq!(summary(&Pool::open(d).unwrap()), *states.last().unwrap());
    }
    let mut d = dev.clone();
    d.as_bytes_mut()[20] ^= 0x40;
    d.as_bytes_mut()[bs + 20] ^= 0x40;
    assert_eq!(Pool::open(d).err(), Some(Error::Corrupt(Corruption::NoSuperblock)));
    assert_eq!(
        Pool::open(RamDevice::new(BLOCK, 4096)).err(),
        Some(Error::Corrupt(Corruption::NoSuperblock))
    );
}

#[test]
fn damaged_record_followed_by_intact_ones_refuses_to_mount() {
    let mut pool = common::ram_pool(16);
    // Fresh journal after a forced checkpoint is not needed: the first records follow the format.
    let a = pool.create_volume(VolumeSpec::new("a", CS)).unwrap();
    pool.create_volume(VolumeSpec::new("b", CS)).unwrap();
    pool.create_volume(VolumeSpec::new("c", CS)).unwrap();
    let mut dev = pool.into_device();
    let journal = (2 + 2 * 128) * BLOCK as usize;
    // Damage the payload of the first record (create "a"): its CRC fails, later ones are intact.
    dev.as_bytes_mut()[journal + 60] ^= 1;
    assert_eq!(
        Pool::open(dev.clone()).err(),
        Some(Error::Corrupt(Corruption::JournalGap(1)))
    );
    // Damage only the last record instead: indistinguishable from a torn write, so it is the end.
    dev.as_bytes_mut()[journal + 60] ^= 1;
    dev.as_bytes_mut()[journal + 2 * BLOCK as usize + 60] ^= 1;
    let pool = Pool::open(dev).unwrap();
    assert!(pool.volume(a).is_ok() && pool.volume_by_name("b").is_some() && pool.volume_by_name("c").is_none());
}
