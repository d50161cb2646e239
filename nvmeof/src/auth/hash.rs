//! The DH-HMAC-CHAP hash functions and every value computed with them.
//!
//! The computations are Linux's, byte for byte (drivers/nvme/common/auth.c,
//! drivers/nvme/target/auth.c, drivers/nvme/host/auth.c):
//!
//! - augmented challenge (`nvme_auth_augmented_challenge`): `Ca = HMAC(H(Ks), C)`, with the
//!   negotiated hash `H` and the DH session key `Ks`;
//! - host response (`nvmet_auth_host_hash`): `HMAC(Kh', C1 || le32(S1) || le16(T_ID) || 00h ||
//!   "HostHost" || NQNh || 00h || NQNc)`, with `Kh'` the host secret transformed with NQNh
//!   ([`crate::auth::secret::Secret::transform`]) and `C1` augmented when a DH group is in use;
//! - controller response (`nvmet_auth_ctrl_hash`): `HMAC(Kc', C2 || le32(S2) || le16(T_ID) ||
//!   00h || "Controller" || NQNc || 00h || NQNh)`, with `Kc'` the controller secret transformed
//!   with NQNc.

use core::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest as _, Sha256, Sha384, Sha512};
use subtle::ConstantTimeEq;
use zeroize::Zeroize;

/// Longest digest (SHA-512), `NVME_AUTH_MAX_DIGEST_SIZE`.
pub const MAX_DIGEST_LEN: usize = 64;

/// A hash function of DH-HMAC-CHAP, by its identifier in the protocol (`NVME_AUTH_HASH_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HashId {
    /// SHA-256 (01h).
    Sha256 = 1,
    /// SHA-384 (02h).
    Sha384 = 2,
    /// SHA-512 (03h).
    Sha512 = 3,
}

impl HashId {
    /// Every hash, in identifier order.
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    /// The hash with this protocol identifier.
    pub const fn from_id(id: u8) -> Option<HashId> {
        match id {
            1 => Some(HashId::Sha256),
            2 => Some(HashId::Sha384),
            3 => Some(HashId::Sha512),
            _ => None,
        }
    }

    /// Its protocol identifier.
    pub const fn id(self) -> u8 {
        self as u8
    }

    /// Digest length in bytes (the messages' HL).
    pub const fn digest_len(self) -> usize {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }

    /// Digest length as the one-byte HL field of the messages.
    pub const fn hl(self) -> u8 {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }

    /// The name Linux and nvme-cli use (`hmac(sha256)` is `nvme_auth_hmac_name`; this is the
    /// digest's).
    pub const fn name(self) -> &'static str {
        match self {
            HashId::Sha256 => "sha256",
            HashId::Sha384 => "sha384",
            HashId::Sha512 => "sha512",
        }
    }

    /// `H(data)`.
    pub fn digest(self, data: &[u8]) -> Digest {
        match self {
            HashId::Sha256 => Digest::from_slice(&Sha256::digest(data)),
            HashId::Sha384 => Digest::from_slice(&Sha384::digest(data)),
            HashId::Sha512 => Digest::from_slice(&Sha512::digest(data)),
        }
    }

    /// An HMAC keyed with `key` (any length), to feed with [`HmacState::update`].
    pub fn hmac(self, key: &[u8]) -> HmacState {
        // HMAC takes keys of every length: new_from_slice cannot fail.
        match self {
            HashId::Sha256 => HmacState::Sha256(hmac_with::<Sha256>(key)),
            HashId::Sha384 => HmacState::Sha384(hmac_with::<Sha384>(key)),
            HashId::Sha512 => HmacState::Sha512(hmac_with::<Sha512>(key)),
        }
    }
}

fn hmac_with<D>(key: &[u8]) -> Hmac<D>
where
    D: hmac::EagerHash,
    Hmac<D>: KeyInit,
{
    match <Hmac<D> as KeyInit>::new_from_slice(key) {
        Ok(mac) => mac,
        // Unreachable: HMAC hashes long keys and pads short ones.
        Err(_) => <Hmac<D> as KeyInit>::new(&Default::default()),
    }
}

