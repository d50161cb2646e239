//! Finite-field Diffie-Hellman for DH-HMAC-CHAP: the null group and the RFC 7919 groups
//! ffdhe2048 … ffdhe8192 (generator 2), by their protocol identifiers (`NVME_AUTH_DHGROUP_*`).
//!
//! Modular exponentiation is crypto-bigint's constant-time Montgomery ladder over heap integers
//! (`BoxedMontyForm::pow_bounded_exp`): its running time depends on the exponent's bound, a
//! public per-group constant, never on the exponent's value. Private exponents are short, as
//! RFC 7919 section 5.2 allows (225 bits for ffdhe2048 up to 400 for ffdhe8192), drawn from the
//! caller's CSPRNG, and zeroized on drop.
//!
//! Values on the wire are big-endian and exactly as long as the prime (Linux's kpp writes them
//! with `mpi_write_to_sgl`, zero-padded to `crypto_kpp_maxsize`); the session key Ks is the
//! shared secret in the same form (`nvme_auth_gen_shared_secret`). A peer value is accepted only
//! in `[2, p-2]` (RFC 7919 section 5.1; the Linux kpp also refuses 0, 1 and >= p).

use core::fmt;
use std::sync::OnceLock;

use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use rand_core::CryptoRng;
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, Zeroizing};

/// A DH group of DH-HMAC-CHAP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DhGroup {
    /// No Diffie-Hellman exchange (00h): the challenge is used as is.
    Null = 0,
    /// RFC 7919 ffdhe2048 (01h).
    Ffdhe2048 = 1,
    /// RFC 7919 ffdhe3072 (02h).
    Ffdhe3072 = 2,
    /// RFC 7919 ffdhe4096 (03h).
    Ffdhe4096 = 3,
    /// RFC 7919 ffdhe6144 (04h).
    Ffdhe6144 = 4,
    /// RFC 7919 ffdhe8192 (05h).
    Ffdhe8192 = 5,
}

/// Why a DH computation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DhError {
    /// The null group has no exchange.
    NullGroup,
    /// A public value is not exactly as long as the group's prime.
    ValueLength,
    /// A public value is outside `[2, p-2]`.
    ValueOutOfRange,
    /// An explicit private exponent is empty, longer than the prime, or below 2.
    BadExponent,
    /// The shared secret is 1 (cannot happen with a valid peer value in a safe-prime group).
    Degenerate,
}

impl fmt::Display for DhError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DhError::NullGroup => "the null DH group has no exchange",
            DhError::ValueLength => "DH value length does not match the group",
            DhError::ValueOutOfRange => "DH value is outside [2, p-2]",
            DhError::BadExponent => "DH private exponent is not usable",
            DhError::Degenerate => "DH shared secret is degenerate",
        })
    }
}

impl std::error::Error for DhError {}

impl DhGroup {
    /// Every group, in identifier order.
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    /// The group with this protocol identifier.
    pub const fn from_id(id: u8) -> Option<DhGroup> {
        match id {
            0 => Some(DhGroup::Null),
            1 => Some(DhGroup::Ffdhe2048),
            2 => Some(DhGroup::Ffdhe3072),
            3 => Some(DhGroup::Ffdhe4096),
            4 => Some(DhGroup::Ffdhe6144),
            5 => Some(DhGroup::Ffdhe8192),
            _ => None,
        }
    }

    /// Its protocol identifier.
    pub const fn id(self) -> u8 {
        self as u8
    }

    /// Its name (`nvme_auth_dhgroup_name`).
    pub const fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }

    /// Size of the prime in bits (0 for the null group).
    pub const fn bits(self) -> u32 {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 2048,
            DhGroup::Ffdhe3072 => 3072,
            DhGroup::Ffdhe4096 => 4096,
            DhGroup::Ffdhe6144 => 6144,
            DhGroup::Ffdhe8192 => 8192,
        }
    }

    /// Length of a public value and of the session key in bytes (DHVLEN; 0 for the null group).
    pub const fn value_len(self) -> usize {
        (self.bits() / 8) as usize
    }

    /// Bits of a generated private exponent: RFC 7919 section 5.2's short exponents.
    pub const fn exponent_bits(self) -> u32 {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 225,
            DhGroup::Ffdhe3072 => 275,
            DhGroup::Ffdhe4096 => 325,
            DhGroup::Ffdhe6144 => 375,
            DhGroup::Ffdhe8192 => 400,
        }
    }

    /// The prime, big-endian (`None` for the null group).
    pub fn prime(self) -> Option<Vec<u8>> {
        group_params(self).map(|g| g.p_bytes.clone())
    }
}

impl fmt::Display for DhGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

struct GroupParams {
    p_bytes: Vec<u8>,
    p_minus_2: Vec<u8>,
    monty: BoxedMontyParams,
    generator: BoxedMontyForm,
}

