//! CSI requests parsed into the node's operations: every field checked here, once, with a
//! uniform INVALID_ARGUMENT text. Secrets are read only for an encrypted volume's passphrase
//! ([`crate::crypt`]), which no error, log line or record ever carries.
//!
//! publish_context keys (set by the appliance's ControllerPublishVolume): `transport` (`tcp`),
//! `targetAddress` (IP), `targetPort`, `subsystemNqn`, `nguid` (32 hex digits), `uuid`
//! (namespace UUID); at least one of `nguid`/`uuid`. volume_context keys: `fsType` (used when
//! the capability names no filesystem), `encrypted` and `encryptedDiscard` (the StorageClass
//! parameters, stored with the volume by the appliance).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::AccessType;
use edgevol_proto::csi::v1::{
    NodeExpandVolumeRequest, NodeGetVolumeStatsRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};

use crate::crypt::{self, Keys, Passphrase, PASSPHRASE_KEY};
use crate::error::{Error, Result};
use crate::fabrics::Target;
use crate::fs::{check_supported, DEFAULT_FS};
use crate::sysfs::{normalize_id, NamespaceId};
use crate::volume::{
    Access, AccessMode, Capability, EncryptedStage, ExpandRequest, PublishRequest, StageRequest,
};

use edgevol_driver::publish_context::{
    ADDRESS as KEY_ADDRESS, NGUID as KEY_NGUID, PORT as KEY_PORT, SUBSYSTEM_NQN as KEY_NQN,
    TRANSPORT as KEY_TRANSPORT, UUID as KEY_UUID,
};
/// volume_context key: filesystem type.
pub const KEY_FS_TYPE: &str = "fsType";

/// Longest volume id accepted (the CSI limit).
const MAX_ID: usize = 128;

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// A required, bounded id.
pub fn volume_id(value: &str) -> Result<String> {
    if value.is_empty() {
        return Err(invalid("volume_id is required"));
    }
    if value.len() > MAX_ID {
        return Err(invalid(format!("volume_id is longer than {MAX_ID} bytes")));
    }
    Ok(value.to_owned())
}

/// A required absolute path without `..`.
pub fn abs_path(field: &str, value: &str) -> Result<PathBuf> {
    if value.is_empty() {
        return Err(invalid(format!("{field} is required")));
    }
    if !is_plain_absolute(value) {
        return Err(invalid(format!(
            "{field} {value:?} must be an absolute path without '..' or NUL"
        )));
    }
    Ok(PathBuf::from(value))
}

fn is_plain_absolute(value: &str) -> bool {
    let path = Path::new(value);
    path.is_absolute()
        && !path.components().any(|c| c == Component::ParentDir)
        && !value.contains('\0')
}

/// The `volume_path` of NodeGetVolumeStats and NodeExpandVolume: required (INVALID_ARGUMENT
/// when empty), and otherwise a question about a path. Only absolute paths are ever staging or
/// target paths, so any other is answered as any path the volume is not at: NOT_FOUND.
pub fn volume_path(volume_id: &str, value: &str) -> Result<PathBuf> {
    if value.is_empty() {
        return Err(invalid("volume_path is required"));
    }
    if !is_plain_absolute(value) {
        return Err(Error::NotFound(format!(
            "volume_path {value:?} is not a path where volume {volume_id} is staged or published \
             on this node (those are absolute paths)"
        )));
    }
    Ok(PathBuf::from(value))
}

fn mode(cap: &VolumeCapability) -> Result<AccessMode> {
    let raw = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| invalid("volume_capability.access_mode is required"))?
        .mode;
    Ok(match Mode::try_from(raw) {
        Ok(Mode::SingleNodeWriter) => AccessMode::SingleNodeWriter,
        Ok(Mode::SingleNodeReaderOnly) => AccessMode::SingleNodeReaderOnly,
        Ok(Mode::MultiNodeReaderOnly) => AccessMode::MultiNodeReaderOnly,
        Ok(Mode::MultiNodeSingleWriter) => AccessMode::MultiNodeSingleWriter,
        Ok(Mode::MultiNodeMultiWriter) => AccessMode::MultiNodeMultiWriter,
        Ok(Mode::SingleNodeSingleWriter) => AccessMode::SingleNodeSingleWriter,
        Ok(Mode::SingleNodeMultiWriter) => AccessMode::SingleNodeMultiWriter,
        Ok(Mode::Unknown) | Err(_) => {
            return Err(invalid(format!(
                "volume_capability.access_mode {raw} is not a known mode"
            )))
        }
    })
}

