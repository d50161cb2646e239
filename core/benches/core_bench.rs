//! Core benchmarks: prints a markdown table. Each figure comes with a baseline measured in the same
//! run, so ratios stay meaningful across machines.
// Host-only test code on 64-bit machines: byte counts of test devices fit in usize.
#![allow(clippy::cast_possible_truncation)]

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use edgevol_core::*;

/// A file-backed device with `fdatasync` as flush, as hal's file backend will do it.
struct FileDevice {
    file: File,
    blocks: u64,
}

impl ErrorType for FileDevice {
    type Error = DeviceErrorKind;
}

impl BlockDevice for FileDevice {
    fn block_size(&self) -> u32 {
        4096
    }
    fn block_count(&self) -> u64 {
        self.blocks
    }
    fn read(&mut self, block: u64, buf: &mut [u8]) -> Result<(), DeviceErrorKind> {
        device::check_io(self, block, buf.len())?;
        self.file
            .read_exact_at(buf, block * 4096)
            .map_err(|_| DeviceErrorKind::Io)
    }
    fn write(&mut self, block: u64, data: &[u8]) -> Result<(), DeviceErrorKind> {
        device::check_io(self, block, data.len())?;
        self.file
            .write_all_at(data, block * 4096)
            .map_err(|_| DeviceErrorKind::Io)
    }
    fn flush(&mut self) -> Result<(), DeviceErrorKind> {
        self.file.sync_data().map_err(|_| DeviceErrorKind::Io)
    }
    fn discard(&mut self, block: u64, count: u64) -> Result<(), DeviceErrorKind> {
        device::check_discard(self, block, count)
    }
}

/// Stores only written blocks: a 1 TiB pool in RAM.
struct SparseDevice {
    blocks: u64,
    data: HashMap<u64, Box<[u8]>>,
}

impl ErrorType for SparseDevice {
    type Error = DeviceErrorKind;
}

