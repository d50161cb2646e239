//! What a CSI operation can fail with once its request is valid: the pool handle refusing the
//! call, core's errors, and the outcomes the appliance decides itself. No gRPC type here:
//! [`super::status::from_error`] gives every variant its status, in one exhaustive mapping.

use std::collections::BTreeMap;

use edgevol_core::{GroupId, GroupSnapshotId, SnapshotId, VolumeId};

use crate::group_commit::CommitFailed;
use crate::state::PoolUnavailable;

/// The kind of object an id names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A volume.
    Volume,
    /// A snapshot.
    Snapshot,
    /// A volume group.
    Group,
    /// A group snapshot.
    GroupSnapshot,
}

/// The bound of a capacity range a size was checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// `required_bytes`.
    Required,
    /// `limit_bytes`.
    Limit,
}

/// A failed CSI operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The pool handle refused the call.
    Unavailable(PoolUnavailable),
    /// Core refused the operation.
    Core(edgevol_core::Error),
    /// An id that is not one of this appliance's (malformed, or another appliance's): nothing of
    /// that kind exists here. Named as given.
    UnknownId(Kind, String),
    /// A node id that is not an NVMe host NQN: no node the target could serve.
    UnknownNode(String),
    /// Publishing needs the NVMe/TCP target, which is not running.
    NoTarget,
    /// No requisite topology includes this appliance, whose segments these are.
    OutsideTopology(BTreeMap<String, String>),
    /// The content source holds more bytes than a bound of the capacity range.
    SourceTooLarge {
        /// The source's size.
        source: u64,
        /// Which bound.
        bound: Bound,
        /// Its value.
        value: u64,
    },
    /// No multiple of the cluster lies in the capacity range.
    NoSizeInRange {
        /// The cluster size.
        cluster: u64,
        /// `required_bytes`.
        required: u64,
        /// `limit_bytes`.
        limit: u64,
    },
    /// The volume was not created for the access mode a publication asks for.
    ModeNotCreated(VolumeId),
    /// The volume's access mode allows no further node (or writer): it is published to these.
    PublishedElsewhere {
        /// The volume.
        volume: VolumeId,
        /// The nodes holding it.
        holders: Vec<String>,
        /// Whether the refused publication was read-only.
        readonly: bool,
    },
    /// The node already has the volume, with the other `readonly`.
    PublishedOtherwise {
        /// The volume.
        volume: VolumeId,
        /// The node.
        node: String,
        /// The refused publication's `readonly`.
        readonly: bool,
    },
    /// A group snapshot source is in no volume group.
    NotInGroup(VolumeId),
    /// Group snapshot sources lie in different volume groups.
    DifferentGroups(GroupId, GroupId),
    /// The group holds volumes a group snapshot request does not name.
    NotAllMembers {
        /// The group.
        group: GroupId,
        /// Its members the request left out.
        missing: Vec<VolumeId>,
    },
    /// Delete/GetVolumeGroupSnapshot without the member snapshot ids.
    SnapshotIdsRequired,
    /// The member snapshot ids given are not the group snapshot's.
    SnapshotIdsMismatch {
        /// The group snapshot.
        group_snapshot: GroupSnapshotId,
        /// Its members.
        members: Vec<SnapshotId>,
    },
    /// A `starting_token` this plugin did not issue.
    BadToken(String),
    /// GetMetadataDelta of snapshots taken of different volumes.
    SnapshotsOfDifferentVolumes {
        /// The base snapshot.
        base: SnapshotId,
        /// The target snapshot.
        target: SnapshotId,
    },
    /// GetMetadataDelta whose base was taken after its target.
    BaseNewerThanTarget {
        /// The base snapshot.
        base: SnapshotId,
        /// The target snapshot.
        target: SnapshotId,
    },
    /// A restore or clone whose `encrypted` parameter contradicts its source: a copy of
    /// ciphertext cannot be unencrypted, nor plain data encrypted in place.
    EncryptionMismatch {
        /// Whether the source is encrypted.
        source_encrypted: bool,
    },
    /// A snapshot metadata `starting_offset` that is negative or past the volume's end.
    OffsetOutOfRange {
        /// The offset asked for.
        offset: i64,
        /// The volume's size when the snapshot was taken.
        capacity: u64,
    },
}

/// A deletion's outcome, as CSI wants it: an object that does not exist (never ours, or gone)
/// is deleted.
pub fn gone_is_ok(result: Result<(), Error>) -> Result<(), Error> {
    match result {
        Err(Error::UnknownId(..) | Error::Core(edgevol_core::Error::NotFound(_))) => Ok(()),
        other => other,
    }
}

impl From<PoolUnavailable> for Error {
    fn from(e: PoolUnavailable) -> Self {
        Error::Unavailable(e)
    }
}

impl From<edgevol_core::Error> for Error {
    fn from(e: edgevol_core::Error) -> Self {
        Error::Core(e)
    }
}

impl From<CommitFailed> for Error {
    fn from(e: CommitFailed) -> Self {
        match e {
            CommitFailed::Core(e) => Error::Core(e),
            CommitFailed::Unavailable(e) => Error::Unavailable(e),
        }
    }
}
