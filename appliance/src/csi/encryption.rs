//! The encryption parameters of CreateVolume (`encrypted`, `encryptedDiscard`): stored with the
//! volume like every parameter, returned in its volume_context, and read only by the node
//! plugin, which formats and opens LUKS2 with a key the appliance never receives. A restore or
//! clone of an encrypted volume holds its ciphertext, so it is encrypted too: it inherits the
//! source's parameters, and a request that asks for it unencrypted (or for a plain source to
//! be encrypted in place) is refused. A snapshot outlives its volume and core keeps no
//! parameters with it: once the volume is gone, a snapshot that starts with a LUKS2 header is
//! taken for encrypted ([`starts_with_luks2`]).

use super::error::Error;

/// StorageClass parameter: the node encrypts the volume (`"true"`/`"false"`).
pub const ENCRYPTED: &str = "encrypted";
/// StorageClass parameter: discards pass through the node's encryption (`"true"`/`"false"`).
pub const DISCARD: &str = "encryptedDiscard";

fn get<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The magic of a LUKS2 volume's primary binary header, at byte 0 of the device (LUKS2 on-disk
/// format; the secondary header's is `SKUL\xba\xbe`, at its own offset).
const LUKS_MAGIC: &[u8; 6] = b"LUKS\xba\xbe";
/// The LUKS format version that follows the magic, a big-endian u16 (LUKS1 has 1 there).
const LUKS2_VERSION: u16 = 2;
/// How many first bytes of a device [`starts_with_luks2`] looks at: the magic and the version.
pub const HEADER_PROBE_LEN: usize = LUKS_MAGIC.len() + 2;

/// True when `first` (a device's first bytes) begin with a LUKS2 primary header: the magic, then
/// version 2. Only these eight bytes are read, never the key slots or anything else of the
/// header; a LUKS1 header is not LUKS2 (the node plugin formats and opens LUKS2 only).
pub fn starts_with_luks2(first: &[u8]) -> bool {
    first.get(..LUKS_MAGIC.len()) == Some(LUKS_MAGIC.as_slice())
        && first.get(LUKS_MAGIC.len()..HEADER_PROBE_LEN)
            == Some(LUKS2_VERSION.to_be_bytes().as_slice())
}

/// What a restore or clone knows of its source's encryption.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source<'a> {
    /// The parameters of the source volume (the cloned one, or the one a snapshot was taken of).
    Parameters(&'a [(String, String)]),
    /// A snapshot whose volume is gone and that starts with a LUKS2 header: encrypted;
    /// whether discards passed through is unknown, so they do not (the safe default).
    Luks2Header,
}

/// True when `params` ask for encryption.
pub fn is_encrypted(params: &[(String, String)]) -> bool {
    get(params, ENCRYPTED) == Some("true")
}

/// The parameters (sorted) of a volume created from `source` (`None`: no source, or a snapshot
/// whose volume is gone and that holds no LUKS2 header, so nothing is known): an encrypted
/// source's encryption parameters are added when the request leaves them out; a request that
/// contradicts the source is refused.
pub fn inherit(
    params: Vec<(String, String)>,
    source: Option<Source<'_>>,
) -> Result<Vec<(String, String)>, Error> {
    match source {
        None => Ok(params),
        Some(Source::Parameters(source)) => inherit_from(params, source),
        Some(Source::Luks2Header) => {
            inherit_from(params, &[(ENCRYPTED.to_owned(), "true".to_owned())])
        }
    }
}

/// [`inherit`] from a source whose parameters are `source`.
fn inherit_from(
    mut params: Vec<(String, String)>,
    source: &[(String, String)],
) -> Result<Vec<(String, String)>, Error> {
    let asked = get(&params, ENCRYPTED);
    match (is_encrypted(source), asked) {
        (true, None) => {
            params.push((ENCRYPTED.to_owned(), "true".to_owned()));
            if get(&params, DISCARD).is_none() {
                if let Some(d) = get(source, DISCARD) {
                    params.push((DISCARD.to_owned(), d.to_owned()));
                }
            }
            params.sort();
            Ok(params)
        }
        (true, Some("true")) | (false, None | Some("false")) => Ok(params),
        (true, Some(_)) => Err(Error::EncryptionMismatch {
            source_encrypted: true,
        }),
        (false, Some(_)) => Err(Error::EncryptionMismatch {
            source_encrypted: false,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(params: &[(String, String)]) -> Option<Source<'_>> {
        Some(Source::Parameters(params))
    }

    fn p(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn copies_of_encrypted_volumes_stay_encrypted() {
        let src = p(&[(ENCRYPTED, "true"), (DISCARD, "true")]);
        assert_eq!(inherit(p(&[]), of(&src)).unwrap(), src);
        assert_eq!(
            inherit(p(&[("fsType", "xfs")]), of(&src)).unwrap(),
            p(&[(ENCRYPTED, "true"), (DISCARD, "true"), ("fsType", "xfs")])
        );
        // Asked for explicitly: kept as asked (discards are the new class's choice).
        let asked = p(&[(ENCRYPTED, "true")]);
        assert_eq!(inherit(asked.clone(), of(&src)).unwrap(), asked);
        // Unknown source (its volume is gone, no LUKS2 header): as asked.
        assert_eq!(inherit(p(&[]), None).unwrap(), p(&[]));
        assert_eq!(inherit(asked.clone(), None).unwrap(), asked);
        assert_eq!(inherit(p(&[]), of(&p(&[]))).unwrap(), p(&[]));
        for (params, source) in [
            (p(&[(ENCRYPTED, "false")]), src.clone()),
            (p(&[(ENCRYPTED, "true")]), p(&[])),
        ] {
            assert!(matches!(
                inherit(params, of(&source)),
                Err(Error::EncryptionMismatch { .. })
            ));
        }
    }

    #[test]
    fn a_luks2_header_makes_an_orphaned_snapshot_encrypted_without_discards() {
        let header = Some(Source::Luks2Header);
        assert_eq!(inherit(p(&[]), header).unwrap(), p(&[(ENCRYPTED, "true")]));
        assert_eq!(
            inherit(p(&[("fsType", "xfs")]), header).unwrap(),
            p(&[(ENCRYPTED, "true"), ("fsType", "xfs")])
        );
        let asked = p(&[(DISCARD, "true"), (ENCRYPTED, "true")]);
        assert_eq!(inherit(asked.clone(), header).unwrap(), asked);
        assert_eq!(
            inherit(p(&[(ENCRYPTED, "false")]), header),
            Err(Error::EncryptionMismatch {
                source_encrypted: true
            })
        );
    }

    #[test]
    fn only_a_luks2_primary_header_is_recognised() {
        let mut block = vec![0u8; 4096];
        block[..6].copy_from_slice(b"LUKS\xba\xbe");
        block[6..8].copy_from_slice(&2u16.to_be_bytes());
        assert!(starts_with_luks2(&block));
        assert!(starts_with_luks2(&block[..HEADER_PROBE_LEN]));
        // LUKS1, the version little-endian, the secondary header's magic, a short read, zeros.
        let mut luks1 = block.clone();
        luks1[6..8].copy_from_slice(&1u16.to_be_bytes());
        let mut little = block.clone();
        little[6..8].copy_from_slice(&2u16.to_le_bytes());
        let mut secondary = block.clone();
        secondary[..6].copy_from_slice(b"SKUL\xba\xbe");
        for not in [
            &luks1[..],
            &little,
            &secondary,
            &block[..7],
            &[0u8; 4096],
            &[],
        ] {
            assert!(!starts_with_luks2(not), "{:?}", &not[..not.len().min(8)]);
        }
    }
}
