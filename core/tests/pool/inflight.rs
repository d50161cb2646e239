//! I/O outside the pool's lock: tickets pin clusters, snapshots wait for in-flight writes.
//!
//! The device is shared (as the appliance's second handle shares the file) so a test can run a
//! ticket's I/O at any point of an interleaving: before, between or after other operations. The
//! seeded random test interleaves begin/land/complete with trims, deletions, snapshots, flushes
//! and allocating writes of other volumes against a byte model, and prints its seed on failure.
// Host-only test code on 64-bit machines: byte counts of test devices fit in usize.
#![allow(clippy::cast_possible_truncation)]

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::{check_accounting, options, read, write, BLOCK, CLUSTER};
use edgevol_core::*;

const CS: u64 = CLUSTER as u64;

/// A RAM device behind a shared handle.
#[derive(Debug, Clone)]
struct Shared(Arc<Mutex<RamDevice>>);

impl ErrorType for Shared {
    type Error = DeviceErrorKind;
}

impl BlockDevice for Shared {
    fn block_size(&self) -> u32 {
        self.0.lock().unwrap().block_size()
    }
    fn block_count(&self) -> u64 {
        self.0.lock().unwrap().block_count()
    }
    fn read(&mut self, block: u64, buf: &mut [u8]) -> Result<(), DeviceErrorKind> {
        self.0.lock().unwrap().read(block, buf)
    }
    fn write(&mut self, block: u64, data: &[u8]) -> Result<(), DeviceErrorKind> {
        self.0.lock().unwrap().write(block, data)
    }
    fn flush(&mut self) -> Result<(), DeviceErrorKind> {
        self.0.lock().unwrap().flush()
    }
    fn discard(&mut self, block: u64, count: u64) -> Result<(), DeviceErrorKind> {
        self.0.lock().unwrap().discard(block, count)
    }
}

fn shared_pool(data_clusters: u64) -> (Pool<Shared>, Shared) {
    let blocks = 2 + 2 * 128 + 64 + 8 + data_clusters * u64::from(CLUSTER / BLOCK);
    let dev = Shared(Arc::new(Mutex::new(RamDevice::new(BLOCK, blocks))));
    (Pool::format(dev.clone(), options(7)).unwrap(), dev)
}

fn dev_read(dev: &Shared, device_offset: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0; len as usize];
    dev.clone().read(device_offset / u64::from(BLOCK), &mut buf).unwrap();
    buf
}

fn dev_write(dev: &Shared, device_offset: u64, data: &[u8]) {
    dev.clone().write(device_offset / u64::from(BLOCK), data).unwrap();
}

/// Runs the device part of a read mapped by `begin_read`.
fn read_segments(dev: &Shared, segs: &[ReadSegment]) -> Vec<u8> {
    let mut out = Vec::new();
    for s in segs {
        match *s {
            ReadSegment::Zero { len } => out.resize(out.len() + len as usize, 0),
            ReadSegment::Data { device_offset, len } => out.extend(dev_read(dev, device_offset, len)),
        }
    }
    out
}

/// A detached write: its data goes to the mapped device offsets.
fn land(dev: &Shared, offset: u64, data: &[u8], segs: &[WriteSegment]) {
    for s in segs {
        assert_eq!(s.prepare, Prepare::None, "a detachable write has nothing to prepare");
        let at = (s.offset - offset) as usize;
        dev_write(dev, s.device_offset, &data[at..at + s.len as usize]);
    }
}

/// An allocating write: prepare steps, then data (what the caller does under the lock).
fn prepare_and_land(dev: &Shared, offset: u64, data: &[u8], segs: &[WriteSegment]) {
    for s in segs {
        match s.prepare {
            Prepare::None => {}
            Prepare::Zero { device_offset } => dev_write(dev, device_offset, &vec![0; CS as usize]),
            Prepare::Copy { from, to } => dev_write(dev, to, &dev_read(dev, from, CS)),
        }
        let at = (s.offset - offset) as usize;
        dev_write(dev, s.device_offset, &data[at..at + s.len as usize]);
    }
}

fn begin_write_all(pool: &mut Pool<Shared>, vol: VolumeId, offset: u64, len: u64) -> (Vec<WriteSegment>, IoTicket) {
    let mut segs = [WriteSegment::EMPTY; 8];
    let (n, t) = pool.begin_write(vol, offset, len, &mut segs).unwrap();
    assert_eq!(
        segs[..n].iter().map(|s| s.len).sum::<u64>(),
        len,
        "test writes fit one call"
    );
    (segs[..n].to_vec(), t)
}

