//! `Pool::format_discarding`: the data area is deallocated in bounded chunks with honest progress,
//! the pool it leaves works, and an interrupted run leaves a valid empty pool. `Pool::probe`.

use crate::common;

use std::collections::BTreeMap;

use common::{read, write};
use edgevol_core::*;

const BS: u32 = 4096;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A sparse device of any size: only written blocks take memory; discards are recorded.
#[derive(Debug)]
struct Sparse {
    blocks: u64,
    data: BTreeMap<u64, Vec<u8>>,
    discards: Vec<(u64, u64)>,
    /// A discard touching this block or beyond fails (`Io`), as a dying drive would.
    fail_from: Option<u64>,
}

impl Sparse {
    fn new(bytes: u64) -> Self {
        Self {
            blocks: bytes / u64::from(BS),
            data: BTreeMap::new(),
            discards: Vec::new(),
            fail_from: None,
        }
    }
}

impl ErrorType for Sparse {
    type Error = DeviceErrorKind;
}

impl BlockDevice for Sparse {
    fn block_size(&self) -> u32 {
        BS
    }
    fn block_count(&self) -> u64 {
        self.blocks
    }
    fn read(&mut self, block: u64, buf: &mut [u8]) -> Result<(), DeviceErrorKind> {
        device::check_io(self, block, buf.len())?;
        for (i, out) in buf.chunks_mut(BS as usize).enumerate() {
            match self.data.get(&(block + i as u64)) {
                Some(b) => out.copy_from_slice(b),
                None => out.fill(0),
            }
        }
        Ok(())
    }
    fn write(&mut self, block: u64, data: &[u8]) -> Result<(), DeviceErrorKind> {
        device::check_io(self, block, data.len())?;
        for (i, b) in data.chunks(BS as usize).enumerate() {
            self.data.insert(block + i as u64, b.to_vec());
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), DeviceErrorKind> {
        Ok(())
    }
    fn discard(&mut self, block: u64, count: u64) -> Result<(), DeviceErrorKind> {
        device::check_discard(self, block, count)?;
        if self.fail_from.is_some_and(|f| block + count > f) {
            return Err(DeviceErrorKind::Io);
        }
        self.data.retain(|b, _| !(block..block + count).contains(b));
        self.discards.push((block, count));
        Ok(())
    }
}

fn options() -> FormatOptions {
    FormatOptions::new([9; 16], 1 << 20)
}

/// Formats `dev` with progress; returns the pool and every progress report.
fn format(dev: Sparse) -> (Pool<Sparse>, Vec<Progress>) {
    let mut seen = Vec::new();
    let pool = Pool::format_discarding(dev, options(), &mut |p| seen.push(p)).unwrap();
    (pool, seen)
}

/// Merges discarded ranges into sorted, disjoint `[start, end)` ranges.
fn covered(discards: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = discards.iter().map(|&(b, n)| (b, b + n)).collect();
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, e) in ranges {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

#[test]
fn progress_is_monotonic_ends_at_total_and_every_data_block_is_discarded() {
    let mut dev = Sparse::new(8 * GIB);
    // A previous owner's data all over the device, past any metadata.
    for block in (0..dev.blocks).step_by(99_991) {
        dev.data.insert(block, vec![0xAB; BS as usize]);
    }
    let (mut pool, seen) = format(dev);
    let data_start = pool.data_offset() / u64::from(BS);
    let dev = pool.device_mut();
    let total = seen[0].total;
    assert_eq!(seen[0].done, 0, "starts at 0: {seen:?}");
    assert!(seen.iter().all(|p| p.total == total));
    assert!(seen.windows(2).all(|w| w[0].done < w[1].done), "strictly increasing");
    assert_eq!(seen.last().unwrap().done, total, "ends at total");
    assert!(
        total >= (dev.blocks - data_start) * u64::from(BS),
        "covers the data area"
    );
    // About a percent per step: a progress bar moves smoothly.
    assert!((100..=110).contains(&(seen.len() - 1)), "{} steps", seen.len() - 1);
    let data_ranges = covered(&dev.discards);
    assert!(
        data_ranges.iter().any(|&(s, e)| s <= data_start && e == dev.blocks),
        "data area [{data_start}, {}) discarded: {data_ranges:?}",
        dev.blocks
    );
    assert!(
        dev.data.keys().all(|&b| b < data_start),
        "no old data left in the data area"
    );
}

#[test]
fn a_huge_device_is_discarded_in_chunks_of_at_most_a_gib_on_chunk_boundaries() {
    let (mut pool, seen) = format(Sparse::new(300 * GIB));
    let total = seen[0].total;
    assert_eq!(seen.last().unwrap().done, total);
    let dev = pool.device_mut();
    let max_blocks = DISCARD_CHUNK_MAX / u64::from(BS);
    // The data-area discards: the format's own metadata discards come first.
    let tail = &dev.discards[dev.discards.len() - (seen.len() - 1)..];
    assert!(tail.iter().all(|&(_, n)| n <= max_blocks), "bounded chunks");
    assert!(
        tail[1..].iter().all(|&(b, _)| b % max_blocks == 0),
        "chunks start on absolute chunk boundaries"
    );
    assert_eq!(tail.iter().map(|&(_, n)| n * u64::from(BS)).sum::<u64>(), total);
    assert_eq!(tail.last().map(|&(b, n)| b + n), Some(dev.blocks), "up to the end");
}

#[test]
fn the_formatted_pool_opens_and_works() {
    let (pool, _) = format(Sparse::new(GIB));
    let uuid = pool.uuid();
    let mut pool = Pool::open(pool.into_device()).unwrap();
    assert_eq!(pool.uuid(), uuid);
    assert_eq!(pool.capacity().used, 0);
    let v = pool.create_volume(VolumeSpec::new("v", 4 * MIB)).unwrap();
    write(&mut pool, v, MIB, &[7; 8192]).unwrap();
    pool.flush().unwrap();
    let mut pool = Pool::open(pool.into_device()).unwrap();
    assert_eq!(read(&mut pool, v, MIB, 8192), vec![7; 8192]);
    assert_eq!(read(&mut pool, v, 0, 4096), vec![0; 4096]);
    assert_eq!(Pool::probe(pool.device_mut()), Ok(Some(uuid)));
}

#[test]
fn a_failing_discard_fails_the_format_but_leaves_a_valid_empty_pool() {
    let mut dev = Sparse::new(4 * GIB);
    dev.fail_from = Some(dev.blocks / 2);
    let mut seen = Vec::new();
    let err = Pool::format_discarding(&mut dev, options(), &mut |p| seen.push(p)).unwrap_err();
    assert_eq!(err, Error::Device(DeviceErrorKind::Io));
    let last = seen.last().unwrap();
    assert!(0 < last.done && last.done < last.total, "stopped part way: {last:?}");
    // What an interruption (error, power cut, Ctrl-C) at that point leaves: an empty pool.
    dev.fail_from = None;
    let pool = Pool::open(&mut dev).unwrap();
    assert_eq!(pool.uuid(), [9; 16]);
    assert_eq!(pool.capacity().used, 0);
}

#[test]
fn probe_reads_without_writing_and_tells_pools_from_anything_else() {
    let mut blank = Sparse::new(GIB);
    assert_eq!(Pool::probe(&mut blank), Ok(None));
    blank.data.insert(0, vec![0x5A; BS as usize]);
    assert_eq!(Pool::probe(&mut blank), Ok(None), "foreign data is not a pool");
    let pool = Pool::format(Sparse::new(GIB), options()).unwrap();
    let mut dev = pool.into_device();
    let before = (dev.data.clone(), dev.discards.len());
    assert_eq!(Pool::probe(&mut dev), Ok(Some([9; 16])));
    assert_eq!(
        (dev.data.clone(), dev.discards.len()),
        before,
        "nothing written or discarded"
    );
}
