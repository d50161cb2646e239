//! StorageClass parameters of CreateVolume and GetCapacity.
//!
//! | key | values | default |
//! |---|---|---|
//! | `provisioning` | `thin`, `thick` | `thin` |
//! | `fsType` | `ext4`, `xfs` (for mount capabilities that name none) | `ext4` |
//!
//! The metadata Kubernetes' external-provisioner adds with `--extra-create-metadata`
//! ([`K8S_METADATA`]: the claim's name and namespace, the PV's name) is accepted and stored with
//! the volume (its parameters; `edgevol volumes` shows them). The provisioner strips a
//! StorageClass's `csi.storage.k8s.io/*secret*` keys before calling; one that still arrives is
//! refused with a message saying so (its value is never echoed). Any other key is refused, so a
//! typo cannot silently give a thin volume.

use std::collections::HashMap;

use edgevol_core::Provisioning;
use tonic::Status;

use super::capability::FS_TYPES;

/// Prefix of the keys Kubernetes reserves in StorageClass parameters.
const K8S_PREFIX: &str = "csi.storage.k8s.io/";
/// The keys external-provisioner's `--extra-create-metadata` adds.
pub const K8S_METADATA: [&str; 3] = [
    "csi.storage.k8s.io/pvc/name",
    "csi.storage.k8s.io/pvc/namespace",
    "csi.storage.k8s.io/pv/name",
];

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
            k if K8S_METADATA.contains(&k) => {}
            k if k.starts_with(K8S_PREFIX) && k.contains("secret") => {
                return Err(Status::invalid_argument(format!(
                    "parameter {k:?} names a Kubernetes secret: the CO's provisioner resolves \
                     secret keys and must not pass them on (is the external-provisioner sidecar \
                     in front of this driver?)"
                )))
            }
            k if k.starts_with(K8S_PREFIX) => {
                return Err(Status::invalid_argument(format!(
                    "unknown parameter {k:?} (accepted Kubernetes metadata: {})",
                    K8S_METADATA.join(", ")
                )))
            }
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
            ("csi.storage.k8s.io/pvc/nmae", "data"),
        ] {
            let e = parse(&HashMap::from([(k.to_owned(), v.to_owned())])).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
        }
    }

    #[test]
    fn extra_create_metadata_is_accepted() {
        let m: HashMap<String, String> = K8S_METADATA
            .iter()
            .map(|k| ((*k).to_owned(), "x".to_owned()))
            .collect();
        assert_eq!(parse(&m).unwrap(), parse(&HashMap::new()).unwrap());
    }

    #[test]
    fn secret_keys_are_refused_without_echoing_their_value() {
        for key in [
            "csi.storage.k8s.io/provisioner-secret-name",
            "csi.storage.k8s.io/provisioner-secret-namespace",
            "csi.storage.k8s.io/node-stage-secret-name",
            "csi.storage.k8s.io/controller-expand-secret-name",
        ] {
            let m = HashMap::from([(key.to_owned(), "hunter2".to_owned())]);
            let e = parse(&m).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains(key), "{}", e.message());
            assert!(e.message().contains("secret"), "{}", e.message());
            assert!(!e.message().contains("hunter2"), "{}", e.message());
        }
    }
}
