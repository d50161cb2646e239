//! The secrets the appliance makes, and how the key store keeps them.
//!
//! A secret is nvmeof's [`Secret`] (the `DHHC-1:hh:<base64>:` representation, its NQN
//! transform, redacted `Debug`, wiped on drop). Each one the appliance makes is 32 fresh random
//! bytes with the SHA-256 key transform (`DHHC-1:01:`):
//! - 32 bytes (256 bits) is out of reach of any search, is one of the three lengths NVMe allows
//!   (32, 48, 64) and what `nvme gen-dhchap-key` makes for SHA-256; an HMAC key of that length
//!   works with whichever hash a host negotiates (SHA-256, -384 or -512).
//! - The transform (`HMAC-SHA-256(secret, NQN || "NVMe-over-Fabrics")`, computed by both ends)
//!   makes the key that enters the protocol depend on an NQN: the host secret on the host's NQN,
//!   the controller secret on the subsystem's. The same secret presented under another host NQN
//!   is a different key, and each volume's subsystem answers with its own controller key.
//!   SHA-256 matches the key length, and every kernel with NVMe authentication implements it.
//!
//! The bytes come from ring's `SystemRandom` (the operating system's generator: the crypto
//! provider the appliance already uses for TLS), handed to [`Secret::from_key`].

use std::fmt;

use edgevol_nvmeof::auth::{HashId, Secret};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Deserializer, Serializer};
use zeroize::Zeroizing;

/// Length of every secret the appliance makes, in bytes.
pub const SECRET_LEN: usize = 32;

/// The transform hash of every secret the appliance makes.
pub const TRANSFORM: HashId = HashId::Sha256;

/// The system's random source failed: no secret could be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RandomFailed;

impl fmt::Display for RandomFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the system random source failed")
    }
}

impl std::error::Error for RandomFailed {}

/// A fresh secret: 32 bytes from the operating system's random source, SHA-256 transform.
pub fn generate() -> Result<Secret, RandomFailed> {
    let mut key = Zeroizing::new([0u8; SECRET_LEN]);
    SystemRandom::new()
        .fill(key.as_mut())
        .map_err(|_| RandomFailed)?;
    Ok(Secret::from_key(Some(TRANSFORM), key.as_ref()).expect("32 bytes is a valid key length"))
}

/// Serde for a [`Secret`] in the key store: its `DHHC-1` representation, which carries the
/// transform and a CRC-32 of the key, checked again when the store is read.
pub mod dhchap {
    use super::*;

    /// Writes the representation.
    pub fn serialize<S: Serializer>(secret: &Secret, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&secret.encode())
    }

    /// Reads and checks the representation. The error names what is wrong, never the text.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        let text = Zeroizing::new(String::deserialize(d)?);
        Secret::parse(&text).map_err(|e| serde::de::Error::custom(format!("a secret: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_32_random_bytes_with_the_sha256_transform_and_never_printed() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert!(!a.ct_eq(&b), "two draws gave the same key");
        assert_eq!((a.hash(), a.key_len()), (Some(HashId::Sha256), 32));
        let text = a.encode();
        assert!(text.starts_with("DHHC-1:01:"), "the representation");
        assert!(Secret::parse(&text).unwrap().ct_eq(&a));
        let shown = format!("{a:?} {:#?}", Some(&a));
        let base64 = &text["DHHC-1:01:".len()..text.len() - 1];
        assert!(
            !shown.contains(base64) && !shown.contains("DHHC"),
            "{shown}"
        );
    }

    #[test]
    fn the_store_keeps_the_representation_and_refuses_a_damaged_one() {
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Held(#[serde(with = "dhchap")] Secret);
        let a = generate().unwrap();
        let bytes = postcard::to_allocvec(&Held(a.clone())).unwrap();
        let back: Held = postcard::from_bytes(&bytes).unwrap();
        assert!(back.0.ct_eq(&a));
        // One character of the base64 changed: the CRC no longer matches.
        let mut damaged = bytes.clone();
        let at = damaged.len() - 10;
        damaged[at] = if damaged[at] == b'A' { b'B' } else { b'A' };
        let e = postcard::from_bytes::<Held>(&damaged).err().unwrap();
        assert!(!e.to_string().contains("DHHC"), "{e}");
    }
}
