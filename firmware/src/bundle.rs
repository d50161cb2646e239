//! The firmware update bundle: one file, signed once, checked whole before anything is written.
//!
//! ```text
//! offset        size  field
//! 0             8     magic "EVFWBDL1"
//! 8             4     manifest length M (u32 LE, at most MAX_MANIFEST_LEN)
//! 12            M     manifest:
//!                       u16 format (1 or 2)
//!                       u8 n, n bytes   architecture ("x86_64"; 1..=32 of [a-z0-9_])
//!                       u8 n, n bytes   version (1..=64 printable ASCII, no space)
//!                       8 bytes         key id of the signing key
//!                       u64, 32 bytes   kernel length, SHA-256
//!                       u64, 32 bytes   initramfs length, SHA-256
//!                     format 2 only, the pools the firmware reads (`pool_format`):
//!                       u32, u32        oldest and newest pool format version
//!                       u64 x 3         compatible, read-only-compatible, incompatible
//!                                       features it supports
//! 12+M          64    Ed25519 signature over bytes [0, 12+M)
//! 76+M          K     kernel
//! 76+M+K        I     initramfs (end of file: nothing may follow)
//! ```
//!
//! The signature covers the manifest and the manifest pins each part by length and digest, so
//! the signature is checked on a few hundred bytes and the parts by hashing. [`verify`] checks,
//! in order: framing and lengths (a truncated bundle is named as such), the key id, the
//! signature, the architecture, then both digests. Only a bundle passing all of them yields a
//! [`Verified`], the only way to reach the parts.
//!
//! A format-1 manifest declares no pool format: such a bundle is read as firmware that reads
//! exactly pool format version 3 with no feature ([`PoolFormat::V3_ONLY`]), which is what every
//! firmware before format 2 does. [`build`] still writes format 1 (firmware that predates format
//! 2 refuses a format-2 bundle, so an update from it needs one); [`build_declaring`] writes
//! format 2.

use std::fmt;

use ring::digest::{digest, SHA256};

use crate::key::{KeyId, SigningKey, VerifyingKey, KEY_ID_LEN, SIGNATURE_LEN};
use crate::pool_format::PoolFormat;

/// First bytes of every bundle.
pub const MAGIC: [u8; 8] = *b"EVFWBDL1";
/// The newest manifest layout this crate reads and writes: with the pool format.
pub const FORMAT: u16 = 2;
/// The manifest layout without the pool format (read as [`PoolFormat::V3_ONLY`]).
pub const FORMAT_WITHOUT_POOL_FORMAT: u16 = 1;
/// Bound on the manifest, checked before anything else is read.
pub const MAX_MANIFEST_LEN: u32 = 1024;
const PREFIX_LEN: usize = MAGIC.len() + 4;
const DIGEST_LEN: usize = 32;

/// The parts of a bundle, as named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The kernel image.
    Kernel,
    /// The initramfs.
    Initramfs,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Part::Kernel => "kernel",
            Part::Initramfs => "initramfs",
        })
    }
}

/// Why a bundle was refused (or could not be built).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundleError {
    /// Not a bundle: the magic is wrong.
    NotABundle,
    /// A manifest layout that never existed (format 0).
    UnsupportedFormat(u16),
    /// A manifest layout newer than this firmware reads: the bundle is for newer firmware, whose
    /// update path goes through a firmware that reads it.
    FormatTooNew {
        /// The bundle's format.
        found: u16,
        /// The newest format this firmware reads.
        newest: u16,
    },
    /// The bundle ends before the length its header declares.
    Truncated {
        /// Bytes the header declares.
        expected: u64,
        /// Bytes present.
        actual: u64,
    },
    /// Bytes follow the initramfs.
    TrailingData {
        /// Bytes the header declares.
        expected: u64,
        /// Bytes present.
        actual: u64,
    },
    /// A manifest field is out of its bounds.
    Malformed(&'static str),
    /// Signed by a key other than the one this firmware trusts.
    UnknownKey {
        /// The key id in the bundle.
        bundle: KeyId,
        /// The key id this firmware trusts.
        trusted: KeyId,
    },
    /// The signature does not verify: the manifest was altered or forged.
    BadSignature,
    /// Built for another machine.
    WrongArchitecture {
        /// The bundle's architecture.
        bundle: String,
        /// This machine's.
        expected: String,
    },
    /// A part does not hash to the signed digest.
    DigestMismatch(Part),
}

