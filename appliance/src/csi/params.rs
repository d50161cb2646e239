//! StorageClass parameters of CreateVolume and GetCapacity.
//!
//! | key | values | default |
//! |---|---|---|
//! | `provisioning` | `thin`, `thick` | `thin` |
//! | `fsType` | `ext4`, `xfs` (for mount capabilities that name none) | `ext4` |
//! | `encrypted` | `true`, `false`: the node plugin keeps the volume in LUKS2 ([`super::encryption`]) | `false` |
//! | `encryptedDiscard` | `true`, `false`: discards pass through that encryption | `false` |
//!
//! The metadata Kubernetes' external-provisioner adds with `--extra-create-metadata`
//! ([`K8S_METADATA`]: the claim's name and namespace, the PV's name) is accepted and stored with
//! the volume (its parameters; `edgevol volumes` shows them). The provisioner strips a
//! StorageClass's `csi.storage.k8s.io/*secret*` keys before calling; one that still arrives is
//! refused with a message saying so (its value is never echoed). Any other key is refused, so a
//! typo cannot silently give a thin volume.
//!
//! `edgevol.io/leg` and `edgevol.io/legs-before` ([`LegMark`]) mark a volume as one leg of a
//! replicated volume; `edgevol proxy` sets them on every leg it creates. They are checked
//! (position below the number of legs, at most three legs, exactly as many earlier legs as the
//! position) and stored and shown like the Kubernetes metadata, so a listing can tell legs apart.
//!
//! [`EXISTING_ONLY_PARAM`] (`edgevol.io/existing-only: "true"`) is set only by `edgevol proxy`
//! on CreateVolume and CreateSnapshot, to ask whether this appliance already holds a volume
//! (snapshot) of the name before it places one elsewhere: taken off by [`take_existing_only`],
//! never stored, refused everywhere else.

use std::collections::HashMap;

use edgevol_core::Provisioning;
use edgevol_driver::fleet::{LegMark, LEGS_BEFORE_PARAM, LEG_PARAM};
use tonic::Status;

use super::capability::FS_TYPES;
use super::encryption::{DISCARD, ENCRYPTED};

/// Prefix of the keys Kubernetes reserves in StorageClass parameters.
const K8S_PREFIX: &str = "csi.storage.k8s.io/";
/// The keys external-provisioner's `--extra-create-metadata` adds.
pub const K8S_METADATA: [&str; 3] = [
    "csi.storage.k8s.io/pvc/name",
    "csi.storage.k8s.io/pvc/namespace",
    "csi.storage.k8s.io/pv/name",
];

/// Set by `edgevol proxy` on CreateVolume (CreateSnapshot): answer the volume (snapshot) of that
/// name as an idempotent call would (ALREADY_EXISTS for an incompatible one, a snapshot of
/// another source), NOT_FOUND when there is none, and create nothing. The proxy refuses it from
/// a CO and spells it the same.
pub const EXISTING_ONLY_PARAM: &str = "edgevol.io/existing-only";

/// Takes [`EXISTING_ONLY_PARAM`] off CreateVolume's (CreateSnapshot's) `map`: whether it was
/// `"true"`.
pub fn take_existing_only(map: &mut HashMap<String, String>) -> Result<bool, Status> {
    match map.remove(EXISTING_ONLY_PARAM).as_deref() {
        None => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(Status::invalid_argument(format!(
            "parameter {EXISTING_ONLY_PARAM}={other:?}: only \"true\", set by edgevol proxy"
        ))),
    }
}

/// Checked parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// Thin or thick.
    pub provisioning: Provisioning,
    /// Filesystem for mount volumes whose capability names none.
    pub fs_type: String,
    /// The replicated volume this one is a leg of, if it is one.
    pub leg: Option<LegMark>,
}

/// A `"true"`/`"false"` parameter.
fn check_flag(key: &str, value: &str) -> Result<(), Status> {
    match value {
        "true" | "false" => Ok(()),
        _ => Err(Status::invalid_argument(format!(
            "parameter {key}={value:?}: expected \"true\" or \"false\""
        ))),
    }
}

