//! Fuzzes every metadata decoder of core: `Pool::open` over a real pool whose metadata area the
//! input damages (superblocks, checkpoint headers, journal frames: everything in front of a CRC),
//! and the postcard decoders of checkpoint tables and journal records behind the CRCs.
//!
//! Run from the repository root: `cargo +nightly fuzz run metadata_decode -- -max_total_time=20`
#![no_main]

use std::sync::OnceLock;

use edgevol_core::{FormatOptions, Pool, RamDevice, VolumeSpec};
use libfuzzer_sys::fuzz_target;

const BLOCK: u32 = 512;
/// Superblocks, two 16-block checkpoint slots and a 16-block journal.
const METADATA: usize = (2 + 2 * 16 + 16) * BLOCK as usize;

/// A small pool with some history, built once.
fn base() -> &'static RamDevice {
    static BASE: OnceLock<RamDevice> = OnceLock::new();
    BASE.get_or_init(|| {
        let options = FormatOptions { uuid: [1; 16], cluster_size: 4096, checkpoint_bytes: 8192, journal_bytes: 8192 };
        let mut pool = Pool::format(RamDevice::new(BLOCK, 512), options).unwrap();
        for i in 0..6 {
            let v = pool.create_volume(VolumeSpec::new(format!("v{i}"), 8192)).unwrap();
            pool.create_snapshot(v, &format!("s{i}"), 0).unwrap();
        }
        pool.into_device()
    })
}

fuzz_target!(|data: &[u8]| {
    edgevol_core::fuzzing::decode_metadata(data);
    // First two bytes: where in the metadata area the rest of the input is XORed in.
    let [hi, lo, patch @ ..] = data else { return };
    let mut dev = base().clone();
    let at = usize::from(u16::from_be_bytes([*hi, *lo])) % METADATA;
    for (byte, x) in dev.as_bytes_mut()[at..METADATA].iter_mut().zip(patch) {
        *byte ^= x;
    }
    if let Ok(pool) = Pool::open(dev) {
        let _ = pool.capacity();
    }
});