fn begin_read_all(
    pool: &mut Pool<Shared>,
    image: impl Into<ImageId>,
    offset: u64,
    len: u64,
) -> (Vec<ReadSegment>, IoTicket) {
    let mut segs = [ReadSegment::Zero { len: 0 }; 8];
    let (n, t) = pool.begin_read(image, offset, len, &mut segs).unwrap();
    assert_eq!(
        segs[..n].iter().map(|s| s.len()).sum::<u64>(),
        len,
        "test reads fit one call"
    );
    (segs[..n].to_vec(), t)
}

#[test]
fn a_cluster_read_in_flight_is_not_reused_after_trim_and_flush() {
    let (mut pool, dev) = shared_pool(2);
    let a = pool.create_volume(VolumeSpec::new("a", 2 * CS)).unwrap();
    let b = pool.create_volume(VolumeSpec::new("b", 2 * CS)).unwrap();
    write(&mut pool, a, 0, &vec![0xaa; CS as usize]).unwrap();
    pool.flush().unwrap();
    let (segs, ticket) = begin_read_all(&mut pool, a, 0, CS);
    assert!(ticket.detachable());
    let ReadSegment::Data { device_offset, .. } = segs[0] else {
        panic!("{segs:?}")
    };
    assert_eq!(pool.pins_at(device_offset), 1);
    // While the read is in flight, the cluster is trimmed and the trim made durable.
    assert_eq!(pool.trim(a, 0, CS).unwrap(), CS);
    pool.flush().unwrap();
    assert_eq!(pool.capacity().pending_free, CS, "held by the read");
    // Another volume may take the one free cluster, but not the held one.
    write(&mut pool, b, 0, &vec![0xbb; CS as usize]).unwrap();
    assert!(matches!(
        write(&mut pool, b, CS, &vec![0xbc; CS as usize]),
        Err(Error::ResourceExhausted(_))
    ));
    // The read, running only now, still sees a's data.
    assert_eq!(read_segments(&dev, &segs), vec![0xaa; CS as usize]);
    pool.complete(ticket);
    assert_eq!(pool.pins_at(device_offset), 0);
    assert_eq!(pool.capacity().pending_free, 0);
    write(&mut pool, b, CS, &vec![0xbc; CS as usize]).unwrap();
    assert_eq!(
        read(&mut pool, b, 0, 2 * CS),
        [vec![0xbb; CS as usize], vec![0xbc; CS as usize]].concat()
    );
    check_accounting(&pool);
}

#[test]
fn a_write_in_flight_lands_in_its_own_cluster_even_after_delete_and_flush() {
    let (mut pool, dev) = shared_pool(2);
    let a = pool.create_volume(VolumeSpec::new("a", CS)).unwrap();
    let b = pool.create_volume(VolumeSpec::new("b", 2 * CS)).unwrap();
    write(&mut pool, a, 0, &vec![1; CS as usize]).unwrap();
    let (segs, ticket) = begin_write_all(&mut pool, a, 512, 512);
    assert!(ticket.detachable(), "a's own cluster: written in place");
    assert_eq!(pool.writes_in_flight(), 1);
    pool.delete_volume(a).unwrap();
    pool.flush().unwrap();
    write(&mut pool, b, 0, &vec![2; CS as usize]).unwrap();
    assert!(
        write(&mut pool, b, CS, &vec![3; CS as usize]).is_err(),
        "a's cluster is held"
    );
    land(&dev, 512, &[9; 512], &segs);
    pool.complete(ticket);
    assert_eq!(pool.writes_in_flight(), 0);
    assert_eq!(
        read(&mut pool, b, 0, CS),
        vec![2; CS as usize],
        "b untouched by a's late write"
    );
    write(&mut pool, b, CS, &vec![3; CS as usize]).unwrap();
    check_accounting(&pool);
}

