//! One DH-HMAC-CHAP secret as the appliance makes and keeps them.
//!
//! Each secret is 32 fresh random bytes whose key transform is SHA-256 (`DHHC-1:01:` in the NVMe
//! secret representation):
//! - 32 bytes (256 bits) is out of reach of any search, is one of the three lengths NVMe allows
//!   (32, 48, 64) and what `nvme gen-dhchap-key` makes for SHA-256; an HMAC key of that length
//!   works with whichever hash a host negotiates (SHA-256, -384 or -512).
//! - The transform (`HMAC-SHA-256(secret, NQN || "NVMe-over-Fabrics")`, computed by both ends)
//!   makes the key that enters the protocol depend on an NQN: the host secret on the host's NQN,
//!   the controller secret on the subsystem's. The same secret presented under another host NQN
//!   is a different key, and each volume's subsystem answers with its own controller key.
//!   SHA-256 matches the key length, and every kernel with NVMe authentication implements it.
//!
//! A secret never prints: its `Debug` is redacted and it has no `Display`. Its bytes are wiped
//! when it is dropped.

use std::fmt;

use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use zeroize::Zeroize;

/// Length of every secret the appliance makes, in bytes.
pub const SECRET_LEN: usize = 32;

/// The transform hash of every secret the appliance makes: `hh` = 01, SHA-256.
pub const TRANSFORM_SHA256: u8 = 1;

/// A 32-byte DH-HMAC-CHAP secret with the SHA-256 key transform.
#[derive(Clone, Serialize, Deserialize)]
pub struct Secret([u8; SECRET_LEN]);

/// The system's random source failed: no secret could be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RandomFailed;

impl fmt::Display for RandomFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the system random source failed")
    }
}

impl std::error::Error for RandomFailed {}

impl Secret {
    /// A fresh secret from the operating system's random source.
    pub fn generate() -> Result<Secret, RandomFailed> {
        let mut key = [0u8; SECRET_LEN];
        SystemRandom::new()
            .fill(&mut key)
            .map_err(|_| RandomFailed)?;
        let secret = Secret(key);
        key.zeroize();
        Ok(secret)
    }

    /// The secret's bytes, before the key transform.
    pub fn key(&self) -> &[u8; SECRET_LEN] {
        &self.0
    }

    /// The transform hash (`hh` of the secret representation): always [`TRANSFORM_SHA256`].
    pub fn transform(&self) -> u8 {
        TRANSFORM_SHA256
    }

    /// A secret of the given bytes: for tests that need known keys.
    #[cfg(test)]
    pub(crate) fn from_bytes(key: [u8; SECRET_LEN]) -> Secret {
        Secret(key)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_random_and_never_printed() {
        let a = Secret::generate().unwrap();
        let b = Secret::generate().unwrap();
        assert_ne!(a.key(), b.key(), "two draws gave the same key");
        assert_ne!(a.key(), &[0u8; SECRET_LEN]);
        assert_eq!(a.transform(), TRANSFORM_SHA256);
        let known = Secret::from_bytes([0xab; SECRET_LEN]);
        let text = format!("{known:?} {:#?}", Some(&known));
        assert!(!text.contains("ab") && !text.contains("171"), "{text}");
        assert!(text.contains("redacted"), "{text}");
    }
}