impl BlockDevice for SparseDevice {
    fn block_size(&self) -> u32 {
        4096
    }
    fn block_count(&self) -> u64 {
        self.blocks
    }
    fn read(&mut self, block: u64, buf: &mut [u8]) -> Result<(), DeviceErrorKind> {
        device::check_io(self, block, buf.len())?;
        for (i, chunk) in buf.chunks_mut(4096).enumerate() {
            match self.data.get(&(block + i as u64)) {
                Some(b) => chunk.copy_from_slice(b),
                None => chunk.fill(0),
            }
        }
        Ok(())
    }
    fn write(&mut self, block: u64, data: &[u8]) -> Result<(), DeviceErrorKind> {
        device::check_io(self, block, data.len())?;
        for (i, chunk) in data.chunks(4096).enumerate() {
            self.data.insert(block + i as u64, chunk.into());
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), DeviceErrorKind> {
        Ok(())
    }
    fn discard(&mut self, block: u64, count: u64) -> Result<(), DeviceErrorKind> {
        device::check_discard(self, block, count)?;
        if count < 1 << 16 {
            (block..block + count).for_each(|b| drop(self.data.remove(&b)));
        } else {
            self.data.retain(|b, _| !(block..block + count).contains(b));
        }
        Ok(())
    }
}

fn per_op(d: Duration, n: u64) -> f64 {
    d.as_nanos() as f64 / n as f64
}

fn row(what: &str, value: f64, unit: &str, baseline: &str, base: f64) {
    println!(
        "| {what} | {value:.1} {unit} | {baseline}: {base:.1} {unit} | {:.2}x |",
        value / base
    );
}

fn options(cluster: u32) -> FormatOptions {
    FormatOptions::new(*b"edgevol-bench-01", cluster)
}

fn lookup() {
    let mut pool = Pool::format(RamDevice::new(4096, 70_000), options(4096)).unwrap();
    let v = pool.create_volume(VolumeSpec::new("v", 60_000 * 4096)).unwrap();
    let mut segs = [WriteSegment::EMPTY; 64];
    for c in (0..60_000u64).step_by(60) {
        pool.map_write(v, c * 4096, 60 * 4096, &mut segs).unwrap();
    }
    let n = 2_000_000u64;
    let mut x = 1u64;
    let t = Instant::now();
    for _ in 0..n {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        let off = (x >> 16) % 60_000 * 4096;
        black_box(pool.map_read(v, off, 4096).unwrap().next());
    }
    let ours = per_op(t.elapsed(), n);
    let map: BTreeMap<u64, u64> = (0..60_000).map(|i| (i, i)).collect();
    let t = Instant::now();
    for _ in 0..n {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        black_box(map.get(&((x >> 16) % 60_000)));
    }
    let base = per_op(t.elapsed(), n);
    row(
        "map_read, 4 KiB, 60k mapped clusters",
        ours,
        "ns",
        "BTreeMap::get",
        base,
    );
    let t = Instant::now();
    for _ in 0..n {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        let off = (x >> 16) % 60_000 * 4096;
        black_box(pool.map_write(v, off, 4096, &mut segs[..1]).unwrap());
    }
    row(
        "map_write in place, 4 KiB",
        per_op(t.elapsed(), n),
        "ns",
        "BTreeMap::get",
        base,
    );
}

fn commit<D: BlockDevice>(label: &str, dev: D, raw: impl FnOnce() -> f64, n: u64) {
    let mut pool = Pool::format(dev, options(64 << 10)).unwrap();
    let v = pool.create_volume(VolumeSpec::new("v", 1 << 30)).unwrap();
    let t = Instant::now();
    for i in 0..n {
        if i % 2 == 0 {
            pool.publish(v, "nqn.2014-08.org.nvmexpress:uuid:bench", false).unwrap();
        } else {
            pool.unpublish(v, "nqn.2014-08.org.nvmexpress:uuid:bench").unwrap();
        }
    }
    row(
        label,
        per_op(t.elapsed(), n) / 1000.0,
        "µs",
        "raw 4 KiB write + flush",
        raw(),
    );
}

/// µs per first (allocating) 4 KiB write of a 4 KiB-cluster volume: map, data write, and with
/// `persist` the soft commit that makes it survive a process crash, `group` writers per commit.
/// `journal_bytes` 0: the default 8 MiB.
fn first_writes<D: BlockDevice>(dev: D, n: u64, persist: bool, group: u64, journal_bytes: u64) -> f64 {
    let options = FormatOptions {
        journal_bytes,
        ..options(4096)
    };
    let mut pool = Pool::format(dev, options).unwrap();
    pool.set_epoch(Epoch(*b"bench-boot-epoch")).unwrap();
    let v = pool.create_volume(VolumeSpec::new("v", n * 4096)).unwrap();
    let data = [7u8; 4096];
    let mut segs = [WriteSegment::EMPTY; 1];
    let mut tickets = Vec::new();
    let t = Instant::now();
    for i in 0..n {
        assert_eq!(pool.map_write(v, i * 4096, 4096, &mut segs).unwrap(), 1);
        let block = segs[0].device_offset / 4096;
        pool.device_mut().write(block, black_box(&data)).unwrap();
        tickets.push(pool.persist_ticket());
        if persist && tickets.len() as u64 == group {
            for t in tickets.drain(..) {
                pool.persist(t).unwrap();
            }
        }
    }
    let us = per_op(t.elapsed(), n) / 1000.0;
    pool.flush().unwrap();
    us
}

fn persist_file() {
    let path = std::env::temp_dir().join(format!("edgevol-bench-persist-{}", std::process::id()));
    let dev = || {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(1 << 30).unwrap();
        FileDevice {
            file,
            blocks: (1 << 30) / 4096,
        }
    };
    let n = 20_000;
    let big = 128 << 20; // more than n one-block frames: no checkpoint during the run
    let base = first_writes(dev(), n, false, 1, 0);
    row(
        "first 4 KiB write + persist (file, journal never full)",
        first_writes(dev(), n, true, 1, big),
        "µs",
        "without persist",
        base,
    );
    row(
        "first 4 KiB write + persist (file, 8 MiB journal)",
        first_writes(dev(), n, true, 1, 0),
        "µs",
        "without persist",
        base,
    );
    row(
        "first 4 KiB write + persist, 8 writers per commit (file, 8 MiB journal)",
        first_writes(dev(), n, true, 8, 0),
        "µs",
        "without persist",
        base,
    );
    std::fs::remove_file(path).ok();
}

fn open_10k() {
    let options = FormatOptions {
        checkpoint_bytes: 4 << 20,
        journal_bytes: 1 << 20,
        ..options(64 << 10)
    };
    let mut pool = Pool::format(RamDevice::new(4096, 8192), options).unwrap();
    for i in 0..10_000u64 {
        pool.create_volume(VolumeSpec::new(
            format!("pvc-{i:08}-0000-4000-8000-000000000000"),
            1 << 30,
        ))
        .unwrap();
    }
    let dev = pool.into_device();
    let t = Instant::now();
    let pool = Pool::open(dev.clone()).unwrap();
    let ours = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(pool.volume_count(), 10_000);
    let mut copy = dev.clone();
    let t = Instant::now();
    let mut buf = vec![0u8; 1 << 20];
    for c in 0..(5 << 20) / (1 << 20) {
        black_box(&mut copy).read(c * 256, black_box(&mut buf)).unwrap();
    }
    row(
        "open, 10,000 volumes (RAM)",
        ours,
        "ms",
        "read 5 MiB of metadata",
        t.elapsed().as_secs_f64() * 1000.0,
    );
}

fn snapshot_1tib() {
    let blocks = (1u64 << 40) / 4096 + (64 << 20) / 4096;
    let mut pool = Pool::format(
        SparseDevice {
            blocks,
            data: HashMap::new(),
        },
        options(1 << 20),
    )
    .unwrap();
    let v = pool.create_volume(VolumeSpec::new("big", 1 << 40)).unwrap();
    let written = (1u64 << 20) / 10; // 10% of 1 Mi clusters
    let mut segs = [WriteSegment::EMPTY; 1];
    for i in 0..written {
        pool.map_write(v, (i * 10) << 20, 1 << 20, &mut segs).unwrap();
    }
    pool.flush().unwrap();
    assert_eq!(pool.volume(v).unwrap().mapped_clusters(), written);
    let t = Instant::now();
    let s = pool.create_snapshot(v, "snap", 0).unwrap();
    let ours = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    let copy: BTreeMap<u64, u64> = (0..written).map(|i| (i, i)).collect();
    black_box(copy);
    row(
        "snapshot, 1 TiB thin, 10% written",
        ours,
        "ms",
        "build a 105k-entry BTreeMap",
        t.elapsed().as_secs_f64() * 1000.0,
    );
    assert_eq!(pool.snapshot(s).unwrap().mapped_clusters(), written);
}

fn main() {
    println!("| measurement | edgevol-core | baseline | ratio |");
    println!("|---|---|---|---|");
    lookup();
    commit(
        "metadata commit (RAM)",
        RamDevice::new(4096, 1 << 16),
        || {
            let mut d = RamDevice::new(4096, 16);
            let t = Instant::now();
            for i in 0..100_000u64 {
                black_box(&mut d).write(i % 16, black_box(&[1; 4096])).unwrap();
                black_box(&mut d).flush().unwrap();
            }
            per_op(t.elapsed(), 100_000) / 1000.0
        },
        100_000,
    );
    let dir = std::env::temp_dir();
    let path = dir.join(format!("edgevol-bench-{}", std::process::id()));
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.set_len(1 << 32).unwrap();
    let raw_file = file.try_clone().unwrap();
    commit(
        "metadata commit (file, fdatasync)",
        FileDevice { file, blocks: 1 << 20 },
        move || {
            let t = Instant::now();
            for i in 0..500u64 {
                raw_file.write_all_at(&[1; 4096], (1 << 31) + i * 4096).unwrap();
                raw_file.sync_data().unwrap();
            }
            per_op(t.elapsed(), 500) / 1000.0
        },
        500,
    );
    std::fs::remove_file(path).ok();
    persist_file();
    open_10k();
    snapshot_1tib();
}
