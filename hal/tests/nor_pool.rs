//! Core's own pool and journal on raw NOR flash: a pool formatted on [`NorBlockDevice`] over the
//! NOR simulator (4 KiB erase blocks as core's blocks), volumes and a snapshot created, data
//! written through `map_write` the way a flash data path must (erase, then program), reopened;
//! then a power cut at every program or erase of a workload, each followed by power-on, reopen and
//! a check that everything acknowledged is there.
#![cfg(feature = "nor-flash")]
// Test sizes are small constants.
#![allow(clippy::cast_possible_truncation)]

use edgevol_core::{
    BlockDevice, DeviceErrorKind, Error, FormatOptions, Pool, Prepare, ReadSegment, VolumeId,
    VolumeSpec, WriteSegment,
};
use edgevol_hal::{NorBlockDevice, NorSim};

type Flash = NorSim<4, 4096>;
type Dev = NorBlockDevice<Flash>;

const BS: u64 = 4096;
/// 1 MiB of flash: 2 superblocks, 2 x 8 checkpoint blocks, 16 journal blocks, 222 data clusters.
const ERASE_BLOCKS: usize = 256;
const KIB: u64 = 1024;

fn options(uuid: u8) -> FormatOptions {
    FormatOptions {
        checkpoint_bytes: 32 * KIB,
        journal_bytes: 64 * KIB,
        ..FormatOptions::new([uuid; 16], BS as u32)
    }
}

fn format(seed: u64) -> Pool<Dev> {
    Pool::format(
        NorBlockDevice::new(Flash::new(ERASE_BLOCKS, seed)),
        options(seed as u8),
    )
    .expect("format on NOR")
}

/// Power back on (if cut) and mount again.
fn reopen(pool: Pool<Dev>) -> Result<Pool<Dev>, Error> {
    let mut flash = pool.into_device().into_flash();
    flash.power_on();
    Pool::open(NorBlockDevice::new(flash))
}

fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

fn device(e: impl edgevol_core::DeviceError) -> Error {
    Error::Device(e.kind())
}

/// Writes `data` at `offset` of `vol` as a NOR data path does: core maps; each cluster (one
/// erase block) is composed whole (zero-fill, copy-on-write source or its current content under
/// the new bytes), erased unless still erased, then programmed.
fn write(pool: &mut Pool<Dev>, vol: VolumeId, offset: u64, data: &[u8]) -> Result<(), Error> {
    let mut done = 0u64;
    while done < data.len() as u64 {
        let mut segs = [WriteSegment::EMPTY; 8];
        let n = pool.map_write(vol, offset + done, data.len() as u64 - done, &mut segs)?;
        for s in &segs[..n] {
            let within = s.device_offset % BS;
            let target = (s.device_offset - within) / BS;
            let dev = pool.device_mut();
            let mut current = vec![0u8; BS as usize];
            dev.read(target, &mut current).map_err(device)?;
            let mut block = match s.prepare {
                Prepare::Zero { .. } => vec![0u8; BS as usize],
                Prepare::Copy { from, .. } => {
                    let mut source = vec![0u8; BS as usize];
                    dev.read(from / BS, &mut source).map_err(device)?;
                    source
                }
                Prepare::None => current.clone(),
            };
            let src = (s.offset - offset) as usize;
            block[within as usize..(within + s.len) as usize]
                .copy_from_slice(&data[src..src + s.len as usize]);
            if current.iter().any(|&b| b != 0xFF) {
                dev.discard(target, 1).map_err(device)?;
            }
            dev.write(target, &block).map_err(device)?;
            done += s.len;
        }
    }
    Ok(())
}