/// A required capability; the fs type falls back to volume_context `fsType`, then ext4.
pub fn capability(
    cap: Option<&VolumeCapability>,
    volume_context: &HashMap<String, String>,
) -> Result<Capability> {
    let cap = cap.ok_or_else(|| invalid("volume_capability is required"))?;
    let mode = mode(cap)?;
    let access = match &cap.access_type {
        None => {
            return Err(invalid(
                "volume_capability.access_type (mount or block) is required",
            ))
        }
        Some(AccessType::Block(_)) => Access::Block,
        Some(AccessType::Mount(m)) => {
            let fs_type = if !m.fs_type.is_empty() {
                m.fs_type.clone()
            } else {
                volume_context
                    .get(KEY_FS_TYPE)
                    .filter(|v| !v.is_empty())
                    .cloned()
                    .unwrap_or_else(|| DEFAULT_FS.to_owned())
            };
            check_supported(&fs_type)?;
            if let Some(flag) = m
                .mount_flags
                .iter()
                .find(|f| f.is_empty() || f.contains(char::is_whitespace))
            {
                return Err(invalid(format!(
                    "volume_capability mount flag {flag:?} is not valid"
                )));
            }
            Access::Mount {
                fs_type,
                mount_flags: m.mount_flags.clone(),
            }
        }
    };
    Ok(Capability { access, mode })
}

fn context_key<'a>(ctx: &'a HashMap<String, String>, key: &str) -> Result<&'a str> {
    match ctx.get(key) {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(invalid(format!(
            "publish_context is missing {key:?} (ControllerPublishVolume provides it)"
        ))),
    }
}

pub(crate) fn namespace(ctx: &HashMap<String, String>) -> Result<NamespaceId> {
    let parse = |key: &str| -> Result<Option<String>> {
        match ctx.get(key).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => normalize_id(v).map(Some).ok_or_else(|| {
                invalid(format!(
                    "publish_context {key} {v:?} is not a 16-byte hex identifier"
                ))
            }),
        }
    };
    let id = NamespaceId {
        nguid: parse(KEY_NGUID)?,
        uuid: parse(KEY_UUID)?,
    };
    if id.nguid.is_none() && id.uuid.is_none() {
        return Err(invalid(format!(
            "publish_context needs {KEY_NGUID:?} or {KEY_UUID:?} to find the namespace"
        )));
    }
    Ok(id)
}

/// NodeStageVolume.
pub fn stage(req: &NodeStageVolumeRequest) -> Result<StageRequest> {
    let volume_id = volume_id(&req.volume_id)?;
    let staging_path = abs_path("staging_target_path", &req.staging_target_path)?;
    let capability = capability(req.volume_capability.as_ref(), &req.volume_context)?;
    let ctx = &req.publish_context;
    let target = Target::parse(
        context_key(ctx, KEY_TRANSPORT)?,
        context_key(ctx, KEY_ADDRESS)?,
        context_key(ctx, KEY_PORT)?,
        context_key(ctx, KEY_NQN)?,
    )?;
    let namespace = namespace(ctx)?;
    let encrypted = encrypted_stage(&volume_id, &req.volume_context, &req.secrets)?;
    Ok(StageRequest {
        volume_id,
        staging_path,
        capability,
        target,
        namespace,
        encrypted,
    })
}

/// The encryption a NodeStageVolume's volume_context asks for, with the passphrases its
/// secrets carry (INVALID_ARGUMENT naming the key when they lack it); `None` for a plain
/// volume, whose secrets are not read.
pub(crate) fn encrypted_stage(
    volume_id: &str,
    volume_context: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
) -> Result<Option<EncryptedStage>> {
    let Some(encryption) = crypt::from_context(volume_id, volume_context)? else {
        return Ok(None);
    };
    Ok(Some(EncryptedStage {
        encryption,
        keys: Keys::from_secrets(volume_id, secrets)?,
    }))
}