impl fmt::Display for BundleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BundleError::NotABundle => f.write_str("not a firmware bundle (bad magic)"),
            BundleError::UnsupportedFormat(v) => write!(f, "unsupported bundle format {v}"),
            BundleError::FormatTooNew { found, newest } => write!(
                f,
                "bundle format {found} is newer than this firmware reads ({newest}): update to \
                 a firmware that reads it first"
            ),
            BundleError::Truncated { expected, actual } => {
                write!(f, "truncated bundle: {actual} of {expected} bytes")
            }
            BundleError::TrailingData { expected, actual } => write!(
                f,
                "bundle has {} bytes after its end ({expected} declared)",
                actual - expected
            ),
            BundleError::Malformed(what) => write!(f, "malformed bundle manifest: {what}"),
            BundleError::UnknownKey { bundle, trusted } => write!(
                f,
                "bundle signed by key {bundle}, this firmware trusts key {trusted}"
            ),
            BundleError::BadSignature => f.write_str("bad bundle signature"),
            BundleError::WrongArchitecture { bundle, expected } => write!(
                f,
                "bundle is for architecture {bundle:?}, this machine is {expected:?}"
            ),
            BundleError::DigestMismatch(part) => {
                write!(f, "{part} does not match its signed SHA-256")
            }
        }
    }
}

impl std::error::Error for BundleError {}

/// What a bundle says about itself (signed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Target architecture, as Rust's `std::env::consts::ARCH` names it.
    pub arch: String,
    /// Firmware version (what `GetPluginInfo` reports once it runs).
    pub version: String,
    /// Who signed it.
    pub key_id: KeyId,
    /// Kernel length and SHA-256.
    pub kernel: PartInfo,
    /// Initramfs length and SHA-256.
    pub initramfs: PartInfo,
    /// The pools the firmware reads, as its manifest declares them (format 2); `None`: a
    /// format-1 manifest, see [`Manifest::pool_format`].
    pub declared_pool_format: Option<PoolFormat>,
}

impl Manifest {
    /// The pools the firmware reads: as declared, or for a format-1 manifest exactly format
    /// version 3 with no feature, all that firmware from before the declaration can read.
    pub fn pool_format(&self) -> PoolFormat {
        self.declared_pool_format.unwrap_or(PoolFormat::V3_ONLY)
    }
}

/// Length and digest of one part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartInfo {
    /// Bytes.
    pub len: u64,
    /// SHA-256.
    pub sha256: [u8; DIGEST_LEN],
}

impl PartInfo {
    fn of(data: &[u8]) -> PartInfo {
        let mut sha256 = [0u8; DIGEST_LEN];
        sha256.copy_from_slice(digest(&SHA256, data).as_ref());
        PartInfo {
            len: data.len() as u64,
            sha256,
        }
    }
}

/// A bundle that passed [`verify`]: its parts are what its signer signed, for this machine.
#[derive(Debug)]
pub struct Verified<'a> {
    /// The signed manifest.
    pub manifest: Manifest,
    /// The kernel bytes.
    pub kernel: &'a [u8],
    /// The initramfs bytes.
    pub initramfs: &'a [u8],
}

