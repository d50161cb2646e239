//! StorageClass parameters of CreateVolume and GetCapacity.
//!
//! | key | values | default |
//! |---|---|---|
//! | `provisioning` | `thin`, `thick` | `thin` |
//! | `fsType` | `ext4`, `xfs` (for mount capabilities that name none) | `ext4` |
//!
//! Keys under `csi.storage.k8s.io/` (the Kubernetes provisioner's PVC/PV metadata) are accepted
//! and kept; any other key is refused, so a typo cannot silently give a thin volume.

use std::collections::HashMap;

use edgevol_core::Provisioning;
use tonic::Status;

use super::capability::FS_TYPES;

/// Prefix of the metadata keys Kubernetes' external-provisioner adds.
const K8S_PREFIX: &str = "csi.storage.k8s.io/";

/// Checked parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// Thin or thick.
    pub provisioning: Provisioning,
    /// Filesystem for mount volumes whose capability names none.
    pub fs_type: String,
}

/// Parses and checks `map`.
pub fn parse(map: &HashMap<String, String>) -> Result<Params, Status> {
    let mut params = Params {
        provisioning: Provisioning::Thin,
        fs_type: FS_TYPES[0].to_owned(),
    };
    for (key, value) in map {
        match key.as_str() {
            "provisioning" => {
                params.provisioning = match value.as_str() {
                    "thin" => Provisioning::Thin,
                    "thick" => Provisioning::Thick,
                    other => {
                        return Err(Status::invalid_argument(format!(
                            "parameter provisioning={other:?}: expected thin or thick"
                        )))
                    }
                }
            }
            "fsType" => {
                if !FS_TYPES.contains(&value.as_str()) {
                    return Err(Status::invalid_argument(format!(
                        "parameter fsType={value:?}: expected ext4 or xfs"
                    )));
                }
                params.fs_type = value.clone();
            }
            k if k.starts_with(K8S_PREFIX) => {}
            other => {
                return Err(Status::invalid_argument(format!(
                    "unknown parameter {other:?} (known: provisioning, fsType)"
                )))
            }
        }
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_keys_parse_and_unknown_keys_are_refused() {
        let p = parse(&HashMap::new()).unwrap();
        assert_eq!(p.provisioning, Provisioning::Thin);
        assert_eq!(p.fs_type, "ext4");
        let m = HashMap::from([
            ("provisioning".to_owned(), "thick".to_owned()),
            ("fsType".to_owned(), "xfs".to_owned()),
            ("csi.storage.k8s.io/pvc/name".to_owned(), "data".to_owned()),
        ]);
        let p = parse(&m).unwrap();
        assert_eq!(
            (p.provisioning, p.fs_type.as_str()),
            (Provisioning::Thick, "xfs")
        );
        for (k, v) in [
            ("provisioning", "fat"),
            ("fsType", "btrfs"),
            ("provisoning", "thin"),
        ] {
            let e = parse(&HashMap::from([(k.to_owned(), v.to_owned())])).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
        }
    }
}