/// NodeUnstageVolume.
pub fn unstage(req: &NodeUnstageVolumeRequest) -> Result<(String, PathBuf)> {
    Ok((
        volume_id(&req.volume_id)?,
        abs_path("staging_target_path", &req.staging_target_path)?,
    ))
}

/// NodePublishVolume.
pub fn publish(req: &NodePublishVolumeRequest) -> Result<PublishRequest> {
    // The REQUIRED fields first ("Missing required field" -> INVALID_ARGUMENT), then the
    // staging path, which the spec makes REQUIRED only for plugins that stage.
    let volume_id = volume_id(&req.volume_id)?;
    let target_path = abs_path("target_path", &req.target_path)?;
    let capability = capability(req.volume_capability.as_ref(), &req.volume_context)?;
    // STAGE_UNSTAGE_VOLUME is advertised: an unset staging path is the spec's own
    // FAILED_PRECONDITION row ("Staging target path not set"), not a malformed request.
    if req.staging_target_path.is_empty() {
        return Err(Error::FailedPrecondition(format!(
            "staging_target_path is not set: this plugin stages volumes (STAGE_UNSTAGE_VOLUME); \
             call NodeStageVolume for volume {volume_id} and pass its staging_target_path"
        )));
    }
    let staging_path = abs_path("staging_target_path", &req.staging_target_path)?;
    if target_path == staging_path {
        return Err(invalid("target_path must differ from staging_target_path"));
    }
    Ok(PublishRequest {
        volume_id,
        staging_path,
        target_path,
        read_only: req.readonly || capability.mode.read_only(),
        capability,
    })
}

/// NodeUnpublishVolume.
pub fn unpublish(req: &NodeUnpublishVolumeRequest) -> Result<(String, PathBuf)> {
    Ok((
        volume_id(&req.volume_id)?,
        abs_path("target_path", &req.target_path)?,
    ))
}

/// NodeGetVolumeStats. `staging_target_path` is optional and not needed: the node's record
/// says where the volume is staged.
pub fn stats(req: &NodeGetVolumeStatsRequest) -> Result<(String, PathBuf)> {
    let id = volume_id(&req.volume_id)?;
    let path = volume_path(&id, &req.volume_path)?;
    Ok((id, path))
}

/// The access a NodeExpandVolume request names, when it names one: block, or mount with the
/// filesystem type (empty when the capability leaves it to the volume).
fn expand_access(cap: &VolumeCapability) -> Result<Access> {
    mode(cap)?;
    match &cap.access_type {
        None => Err(invalid(
            "volume_capability.access_type (mount or block) is required when volume_capability \
             is given",
        )),
        Some(AccessType::Block(_)) => Ok(Access::Block),
        Some(AccessType::Mount(m)) => {
            if !m.fs_type.is_empty() {
                check_supported(&m.fs_type)?;
            }
            Ok(Access::Mount {
                fs_type: m.fs_type.clone(),
                mount_flags: m.mount_flags.clone(),
            })
        }
    }
}

/// NodeExpandVolume.
pub fn expand(req: &NodeExpandVolumeRequest) -> Result<ExpandRequest> {
    let id = volume_id(&req.volume_id)?;
    let path = volume_path(&id, &req.volume_path)?;
    let (required_bytes, limit_bytes) = match &req.capacity_range {
        None => (0, 0),
        Some(r) => {
            if r.required_bytes < 0 || r.limit_bytes < 0 {
                return Err(invalid("capacity_range bytes must not be negative"));
            }
            if r.limit_bytes > 0 && r.required_bytes > r.limit_bytes {
                return Err(invalid("capacity_range.required_bytes exceeds limit_bytes"));
            }
            (
                u64::try_from(r.required_bytes).unwrap_or(0),
                u64::try_from(r.limit_bytes).unwrap_or(0),
            )
        }
    };
    let access = req
        .volume_capability
        .as_ref()
        .map(expand_access)
        .transpose()?;
    let key = req
        .secrets
        .get(PASSPHRASE_KEY)
        .map(|v| Passphrase::parse(PASSPHRASE_KEY, v))
        .transpose()?;
    Ok(ExpandRequest {
        volume_id: id,
        volume_path: path,
        required_bytes,
        limit_bytes,
        access,
        key,
    })
}