/// Checks `bundle` against the trusted key and this machine's architecture.
pub fn verify<'a>(
    bundle: &'a [u8],
    trusted: &VerifyingKey,
    arch: &str,
) -> Result<Verified<'a>, BundleError> {
    let framed = frame(bundle)?;
    let manifest = &framed.manifest;
    if manifest.key_id != trusted.id() {
        return Err(BundleError::UnknownKey {
            bundle: manifest.key_id,
            trusted: trusted.id(),
        });
    }
    if !trusted.verify(framed.signed, framed.signature) {
        return Err(BundleError::BadSignature);
    }
    if manifest.arch != arch {
        return Err(BundleError::WrongArchitecture {
            bundle: manifest.arch.clone(),
            expected: arch.to_owned(),
        });
    }
    for (part, data, info) in [
        (Part::Kernel, framed.kernel, &manifest.kernel),
        (Part::Initramfs, framed.initramfs, &manifest.initramfs),
    ] {
        if PartInfo::of(data).sha256 != info.sha256 {
            return Err(BundleError::DigestMismatch(part));
        }
    }
    Ok(Verified {
        manifest: framed.manifest,
        kernel: framed.kernel,
        initramfs: framed.initramfs,
    })
}

/// Reads a bundle's manifest without trusting it: for showing what a file claims to be.
pub fn inspect(bundle: &[u8]) -> Result<Manifest, BundleError> {
    frame(bundle).map(|f| f.manifest)
}

/// Builds and signs a bundle with a format-1 manifest: it declares no pool format, so it is
/// read as firmware that reads exactly pool format version 3, and every firmware accepts it.
pub fn build(
    key: &SigningKey,
    arch: &str,
    version: &str,
    kernel: &[u8],
    initramfs: &[u8],
) -> Result<Vec<u8>, BundleError> {
    build_manifest(key, arch, version, None, kernel, initramfs)
}

/// Builds and signs a bundle declaring the pools its firmware reads (a format-2 manifest).
/// Firmware from before format 2 refuses it ("unsupported bundle format 2").
pub fn build_declaring(
    key: &SigningKey,
    arch: &str,
    version: &str,
    pool_format: PoolFormat,
    kernel: &[u8],
    initramfs: &[u8],
) -> Result<Vec<u8>, BundleError> {
    build_manifest(key, arch, version, Some(pool_format), kernel, initramfs)
}

fn build_manifest(
    key: &SigningKey,
    arch: &str,
    version: &str,
    declared_pool_format: Option<PoolFormat>,
    kernel: &[u8],
    initramfs: &[u8],
) -> Result<Vec<u8>, BundleError> {
    check_arch(arch)?;
    check_version(version)?;
    if declared_pool_format.is_some_and(|f| f.oldest > f.newest) {
        return Err(BundleError::Malformed(
            "pool format: oldest version above newest",
        ));
    }
    let manifest = Manifest {
        arch: arch.to_owned(),
        version: version.to_owned(),
        key_id: key.verifying_key().id(),
        kernel: PartInfo::of(kernel),
        initramfs: PartInfo::of(initramfs),
        declared_pool_format,
    };
    let encoded = encode_manifest(&manifest);
    let manifest_len = u32::try_from(encoded.len())
        .ok()
        .filter(|&n| n <= MAX_MANIFEST_LEN)
        .ok_or(BundleError::Malformed("manifest too long"))?;
    let mut out = Vec::with_capacity(
        PREFIX_LEN + encoded.len() + SIGNATURE_LEN + kernel.len() + initramfs.len(),
    );
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&manifest_len.to_le_bytes());
    out.extend_from_slice(&encoded);
    let signature = key.sign(&out);
    out.extend_from_slice(&signature);
    out.extend_from_slice(kernel);
    out.extend_from_slice(initramfs);
    Ok(out)
}

struct Framed<'a> {
    manifest: Manifest,
    signed: &'a [u8],
    signature: &'a [u8],
    kernel: &'a [u8],
    initramfs: &'a [u8],
}

