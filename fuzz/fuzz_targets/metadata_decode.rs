//! Fuzzes every metadata decoder of core: `Pool::open` over a real pool whose metadata area the
//! input damages (superblocks, checkpoint headers, journal frames: everything in front of a CRC),
//! and the postcard decoders of checkpoint tables and journal records behind the CRCs.
//!
//! Seeds (fuzz/corpus/metadata_decode/): the pool's real checkpoint tables and journal payloads,
//! and small patches at each superblock, checkpoint and journal header.
//!
//! Run from the repository root: `scripts/fuzz.sh metadata_decode 60`
#![no_main]

use edgevol_core::Pool;
use edgevol_fuzz::{base_pool, METADATA};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    edgevol_core::fuzzing::decode_metadata(data);
    // First two bytes: where in the metadata area the rest of the input is XORed in.
    let [hi, lo, patch @ ..] = data else { return };
    let mut dev = base_pool().clone();
    let at = usize::from(u16::from_be_bytes([*hi, *lo])) % METADATA;
    for (byte, x) in dev.as_bytes_mut()[at..METADATA].iter_mut().zip(patch) {
        *byte ^= x;
    }
    if let Ok(pool) = Pool::open(dev) {
        let _ = pool.capacity();
    }
});
