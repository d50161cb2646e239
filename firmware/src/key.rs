//! Firmware signing keys: the private key the operator keeps (PKCS#8 v2 in a PEM `PRIVATE KEY`
//! block, as ring generates it) and the public key the image carries (64 hex digits on one line,
//! easy to bake into an initramfs and to compare by eye). Neither type prints key bytes in
//! `Debug`: only the key id, a fingerprint of the public key.

use std::fmt;

use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};

/// Length of an Ed25519 public key.
pub const PUBLIC_KEY_LEN: usize = 32;
/// Length of an Ed25519 signature.
pub const SIGNATURE_LEN: usize = 64;
/// Length of a key id: the first bytes of the public key's SHA-256.
pub const KEY_ID_LEN: usize = 8;
const PEM_TAG: &str = "PRIVATE KEY";

/// What was wrong with key material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The text is not a PEM `PRIVATE KEY` block.
    NotPem,
    /// The PEM block holds no Ed25519 PKCS#8 key ring accepts.
    NotEd25519,
    /// The public key is not 64 hex digits.
    BadPublicKey,
    /// The system random source failed.
    Random,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyError::NotPem => "not a PEM PRIVATE KEY block",
            KeyError::NotEd25519 => "not an Ed25519 PKCS#8 private key",
            KeyError::BadPublicKey => "not an Ed25519 public key (64 hex digits)",
            KeyError::Random => "the system random source failed",
        })
    }
}

impl std::error::Error for KeyError {}

/// A key id: names a verification key in a bundle and in messages, never the key itself.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(pub [u8; KEY_ID_LEN]);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// The private half: signs bundles. Lives with the operator, never on the appliance.
pub struct SigningKey {
    pair: Ed25519KeyPair,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("id", &self.verifying_key().id())
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A new random key and its PEM text (the caller writes it, mode 0600).
    pub fn generate() -> Result<(SigningKey, String), KeyError> {
        let pkcs8 =
            Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).map_err(|_| KeyError::Random)?;
        let pem = pem::encode(&pem::Pem::new(PEM_TAG, pkcs8.as_ref()));
        Ok((SigningKey::from_pem(&pem)?, pem))
    }

    /// Reads the PEM text [`SigningKey::generate`] produced.
    pub fn from_pem(text: &str) -> Result<SigningKey, KeyError> {
        let block = pem::parse(text).map_err(|_| KeyError::NotPem)?;
        if block.tag() != PEM_TAG {
            return Err(KeyError::NotPem);
        }
        let pair =
            Ed25519KeyPair::from_pkcs8(block.contents()).map_err(|_| KeyError::NotEd25519)?;
        Ok(SigningKey { pair })
    }

    /// The matching verification key.
    pub fn verifying_key(&self) -> VerifyingKey {
        let mut bytes = [0u8; PUBLIC_KEY_LEN];
        bytes.copy_from_slice(self.pair.public_key().as_ref());
        VerifyingKey(bytes)
    }

    pub(crate) fn sign(&self, message: &[u8]) -> [u8; SIGNATURE_LEN] {
        let mut out = [0u8; SIGNATURE_LEN];
        out.copy_from_slice(self.pair.sign(message).as_ref());
        out
    }
}

/// The public half: baked into the image, checks bundles.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct VerifyingKey(pub [u8; PUBLIC_KEY_LEN]);

impl fmt::Debug for VerifyingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VerifyingKey({})", self.id())
    }
}

impl VerifyingKey {
    /// The key as the image stores it: 64 lowercase hex digits and a newline.
    pub fn to_hex(&self) -> String {
        let mut s: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        s.push('\n');
        s
    }

    /// Parses [`VerifyingKey::to_hex`]'s text (surrounding whitespace allowed).
    pub fn from_hex(text: &str) -> Result<VerifyingKey, KeyError> {
        let text = text.trim().as_bytes();
        if text.len() != 2 * PUBLIC_KEY_LEN {
            return Err(KeyError::BadPublicKey);
        }
        let mut out = [0u8; PUBLIC_KEY_LEN];
        for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
            let digits = std::str::from_utf8(pair).map_err(|_| KeyError::BadPublicKey)?;
            *byte = u8::from_str_radix(digits, 16).map_err(|_| KeyError::BadPublicKey)?;
        }
        Ok(VerifyingKey(out))
    }

    /// The first bytes of the key's SHA-256.
    pub fn id(&self) -> KeyId {
        let digest = ring::digest::digest(&ring::digest::SHA256, &self.0);
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&digest.as_ref()[..KEY_ID_LEN]);
        KeyId(id)
    }

    pub(crate) fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, &self.0)
            .verify(message, signature)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_key_round_trips_through_pem_and_signs() {
        let (key, pem) = SigningKey::generate().unwrap();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let again = SigningKey::from_pem(&pem).unwrap();
        assert_eq!(key.verifying_key(), again.verifying_key());
        let sig = again.sign(b"edgevol");
        assert!(key.verifying_key().verify(b"edgevol", &sig));
        assert!(!key.verifying_key().verify(b"edgevoL", &sig));
    }

    #[test]
    fn public_key_hex_round_trips_and_rejects_garbage() {
        let (key, _) = SigningKey::generate().unwrap();
        let public = key.verifying_key();
        let hex = public.to_hex();
        assert_eq!(hex.len(), 65);
        assert_eq!(VerifyingKey::from_hex(&hex).unwrap(), public);
        assert_eq!(
            VerifyingKey::from_hex(&hex[..62]),
            Err(KeyError::BadPublicKey)
        );
        let mut bad = hex.clone();
        bad.replace_range(0..1, "g");
        assert_eq!(VerifyingKey::from_hex(&bad), Err(KeyError::BadPublicKey));
        // A multi-byte character must not panic the parser.
        let unicode = format!("é{}", &hex[2..64]);
        assert_eq!(
            VerifyingKey::from_hex(&unicode),
            Err(KeyError::BadPublicKey)
        );
    }

    #[test]
    fn pem_that_is_not_an_ed25519_key_is_refused() {
        assert_eq!(SigningKey::from_pem("hello").unwrap_err(), KeyError::NotPem);
        let cert = pem::encode(&pem::Pem::new("CERTIFICATE", vec![1, 2, 3]));
        assert_eq!(SigningKey::from_pem(&cert).unwrap_err(), KeyError::NotPem);
        let junk = pem::encode(&pem::Pem::new("PRIVATE KEY", vec![1, 2, 3]));
        assert_eq!(
            SigningKey::from_pem(&junk).unwrap_err(),
            KeyError::NotEd25519
        );
    }

    #[test]
    fn debug_output_names_the_key_id_not_the_key() {
        let (key, pem) = SigningKey::generate().unwrap();
        let shown = format!("{key:?} {:?}", key.verifying_key());
        let id = key.verifying_key().id().to_string();
        assert!(shown.contains(&id));
        let public_hex = key.verifying_key().to_hex();
        assert!(!shown.contains(public_hex.trim()));
        let body: String = pem.lines().nth(1).unwrap().chars().take(16).collect();
        assert!(!shown.contains(&body));
    }
}
