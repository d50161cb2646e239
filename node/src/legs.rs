//! A replicated volume's legs as ControllerPublishVolume hands them to the node: its
//! publish_context has `replicas: "N"` and, for each leg `i`, the ordinary publish_context keys
//! prefixed `leg<i>.` plus `leg<i>.volumeId` (the contract in `edgevol_driver::fleet`).

use std::collections::HashMap;
use std::path::PathBuf;

use edgevol_driver::fleet::{join_legs, leg_key, LEG_VOLUME_ID, REPLICAS};
use edgevol_driver::publish_context::{ADDRESS, NGUID, PORT, SUBSYSTEM_NQN, TRANSPORT, UUID};
use edgevol_proto::csi::v1::NodeStageVolumeRequest;
use serde::{Deserialize, Serialize};

use crate::appliances::appliance_of_nqn;
use crate::csi::request;
use crate::error::{Error, Result};
use crate::fabrics::Target;
use crate::sysfs::NamespaceId;
use crate::volume::Capability;

/// Most legs a replicated volume has.
pub const MAX_LEGS: usize = 3;

/// One leg: a namespace on one appliance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leg {
    /// The leg's CSI volume id on its appliance.
    pub volume_id: String,
    /// The appliance its subsystem NQN names (for messages).
    pub appliance: String,
    /// Where its subsystem lives.
    pub target: Target,
    /// Namespace NGUID (32 hex digits).
    pub nguid: Option<String>,
    /// Namespace UUID (32 hex digits).
    pub uuid: Option<String>,
}

impl Leg {
    /// The namespace's identity.
    pub fn namespace(&self) -> NamespaceId {
        NamespaceId {
            nguid: self.nguid.clone(),
            uuid: self.uuid.clone(),
        }
    }

    /// `leg <volume id> (<appliance>)`, as messages name it.
    pub fn describe(&self) -> String {
        format!("leg {} ({})", self.volume_id, self.appliance)
    }
}

/// What the state record keeps of a replicated volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replicated {
    /// The md array's name ([`crate::raid::array_name`]).
    pub array: String,
    /// The legs, in the volume id's order.
    pub legs: Vec<Leg>,
}

/// NodeStageVolume of a replicated volume, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicatedStageRequest {
    /// The replicated volume's id (its legs' ids joined by '+').
    pub volume_id: String,
    /// Absolute staging path.
    pub staging_path: PathBuf,
    /// Capability (fs type already resolved).
    pub capability: Capability,
    /// Every leg.
    pub legs: Vec<Leg>,
    /// LUKS2 on the md array, and its passphrases; `None` for an unencrypted volume.
    pub encrypted: Option<crate::volume::EncryptedStage>,
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

/// The legs of a publish_context with `replicas`; `None` for a plain volume's.
pub fn parse_legs(volume_id: &str, ctx: &HashMap<String, String>) -> Result<Option<Vec<Leg>>> {
    let Some(count) = ctx.get(REPLICAS) else {
        return Ok(None);
    };
    let n: usize = count
        .parse()
        .ok()
        .filter(|n| (2..=MAX_LEGS).contains(n))
        .ok_or_else(|| {
            invalid(format!(
                "publish_context {REPLICAS} {count:?} must be 2 or 3 (ControllerPublishVolume \
                 provides it)"
            ))
        })?;
    let mut legs = Vec::with_capacity(n);
    for i in 0..n {
        let key = |k: &str| -> Result<&str> {
            let full = leg_key(i, k);
            ctx.get(&full)
                .map(String::as_str)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| {
                    invalid(format!(
                        "publish_context of replicated volume {volume_id} is missing {full:?} \
                         (ControllerPublishVolume provides it)"
                    ))
                })
        };
        let target = Target::parse(
            key(TRANSPORT)?,
            key(ADDRESS)?,
            key(PORT)?,
            key(SUBSYSTEM_NQN)?,
        )?;
        let ids: HashMap<String, String> = [NGUID, UUID]
            .into_iter()
            .filter_map(|k| ctx.get(&leg_key(i, k)).map(|v| (k.to_owned(), v.clone())))
            .collect();
        let ns = request::namespace(&ids)?;
        legs.push(Leg {
            volume_id: key(LEG_VOLUME_ID)?.to_owned(),
            appliance: appliance_of_nqn(&target.subsysnqn)
                .unwrap_or("unknown appliance")
                .to_owned(),
            target,
            nguid: ns.nguid,
            uuid: ns.uuid,
        });
    }
    let joined = join_legs(legs.iter().map(|l| l.volume_id.as_str()));
    if joined != volume_id {
        return Err(invalid(format!(
            "publish_context names legs {joined}, not those of volume {volume_id}"
        )));
    }
    for (i, leg) in legs.iter().enumerate() {
        if legs[..i].iter().any(|o| o.target == leg.target) {
            return Err(invalid(format!(
                "publish_context of volume {volume_id} names subsystem {} twice",
                leg.target.subsysnqn
            )));
        }
    }
    Ok(Some(legs))
}

