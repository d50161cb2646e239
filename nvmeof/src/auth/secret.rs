//! DH-HMAC-CHAP secrets: the `DHHC-1:hh:<base64(key || crc32-le(key))>:` representation
//! (NVMe base specification "DH-HMAC-CHAP secret representation"; nvme-cli `gen-dhchap-key`,
//! Linux `nvme_auth_extract_key`), generation, and the transform with an NQN
//! (`nvme_auth_transform_key`).
//!
//! `hh` names the hash the key is transformed with before use: 00 none (the key is used as
//! is), 01 SHA-256, 02 SHA-384, 03 SHA-512. The key is 32, 48 or 64 bytes; like Linux, any
//! length goes with any `hh`. The CRC is the usual CRC-32 (zlib's; Linux computes it as
//! `~crc32(~0, key)`), little-endian.
//!
//! Secret material never leaves through `Debug` or `Display`, and is zeroized on drop: a
//! [`Secret`] shows only its hash and length; the encoded form comes from [`Secret::encode`] as
//! a [`Zeroizing`] string the caller stores and drops.

use core::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use rand_core::CryptoRng;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use super::hash::HashId;

/// The fixed prefix of the representation.
pub const PREFIX: &str = "DHHC-1:";
/// The key lengths the representation allows.
pub const KEY_LENS: [usize; 3] = [32, 48, 64];

/// Why a secret was refused. The variants never carry secret material.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SecretError {
    /// Not `DHHC-1:hh:<base64>:`.
    Format,
    /// `hh` is not 00, 01, 02 or 03.
    UnknownHash,
    /// The base64 part does not decode.
    Base64,
    /// The key is not 32, 48 or 64 bytes.
    KeyLength,
    /// The CRC-32 after the key does not match it.
    Crc,
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SecretError::Format => "not a DHHC-1:hh:<base64>: secret",
            SecretError::UnknownHash => "secret hash is not 00, 01, 02 or 03",
            SecretError::Base64 => "secret is not valid base64",
            SecretError::KeyLength => "secret key is not 32, 48 or 64 bytes",
            SecretError::Crc => "secret CRC-32 does not match its key",
        })
    }
}

impl std::error::Error for SecretError {}

/// A DH-HMAC-CHAP secret (a host's or a controller's).
#[derive(Clone)]
pub struct Secret {
    hash: Option<HashId>,
    key: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("hash", &self.hash)
            .field("len", &self.key.len())
            .finish_non_exhaustive()
    }
}

/// A secret transformed with an NQN: the HMAC key of a response. Zeroized on drop.
pub struct TransformedKey(Zeroizing<Vec<u8>>);

impl TransformedKey {
    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for TransformedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransformedKey")
            .field("len", &self.0.len())
            .finish_non_exhaustive()
    }
}

fn crc32(key: &[u8]) -> [u8; 4] {
    let mut h = crc32fast::Hasher::new();
    h.update(key);
    h.finalize().to_le_bytes()
}

impl Secret {
    /// A secret from its raw key, transformed with `hash` before use (`None`: used as is).
    pub fn from_key(hash: Option<HashId>, key: &[u8]) -> Result<Self, SecretError> {
        if !KEY_LENS.contains(&key.len()) {
            return Err(SecretError::KeyLength);
        }
        Ok(Secret {
            hash,
            key: Zeroizing::new(key.to_vec()),
        })
    }

    /// A new random secret of `len` bytes (32, 48 or 64; nvme-cli pairs SHA-256 with 32 and so
    /// on, which [`Secret::generate_for`] does).
    pub fn generate<R: CryptoRng + ?Sized>(
        hash: Option<HashId>,
        len: usize,
        rng: &mut R,
    ) -> Result<Self, SecretError> {
        if !KEY_LENS.contains(&len) {
            return Err(SecretError::KeyLength);
        }
        let mut key = Zeroizing::new(vec![0u8; len]);
        rng.fill_bytes(&mut key);
        Ok(Secret { hash, key })
    }

    /// A new random secret transformed with `hash`, as long as its digest.
    pub fn generate_for<R: CryptoRng + ?Sized>(hash: HashId, rng: &mut R) -> Self {
        let mut key = Zeroizing::new(vec![0u8; hash.digest_len()]);
        rng.fill_bytes(&mut key);
        Secret {
            hash: Some(hash),
            key,
        }
    }