/// Parses and checks `map`.
pub fn parse(map: &HashMap<String, String>) -> Result<Params, Status> {
    let mut params = Params {
        provisioning: Provisioning::Thin,
        fs_type: FS_TYPES[0].to_owned(),
        leg: LegMark::of(map).map_err(|e| Status::invalid_argument(e.to_string()))?,
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
            // Spelled out: the deploy checks read the accepted keys from these arms.
            "encrypted" => check_flag(ENCRYPTED, value)?,
            "encryptedDiscard" => check_flag(DISCARD, value)?,
            k if K8S_METADATA.contains(&k) || k == LEG_PARAM || k == LEGS_BEFORE_PARAM => {}
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
                    "unknown parameter {other:?} (known: provisioning, fsType, {ENCRYPTED}, \
                     {DISCARD}, {LEG_PARAM}, {LEGS_BEFORE_PARAM})"
                )))
            }
        }
    }
    if map.get(DISCARD).is_some_and(|v| v == "true")
        && map.get(ENCRYPTED).is_none_or(|v| v != "true")
    {
        return Err(Status::invalid_argument(format!(
            "parameter {DISCARD}=\"true\" needs {ENCRYPTED}=\"true\""
        )));
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
    fn encryption_flags_are_checked() {
        let m = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        for ok in [
            m(&[(ENCRYPTED, "true")]),
            m(&[(ENCRYPTED, "false")]),
            m(&[(ENCRYPTED, "true"), (DISCARD, "true")]),
            m(&[(DISCARD, "false")]),
        ] {
            parse(&ok).unwrap();
        }
        for bad in [
            m(&[(ENCRYPTED, "yes")]),
            m(&[(DISCARD, "true")]),
            m(&[(ENCRYPTED, "false"), (DISCARD, "true")]),
        ] {
            let e = parse(&bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}");
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
    fn leg_markings_are_accepted_together_and_checked() {
        let m = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let p = parse(&m(&[(LEG_PARAM, "0/2")])).unwrap();
        assert_eq!(p.leg, Some(LegMark::new(0, 2, &[])));
        let p = parse(&m(&[(LEG_PARAM, "2/3"), (LEGS_BEFORE_PARAM, "a-v1+b-v7")])).unwrap();
        assert_eq!(p.leg, Some(LegMark::new(2, 3, &["a-v1", "b-v7"])));
        assert_eq!(parse(&HashMap::new()).unwrap().leg, None);
        for bad in [
            m(&[(LEG_PARAM, "1/2")]),
            m(&[(LEGS_BEFORE_PARAM, "a-v1")]),
            m(&[(LEG_PARAM, "0/2"), (LEGS_BEFORE_PARAM, "a-v1")]),
            m(&[(LEG_PARAM, "3/4"), (LEGS_BEFORE_PARAM, "a-v1+b-v1+c-v1")]),
            m(&[(LEG_PARAM, "1/1")]),
            m(&[(LEG_PARAM, "one/two")]),
            m(&[(LEG_PARAM, "1/2"), (LEGS_BEFORE_PARAM, "a-v1+b-v2")]),
        ] {
            let e = parse(&bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}");
            assert!(e.message().contains("edgevol.io/leg"), "{}", e.message());
        }
    }

    #[test]
    fn the_existing_only_marking_is_taken_off_and_refused_elsewhere() {
        let mut m = HashMap::from([
            (EXISTING_ONLY_PARAM.to_owned(), "true".to_owned()),
            ("provisioning".to_owned(), "thick".to_owned()),
        ]);
        assert!(take_existing_only(&mut m).unwrap());
        assert_eq!(parse(&m).unwrap().provisioning, Provisioning::Thick);
        assert!(!take_existing_only(&mut m).unwrap(), "gone once taken");
        let mut bad = HashMap::from([(EXISTING_ONLY_PARAM.to_owned(), "yes".to_owned())]);
        assert_eq!(
            take_existing_only(&mut bad).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        // Not a parameter of anything else (GetCapacity, ValidateVolumeCapabilities).
        let left = HashMap::from([(EXISTING_ONLY_PARAM.to_owned(), "true".to_owned())]);
        assert_eq!(
            parse(&left).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
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
