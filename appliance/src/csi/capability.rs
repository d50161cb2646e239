//! Volume capabilities: which access types and modes the appliance supports, as core access
//! modes.
//!
//! Every mode works for raw block volumes (sharing a block device between nodes is the
//! application's business, as with any SAN). Mounted volumes carry ext4 or xfs, which are not
//! cluster filesystems: several nodes may mount one read-only, but never with a writer among
//! them, so MULTI_NODE_SINGLE_WRITER and MULTI_NODE_MULTI_WRITER are refused for mounts.

use edgevol_core::{AccessMode, AccessModes};
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::AccessType;
use edgevol_proto::csi::v1::VolumeCapability;

/// Filesystems the node plugin can create.
pub const FS_TYPES: [&str; 2] = ["ext4", "xfs"];

/// What a list of capabilities asks for, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requested {
    /// The union of the requested access modes.
    pub modes: AccessModes,
    /// Whether every capability is a raw block one.
    pub block_only: bool,
}

/// Checks one capability; `Err` says why it is unsupported.
pub fn check(cap: &VolumeCapability) -> Result<AccessMode, String> {
    let mode = cap
        .access_mode
        .map(|m| m.mode())
        .ok_or("a volume capability has no access_mode")?;
    let mode = match mode {
        Mode::Unknown => return Err("access mode UNKNOWN is not a mode".into()),
        Mode::SingleNodeWriter => AccessMode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly => AccessMode::SingleNodeReaderOnly,
        Mode::MultiNodeReaderOnly => AccessMode::MultiNodeReaderOnly,
        Mode::MultiNodeSingleWriter => AccessMode::MultiNodeSingleWriter,
        Mode::MultiNodeMultiWriter => AccessMode::MultiNodeMultiWriter,
        Mode::SingleNodeSingleWriter => AccessMode::SingleNodeSingleWriter,
        Mode::SingleNodeMultiWriter => AccessMode::SingleNodeMultiWriter,
    };
    match &cap.access_type {
        None => Err("a volume capability has neither block nor mount access type".into()),
        Some(AccessType::Block(_)) => Ok(mode),
        Some(AccessType::Mount(mount)) => {
            if !mount.fs_type.is_empty() && !FS_TYPES.contains(&mount.fs_type.as_str()) {
                return Err(format!(
                    "filesystem {:?} is not supported (use ext4 or xfs)",
                    mount.fs_type
                ));
            }
            if matches!(
                mode,
                AccessMode::MultiNodeSingleWriter | AccessMode::MultiNodeMultiWriter
            ) {
                return Err(format!(
                    "access mode {} needs a cluster filesystem; mounted volumes support it only as a raw block volume",
                    mode_of(mode).as_str_name()
                ));
            }
            Ok(mode)
        }
    }
}

fn mode_of(mode: AccessMode) -> Mode {
    match mode {
        AccessMode::SingleNodeWriter => Mode::SingleNodeWriter,
        AccessMode::SingleNodeReaderOnly => Mode::SingleNodeReaderOnly,
        AccessMode::MultiNodeReaderOnly => Mode::MultiNodeReaderOnly,
        AccessMode::MultiNodeSingleWriter => Mode::MultiNodeSingleWriter,
        AccessMode::MultiNodeMultiWriter => Mode::MultiNodeMultiWriter,
        AccessMode::SingleNodeSingleWriter => Mode::SingleNodeSingleWriter,
        AccessMode::SingleNodeMultiWriter => Mode::SingleNodeMultiWriter,
    }
}

/// Checks a non-empty list of capabilities.
pub fn check_all(caps: &[VolumeCapability]) -> Result<Requested, String> {
    if caps.is_empty() {
        return Err("volume_capabilities is required".into());
    }
    let mut modes = AccessModes::EMPTY;
    for cap in caps {
        modes = modes.with(check(cap)?);
    }
    let block_only = caps
        .iter()
        .all(|c| matches!(c.access_type, Some(AccessType::Block(_))));
    Ok(Requested { modes, block_only })
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_proto::csi::v1::volume_capability::{AccessMode as Am, BlockVolume, MountVolume};

    fn cap(block: bool, fs: &str, mode: Mode) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(Am { mode: mode as i32 }),
            access_type: Some(if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume {
                    fs_type: fs.into(),
                    ..Default::default()
                })
            }),
        }
    }

    #[test]
    fn supported_and_refused_capabilities() {
        assert!(check(&cap(false, "ext4", Mode::SingleNodeWriter)).is_ok());
        assert!(check(&cap(false, "", Mode::MultiNodeReaderOnly)).is_ok());
        assert!(check(&cap(true, "", Mode::MultiNodeMultiWriter)).is_ok());
        let e = check(&cap(false, "xfs", Mode::MultiNodeMultiWriter)).unwrap_err();
        assert!(e.contains("MULTI_NODE_MULTI_WRITER"), "{e}");
        assert!(check(&cap(false, "zfs", Mode::SingleNodeWriter))
            .unwrap_err()
            .contains("zfs"));
        assert!(check(&cap(true, "", Mode::Unknown)).is_err());
        assert!(check(&VolumeCapability::default()).is_err());
        let r = check_all(&[
            cap(true, "", Mode::SingleNodeWriter),
            cap(true, "", Mode::MultiNodeReaderOnly),
        ])
        .unwrap();
        assert!(r.block_only);
        assert!(r.modes.contains(AccessMode::MultiNodeReaderOnly));
        assert!(!r.modes.single_node());
        assert!(check_all(&[]).is_err());
    }
}