fn hex_to_bytes(hex: &str) -> Vec<u8> {
    hex.as_bytes()
        .chunks(2)
        .map(|pair| {
            let nibble = |c: u8| match c {
                b'0'..=b'9' => c - b'0',
                b'A'..=b'F' => c - b'A' + 10,
                _ => 0,
            };
            (nibble(pair[0]) << 4) | nibble(pair[1])
        })
        .collect()
}

fn build(hex: &str, bits: u32) -> GroupParams {
    let p_bytes = hex_to_bytes(hex);
    let p = BoxedUint::from_be_slice(&p_bytes, bits).expect("prime fits its group size");
    let odd = Option::from(Odd::new(p)).expect("RFC 7919 primes are odd");
    // The modulus is public: the variable-time setup is fine.
    let monty = BoxedMontyParams::new_vartime(odd);
    let generator = BoxedMontyForm::new(
        BoxedUint::from_be_slice(&[2], bits).expect("2 fits"),
        &monty,
    );
    let mut p_minus_2 = p_bytes.clone();
    // p ends in ...FF: subtracting 2 touches the last byte only.
    if let Some(last) = p_minus_2.last_mut() {
        *last -= 2;
    }
    GroupParams {
        p_bytes,
        p_minus_2,
        monty,
        generator,
    }
}

fn group_params(group: DhGroup) -> Option<&'static GroupParams> {
    static PARAMS: [OnceLock<GroupParams>; 5] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    let hex = match group {
        DhGroup::Null => return None,
        DhGroup::Ffdhe2048 => FFDHE2048_HEX,
        DhGroup::Ffdhe3072 => FFDHE3072_HEX,
        DhGroup::Ffdhe4096 => FFDHE4096_HEX,
        DhGroup::Ffdhe6144 => FFDHE6144_HEX,
        DhGroup::Ffdhe8192 => FFDHE8192_HEX,
    };
    let slot = PARAMS.get(usize::from(group.id()) - 1)?;
    Some(slot.get_or_init(|| build(hex, group.bits())))
}

/// An ephemeral private exponent of one transaction. Zeroized on drop; Debug shows the group
/// only.
pub struct PrivateKey {
    group: DhGroup,
    x: BoxedUint,
    bits: u32,
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrivateKey")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl Drop for PrivateKey {
    fn drop(&mut self) {
        self.x.zeroize();
    }
}

/// The DH session key Ks (the shared secret, as long as the prime). Zeroized on drop.
pub struct SessionKey(Zeroizing<Vec<u8>>);

impl SessionKey {
    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionKey")
            .field("len", &self.0.len())
            .finish_non_exhaustive()
    }
}

impl PrivateKey {
    /// A fresh exponent of [`DhGroup::exponent_bits`] bits from `rng`.
    pub fn generate<R: CryptoRng + ?Sized>(group: DhGroup, rng: &mut R) -> Result<Self, DhError> {
        let g = group_params(group).ok_or(DhError::NullGroup)?;
        let bits = group.exponent_bits();
        let len = usize::from(u8::try_from(bits.div_ceil(8)).unwrap_or(u8::MAX));
        // Bits of the top byte above the exponent's length.
        let spare = bits.div_ceil(8) * 8 - bits;
        let mut buf = Zeroizing::new(vec![0u8; len]);
        loop {
            rng.fill_bytes(&mut buf);
            buf[0] &= 0xff >> spare;
            // Below 2 is refused; with 2^-224 odds, draw again.
            let small = buf[..len - 1].iter().all(|&b| b == 0) && buf[len - 1] < 2;
            if !small {
                break;
            }
        }
        let x = BoxedUint::from_be_slice(&buf, g.monty.bits_precision())
            .map_err(|_| DhError::BadExponent)?;
        Ok(PrivateKey { group, x, bits })
    }

    /// An explicit exponent, big-endian (tests and known-answer vectors). It must be at least 2
    /// and no longer than the prime; the exponentiation is bounded by its length in bits.
    pub fn from_be_bytes(group: DhGroup, exponent: &[u8]) -> Result<Self, DhError> {
        let g = group_params(group).ok_or(DhError::NullGroup)?;
        let n = exponent.len();
        let small = exponent.iter().take(n.saturating_sub(1)).all(|&b| b == 0)
            && exponent.last().is_none_or(|&b| b < 2);
        if n == 0 || n > group.value_len() || small {
            return Err(DhError::BadExponent);
        }
        let x = BoxedUint::from_be_slice(exponent, g.monty.bits_precision())
            .map_err(|_| DhError::BadExponent)?;
        // n is at most the prime's length (1024 bytes).
        let bits = u32::try_from(n).unwrap_or(u32::MAX).saturating_mul(8);
        Ok(PrivateKey { group, x, bits })
    }