#[test]
fn allocating_writes_are_not_detachable_and_pin_the_copy_source() {
    let (mut pool, _dev) = shared_pool(4);
    let a = pool.create_volume(VolumeSpec::new("a", CS)).unwrap();
    let (segs, t) = begin_write_all(&mut pool, a, 0, 512);
    assert!(
        !t.detachable(),
        "first write allocates: the new mapping is visible at once"
    );
    assert!(matches!(segs[0].prepare, Prepare::Zero { .. }));
    pool.complete(t);
    let s = pool.create_snapshot(a, "s", 0).unwrap();
    let (segs, t) = begin_write_all(&mut pool, a, 0, 512);
    let Prepare::Copy { from, to } = segs[0].prepare else {
        panic!("{segs:?}")
    };
    assert!(!t.detachable());
    assert_eq!((pool.pins_at(from), pool.pins_at(to)), (1, 1));
    pool.delete_snapshot(s).unwrap();
    pool.flush().unwrap();
    assert_eq!(pool.pins_at(from), 1, "the copy source stays pinned");
    assert_eq!(pool.capacity().pending_free, CS, "and held, not free");
    pool.complete(t);
    assert_eq!(pool.capacity().pending_free, 0);
    check_accounting(&pool);
}

/// A detached write waiting to land: offset, data, segments.
type Queued = (u64, Vec<u8>, Vec<WriteSegment>);

/// Lands every queued write when a snapshot asks.
#[derive(Debug, Default)]
struct Hook {
    dev: Mutex<Option<Shared>>,
    queue: Mutex<Vec<Queued>>,
    calls: Mutex<u32>,
}

impl Quiesce for Hook {
    fn wait_writes_landed(&self) {
        *self.calls.lock().unwrap() += 1;
        let dev = self.dev.lock().unwrap().clone().expect("device set");
        for (offset, data, segs) in self.queue.lock().unwrap().drain(..) {
            land(&dev, offset, &data, &segs);
        }
    }
}

#[test]
fn a_snapshot_waits_for_in_place_writes_in_flight_and_never_changes_after() {
    let (mut pool, dev) = shared_pool(8);
    let hook = Arc::new(Hook::default());
    *hook.dev.lock().unwrap() = Some(dev.clone());
    pool.set_quiesce(Box::new(hook.clone()));
    let a = pool.create_volume(VolumeSpec::new("a", 2 * CS)).unwrap();
    write(&mut pool, a, 0, &vec![1; 2 * CS as usize]).unwrap();
    pool.create_snapshot(a, "before", 0).unwrap();
    assert_eq!(*hook.calls.lock().unwrap(), 0, "nothing in flight: no wait");
    // Unshare cluster 0 again so the next write goes in place.
    write(&mut pool, a, 0, &vec![2; CS as usize]).unwrap();
    let (segs, ticket) = begin_write_all(&mut pool, a, 0, 1024);
    assert!(ticket.detachable());
    hook.queue.lock().unwrap().push((0, vec![3; 1024], segs));
    let s = pool.create_snapshot(a, "during", 0).unwrap();
    assert_eq!(*hook.calls.lock().unwrap(), 1);
    pool.complete(ticket);
    let mut expect = vec![3; 1024];
    expect.resize(CS as usize, 2);
    expect.resize(2 * CS as usize, 1);
    assert_eq!(
        read(&mut pool, s, 0, 2 * CS),
        expect,
        "the write in flight is in the snapshot"
    );
    // Later writes (copy-on-write now) leave it alone.
    write(&mut pool, a, 0, &vec![4; 2 * CS as usize]).unwrap();
    assert_eq!(read(&mut pool, s, 0, 2 * CS), expect);
    // A clone of a volume waits the same way.
    let (segs, ticket) = begin_write_all(&mut pool, a, CS, 512);
    hook.queue.lock().unwrap().push((CS, vec![5; 512], segs));
    let mut clone = VolumeSpec::new("c", 2 * CS);
    clone.source = Some(ContentSource::Volume(a));
    let c = pool.create_volume(clone).unwrap();
    assert_eq!(*hook.calls.lock().unwrap(), 2);
    pool.complete(ticket);
    assert_eq!(read(&mut pool, c, CS, 512), vec![5; 512]);
    // Reopen: the snapshot is durable with the data it shows.
    pool.flush().unwrap();
    let mut pool = Pool::open(pool.into_device()).unwrap();
    assert_eq!(read(&mut pool, s, 0, 2 * CS), expect);
    check_accounting(&pool);
}

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

const VOL_CLUSTERS: u64 = 3;

/// A read in flight: what it must return, unless a write to its volume landed meanwhile.
struct InRead {
    image: ImageId,
    segs: Vec<ReadSegment>,
    ticket: IoTicket,
    expect: Vec<u8>,
    tainted: bool,
}

/// A detached write in flight; `live` is false once a trim or delete overtook it (it then lands
/// in an orphaned cluster).
struct InWrite {
    vol: VolumeId,
    offset: u64,
    data: Vec<u8>,
    segs: Vec<WriteSegment>,
    ticket: IoTicket,
    live: bool,
}