impl fmt::Display for HashId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An HMAC computation in progress.
#[derive(Clone)]
pub enum HmacState {
    /// HMAC-SHA-256.
    Sha256(Hmac<Sha256>),
    /// HMAC-SHA-384.
    Sha384(Hmac<Sha384>),
    /// HMAC-SHA-512.
    Sha512(Hmac<Sha512>),
}

impl fmt::Debug for HmacState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The state derives from the key: show only the algorithm.
        let name = match self {
            HmacState::Sha256(_) => "sha256",
            HmacState::Sha384(_) => "sha384",
            HmacState::Sha512(_) => "sha512",
        };
        f.debug_tuple("HmacState").field(&name).finish()
    }
}

impl HmacState {
    /// Feeds `data`.
    pub fn update(&mut self, data: &[u8]) -> &mut Self {
        match self {
            HmacState::Sha256(m) => m.update(data),
            HmacState::Sha384(m) => m.update(data),
            HmacState::Sha512(m) => m.update(data),
        }
        self
    }

    /// The MAC.
    pub fn finalize(self) -> Digest {
        match self {
            HmacState::Sha256(m) => Digest::from_slice(&m.finalize().into_bytes()),
            HmacState::Sha384(m) => Digest::from_slice(&m.finalize().into_bytes()),
            HmacState::Sha512(m) => Digest::from_slice(&m.finalize().into_bytes()),
        }
    }
}

/// A digest or MAC of up to 64 bytes. Responses and augmented challenges are key material until
/// they are on the wire: zeroized on drop, compared in constant time, never Debug-printed.
#[derive(Clone)]
pub struct Digest {
    bytes: [u8; MAX_DIGEST_LEN],
    len: usize,
}

impl Digest {
    fn from_slice(b: &[u8]) -> Self {
        let mut bytes = [0u8; MAX_DIGEST_LEN];
        let len = b.len().min(MAX_DIGEST_LEN);
        bytes[..len].copy_from_slice(&b[..len]);
        Digest { bytes, len }
    }

    /// The digest bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Constant-time comparison with `other` (false when the lengths differ).
    pub fn ct_eq_bytes(&self, other: &[u8]) -> bool {
        self.len == other.len() && bool::from(self.as_bytes().ct_eq(other))
    }
}

impl PartialEq for Digest {
    fn eq(&self, other: &Self) -> bool {
        self.ct_eq_bytes(other.as_bytes())
    }
}

impl Eq for Digest {}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Digest").field("len", &self.len).finish()
    }
}

impl Drop for Digest {
    fn drop(&mut self) {
        self.bytes.zeroize();
    }
}

/// The augmented challenge `HMAC(H(session_key), challenge)` of `nvme_auth_augmented_challenge`.
pub fn augmented_challenge(hash: HashId, session_key: &[u8], challenge: &[u8]) -> Digest {
    let hashed_key = hash.digest(session_key);
    let mut mac = hash.hmac(hashed_key.as_bytes());
    mac.update(challenge);
    mac.finalize()
}

/// The challenge a response is computed over: `challenge` itself with the null DH group, its
/// augmented form with a session key.
fn effective_challenge(hash: HashId, session_key: Option<&[u8]>, challenge: &[u8]) -> Digest {
    match session_key {
        Some(ks) => augmented_challenge(hash, ks, challenge),
        None => Digest::from_slice(challenge),
    }
}

/// The inputs of one response: which challenge, sequence number and transaction it answers.
#[derive(Clone, Copy)]
pub struct ResponseInput<'a> {
    /// The negotiated hash.
    pub hash: HashId,
    /// The DH session key, `None` with the null group.
    pub session_key: Option<&'a [u8]>,
    /// The challenge (C1 for the host's response, C2 for the controller's), HL bytes.
    pub challenge: &'a [u8],
    /// Its sequence number (S1 or S2).
    pub seqnum: u32,
    /// The transaction identifier.
    pub t_id: u16,
}

