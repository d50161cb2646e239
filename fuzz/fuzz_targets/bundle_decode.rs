//! Arbitrary bytes into the firmware bundle decoder: `bundle::inspect` (the manifest, untrusted,
//! what `edgevol firmware` shows of a file) and `bundle::verify` (everything, against the fuzz
//! key).
//!
//! Only the public decoders are called, so fields added to the manifest do not break the target.
//! Oracle: nothing panics, and
//! - `inspect` and `verify` agree: a framing error of one is the other's, a verified manifest is
//!   the inspected one;
//! - a bundle that frames is exactly as long as its header says (12 + manifest + 64-byte
//!   signature + kernel + initramfs) and holds a well-formed version;
//! - any cut of a bundle that frames is refused as `Truncated`, naming its length;
//! - a verified bundle is for the trusted key and architecture, and its parts hash to the
//!   signed digests.
//!
//! Seeds (fuzz/corpus/bundle_decode/): bundles signed with the fuzz key (see `edgevol_fuzz`), so
//! mutations start past the signature check.
//!
//! Run from the repository root: `scripts/fuzz.sh bundle_decode 60`
#![no_main]

use std::sync::OnceLock;

use edgevol_firmware::bundle::{self, BundleError};
use edgevol_firmware::key::{VerifyingKey, SIGNATURE_LEN};
use edgevol_fuzz::{bundle_key, BUNDLE_ARCH};
use libfuzzer_sys::fuzz_target;
use ring::digest::{digest, SHA256};

/// Magic and manifest length.
const PREFIX_LEN: usize = 12;

fn key() -> &'static VerifyingKey {
    static KEY: OnceLock<VerifyingKey> = OnceLock::new();
    KEY.get_or_init(bundle_key)
}

fuzz_target!(|data: &[u8]| {
    let inspected = bundle::inspect(data);
    let verified = bundle::verify(data, key(), BUNDLE_ARCH);

    match (&inspected, &verified) {
        (Err(e), Err(v)) => assert_eq!(e, v, "verify must report the framing error first"),
        (Err(e), Ok(_)) => panic!("verified a bundle inspect refuses: {e}"),
        (Ok(m), Ok(v)) => assert_eq!(m, &v.manifest),
        (Ok(_), Err(_)) => {}
    }

    if let Ok(manifest) = &inspected {
        let manifest_len = u32::from_le_bytes(data[8..PREFIX_LEN].try_into().expect("4 bytes"));
        let declared = PREFIX_LEN as u64
            + u64::from(manifest_len)
            + SIGNATURE_LEN as u64
            + manifest.kernel.len
            + manifest.initramfs.len;
        assert_eq!(declared, data.len() as u64, "framed length");
        assert!(bundle::check_version(&manifest.version).is_ok());
        assert!(!manifest.arch.is_empty());

        // One cut, chosen by the input: every proper prefix is named truncated.
        let cut = usize::from(data[data.len() - 1]) * data.len() / 256;
        match bundle::inspect(&data[..cut]) {
            Err(BundleError::Truncated { expected, actual }) => {
                assert_eq!(actual, cut as u64);
                assert!(expected > actual && expected <= data.len() as u64);
            }
            other => panic!("cut at {cut} of {}: {other:?}", data.len()),
        }
    }

    if let Ok(v) = &verified {
        assert_eq!(v.manifest.key_id, key().id());
        assert_eq!(v.manifest.arch, BUNDLE_ARCH);
        for (part, info) in [
            (v.kernel, &v.manifest.kernel),
            (v.initramfs, &v.manifest.initramfs),
        ] {
            assert_eq!(part.len() as u64, info.len);
            assert_eq!(digest(&SHA256, part).as_ref(), &info.sha256[..]);
        }
    }
});