/// Reads `len` bytes at `offset` of a volume or snapshot.
fn read(
    pool: &mut Pool<Dev>,
    image: impl Into<edgevol_core::ImageId>,
    offset: u64,
    len: u64,
) -> Vec<u8> {
    let segments: Vec<ReadSegment> = pool.map_read(image, offset, len).unwrap().collect();
    let mut out = Vec::new();
    for seg in segments {
        match seg {
            ReadSegment::Zero { len } => out.resize(out.len() + len as usize, 0),
            ReadSegment::Data { device_offset, len } => {
                // Contiguous clusters come as one segment: read the blocks it spans.
                let within = device_offset % BS;
                let blocks = (within + len).div_ceil(BS);
                let mut buf = vec![0u8; (blocks * BS) as usize];
                pool.device_mut()
                    .read(device_offset / BS, &mut buf)
                    .unwrap();
                out.extend_from_slice(&buf[within as usize..(within + len) as usize]);
            }
        }
    }
    out
}

#[test]
fn a_core_pool_formats_writes_snapshots_and_reopens_on_nor_flash() {
    let mut pool = format(1);
    let a = pool.create_volume(VolumeSpec::new("a", 64 * KIB)).unwrap();
    let b = pool.create_volume(VolumeSpec::new("b", 128 * KIB)).unwrap();
    // Whole clusters, a partial cluster (zero-filled around it) and b's last cluster.
    write(&mut pool, a, 0, &pattern(16 * KIB, 1)).unwrap();
    write(&mut pool, a, 20 * KIB + 512, &pattern(1536, 2)).unwrap();
    write(&mut pool, b, 124 * KIB, &pattern(4 * KIB, 3)).unwrap();
    pool.flush().unwrap();
    // A snapshot, then a partial overwrite of a: copy-on-write onto a fresh erase block.
    let snap = pool.create_snapshot(a, "a-1", 0).unwrap();
    write(&mut pool, a, 4 * KIB, &pattern(KIB, 4)).unwrap();
    // In place (a owns the new cluster alone now): erase, program.
    write(&mut pool, a, 4 * KIB + 2048, &pattern(512, 5)).unwrap();
    pool.flush().unwrap();

    let mut at_snapshot = pattern(16 * KIB, 1);
    at_snapshot.resize(64 * KIB as usize, 0);
    at_snapshot[20 * 1024 + 512..22 * 1024].copy_from_slice(&pattern(1536, 2));
    let mut expect_a = at_snapshot.clone();
    expect_a[4096..5120].copy_from_slice(&pattern(KIB, 4));
    expect_a[4096 + 2048..4096 + 2560].copy_from_slice(&pattern(512, 5));

    for round in 0..2 {
        assert_eq!(read(&mut pool, a, 0, 64 * KIB), expect_a, "round {round}");
        assert_eq!(
            read(&mut pool, snap, 0, 64 * KIB),
            at_snapshot,
            "round {round}"
        );
        let tail = read(&mut pool, b, 120 * KIB, 8 * KIB);
        assert!(tail[..4096].iter().all(|&x| x == 0), "never written: zeros");
        assert_eq!(tail[4096..], pattern(4 * KIB, 3));
        pool = reopen(pool).expect("reopen on NOR");
        assert_eq!(pool.volume_count(), 2);
    }
    // Deleting frees clusters; reusing them needs the data path's erase.
    pool.delete_snapshot(snap).unwrap();
    pool.delete_volume(b).unwrap();
    pool.flush().unwrap();
    let c = pool.create_volume(VolumeSpec::new("c", 512 * KIB)).unwrap();
    write(&mut pool, c, 0, &pattern(512 * KIB, 6)).unwrap();
    pool.flush().unwrap();
    let mut pool = reopen(pool).unwrap();
    assert_eq!(read(&mut pool, c, 0, 512 * KIB), pattern(512 * KIB, 6));
    let wear = pool.device_mut().flash_mut().erase_counts();
    println!(
        "erases per block: max {}, total {}",
        wear.iter().max().unwrap(),
        wear.iter().map(|&n| u64::from(n)).sum::<u64>()
    );
}