    /// The group.
    pub fn group(&self) -> DhGroup {
        self.group
    }

    fn params(&self) -> &'static GroupParams {
        // Built only for non-null groups, whose parameters exist.
        group_params(self.group).expect("a private key has a non-null group")
    }

    /// The public value `g^x mod p`, big-endian, as long as the prime.
    pub fn public_value(&self) -> Vec<u8> {
        let g = self.params();
        g.generator
            .pow_bounded_exp(&self.x, self.bits)
            .retrieve()
            .to_be_bytes()
            .into_vec()
    }

    /// The session key `peer^x mod p` from the peer's public value (exactly as long as the
    /// prime, in `[2, p-2]`).
    pub fn shared_secret(&self, peer: &[u8]) -> Result<SessionKey, DhError> {
        let g = self.params();
        if peer.len() != g.p_bytes.len() {
            return Err(DhError::ValueLength);
        }
        // Equal-length big-endian byte strings compare as the numbers they encode.
        let below_two = peer[..peer.len() - 1].iter().all(|&b| b == 0) && peer[peer.len() - 1] < 2;
        if below_two || peer > g.p_minus_2.as_slice() {
            return Err(DhError::ValueOutOfRange);
        }
        let y = BoxedUint::from_be_slice(peer, g.monty.bits_precision())
            .map_err(|_| DhError::ValueLength)?;
        let mut zm = BoxedMontyForm::new(y, &g.monty).pow_bounded_exp(&self.x, self.bits);
        let mut z = zm.retrieve();
        let bytes = Zeroizing::new(z.to_be_bytes().into_vec());
        // The secret's other copies go too.
        zm.zeroize();
        z.zeroize();
        let mut one = vec![0u8; bytes.len()];
        if let Some(last) = one.last_mut() {
            *last = 1;
        }
        if bool::from(bytes.as_slice().ct_eq(one.as_slice())) {
            return Err(DhError::Degenerate);
        }
        Ok(SessionKey(bytes))
    }
}

// RFC 7919 appendix A: p = 2^b - 2^(b-64) + {[2^(b-130) e] + X} * 2^64 - 1. The fixture
// script tests/fixtures/auth_vectors.py recomputes each one from that formula.
const FFDHE2048_HEX: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B423861285C97FFFFFFFFFFFFFFFF",
);

const FFDHE3072_HEX: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B66C62E37FFFFFFFFFFFFFFFF",
);

const FFDHE4096_HEX: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A",
    "7135C886EFB4318AED6A1E012D9E6832A907600A918130C46DC778F971AD0038",
    "092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E655F6AFFFFFFFFFFFFFFFF",
);

const FFDHE6144_HEX: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A",
    "7135C886EFB4318AED6A1E012D9E6832A907600A918130C46DC778F971AD0038",
    "092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E0DD9020BFD64B645036C7A",
    "4E677D2C38532A3A23BA4442CAF53EA63BB454329B7624C8917BDD64B1C0FD4C",
    "B38E8C334C701C3ACDAD0657FCCFEC719B1F5C3E4E46041F388147FB4CFDB477",
    "A52471F7A9A96910B855322EDB6340D8A00EF092350511E30ABEC1FFF9E3A26E",
    "7FB29F8C183023C3587E38DA0077D9B4763E4E4B94B2BBC194C6651E77CAF992",
    "EEAAC0232A281BF6B3A739C1226116820AE8DB5847A67CBEF9C9091B462D538C",
    "D72B03746AE77F5E62292C311562A846505DC82DB854338AE49F5235C95B9117",
    "8CCF2DD5CACEF403EC9D1810C6272B045B3B71F9DC6B80D63FDD4A8E9ADB1E69",
    "62A69526D43161C1A41D570D7938DAD4A40E329CD0E40E65FFFFFFFFFFFFFFFF",
);