fn interleaving(seed: u64) {
    let mut rng = Rng(seed | 1);
    let (mut pool, dev) = shared_pool(14);
    let mut vols: BTreeMap<VolumeId, Vec<u8>> = BTreeMap::new();
    let mut snaps: BTreeMap<SnapshotId, Vec<u8>> = BTreeMap::new();
    let mut reads: Vec<InRead> = Vec::new();
    let mut writes: Vec<InWrite> = Vec::new();
    let mut names = 0u32;
    let size = VOL_CLUSTERS * CS;
    for step in 0..200 {
        let pick_vol = |rng: &mut Rng, vols: &BTreeMap<VolumeId, Vec<u8>>| {
            vols.keys().nth(rng.below(vols.len() as u64) as usize).copied()
        };
        let op = rng.below(11);
        if std::env::var_os("EDGEVOL_TRACE").is_some() {
            eprintln!("step {step} op {op} reads {} writes {}", reads.len(), writes.len());
        }
        match op {
            0 if vols.len() < 4 => {
                names += 1;
                let id = pool.create_volume(VolumeSpec::new(format!("v{names}"), size)).unwrap();
                vols.insert(id, vec![0; size as usize]);
            }
            1 | 2 => {
                // A write under the lock: it may allocate, so it runs to the end at once.
                let Some(v) = pick_vol(&mut rng, &vols) else { continue };
                let off = rng.below(size / 512) * 512;
                let data = vec![rng.below(255) as u8 + 1; 512];
                if std::env::var_os("EDGEVOL_TRACE").is_some() {
                    eprintln!("  write {v:?} {off} {}", data[0]);
                }
                match write(&mut pool, v, off, &data) {
                    Ok(()) => vols.get_mut(&v).unwrap()[off as usize..off as usize + 512].copy_from_slice(&data),
                    Err(Error::ResourceExhausted(_)) => {}
                    Err(e) => panic!("{e:?}"),
                }
                taint(&mut reads, v);
            }
            3 => {
                let Some(v) = pick_vol(&mut rng, &vols) else { continue };
                let off = rng.below(size / 512) * 512;
                let data = vec![rng.below(255) as u8 + 1; 512];
                let mut segs = [WriteSegment::EMPTY; 1];
                let ticket = match pool.begin_write(v, off, 512, &mut segs) {
                    Ok((1, t)) => t,
                    Err(Error::ResourceExhausted(_)) => continue,
                    other => panic!("{other:?}"),
                };
                let segs = segs.to_vec();
                if !ticket.detachable() {
                    // It allocated: prepare and write before anything else touches the pool.
                    prepare_and_land(&dev, off, &data, &segs);
                    pool.complete(ticket);
                    vols.get_mut(&v).unwrap()[off as usize..off as usize + 512].copy_from_slice(&data);
                    taint(&mut reads, v);
                    continue;
                }
                writes.push(InWrite {
                    vol: v,
                    offset: off,
                    data,
                    segs,
                    ticket,
                    live: true,
                });
            }
            4 if !writes.is_empty() => {
                let w = writes.remove(rng.below(writes.len() as u64) as usize);
                land(&dev, w.offset, &w.data, &w.segs);
                // A read of the volume in flight together with the write may see it either way,
                // even when a trim or delete overtook the write.
                taint(&mut reads, w.vol);
                if w.live {
                    vols.get_mut(&w.vol).unwrap()[w.offset as usize..w.offset as usize + 512].copy_from_slice(&w.data);
                }
                pool.complete(w.ticket);
            }
            5 => {
                let images: Vec<ImageId> = vols
                    .keys()
                    .map(|&v| ImageId::from(v))
                    .chain(snaps.keys().map(|&s| ImageId::from(s)))
                    .collect();
                if images.is_empty() {
                    continue;
                }
                let image = images[rng.below(images.len() as u64) as usize];
                let off = rng.below(size / 512) * 512;
                let len = (1 + rng.below(2 * CS / 512)).min((size - off) / 512) * 512;
                let content = match image {
                    ImageId::Volume(v) => &vols[&v],
                    ImageId::Snapshot(s) => &snaps[&s],
                };
                let expect = content[off as usize..(off + len) as usize].to_vec();
                let (segs, ticket) = begin_read_all(&mut pool, image, off, len);
                if std::env::var_os("EDGEVOL_TRACE").is_some() {
                    eprintln!("  begin read {image:?} {off}+{len} {segs:?}");
                }
                reads.push(InRead {
                    image,
                    segs,
                    ticket,
                    expect,
                    tainted: false,
                });
            }
            6 if !reads.is_empty() => {
                let r = reads.remove(rng.below(reads.len() as u64) as usize);
                let got = read_segments(&dev, &r.segs);
                if !r.tainted {
                    same(
                        &got,
                        &r.expect,
                        &format!("seed {seed} step {step}: read of {:?} in flight", r.image),
                    );
                }
                pool.complete(r.ticket);
            }
            7 => {
                let Some(v) = pick_vol(&mut rng, &vols) else { continue };
                let c = rng.below(VOL_CLUSTERS);
                pool.trim(v, c * CS, CS).unwrap();
                if std::env::var_os("EDGEVOL_TRACE").is_some() {
                    eprintln!("  trim {v:?} {c}");
                }
                vols.get_mut(&v).unwrap()[(c * CS) as usize..((c + 1) * CS) as usize].fill(0);
                for w in writes.iter_mut().filter(|w| w.vol == v && w.offset / CS == c) {
                    w.live = false;
                }
            }
            8 => {
                if rng.below(2) == 0 {
                    let Some(v) = pick_vol(&mut rng, &vols) else { continue };
                    pool.delete_volume(v).unwrap();
                    vols.remove(&v);
                    writes.iter_mut().filter(|w| w.vol == v).for_each(|w| w.live = false);
                } else if let Some(&s) = snaps.keys().nth(rng.below(snaps.len() as u64) as usize) {
                    pool.delete_snapshot(s).unwrap();
                    snaps.remove(&s);
                    // Its clusters may go back to the source volume alone, which then writes
                    // them in place: a read of the deleted snapshot still in flight may see that
                    // (never another volume's data: see the held clusters).
                    reads
                        .iter_mut()
                        .filter(|r| r.image == ImageId::Snapshot(s))
                        .for_each(|r| r.tainted = true);
                }
            }
            9 => {
                let Some(v) = pick_vol(&mut rng, &vols) else { continue };
                // No hook here: land every write first, as the hook would (its order is free).
                for w in writes.drain(..) {
                    land(&dev, w.offset, &w.data, &w.segs);
                    taint(&mut reads, w.vol);
                    if w.live {
                        vols.get_mut(&w.vol).unwrap()[w.offset as usize..w.offset as usize + 512]
                            .copy_from_slice(&w.data);
                    }
                    pool.complete(w.ticket);
                }
                names += 1;
                match pool.create_snapshot(v, &format!("s{names}"), 0) {
                    Ok(s) => {
                        snaps.insert(s, vols[&v].clone());
                    }
                    Err(Error::ResourceExhausted(_)) => {}
                    Err(e) => panic!("{e:?}"),
                }
            }
            _ => pool.flush().unwrap(),
        }
        check_accounting(&pool);
        for (&v, content) in &vols {
            same(
                &read(&mut pool, v, 0, size),
                content,
                &format!("seed {seed} step {step}: volume {v:?}"),
            );
        }
        for (&s, content) in &snaps {
            same(
                &read(&mut pool, s, 0, size),
                content,
                &format!("seed {seed} step {step}: snapshot {s:?}"),
            );
        }
    }
    for r in reads {
        pool.complete(r.ticket);
    }
    for w in writes {
        pool.complete(w.ticket);
    }
    pool.flush().unwrap();
    assert_eq!(pool.capacity().pending_free, 0, "seed {seed}: every pin released");
    assert_eq!(pool.writes_in_flight(), 0);
}

/// Equal bytes; on failure names the first difference instead of printing kilobytes.
fn same(got: &[u8], want: &[u8], what: &str) {
    if let Some(i) = (0..got.len().max(want.len())).find(|&i| got.get(i) != want.get(i)) {
        panic!("{what}: byte {i} is {:?}, want {:?}", got.get(i), want.get(i));
    }
}

fn taint(reads: &mut [InRead], v: VolumeId) {
    reads
        .iter_mut()
        .filter(|r| r.image == ImageId::Volume(v))
        .for_each(|r| r.tainted = true);
}

#[test]
fn random_interleavings_of_in_flight_io_with_trims_deletes_snapshots_and_flushes() {
    if let Some(seed) = std::env::var("EDGEVOL_SEED").ok().and_then(|s| s.parse().ok()) {
        return interleaving(seed);
    }
    for i in 0..200 {
        let base = 0x5eed_u64;
        interleaving(base.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
}