/// What a workload step changed, once acknowledged.
#[derive(Debug, Default, Clone)]
struct Acked {
    /// Volume `v` created.
    v: Option<VolumeId>,
    /// `v`'s first 8 KiB written and flushed.
    v_data: bool,
    /// `base`'s first cluster overwritten in place and flushed.
    base_new: bool,
    /// Snapshot of `base` taken (name "s").
    snap: bool,
    /// `base`'s first cluster overwritten again after the snapshot (copy-on-write) and flushed.
    base_cow: bool,
    /// `v`'s deletion started (it may or may not have happened).
    deleting: bool,
    /// `v` deleted.
    v_deleted: bool,
    /// Short-lived volumes `t0`, `t1`...: enough commits to wrap the journal and checkpoint.
    t: Vec<Temp>,
}

/// A short-lived volume of the workload, as far as it got.
#[derive(Debug, Default, Clone)]
struct Temp {
    id: Option<VolumeId>,
    data: bool,
    deleting: bool,
    deleted: bool,
}

/// Commits in the journal-wrapping part of the workload (the journal holds 16 blocks).
const TEMPS: usize = 24;

/// Runs the workload until it ends or the flash loses power; returns what was acknowledged.
fn workload(pool: &mut Pool<Dev>, base: VolumeId, acked: &mut Acked) -> Result<(), Error> {
    let v = pool.create_volume(VolumeSpec::new("v", 32 * KIB))?;
    acked.v = Some(v);
    write(pool, v, 0, &pattern(8 * KIB, 20))?;
    pool.flush()?;
    acked.v_data = true;
    write(pool, base, 0, &pattern(4 * KIB, 21))?;
    pool.flush()?;
    acked.base_new = true;
    pool.create_snapshot(base, "s", 1)?;
    acked.snap = true;
    write(pool, base, 0, &pattern(4 * KIB, 22))?;
    pool.flush()?;
    acked.base_cow = true;
    acked.deleting = true;
    pool.delete_volume(v)?;
    acked.v_deleted = true;
    for k in 0..TEMPS {
        acked.t.push(Temp::default());
        let t = pool.create_volume(VolumeSpec::new(format!("t{k}"), 8 * KIB))?;
        acked.t[k].id = Some(t);
        write(pool, t, 0, &pattern(4 * KIB, 40 + k as u8))?;
        pool.flush()?;
        acked.t[k].data = true;
        if let Some(prev) = k.checked_sub(1) {
            acked.t[prev].deleting = true;
            pool.delete_volume(acked.t[prev].id.expect("created"))?;
            acked.t[prev].deleted = true;
        }
    }
    Ok(())
}

/// Powers on after a cut and mounts again, with a second cut during that recovery (at its `n`th
/// flash operation): recovery must survive being interrupted, then mount on the next power-on.
/// Returns the pool and whether the second cut happened.
fn reopen_through_a_cut(pool: Pool<Dev>, n: u64) -> Result<(Pool<Dev>, bool), Error> {
    let mut flash = pool.into_device().into_flash();
    flash.power_on();
    flash.cut_after_ops(n);
    // Borrowed, so that the flash outlives a failed open.
    let opened = Pool::open(NorBlockDevice::new(&mut flash)).map(drop);
    let interrupted = match opened {
        Ok(()) => false,
        Err(Error::Device(DeviceErrorKind::Io)) if !flash.is_powered() => true,
        Err(e) => return Err(e),
    };
    flash.power_on();
    Pool::open(NorBlockDevice::new(flash)).map(|p| (p, interrupted))
}

