//! Core's error: a small `Copy` value, one variant per CSI outcome, with enough detail (ids,
//! limits, fields) for the appliance to write a status message without strings in core.

use crate::device::DeviceErrorKind;
use crate::feature::Feature;
use crate::id::{GroupId, GroupSnapshotId, SnapshotId, VolumeId};

/// Everything a core operation can fail with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The object does not exist (CSI NOT_FOUND).
    NotFound(ObjectRef),
    /// An object of that name exists with an incompatible spec (CSI ALREADY_EXISTS).
    AlreadyExists(ObjectRef),
    /// A limit or the pool's space is exhausted (CSI RESOURCE_EXHAUSTED).
    ResourceExhausted(Limit),
    /// A size or range is outside what the object allows (CSI OUT_OF_RANGE).
    OutOfRange(Range),
    /// The object's state forbids the operation (CSI FAILED_PRECONDITION).
    FailedPrecondition(Precondition),
    /// An argument is malformed (CSI INVALID_ARGUMENT).
    InvalidArgument(Field, Problem),
    /// On-media metadata failed validation; the pool is not mounted (CSI INTERNAL / DATA_LOSS).
    Corrupt(Corruption),
    /// The pool is intact but needs what this build lacks (a newer format version, an
    /// incompatible feature); it is not mounted (CSI FAILED_PRECONDITION: boot firmware that
    /// reads it). Also [`crate::Pool::enable_feature`] of a feature this build does not support.
    Unsupported(Unsupported),
    /// The pool is mounted read-only because it has this read-only-compatible feature that this
    /// build lacks: every change is refused (CSI FAILED_PRECONDITION, NVMe Namespace Is Write
    /// Protected).
    ReadOnly(Feature),
    /// The device failed. After a failure during a commit the pool refuses further work until it is
    /// reopened, because what reached the medium is unknown.
    Device(DeviceErrorKind),
}

/// Result of core operations.
pub type Result<T, E = Error> = core::result::Result<T, E>;

impl From<DeviceErrorKind> for Error {
    fn from(kind: DeviceErrorKind) -> Self {
        Self::Device(kind)
    }
}

/// The object an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectRef {
    /// A volume.
    Volume(VolumeId),
    /// A snapshot.
    Snapshot(SnapshotId),
    /// A volume group.
    Group(GroupId),
    /// A group snapshot.
    GroupSnapshot(GroupSnapshotId),
}

/// Which limit was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// [`crate::limits::MAX_VOLUMES`].
    Volumes,
    /// [`crate::limits::MAX_SNAPSHOTS`].
    Snapshots,
    /// [`crate::limits::MAX_GROUPS`].
    Groups,
    /// [`crate::limits::MAX_GROUP_SNAPSHOTS`].
    GroupSnapshots,
    /// [`crate::limits::MAX_GROUP_MEMBERS`].
    GroupMembers,
    /// [`crate::limits::MAX_PUBLISHED_HOSTS`].
    PublishedHosts,
    /// Not enough free (unreserved) clusters. `pending_free` clusters were freed since the last
    /// flush and become allocatable once it completes.
    Clusters {
        /// Clusters the operation needed.
        needed: u64,
        /// Clusters available (free minus reserved).
        available: u64,
    },
    /// The metadata area (checkpoint slot or journal) cannot hold more.
    Metadata,
}

/// What was out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// Expansion asked for less than the current size; volumes only grow.
    Shrink {
        /// Current size, bytes.
        current: u64,
    },
    /// A size above [`crate::limits::MAX_VOLUME_SIZE`].
    TooLarge {
        /// The maximum, bytes.
        max: u64,
    },
    /// A volume from a source must be at least as large as the source.
    SmallerThanSource {
        /// The source's size, bytes.
        source: u64,
    },
    /// An I/O range past the end of the volume.
    PastEnd {
        /// The volume's size, bytes.
        size: u64,
    },
}

/// Why the object's state forbids the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// The volume is a member of this group: remove it from the group first (VolumeGroup spec).
    VolumeInGroup(GroupId),
    /// The volume is published to a host: unpublish it first.
    VolumePublished(VolumeId),
    /// The snapshot belongs to this group snapshot and is deleted with it only.
    SnapshotInGroupSnapshot(GroupSnapshotId),
    /// The volume's access modes are single-node and it is already published to another host.
    PublishedToOtherHost(VolumeId),
}

/// The argument an `InvalidArgument` is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// An object name.
    Name,
    /// A size.
    Size,
    /// A parameter map.
    Parameters,
    /// A host NQN.
    HostNqn,
    /// Access modes.
    AccessModes,
    /// A group's member list, or a group for a group snapshot.
    Members,
    /// Format options.
    FormatOptions,
}

/// What is wrong with the argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// Empty where a value is required.
    Empty,
    /// Longer than the limit, in bytes.
    TooLong {
        /// The limit, bytes.
        max: usize,
    },
    /// Contains a control character (CSI names and ids must not).
    ControlCharacter,
    /// A key or member appears twice.
    Duplicate,
    /// A member is in another group.
    InOtherGroup(GroupId),
    /// Not a supported value (cluster size, geometry, access mode bits).
    Unsupported,
}

/// Where metadata failed validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corruption {
    /// Neither superblock is valid: not an edgevol pool, or both copies damaged.
    NoSuperblock,
    /// The superblock's geometry does not fit this device.
    Geometry,
    /// Neither checkpoint slot holds a valid checkpoint.
    NoCheckpoint,
    /// A checkpoint's CRC matched but its tables are inconsistent.
    Checkpoint,
    /// The journal record with this sequence number is damaged but a later hard commit is intact:
    /// that commit flushed the device first, so the damaged record was durable; not a torn tail,
    /// and mounting would silently drop acknowledged work. (Intact soft frames after a damaged one
    /// prove nothing: after a power cut un-flushed blocks survive in any order.)
    JournalGap(u64),
    /// A journal record's CRC matched but it does not decode or apply.
    Record(u64),
}

/// What this build lacks to read a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsupported {
    /// The pool's format version is newer than this build reads.
    VersionTooNew {
        /// The pool's version.
        found: u32,
        /// The newest version this build reads.
        newest: u32,
    },
    /// The pool's format version is older than this build reads.
    VersionTooOld {
        /// The pool's version.
        found: u32,
        /// The oldest version this build reads.
        oldest: u32,
    },
    /// The pool has a feature this build does not support: an incompatible one at open, or
    /// any one [`crate::Pool::enable_feature`] was asked for.
    Feature(Feature),
}