const FFDHE8192_HEX: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A",
    "7135C886EFB4318AED6A1E012D9E6832A907600A918130C46DC778F971AD0038",
    "092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E0DD9020BFD64B645036C7A",
    "4E677D2C38532A3A23BA4442CAF53EA63BB454329B7624C8917BDD64B1C0FD4C",
    "B38E8C334C701C3ACDAD0657FCCFEC719B1F5C3E4E46041F388147FB4CFDB477",
    "A52471F7A9A96910B855322EDB6340D8A00EF092350511E30ABEC1FFF9E3A26E",
    "7FB29F8C183023C3587E38DA0077D9B4763E4E4B94B2BBC194C6651E77CAF992",
    "EEAAC0232A281BF6B3A739C1226116820AE8DB5847A67CBEF9C9091B462D538C",
    "D72B03746AE77F5E62292C311562A846505DC82DB854338AE49F5235C95B9117",
    "8CCF2DD5CACEF403EC9D1810C6272B045B3B71F9DC6B80D63FDD4A8E9ADB1E69",
    "62A69526D43161C1A41D570D7938DAD4A40E329CCFF46AAA36AD004CF600C838",
    "1E425A31D951AE64FDB23FCEC9509D43687FEB69EDD1CC5E0B8CC3BDF64B10EF",
    "86B63142A3AB8829555B2F747C932665CB2C0F1CC01BD70229388839D2AF05E4",
    "54504AC78B7582822846C0BA35C35F5C59160CC046FD8251541FC68C9C86B022",
    "BB7099876A460E7451A8A93109703FEE1C217E6C3826E52C51AA691E0E423CFC",
    "99E9E31650C1217B624816CDAD9A95F9D5B8019488D9C0A0A1FE3075A577E231",
    "83F81D4A3F2FA4571EFC8CE0BA8A4FE8B6855DFE72B0A66EDED2FBABFBE58A30",
    "FAFABE1C5D71A87E2F741EF8C1FE86FEA6BBFDE530677F0D97D11D49F7A8443D",
    "0822E506A9F4614E011E2A94838FF88CD68C8BB7C5C6424CFFFFFFFFFFFFFFFF",
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_names_and_sizes_match_linux() {
        for g in DhGroup::ALL {
            assert_eq!(DhGroup::from_id(g.id()), Some(g));
        }
        assert_eq!(DhGroup::from_id(6), None);
        assert_eq!(DhGroup::Ffdhe8192.name(), "ffdhe8192");
        assert_eq!(DhGroup::Null.value_len(), 0);
        for g in &DhGroup::ALL[1..] {
            let p = g.prime().unwrap();
            assert_eq!(p.len(), g.value_len());
            // Every RFC 7919 prime starts and ends with 64 one bits.
            assert_eq!(&p[..8], &[0xff; 8]);
            assert_eq!(&p[p.len() - 8..], &[0xff; 8]);
            assert_eq!(&p[8..12], &[0xad, 0xf8, 0x54, 0x58], "{g}");
        }
        assert_eq!(DhGroup::Null.prime(), None);
    }

    #[test]
    fn small_exponents_give_known_powers_of_two() {
        // 2^3 = 8 and 2^300 (a value with one bit set, well below p).
        let k = PrivateKey::from_be_bytes(DhGroup::Ffdhe2048, &[3]).unwrap();
        let v = k.public_value();
        assert_eq!(v.len(), 256);
        assert!(v[..255].iter().all(|&b| b == 0));
        assert_eq!(v[255], 8);
        let k = PrivateKey::from_be_bytes(DhGroup::Ffdhe2048, &[0x01, 0x2c]).unwrap();
        let v = k.public_value();
        let mut want = vec![0u8; 256];
        want[255 - 300 / 8] = 1 << (300 % 8);
        assert_eq!(v, want);
    }

    #[test]
    fn both_sides_agree_and_bad_values_are_refused() {
        let a = PrivateKey::from_be_bytes(DhGroup::Ffdhe2048, &[0x5a; 28]).unwrap();
        let b = PrivateKey::from_be_bytes(DhGroup::Ffdhe2048, &[0xa5; 28]).unwrap();
        let ab = a.shared_secret(&b.public_value()).unwrap();
        let ba = b.shared_secret(&a.public_value()).unwrap();
        assert_eq!(ab.as_bytes(), ba.as_bytes());
        assert_eq!(ab.as_bytes().len(), 256);

        let p = DhGroup::Ffdhe2048.prime().unwrap();
        let mut one = vec![0u8; 256];
        one[255] = 1;
        let mut p_minus_1 = p.clone();
        p_minus_1[255] -= 1;
        for bad in [vec![0u8; 256], one, p_minus_1, p.clone(), vec![0xff; 256]] {
            assert_eq!(a.shared_secret(&bad).unwrap_err(), DhError::ValueOutOfRange);
        }
        let mut p_minus_2 = p;
        p_minus_2[255] -= 2;
        assert!(a.shared_secret(&p_minus_2).is_ok());
        assert_eq!(
            a.shared_secret(&[2; 255]).unwrap_err(),
            DhError::ValueLength
        );
        for bad in [&[][..], &[1], &[0, 0, 1], &[0; 257]] {
            assert_eq!(
                PrivateKey::from_be_bytes(DhGroup::Ffdhe2048, bad).unwrap_err(),
                DhError::BadExponent
            );
        }
        assert_eq!(
            PrivateKey::from_be_bytes(DhGroup::Null, &[5]).unwrap_err(),
            DhError::NullGroup
        );
        assert_eq!(format!("{a:?}"), "PrivateKey { group: Ffdhe2048, .. }");
    }
}