/// NodeStageVolume of a replicated volume; `None` when the volume is a plain one.
pub fn stage_request(req: &NodeStageVolumeRequest) -> Result<Option<ReplicatedStageRequest>> {
    let volume_id = request::volume_id(&req.volume_id)?;
    let Some(legs) = parse_legs(&volume_id, &req.publish_context)? else {
        return Ok(None);
    };
    let staging_path = request::abs_path("staging_target_path", &req.staging_target_path)?;
    let capability = request::capability(req.volume_capability.as_ref(), &req.volume_context)?;
    let encrypted = request::encrypted_stage(&volume_id, &req.volume_context, &req.secrets)?;
    Ok(Some(ReplicatedStageRequest {
        staging_path,
        capability,
        volume_id,
        legs,
        encrypted,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn leg_context(n: usize) -> HashMap<String, String> {
        let mut ctx = HashMap::from([(REPLICAS.to_owned(), n.to_string())]);
        for i in 0..n {
            for (k, v) in [
                (TRANSPORT, "tcp".to_owned()),
                (ADDRESS, format!("10.0.{i}.2")),
                (PORT, "4420".to_owned()),
                (SUBSYSTEM_NQN, format!("nqn.2024-11.io.edgevol:box-{i}:v7")),
                (NGUID, format!("{:032x}", i + 1)),
                (LEG_VOLUME_ID, format!("box-{i}-v7")),
            ] {
                ctx.insert(leg_key(i, k), v);
            }
        }
        ctx
    }

    #[test]
    fn every_leg_is_read_from_its_prefixed_keys() {
        let legs = parse_legs("box-0-v7+box-1-v7", &leg_context(2))
            .unwrap()
            .unwrap();
        assert_eq!(legs.len(), 2);
        assert_eq!(legs[1].volume_id, "box-1-v7");
        assert_eq!(legs[1].appliance, "box-1");
        assert_eq!(legs[1].target.traddr, "10.0.1.2");
        assert_eq!(legs[1].nguid.as_deref(), Some(&*format!("{:032x}", 2)));
        assert_eq!(legs[0].describe(), "leg box-0-v7 (box-0)");
        assert!(parse_legs("v1", &HashMap::new()).unwrap().is_none());
    }

    #[test]
    fn a_bad_replicated_context_is_invalid_argument_naming_the_key() {
        let mut ctx = leg_context(2);
        ctx.remove("leg1.targetAddress");
        let e = parse_legs("box-0-v7+box-1-v7", &ctx).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("leg1.targetAddress")),
            "{e}"
        );
        let e = parse_legs("box-0-v7+box-9-v7", &leg_context(2)).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("not those of")),
            "{e}"
        );
        let mut ctx = leg_context(2);
        ctx.insert(REPLICAS.into(), "4".into());
        assert!(parse_legs("box-0-v7+box-1-v7", &ctx).is_err());
        let mut ctx = leg_context(2);
        ctx.insert("leg1.nguid".into(), "zz".into());
        assert!(parse_legs("box-0-v7+box-1-v7", &ctx).is_err());
    }
}