impl fmt::Debug for ResponseInput<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseInput")
            .field("hash", &self.hash)
            .field("dh", &self.session_key.is_some())
            .field("seqnum", &self.seqnum)
            .field("t_id", &self.t_id)
            .finish()
    }
}

fn response(
    input: &ResponseInput<'_>,
    key: &[u8],
    label: &[u8],
    first_nqn: &str,
    second_nqn: &str,
) -> Digest {
    let challenge = effective_challenge(input.hash, input.session_key, input.challenge);
    let mut mac = input.hash.hmac(key);
    mac.update(challenge.as_bytes())
        .update(&input.seqnum.to_le_bytes())
        .update(&input.t_id.to_le_bytes())
        .update(&[0])
        .update(label)
        .update(first_nqn.as_bytes())
        .update(&[0])
        .update(second_nqn.as_bytes());
    mac.finalize()
}

/// The host's response (R1): what the host sends in DH-HMAC-CHAP_Reply, keyed with the host
/// secret transformed with `host_nqn`.
pub fn host_response(
    input: &ResponseInput<'_>,
    transformed_host_key: &[u8],
    host_nqn: &str,
    subsys_nqn: &str,
) -> Digest {
    response(
        input,
        transformed_host_key,
        b"HostHost",
        host_nqn,
        subsys_nqn,
    )
}

/// The controller's response (R2): what the controller sends in DH-HMAC-CHAP_Success1, keyed
/// with the controller secret transformed with `subsys_nqn`.
pub fn controller_response(
    input: &ResponseInput<'_>,
    transformed_ctrl_key: &[u8],
    subsys_nqn: &str,
    host_nqn: &str,
) -> Digest {
    response(
        input,
        transformed_ctrl_key,
        b"Controller",
        subsys_nqn,
        host_nqn,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn ids_and_lengths_match_linux() {
        for h in HashId::ALL {
            assert_eq!(HashId::from_id(h.id()), Some(h));
        }
        assert_eq!(HashId::from_id(0), None);
        assert_eq!(HashId::from_id(4), None);
        assert_eq!(
            HashId::ALL.map(HashId::digest_len),
            [32, 48, 64],
            "nvme_auth_hmac_hash_len"
        );
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let data = b"what do ya want for nothing?";
        let cases = [
            (
                HashId::Sha256,
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (
                HashId::Sha384,
                "af45d2e376484031617f78d2b58a6b1b9c7ef464f5a01b47e42ec3736322445e\
                 8e2240ca5e69e2c78b3239ecfab21649",
            ),
            (
                HashId::Sha512,
                "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea250554\
                 9758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737",
            ),
        ];
        for (h, want) in cases {
            let mut mac = h.hmac(b"Jefe");
            mac.update(&data[..10]).update(&data[10..]);
            assert_eq!(mac.finalize().as_bytes(), hex(want), "{h}");
        }
    }

    #[test]
    fn responses_differ_by_direction_and_inputs() {
        let c = [7u8; 32];
        let input = ResponseInput {
            hash: HashId::Sha256,
            session_key: None,
            challenge: &c,
            seqnum: 1,
            t_id: 2,
        };
        let key = [9u8; 32];
        let r1 = host_response(&input, &key, "nqn.h", "nqn.c");
        let r2 = controller_response(&input, &key, "nqn.c", "nqn.h");
        assert_ne!(r1, r2);
        let other_tid = ResponseInput { t_id: 3, ..input };
        assert_ne!(r1, host_response(&other_tid, &key, "nqn.h", "nqn.c"));
        let with_dh = ResponseInput {
            session_key: Some(&[1, 2, 3]),
            ..input
        };
        assert_ne!(r1, host_response(&with_dh, &key, "nqn.h", "nqn.c"));
        assert!(r1.ct_eq_bytes(host_response(&input, &key, "nqn.h", "nqn.c").as_bytes()));
        assert!(!r1.ct_eq_bytes(&r1.as_bytes()[..31]));
        assert_eq!(format!("{r1:?}"), "Digest { len: 32 }");
    }
}