#[test]
fn power_cuts_at_every_flash_operation_keep_what_was_acknowledged() {
    let (mut cuts, mut recovery_cuts) = (0, 0);
    let mut n = 1u64;
    loop {
        let mut pool = format(100 + n);
        let base = pool
            .create_volume(VolumeSpec::new("base", 16 * KIB))
            .unwrap();
        write(&mut pool, base, 0, &pattern(16 * KIB, 10)).unwrap();
        pool.flush().unwrap();
        pool.device_mut().flash_mut().cut_after_ops(n);
        let mut acked = Acked::default();
        match workload(&mut pool, base, &mut acked) {
            Ok(()) => break, // the workload needs fewer than n flash operations
            // embedded-storage has no power-loss kind: a dark flash fails with `Io`.
            Err(Error::Device(DeviceErrorKind::Io))
                if !pool.device_mut().flash_mut().is_powered() =>
            {
                cuts += 1;
            }
            Err(e) => panic!("cut at op {n}: unexpected {e:?} after {acked:?}"),
        }
        let mut pool = match reopen_through_a_cut(pool, n % 5 + 1) {
            Ok((p, interrupted)) => {
                recovery_cuts += usize::from(interrupted);
                p
            }
            Err(e) => panic!("cut at op {n}: reopen failed: {e:?} (acked {acked:?})"),
        };
        let ctx = format!("cut at op {n}, acked {acked:?}");
        // base: its first cluster is the original, the in-place rewrite or the copy-on-write
        // one, never older than what was acknowledged; the rest was flushed before the cut.
        let head = read(&mut pool, base, 0, 4 * KIB);
        let versions = [
            pattern(4 * KIB, 10),
            pattern(4 * KIB, 21),
            pattern(4 * KIB, 22),
        ];
        let floor = if acked.base_cow {
            2
        } else {
            usize::from(acked.base_new)
        };
        if acked.base_new || acked.base_cow {
            assert!(versions[floor..].contains(&head), "{ctx}: base head");
        }
        assert_eq!(
            read(&mut pool, base, 4 * KIB, 12 * KIB),
            pattern(16 * KIB, 10)[4096..],
            "{ctx}: base tail"
        );
        // The snapshot, once acknowledged, holds base as it was when taken.
        match pool.snapshot_by_name("s").map(|s| s.id()) {
            Some(s) => {
                assert_eq!(
                    read(&mut pool, s, 0, 4 * KIB),
                    versions[1],
                    "{ctx}: snapshot"
                );
            }
            None => assert!(!acked.snap, "{ctx}: acknowledged snapshot lost"),
        }
        // v: present from its creation until its deletion started, gone once that is acknowledged.
        let v = pool.volume_by_name("v").map(|v| v.id());
        if acked.v_deleted {
            assert!(v.is_none(), "{ctx}: deleted volume back");
        } else if acked.v.is_some() && !acked.deleting {
            assert!(v.is_some(), "{ctx}: acknowledged volume lost");
        }
        if let (Some(v), true) = (v, acked.v_data) {
            assert_eq!(
                read(&mut pool, v, 0, 8 * KIB),
                pattern(8 * KIB, 20),
                "{ctx}: v"
            );
        }
        // The short-lived volumes, by the same rules.
        for (k, t) in acked.t.iter().enumerate() {
            let found = pool.volume_by_name(&format!("t{k}")).map(|v| v.id());
            if t.deleted {
                assert!(found.is_none(), "{ctx}: t{k} deleted, back");
            } else if t.id.is_some() && !t.deleting {
                assert!(found.is_some(), "{ctx}: t{k} lost");
            }
            if let (Some(id), true) = (found, t.data) {
                assert_eq!(
                    read(&mut pool, id, 0, 4 * KIB),
                    pattern(4 * KIB, 40 + k as u8),
                    "{ctx}: t{k}"
                );
            }
        }
        // The recovered pool keeps working and mounts again.
        let w = pool.create_volume(VolumeSpec::new("w", 8 * KIB)).unwrap();
        write(&mut pool, w, 0, &pattern(8 * KIB, 30)).unwrap();
        pool.flush().unwrap();
        let mut pool = reopen(pool).unwrap_or_else(|e| panic!("{ctx}: second reopen: {e:?}"));
        assert_eq!(
            read(&mut pool, w, 0, 8 * KIB),
            pattern(8 * KIB, 30),
            "{ctx}"
        );
        n += 1;
    }
    println!(
        "{cuts} power cuts, one at each flash operation of the workload; {recovery_cuts} more \
         during the recovery from them"
    );
    assert!(cuts > 60, "workload exercised: {cuts} cut points");
    assert!(recovery_cuts > 0, "recovery interrupted at least once");
}
