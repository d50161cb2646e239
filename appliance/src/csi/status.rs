//! Core's errors as gRPC statuses: one exhaustive mapping (no `_` arm, so a new core error does
//! not compile until it is mapped), with messages that name objects by their CSI ids.
//!
//! Handlers refine the few cases where the spec's table for one RPC differs (e.g. a missing
//! source snapshot is NOT_FOUND for CreateVolume); everything else comes from here.

use edgevol_core::{Error, Field, Limit, ObjectRef, Precondition, Problem, Range};
use tonic::Status;

use super::ids::Ids;

fn object(ids: Ids<'_>, o: ObjectRef) -> String {
    match o {
        ObjectRef::Volume(id) => format!("volume {}", ids.volume(id)),
        ObjectRef::Snapshot(id) => format!("snapshot {}", ids.snapshot(id)),
        ObjectRef::Group(id) => format!("volume group {}", ids.group(id)),
        ObjectRef::GroupSnapshot(id) => format!("group snapshot {}", ids.group_snapshot(id)),
    }
}

fn field(f: Field) -> &'static str {
    match f {
        Field::Name => "name",
        Field::Size => "size",
        Field::Parameters => "parameters",
        Field::HostNqn => "node_id (host NQN)",
        Field::AccessModes => "access modes",
        Field::Members => "volume group members",
        Field::FormatOptions => "format options",
    }
}

/// The status for core error `e`.
pub fn from_core(ids: Ids<'_>, e: Error) -> Status {
    match e {
        Error::NotFound(o) => Status::not_found(format!("{} does not exist", object(ids, o))),
        Error::AlreadyExists(o) => Status::already_exists(format!(
            "{} already exists with that name and different arguments",
            object(ids, o)
        )),
        Error::ResourceExhausted(limit) => Status::resource_exhausted(match limit {
            Limit::Volumes => format!(
                "volume limit ({}) reached",
                edgevol_core::limits::MAX_VOLUMES
            ),
            Limit::Snapshots => {
                format!(
                    "snapshot limit ({}) reached",
                    edgevol_core::limits::MAX_SNAPSHOTS
                )
            }
            Limit::Groups => format!(
                "volume group limit ({}) reached",
                edgevol_core::limits::MAX_GROUPS
            ),
            Limit::GroupSnapshots => format!(
                "group snapshot limit ({}) reached",
                edgevol_core::limits::MAX_GROUP_SNAPSHOTS
            ),
            Limit::GroupMembers => format!(
                "a volume group holds at most {} volumes",
                edgevol_core::limits::MAX_GROUP_MEMBERS
            ),
            Limit::PublishedHosts => format!(
                "a volume is published to at most {} hosts",
                edgevol_core::limits::MAX_PUBLISHED_HOSTS
            ),
            Limit::Clusters { needed, available } => {
                format!("not enough free space: {needed} clusters needed, {available} available")
            }
            Limit::Metadata => "the pool's metadata area is full".to_owned(),
        }),
        Error::OutOfRange(range) => Status::out_of_range(match range {
            Range::Shrink { current } => {
                format!("volumes only grow: the current size is {current} bytes")
            }
            Range::TooLarge { max } => format!("size exceeds the maximum of {max} bytes"),
            Range::SmallerThanSource { source } => {
                format!("the requested size is smaller than the source's {source} bytes")
            }
            Range::PastEnd { size } => format!("range past the end of the volume ({size} bytes)"),
        }),
        Error::FailedPrecondition(p) => Status::failed_precondition(match p {
            Precondition::VolumeInGroup(g) => format!(
                "the volume is a member of volume group {}: remove it from the group first",
                ids.group(g)
            ),
            Precondition::VolumePublished(v) => format!(
                "volume {} is still published: unpublish it first",
                ids.volume(v)
            ),
            Precondition::SnapshotInGroupSnapshot(gs) => format!(
                "the snapshot belongs to group snapshot {} and is deleted with it",
                ids.group_snapshot(gs)
            ),
            Precondition::PublishedToOtherHost(v) => format!(
                "volume {} has a single-node access mode and is published to another node",
                ids.volume(v)
            ),
        }),
        Error::InvalidArgument(f, problem) => Status::invalid_argument(match problem {
            Problem::Empty => format!("{} is required", field(f)),
            Problem::TooLong { max } => format!("{} is longer than {max} bytes", field(f)),
            Problem::ControlCharacter => format!("{} contains a control character", field(f)),
            Problem::Duplicate => format!("{} has a duplicate entry", field(f)),
            Problem::InOtherGroup(g) => format!(
                "{}: a volume is already in volume group {}",
                field(f),
                ids.group(g)
            ),
            Problem::Unsupported => format!("{} has an unsupported value", field(f)),
        }),
        Error::Corrupt(c) => Status::data_loss(format!("pool metadata is damaged: {c:?}")),
        Error::Device(kind) => Status::internal(format!("storage device error: {kind}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_core::{Corruption, DeviceErrorKind, GroupId, VolumeId};
    use tonic::Code;

    #[test]
    fn every_outcome_has_its_code_and_names_csi_ids() {
        let ids = Ids::new("box");
        let v = VolumeId(7);
        let cases = [
            (
                Error::NotFound(ObjectRef::Volume(v)),
                Code::NotFound,
                "volume box-v7 does not exist",
            ),
            (
                Error::AlreadyExists(ObjectRef::Volume(v)),
                Code::AlreadyExists,
                "box-v7",
            ),
            (
                Error::ResourceExhausted(Limit::Clusters {
                    needed: 5,
                    available: 2,
                }),
                Code::ResourceExhausted,
                "5 clusters needed, 2 available",
            ),
            (
                Error::OutOfRange(Range::Shrink { current: 10 }),
                Code::OutOfRange,
                "only grow",
            ),
            (
                Error::FailedPrecondition(Precondition::VolumeInGroup(GroupId(3))),
                Code::FailedPrecondition,
                "volume group box-g3",
            ),
            (
                Error::InvalidArgument(Field::Name, Problem::TooLong { max: 128 }),
                Code::InvalidArgument,
                "name is longer than 128 bytes",
            ),
            (
                Error::Corrupt(Corruption::JournalGap(9)),
                Code::DataLoss,
                "JournalGap(9)",
            ),
            (
                Error::Device(DeviceErrorKind::Io),
                Code::Internal,
                "I/O error",
            ),
        ];
        for (error, code, text) in cases {
            let status = from_core(ids, error);
            assert_eq!(status.code(), code, "{error:?}");
            assert!(
                status.message().contains(text),
                "{:?} lacks {text:?}",
                status.message()
            );
        }
    }
}
