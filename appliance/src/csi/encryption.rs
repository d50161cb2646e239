//! The encryption parameters of CreateVolume (`encrypted`, `encryptedDiscard`): stored with the
//! volume like every parameter, returned in its volume_context, and read only by the node
//! plugin, which formats and opens LUKS2 with a key the appliance never receives. A restore or
//! clone of an encrypted volume holds its ciphertext, so it is encrypted too: it inherits the
//! source's parameters, and a request that asks for it unencrypted (or for a plain source to
//! be encrypted in place) is refused.

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

/// True when `params` ask for encryption.
pub fn is_encrypted(params: &[(String, String)]) -> bool {
    get(params, ENCRYPTED) == Some("true")
}

/// The parameters (sorted) of a volume created from a source whose parameters are `source`
/// (`None`: unknown, a snapshot whose volume is gone): an encrypted source's encryption
/// parameters are added when the request leaves them out; a request that contradicts the
/// source is refused.
pub fn inherit(
    mut params: Vec<(String, String)>,
    source: Option<&[(String, String)]>,
) -> Result<Vec<(String, String)>, Error> {
    let Some(source) = source else {
        return Ok(params);
    };
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

    fn p(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn copies_of_encrypted_volumes_stay_encrypted() {
        let src = p(&[(ENCRYPTED, "true"), (DISCARD, "true")]);
        assert_eq!(inherit(p(&[]), Some(&src)).unwrap(), src);
        assert_eq!(
            inherit(p(&[("fsType", "xfs")]), Some(&src)).unwrap(),
            p(&[(ENCRYPTED, "true"), (DISCARD, "true"), ("fsType", "xfs")])
        );
        // Asked for explicitly: kept as asked (discards are the new class's choice).
        let asked = p(&[(ENCRYPTED, "true")]);
        assert_eq!(inherit(asked.clone(), Some(&src)).unwrap(), asked);
        // Unknown source (its volume is gone): as asked.
        assert_eq!(inherit(p(&[]), None).unwrap(), p(&[]));
        assert_eq!(inherit(p(&[]), Some(&p(&[]))).unwrap(), p(&[]));
        for (params, source) in [
            (p(&[(ENCRYPTED, "false")]), src.clone()),
            (p(&[(ENCRYPTED, "true")]), p(&[])),
        ] {
            assert!(matches!(
                inherit(params, Some(&source)),
                Err(Error::EncryptionMismatch { .. })
            ));
        }
    }
}