/// Magic, lengths and manifest fields: everything short of cryptography.
fn frame(bundle: &[u8]) -> Result<Framed<'_>, BundleError> {
    let actual = bundle.len() as u64;
    let Some(magic) = bundle.get(..MAGIC.len()) else {
        return Err(if MAGIC.starts_with(bundle) {
            BundleError::Truncated {
                expected: PREFIX_LEN as u64,
                actual,
            }
        } else {
            BundleError::NotABundle
        });
    };
    if magic != MAGIC {
        return Err(BundleError::NotABundle);
    }
    let truncated = |expected: u64| BundleError::Truncated { expected, actual };
    let len_bytes: [u8; 4] = bundle
        .get(MAGIC.len()..PREFIX_LEN)
        .and_then(|b| b.try_into().ok())
        .ok_or(truncated(PREFIX_LEN as u64))?;
    let manifest_len = u32::from_le_bytes(len_bytes);
    if manifest_len > MAX_MANIFEST_LEN {
        return Err(BundleError::Malformed("manifest length out of bounds"));
    }
    let header_end = PREFIX_LEN + manifest_len as usize;
    let signature_end = header_end + SIGNATURE_LEN;
    let header = bundle
        .get(PREFIX_LEN..header_end)
        .ok_or(truncated(signature_end as u64))?;
    let manifest = decode_manifest(header)?;
    let expected = (signature_end as u64)
        .checked_add(manifest.kernel.len)
        .and_then(|n| n.checked_add(manifest.initramfs.len))
        .ok_or(BundleError::Malformed("part lengths overflow"))?;
    if actual < expected {
        return Err(truncated(expected));
    }
    if actual > expected {
        return Err(BundleError::TrailingData { expected, actual });
    }
    // `expected == actual` fits in usize: every offset below is in bounds.
    let kernel_end = signature_end + usize::try_from(manifest.kernel.len).unwrap_or(usize::MAX);
    Ok(Framed {
        signed: &bundle[..header_end],
        signature: &bundle[header_end..signature_end],
        kernel: &bundle[signature_end..kernel_end],
        initramfs: &bundle[kernel_end..],
        manifest,
    })
}

