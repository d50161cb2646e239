//! What the fuzz targets and the seed generator (`examples/seed_corpus.rs`) must agree on: the
//! pool the metadata target damages, the queue the PDU target drives, the key the bundle target
//! trusts, the host-key file's framing and the HTTP/2 client preface.
//!
//! Not API: shared by `fuzz_targets/*.rs` only.

use std::sync::OnceLock;

use edgevol_core::{FormatOptions, Pool, RamDevice, VolumeSpec};
use edgevol_firmware::key::VerifyingKey;
use edgevol_nvmeof::queue::QueueConfig;

/// Block size of the metadata target's pool.
pub const BLOCK: u32 = 512;
/// Superblocks, two 16-block checkpoint slots and a 16-block journal.
pub const METADATA: usize = (2 + 2 * 16 + 16) * BLOCK as usize;

/// A small pool with some history (volumes and snapshots in its journal), built once.
pub fn base_pool() -> &'static RamDevice {
    static BASE: OnceLock<RamDevice> = OnceLock::new();
    BASE.get_or_init(|| {
        let options = FormatOptions {
            uuid: [1; 16],
            cluster_size: 4096,
            checkpoint_bytes: 8192,
            journal_bytes: 8192,
        };
        let mut pool = Pool::format(RamDevice::new(BLOCK, 512), options).expect("format");
        for i in 0..6 {
            let v = pool
                .create_volume(VolumeSpec::new(format!("v{i}"), 8192))
                .expect("volume");
            pool.create_snapshot(v, &format!("s{i}"), 0)
                .expect("snapshot");
        }
        pool.into_device()
    })
}

/// The target queue of the PDU target (small limits, so R2T and C2HData splitting run).
pub fn pdu_queue_config() -> QueueConfig {
    QueueConfig {
        maxh2cdata: 8192,
        max_c2h_data: 4096,
        io_in_capsule: 8192,
        max_transfer: 64 * 1024,
        max_queue_size: 16,
        ..QueueConfig::default()
    }
}

/// The Ed25519 seed of the key the bundle target trusts and the seed bundles are signed with.
/// A fixed, public test key: bundles signed with it are worthless outside the fuzzer.
pub const BUNDLE_KEY_SEED: [u8; 32] = *b"edgevol fuzz bundle key, public!";
/// The architecture the bundle target verifies for.
pub const BUNDLE_ARCH: &str = "x86_64";

/// The verification key of [`BUNDLE_KEY_SEED`].
pub fn bundle_key() -> VerifyingKey {
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(&BUNDLE_KEY_SEED)
        .expect("any 32 bytes are an Ed25519 seed");
    let mut public = [0u8; 32];
    public.copy_from_slice(ring::signature::KeyPair::public_key(&pair).as_ref());
    VerifyingKey(public)
}

/// The host-key file around `payload`: magic, version 1, length, payload, SHA-256 (the layout
/// `edgevol_appliance::hostkeys::file` documents). Lets a target reach the decoder behind the
/// checksum, which a fuzzer cannot forge.
pub fn seal_host_keys(payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(16 + payload.len() + 32);
    out.extend_from_slice(b"EVHKEYS\n");
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(payload);
    let sum = ring::digest::digest(&ring::digest::SHA256, &out);
    out.extend_from_slice(sum.as_ref());
    out
}

/// What every HTTP/2 client connection begins with (RFC 9113 section 3.4).
pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
