//! Volumes: what the CO asked for (the spec) plus what core keeps (id, publications, cluster map).

use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Field, Problem, Result};
use crate::id::{GroupId, SnapshotId, VolumeId};
use crate::limits::{MAX_NAME_LEN, MAX_NQN_LEN, MAX_PARAMETERS_LEN};

pub(crate) use crate::cluster_map::ClusterMap;

/// How a volume gets its clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Provisioning {
    /// Clusters are allocated on first write; creation needs no space.
    Thin,
    /// Every cluster is reserved at creation (and expansion), so a first write to the volume itself
    /// never fails for space. Copy-on-write after a snapshot needs fresh clusters beyond the
    /// reservation, like any thin write.
    Thick,
}

/// A CSI access mode (the numbering of `VolumeCapability.AccessMode.Mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum AccessMode {
    /// SINGLE_NODE_WRITER.
    SingleNodeWriter = 1,
    /// SINGLE_NODE_READER_ONLY.
    SingleNodeReaderOnly = 2,
    /// MULTI_NODE_READER_ONLY.
    MultiNodeReaderOnly = 3,
    /// MULTI_NODE_SINGLE_WRITER.
    MultiNodeSingleWriter = 4,
    /// MULTI_NODE_MULTI_WRITER.
    MultiNodeMultiWriter = 5,
    /// SINGLE_NODE_SINGLE_WRITER.
    SingleNodeSingleWriter = 6,
    /// SINGLE_NODE_MULTI_WRITER.
    SingleNodeMultiWriter = 7,
}

const ALL_MODES: u8 = 0b1111_1110;
const MULTI_NODE_MODES: u8 = (1 << 3) | (1 << 4) | (1 << 5);

/// A set of access modes: bit `n` is the mode numbered `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AccessModes(u8);

impl AccessModes {
    /// The empty set.
    pub const EMPTY: Self = Self(0);

    /// This set plus `mode`.
    #[must_use]
    pub const fn with(self, mode: AccessMode) -> Self {
        Self(self.0 | 1 << mode as u8)
    }

    /// Whether `mode` is in the set.
    pub const fn contains(self, mode: AccessMode) -> bool {
        self.0 & (1 << mode as u8) != 0
    }

    /// Whether the volume may be published to at most one host at a time.
    pub const fn single_node(self) -> bool {
        self.0 & MULTI_NODE_MODES == 0
    }

    fn valid(self) -> bool {
        self.0 != 0 && self.0 & !ALL_MODES == 0
    }
}

/// Where a new volume's content comes from (CSI `VolumeContentSource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContentSource {
    /// A snapshot: the volume starts as that snapshot's data, sharing its clusters.
    Snapshot(SnapshotId),
    /// A volume (clone): the volume starts as that volume's data, sharing its clusters.
    Volume(VolumeId),
}

/// What a volume is created with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSpec {
    /// Unique name (CSI idempotency key): 1..=128 bytes, no control characters.
    pub name: String,
    /// Size in bytes; rounded up to whole clusters.
    pub size: u64,
    /// Thin or thick.
    pub provisioning: Provisioning,
    /// Opaque CSI parameters, at most 4 KiB of keys and values; keys unique. Stored sorted by key.
    pub parameters: Vec<(String, String)>,
    /// Content source, if any.
    pub source: Option<ContentSource>,
    /// Access modes the volume was created for; at least one.
    pub access_modes: AccessModes,
    /// Group to join at creation.
    pub group: Option<GroupId>,
}

impl VolumeSpec {
    /// A thin volume with no parameters, no source, no group, single-node-writer access.
    pub fn new(name: impl Into<String>, size: u64) -> Self {
        Self {
            name: name.into(),
            size,
            provisioning: Provisioning::Thin,
            parameters: Vec::new(),
            source: None,
            access_modes: AccessModes::EMPTY.with(AccessMode::SingleNodeWriter),
            group: None,
        }
    }

    /// Checks the argument-level rules and puts the spec in its stored form (sorted parameters,
    /// size rounded up to `cluster_size`).
    pub(crate) fn normalize(&mut self, cluster_size: u64) -> Result<()> {
        validate_name(&self.name)?;
        validate_parameters(&mut self.parameters)?;
        if !self.access_modes.valid() {
            return Err(Error::InvalidArgument(Field::AccessModes, Problem::Unsupported));
        }
        if self.size == 0 {
            return Err(Error::InvalidArgument(Field::Size, Problem::Empty));
        }
        self.size = round_up(self.size, cluster_size)?;
        Ok(())
    }

    /// Whether a create request repeated with `other` should return this volume (CSI idempotency).
    /// Group membership may have changed since, so it is not compared.
    pub(crate) fn compatible(&self, other: &Self) -> bool {
        Self {
            group: other.group,
            ..self.clone()
        } == *other
    }
}

/// One host a volume is published to (ControllerPublishVolume).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    /// The host's NVMe qualified name.
    pub host: String,
    /// Whether the host may only read.
    pub readonly: bool,
}

/// A volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    pub(crate) id: VolumeId,
    pub(crate) spec: VolumeSpec,
    pub(crate) published: Vec<Publication>,
    /// Mutable parameters (CSI ControllerModifyVolume), sorted by key.
    pub(crate) mutable: Vec<(String, String)>,
    pub(crate) map: ClusterMap,
}