    /// Parses `DHHC-1:hh:<base64(key || crc32-le(key))>:` (surrounding whitespace and a missing
    /// final colon are accepted, as Linux does).
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let text = text.trim();
        let rest = text.strip_prefix(PREFIX).ok_or(SecretError::Format)?;
        let (hh, rest) = rest.split_once(':').ok_or(SecretError::Format)?;
        let hash = match hh {
            "00" => None,
            "01" | "02" | "03" => {
                let id = hh.as_bytes()[1] - b'0';
                Some(HashId::from_id(id).ok_or(SecretError::UnknownHash)?)
            }
            _ if hh.len() == 2 && hh.bytes().all(|c| c.is_ascii_digit()) => {
                return Err(SecretError::UnknownHash)
            }
            _ => return Err(SecretError::Format),
        };
        let b64 = rest.strip_suffix(':').unwrap_or(rest);
        if b64.is_empty() || b64.contains(':') {
            return Err(SecretError::Format);
        }
        let raw = Zeroizing::new(STANDARD.decode(b64).map_err(|_| SecretError::Base64)?);
        let Some(key_len) = raw.len().checked_sub(4) else {
            return Err(SecretError::KeyLength);
        };
        if !KEY_LENS.contains(&key_len) {
            return Err(SecretError::KeyLength);
        }
        let (key, crc) = raw.split_at(key_len);
        if !bool::from(crc32(key).ct_eq(crc)) {
            return Err(SecretError::Crc);
        }
        Secret::from_key(hash, key)
    }

    /// The `DHHC-1:hh:<base64>:` representation (what nvme-cli's `--dhchap-secret` takes).
    pub fn encode(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(Vec::with_capacity(self.key.len() + 4));
        raw.extend_from_slice(&self.key);
        raw.extend_from_slice(&crc32(&self.key));
        let hh = self.hash.map_or(0, HashId::id);
        let mut out = Zeroizing::new(String::with_capacity(12 + raw.len() * 4 / 3 + 4));
        out.push_str(PREFIX);
        out.push_str(&format!("{hh:02}:"));
        STANDARD.encode_string(&*raw, &mut out);
        out.push(':');
        out
    }

    /// The hash the key is transformed with (`None`: 00, used as is).
    pub fn hash(&self) -> Option<HashId> {
        self.hash
    }

    /// The key length in bytes.
    pub fn key_len(&self) -> usize {
        self.key.len()
    }

    /// Constant-time equality of the keys and hashes (to find a secret among stored ones).
    pub fn ct_eq(&self, other: &Secret) -> bool {
        self.hash == other.hash
            && self.key.len() == other.key.len()
            && bool::from(self.key.as_slice().ct_eq(other.key.as_slice()))
    }

    /// `nvme_auth_transform_key`: the key itself with hash 00, else
    /// `HMAC(key, nqn || "NVMe-over-Fabrics")` with the secret's hash (as long as its digest).
    pub fn transform(&self, nqn: &str) -> TransformedKey {
        match self.hash {
            None => TransformedKey(self.key.clone()),
            Some(h) => {
                let mut mac = h.hmac(&self.key);
                mac.update(nqn.as_bytes()).update(b"NVMe-over-Fabrics");
                TransformedKey(Zeroizing::new(mac.finalize().as_bytes().to_vec()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The key 00 01 .. 1f with hash 01, encoded with Python's base64 and zlib.crc32 (the CRC
    // of bytes 0..32 is 0x91267e8a).
    const SAMPLE: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

    fn sample_key() -> Vec<u8> {
        (0u8..32).collect()
    }

    #[test]
    fn parses_and_encodes_the_representation() {
        let s = Secret::parse(SAMPLE).unwrap();
        assert_eq!(s.hash(), Some(HashId::Sha256));
        assert_eq!(s.key_len(), 32);
        assert!(s.ct_eq(&Secret::from_key(Some(HashId::Sha256), &sample_key()).unwrap()));
        assert_eq!(s.encode().as_str(), SAMPLE);
        // Linux takes it without the final colon and with surrounding whitespace too.
        assert!(Secret::parse(&format!(" {}\n", &SAMPLE[..SAMPLE.len() - 1])).is_ok());
    }

    #[test]
    fn refuses_malformed_secrets() {
        let cases = [
            ("DHHC-2:01:AAAA:", SecretError::Format),
            ("DHHC-1:1:AAAA:", SecretError::Format),
            (
                "DHHC-1:04:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
                SecretError::UnknownHash,
            ),
            ("DHHC-1:01::", SecretError::Format),
            ("DHHC-1:01:AAEC*wQF:", SecretError::Base64),
            ("DHHC-1:01:AAECAwQF:", SecretError::KeyLength),
            (
                "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+LfiaR:",
                SecretError::Crc,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(Secret::parse(text).unwrap_err(), want, "{text}");
        }
        assert_eq!(
            Secret::from_key(None, &[0; 31]).unwrap_err(),
            SecretError::KeyLength
        );
    }

    #[test]
    fn debug_never_shows_the_key() {
        let s = Secret::parse(SAMPLE).unwrap();
        let shown = format!("{s:?} {:?}", s.transform("nqn.x"));
        assert_eq!(
            shown,
            "Secret { hash: Some(Sha256), len: 32, .. } TransformedKey { len: 32, .. }"
        );
    }

    #[test]
    fn transform_uses_the_secret_hash_and_keeps_00_keys() {
        let raw = sample_key();
        let none = Secret::from_key(None, &raw).unwrap();
        assert_eq!(none.transform("nqn.a").as_bytes(), raw.as_slice());
        for h in HashId::ALL {
            let s = Secret::from_key(Some(h), &raw).unwrap();
            let t = s.transform("nqn.a");
            assert_eq!(t.as_bytes().len(), h.digest_len());
            let mut mac = h.hmac(&raw);
            mac.update(b"nqn.aNVMe-over-Fabrics");
            assert_eq!(t.as_bytes(), mac.finalize().as_bytes());
            assert_ne!(t.as_bytes(), s.transform("nqn.b").as_bytes());
        }
    }
}
