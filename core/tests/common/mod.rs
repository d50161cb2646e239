//! Fixtures shared by core's integration tests: small pools and data I/O through the mapping API,
//! done the way the appliance's data path will do it.
//!
//! Crash tests (`crash.rs`, `crash_persist.rs`, `persist.rs`) run on [`FaultyRam`]: hal's fault
//! device over hal's sparse RAM device, the same fault injection hal's and the appliance's tests
//! use (a dev-dependency of core; hal depends on core, a cycle cargo allows for tests). It records
//! a run and rebuilds what a process crash or a power cut at any write of it leaves
//! (`edgevol_hal::Recording::cuts`), chooses what discards leave (`edgevol_hal::DiscardMode`), and
//! counts writes and flushes (`FaultDevice::stats`). Core's own `RamDevice` stays for the tests
//! that need no faults. The model those tests check core against is the device contract in
//! `core/src/device.rs`; the fault device's docs (`hal/src/fault.rs`) say which outcomes it picks.
#![allow(dead_code, clippy::cast_possible_truncation)]

use edgevol_core::{
    BlockDevice, FormatOptions, ImageId, Pool, Prepare, RamDevice, ReadSegment, VolumeId, WriteSegment,
};

pub const BLOCK: u32 = 512;

/// The crash tests' device: hal's fault injection over hal's RAM device.
pub type FaultyRam = edgevol_hal::FaultDevice<edgevol_hal::RamDevice>;

/// A zeroed [`FaultyRam`] of `blocks` blocks of [`BLOCK`] bytes, no fault armed; `seed` drives the
/// device's own random choices (e.g. `DiscardMode::Random`).
pub fn faulty_ram(blocks: u64, seed: u64) -> FaultyRam {
    let cfg = edgevol_hal::FaultConfig {
        seed,
        ..Default::default()
    };
    edgevol_hal::FaultDevice::new(edgevol_hal::RamDevice::new(BLOCK, blocks), cfg)
}

/// How many writes a recording holds.
pub fn recorded_writes<D>(recording: &edgevol_hal::Recording<D>) -> usize
where
    D: BlockDevice + Clone,
{
    recording
        .events()
        .iter()
        .filter(|r| matches!(r.event, edgevol_hal::FaultEvent::Write { .. }))
        .count()
}
pub const CLUSTER: u32 = 4096;

/// Options for small test pools: 4 KiB clusters, small metadata so checkpoints happen often.
pub fn options(uuid: u8) -> FormatOptions {
    FormatOptions {
        uuid: [uuid; 16],
        cluster_size: CLUSTER,
        checkpoint_bytes: 64 << 10,
        journal_bytes: 32 << 10,
    }
}

/// A formatted pool on a RAM device of `data_clusters` data clusters (plus metadata).
pub fn ram_pool(data_clusters: u64) -> Pool<RamDevice> {
    let blocks = 2 + 2 * 128 + 64 + 8 + data_clusters * u64::from(CLUSTER / BLOCK);
    Pool::format(RamDevice::new(BLOCK, blocks), options(1)).unwrap()
}

fn block_of(offset: u64) -> u64 {
    assert_eq!(offset % u64::from(BLOCK), 0, "test I/O must be block aligned");
    offset / u64::from(BLOCK)
}

/// Writes `data` at `offset` of a volume: map, prepare new clusters, write.
pub fn write<D: BlockDevice>(pool: &mut Pool<D>, vol: VolumeId, offset: u64, data: &[u8]) -> edgevol_core::Result<()> {
    let cs = pool.cluster_size() as usize;
    let mut done = 0usize;
    while done < data.len() {
        let mut segs = [WriteSegment::EMPTY; 4];
        let n = pool.map_write(vol, offset + done as u64, (data.len() - done) as u64, &mut segs)?;
        for s in &segs[..n] {
            let dev = pool.device_mut();
            let map_err = |e: D::Error| edgevol_core::Error::Device(edgevol_core::DeviceError::kind(&e));
            match s.prepare {
                Prepare::None => {}
                Prepare::Zero { device_offset } => dev.write(block_of(device_offset), &vec![0; cs]).map_err(map_err)?,
                Prepare::Copy { from, to } => {
                    let mut buf = vec![0; cs];
                    dev.read(block_of(from), &mut buf).map_err(map_err)?;
                    dev.write(block_of(to), &buf).map_err(map_err)?;
                }
            }
            let at = (s.offset - offset) as usize;
            dev.write(block_of(s.device_offset), &data[at..at + s.len as usize])
                .map_err(map_err)?;
            done += s.len as usize;
        }
    }
    Ok(())
}

/// Reads `len` bytes at `offset` of a volume or snapshot through the mapping.
pub fn read<D: BlockDevice>(pool: &mut Pool<D>, image: impl Into<ImageId>, offset: u64, len: u64) -> Vec<u8> {
    let image = image.into();
    let segs: Vec<ReadSegment> = pool.map_read(image, offset, len).unwrap().collect();
    let mut out = Vec::with_capacity(len as usize);
    for s in segs {
        match s {
            ReadSegment::Zero { len } => out.resize(out.len() + len as usize, 0),
            ReadSegment::Data { device_offset, len } => {
                let mut buf = vec![0; len as usize];
                pool.device_mut().read(block_of(device_offset), &mut buf).unwrap();
                out.extend_from_slice(&buf);
            }
        }
    }
    assert_eq!(out.len() as u64, len);
    out
}

/// `free + used + reserved == total`, and reserved matches the thick volumes' unmapped clusters.
pub fn check_accounting<D: BlockDevice>(pool: &Pool<D>) {
    let c = pool.capacity();
    assert_eq!(c.free + c.used + c.reserved, c.total, "{c:?}");
    let cs = u64::from(pool.cluster_size());
    let reserved: u64 = pool
        .volumes(None)
        .filter(|v| v.provisioning() == edgevol_core::Provisioning::Thick)
        .map(|v| v.size() - v.mapped_clusters() * cs)
        .sum();
    assert_eq!(c.reserved, reserved, "{c:?}");
}