impl Volume {
    /// Its id.
    pub fn id(&self) -> VolumeId {
        self.id
    }
    /// Its name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }
    /// Size in bytes (a whole number of clusters).
    pub fn size(&self) -> u64 {
        self.spec.size
    }
    /// Thin or thick.
    pub fn provisioning(&self) -> Provisioning {
        self.spec.provisioning
    }
    /// Parameters, sorted by key.
    pub fn parameters(&self) -> &[(String, String)] {
        &self.spec.parameters
    }
    /// Content source it was created from.
    pub fn source(&self) -> Option<ContentSource> {
        self.spec.source
    }
    /// Access modes.
    pub fn access_modes(&self) -> AccessModes {
        self.spec.access_modes
    }
    /// Group it belongs to.
    pub fn group(&self) -> Option<GroupId> {
        self.spec.group
    }
    /// Its mutable parameters (CSI ControllerModifyVolume), sorted by key.
    pub fn mutable_parameters(&self) -> &[(String, String)] {
        &self.mutable
    }

    /// The hosts it is published to, in publication order.
    pub fn publications(&self) -> &[Publication] {
        &self.published
    }
    /// Clusters mapped (own or shared with snapshots and clones).
    pub fn mapped_clusters(&self) -> u64 {
        self.map.len()
    }
}

pub(crate) fn round_up(size: u64, cluster_size: u64) -> Result<u64> {
    let max = crate::limits::MAX_VOLUME_SIZE;
    match size.checked_next_multiple_of(cluster_size) {
        Some(s) if s <= max => Ok(s),
        _ => Err(Error::OutOfRange(crate::error::Range::TooLarge { max })),
    }
}

/// Names of volumes, snapshots and groups: 1..=128 bytes, no control characters (CSI).
pub(crate) fn validate_name(name: &str) -> Result<()> {
    validate_text(name, Field::Name, MAX_NAME_LEN)
}

/// Host NQNs: 1..=223 bytes, no control characters.
pub(crate) fn validate_nqn(nqn: &str) -> Result<()> {
    validate_text(nqn, Field::HostNqn, MAX_NQN_LEN)
}

fn validate_text(s: &str, field: Field, max: usize) -> Result<()> {
    if s.is_empty() {
        Err(Error::InvalidArgument(field, Problem::Empty))
    } else if s.len() > max {
        Err(Error::InvalidArgument(field, Problem::TooLong { max }))
    } else if s.chars().any(char::is_control) {
        Err(Error::InvalidArgument(field, Problem::ControlCharacter))
    } else {
        Ok(())
    }
}

/// Sorts by key, refuses duplicate or empty keys and maps over 4 KiB.
pub(crate) fn validate_parameters(params: &mut [(String, String)]) -> Result<()> {
    let invalid = |p| Err(Error::InvalidArgument(Field::Parameters, p));
    let total: usize = params.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_PARAMETERS_LEN {
        return invalid(Problem::TooLong {
            max: MAX_PARAMETERS_LEN,
        });
    }
    params.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    if params.iter().any(|(k, _)| k.is_empty()) {
        return invalid(Problem::Empty);
    }
    if params.windows(2).any(|w| w[0].0 == w[1].0) {
        return invalid(Problem::Duplicate);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;

    #[test]
    fn names_are_checked_like_csi() {
        assert!(validate_name("pvc-1234").is_ok());
        assert!(validate_name(&"a".repeat(128)).is_ok());
        let err = |p| Err(Error::InvalidArgument(Field::Name, p));
        assert_eq!(validate_name(""), err(Problem::Empty));
        assert_eq!(validate_name(&"a".repeat(129)), err(Problem::TooLong { max: 128 }));
        assert_eq!(validate_name("a\nb"), err(Problem::ControlCharacter));
        assert_eq!(validate_name("a\u{7f}"), err(Problem::ControlCharacter));
        assert_eq!(validate_name("a\u{85}"), err(Problem::ControlCharacter));
    }

    #[test]
    fn parameters_are_sorted_and_limited() {
        let mut p = vec![("b".to_string(), "2".to_string()), ("a".to_string(), "1".to_string())];
        validate_parameters(&mut p).unwrap();
        assert_eq!(p[0].0, "a");
        let mut dup = vec![("a".to_string(), String::new()), ("a".to_string(), String::new())];
        assert_eq!(
            validate_parameters(&mut dup),
            Err(Error::InvalidArgument(Field::Parameters, Problem::Duplicate))
        );
        let mut big = vec![("k".to_string(), "v".repeat(4096))];
        assert_eq!(
            validate_parameters(&mut big),
            Err(Error::InvalidArgument(
                Field::Parameters,
                Problem::TooLong { max: 4096 }
            ))
        );
        big[0].1.pop();
        assert!(validate_parameters(&mut big).is_ok());
    }

    #[test]
    fn access_modes_know_single_node() {
        let m = AccessModes::EMPTY.with(AccessMode::SingleNodeWriter);
        assert!(m.single_node() && m.contains(AccessMode::SingleNodeWriter));
        assert!(!m.with(AccessMode::MultiNodeReaderOnly).single_node());
        assert!(!AccessModes::EMPTY.valid());
        assert!(!AccessModes(1).valid());
    }
}