fn encode_manifest(m: &Manifest) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    let format = match m.declared_pool_format {
        Some(_) => FORMAT,
        None => FORMAT_WITHOUT_POOL_FORMAT,
    };
    out.extend_from_slice(&format.to_le_bytes());
    for text in [&m.arch, &m.version] {
        // Both were bounded by check_arch/check_version (at most 64 bytes).
        out.push(u8::try_from(text.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(text.as_bytes());
    }
    out.extend_from_slice(&m.key_id.0);
    for part in [&m.kernel, &m.initramfs] {
        out.extend_from_slice(&part.len.to_le_bytes());
        out.extend_from_slice(&part.sha256);
    }
    if let Some(p) = &m.declared_pool_format {
        out.extend_from_slice(&p.oldest.to_le_bytes());
        out.extend_from_slice(&p.newest.to_le_bytes());
        for word in [p.compatible, p.read_only_compatible, p.incompatible] {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }
    out
}

fn decode_manifest(bytes: &[u8]) -> Result<Manifest, BundleError> {
    let mut r = Reader(bytes);
    let format = u16::from_le_bytes(r.array()?);
    if format > FORMAT {
        return Err(BundleError::FormatTooNew {
            found: format,
            newest: FORMAT,
        });
    }
    if format != FORMAT && format != FORMAT_WITHOUT_POOL_FORMAT {
        return Err(BundleError::UnsupportedFormat(format));
    }
    let arch = r.text()?;
    check_arch(&arch)?;
    let version = r.text()?;
    check_version(&version)?;
    let key_id = KeyId(r.array::<KEY_ID_LEN>()?);
    let mut part = || -> Result<PartInfo, BundleError> {
        Ok(PartInfo {
            len: u64::from_le_bytes(r.array()?),
            sha256: r.array()?,
        })
    };
    let kernel = part()?;
    let initramfs = part()?;
    let declared_pool_format = if format == FORMAT {
        let pool_format = PoolFormat {
            oldest: u32::from_le_bytes(r.array()?),
            newest: u32::from_le_bytes(r.array()?),
            compatible: u64::from_le_bytes(r.array()?),
            read_only_compatible: u64::from_le_bytes(r.array()?),
            incompatible: u64::from_le_bytes(r.array()?),
        };
        if pool_format.oldest > pool_format.newest {
            return Err(BundleError::Malformed(
                "pool format: oldest version above newest",
            ));
        }
        Some(pool_format)
    } else {
        None
    };
    if !r.0.is_empty() {
        return Err(BundleError::Malformed("bytes after the manifest fields"));
    }
    Ok(Manifest {
        arch,
        version,
        key_id,
        kernel,
        initramfs,
        declared_pool_format,
    })
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], BundleError> {
        if self.0.len() < n {
            return Err(BundleError::Malformed("manifest ends inside a field"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], BundleError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn text(&mut self) -> Result<String, BundleError> {
        let [len] = self.array::<1>()?;
        let bytes = self.take(usize::from(len))?;
        String::from_utf8(bytes.to_vec()).map_err(|_| BundleError::Malformed("text is not UTF-8"))
    }
}

fn check_arch(arch: &str) -> Result<(), BundleError> {
    let ok = (1..=32).contains(&arch.len())
        && arch
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    ok.then_some(())
        .ok_or(BundleError::Malformed("architecture: 1-32 of [a-z0-9_]"))
}

/// Versions are shown by the CLI and reported over CSI: printable ASCII, no spaces.
pub fn check_version(version: &str) -> Result<(), BundleError> {
    let ok = (1..=64).contains(&version.len()) && version.bytes().all(|b| b.is_ascii_graphic());
    ok.then_some(()).ok_or(BundleError::Malformed(
        "version: 1-64 printable ASCII characters, no spaces",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> SigningKey {
        SigningKey::generate().unwrap().0
    }

    fn sample(key: &SigningKey) -> Vec<u8> {
        build(key, "x86_64", "1.2.3", b"kernel bytes", b"initramfs bytes!").unwrap()
    }

    /// Re-signs a bundle whose manifest a test altered, so a later check is reached.
    fn resign(key: &SigningKey, bundle: &mut [u8]) {
        let m = u32::from_le_bytes(bundle[8..12].try_into().unwrap()) as usize;
        let sig = key.sign(&bundle[..PREFIX_LEN + m]);
        bundle[PREFIX_LEN + m..PREFIX_LEN + m + SIGNATURE_LEN].copy_from_slice(&sig);
    }

    #[test]
    fn a_built_bundle_verifies_and_yields_its_parts() {
        let key = key();
        let bundle = sample(&key);
        let v = verify(&bundle, &key.verifying_key(), "x86_64").unwrap();
        assert_eq!(v.kernel, b"kernel bytes");
        assert_eq!(v.initramfs, b"initramfs bytes!");
        assert_eq!(v.manifest.version, "1.2.3");
        assert_eq!(v.manifest.arch, "x86_64");
        assert_eq!(v.manifest.key_id, key.verifying_key().id());
        assert_eq!(inspect(&bundle).unwrap(), v.manifest);
    }

    #[test]
    fn another_key_is_refused_by_id() {
        let (signer, other) = (key(), key());
        let err = verify(&sample(&signer), &other.verifying_key(), "x86_64").unwrap_err();
        assert_eq!(
            err,
            BundleError::UnknownKey {
                bundle: signer.verifying_key().id(),
                trusted: other.verifying_key().id()
            }
        );
    }

    #[test]
    fn a_forged_signature_is_refused() {
        let key = key();
        let mut bundle = sample(&key);
        let m = u32::from_le_bytes(bundle[8..12].try_into().unwrap()) as usize;
        bundle[PREFIX_LEN + m] ^= 1;
        assert_eq!(
            verify(&bundle, &key.verifying_key(), "x86_64").unwrap_err(),
            BundleError::BadSignature
        );
    }

    #[test]
    fn an_altered_manifest_breaks_the_signature() {
        let key = key();
        let mut bundle = sample(&key);
        // The version's last byte: "1.2.3" -> "1.2.4", still well formed.
        let at = bundle.windows(5).position(|w| w == b"1.2.3").unwrap() + 4;
        bundle[at] = b'4';
        assert_eq!(
            verify(&bundle, &key.verifying_key(), "x86_64").unwrap_err(),
            BundleError::BadSignature
        );
    }

    #[test]
    fn an_altered_part_fails_its_digest() {
        let key = key();
        let mut bundle = sample(&key);
        let n = bundle.len();
        bundle[n - 1] ^= 0x80;
        assert_eq!(
            verify(&bundle, &key.verifying_key(), "x86_64").unwrap_err(),
            BundleError::DigestMismatch(Part::Initramfs)
        );
        let at = bundle.windows(6).position(|w| w == b"kernel").unwrap();
        bundle[at] = b'K';
        assert_eq!(
            verify(&bundle, &key.verifying_key(), "x86_64").unwrap_err(),
            BundleError::DigestMismatch(Part::Kernel)
        );
    }

    #[test]
    fn another_architecture_is_refused_after_the_signature_holds() {
        let key = key();
        let bundle = build(&key, "aarch64", "1.2.3", b"k", b"i").unwrap();
        assert_eq!(
            verify(&bundle, &key.verifying_key(), "x86_64").unwrap_err(),
            BundleError::WrongArchitecture {
                bundle: "aarch64".into(),
                expected: "x86_64".into()
            }
        );
    }

    #[test]
    fn every_truncation_is_named_and_never_verifies() {
        let key = key();
        let bundle = sample(&key);
        for len in 0..bundle.len() {
            match verify(&bundle[..len], &key.verifying_key(), "x86_64") {
                Err(BundleError::Truncated { actual, expected }) => {
                    assert_eq!(actual, len as u64);
                    assert!(expected > actual);
                }
                other => panic!("cut at {len}: {other:?}"),
            }
        }
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let key = key();
        let mut bundle = sample(&key);
        let expected = bundle.len() as u64;
        bundle.push(0);
        assert_eq!(
            verify(&bundle, &key.verifying_key(), "x86_64").unwrap_err(),
            BundleError::TrailingData {
                expected,
                actual: expected + 1
            }
        );
    }

    #[test]
    fn framing_errors_are_typed() {
        let key = key();
        let public = key.verifying_key();
        assert_eq!(
            verify(b"MZ\x90\x00 a PE file", &public, "x86_64").unwrap_err(),
            BundleError::NotABundle
        );
        let mut bundle = sample(&key);
        bundle[8..12].copy_from_slice(&(MAX_MANIFEST_LEN + 1).to_le_bytes());
        assert_eq!(
            verify(&bundle, &public, "x86_64").unwrap_err(),
            BundleError::Malformed("manifest length out of bounds")
        );
        let mut bundle = sample(&key);
        bundle[PREFIX_LEN] = 0;
        assert_eq!(
            verify(&bundle, &public, "x86_64").unwrap_err(),
            BundleError::UnsupportedFormat(0)
        );
    }

    /// A bundle made for firmware with a newer manifest layout: refused in words, before its
    /// unknown fields are read (the signature covers them, but this firmware cannot know where
    /// they end), and never as "malformed".
    #[test]
    fn a_newer_manifest_format_is_named_as_such() {
        let key = key();
        for format in [3u16, 0x0100, u16::MAX] {
            let mut bundle = sample(&key);
            bundle[PREFIX_LEN..PREFIX_LEN + 2].copy_from_slice(&format.to_le_bytes());
            resign(&key, &mut bundle);
            let e = verify(&bundle, &key.verifying_key(), "x86_64").unwrap_err();
            assert_eq!(
                e,
                BundleError::FormatTooNew {
                    found: format,
                    newest: 2
                }
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "bundle format {format} is newer than this firmware reads (2): update to a \
                     firmware that reads it first"
                )
            );
        }
    }

    #[test]
    fn a_length_overflow_is_malformed_not_a_panic() {
        let key = key();
        let mut bundle = sample(&key);
        // kernel length field: after format(2), arch(1+6), version(1+5), key id(8).
        let at = PREFIX_LEN + 2 + 7 + 6 + KEY_ID_LEN;
        bundle[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        resign(&key, &mut bundle);
        assert_eq!(
            verify(&bundle, &key.verifying_key(), "x86_64").unwrap_err(),
            BundleError::Malformed("part lengths overflow")
        );
    }

    const READS_V4: PoolFormat = PoolFormat {
        oldest: 3,
        newest: 4,
        compatible: 1,
        read_only_compatible: 0,
        incompatible: 1 << 63,
    };

    #[test]
    fn the_pool_format_is_signed_and_read_back() {
        let key = key();
        let bundle =
            build_declaring(&key, "x86_64", "2.0", READS_V4, b"kernel", b"initramfs").unwrap();
        let v = verify(&bundle, &key.verifying_key(), "x86_64").unwrap();
        assert_eq!(v.manifest.declared_pool_format, Some(READS_V4));
        assert_eq!(v.manifest.pool_format(), READS_V4);
        // Manifest format 2, the five fields after the initramfs digest (12 + 2 + 1 + 6 + 1 + 3
        // + 8 + 40 + 40 = 113): flipping the newest version byte breaks the signature.
        assert_eq!(&bundle[12..14], &2u16.to_le_bytes());
        let newest_at = 12 + 2 + 1 + 6 + 1 + 3 + 8 + 40 + 40 + 4;
        assert_eq!(&bundle[newest_at..newest_at + 4], &4u32.to_le_bytes());
        let mut altered = bundle.clone();
        altered[newest_at] = 9;
        assert_eq!(
            verify(&altered, &key.verifying_key(), "x86_64").err(),
            Some(BundleError::BadSignature)
        );
        // Re-signed, an inverted range is malformed, never read as a range.
        altered[newest_at] = 2;
        resign(&key, &mut altered);
        assert_eq!(
            verify(&altered, &key.verifying_key(), "x86_64").err(),
            Some(BundleError::Malformed(
                "pool format: oldest version above newest"
            ))
        );
    }

    #[test]
    fn a_bundle_without_a_pool_format_reads_exactly_version_3() {
        let key = key();
        let bundle = sample(&key);
        assert_eq!(
            &bundle[12..14],
            &1u16.to_le_bytes(),
            "format 1: what older firmware accepts"
        );
        let v = verify(&bundle, &key.verifying_key(), "x86_64").unwrap();
        assert_eq!(v.manifest.declared_pool_format, None);
        assert_eq!(v.manifest.pool_format(), PoolFormat::V3_ONLY);
        // A format-1 manifest with the pool fields appended is not format 2: refused.
        let mut longer = build_declaring(&key, "x86_64", "1.2.3", READS_V4, b"k", b"i").unwrap();
        longer[12..14].copy_from_slice(&1u16.to_le_bytes());
        resign(&key, &mut longer);
        assert_eq!(
            verify(&longer, &key.verifying_key(), "x86_64").err(),
            Some(BundleError::Malformed("bytes after the manifest fields"))
        );
    }

    #[test]
    fn build_refuses_bad_names() {
        let key = key();
        assert!(build(&key, "X86", "1", b"", b"").is_err());
        assert!(build(&key, "x86_64", "1 2", b"", b"").is_err());
        assert!(build(&key, "x86_64", "", b"", b"").is_err());
    }

    proptest! {
        /// Any single-byte change of a valid bundle is refused, whichever check catches it.
        #[test]
        fn any_flipped_byte_is_refused(at in any::<prop::sample::Index>(), bit in 0u8..8) {
            let key = key();
            let mut bundle = sample(&key);
            let i = at.index(bundle.len());
            bundle[i] ^= 1 << bit;
            prop_assert!(verify(&bundle, &key.verifying_key(), "x86_64").is_err());
        }

        /// Arbitrary bytes never panic the parser and never verify.
        #[test]
        fn garbage_never_verifies(mut bytes in prop::collection::vec(any::<u8>(), 0..256), magic in any::<bool>()) {
            if magic && bytes.len() >= 8 {
                bytes[..8].copy_from_slice(&MAGIC);
            }
            let key = key();
            prop_assert!(verify(&bytes, &key.verifying_key(), "x86_64").is_err());
        }
    }
}
