//! Every CSI operation's failure as a gRPC status: one exhaustive mapping ([`from_error`], and
//! [`from_core`] for core's errors; no `_` arm, so a new error does not compile until it is
//! mapped), with messages that name objects by their CSI ids.
//!
//! Handlers build no status of their own: request checks ([`super::validate`] and the
//! `TryFrom` conversions) answer INVALID_ARGUMENT, everything after them comes from here.

use edgevol_core::{Error as CoreError, Field, Limit, ObjectRef, Precondition, Problem, Range};
use tonic::Status;

use super::error::{Bound, Error, Kind};
use super::ids::Ids;
use crate::state::PoolUnavailable;

fn object(ids: Ids<'_>, o: ObjectRef) -> String {
    match o {
        ObjectRef::Volume(id) => format!("{} {}", kind(Kind::Volume), ids.volume(id)),
        ObjectRef::Snapshot(id) => format!("{} {}", kind(Kind::Snapshot), ids.snapshot(id)),
        ObjectRef::Group(id) => format!("{} {}", kind(Kind::Group), ids.group(id)),
        ObjectRef::GroupSnapshot(id) => {
            format!("{} {}", kind(Kind::GroupSnapshot), ids.group_snapshot(id))
        }
    }
}

fn kind(k: Kind) -> &'static str {
    match k {
        Kind::Volume => "volume",
        Kind::Snapshot => "snapshot",
        Kind::Group => "volume group",
        Kind::GroupSnapshot => "group snapshot",
    }
}

fn bound(b: Bound) -> &'static str {
    match b {
        Bound::Required => "required_bytes",
        Bound::Limit => "limit_bytes",
    }
}

/// The status for a failed CSI operation.
pub fn from_error(ids: Ids<'_>, e: Error) -> Status {
    match e {
        Error::Unavailable(u) => match u {
            PoolUnavailable::NotReady => {
                Status::unavailable("the pool is still opening; retry shortly")
            }
            PoolUnavailable::Poisoned | PoolUnavailable::TaskFailed => {
                Status::internal(u.to_string())
            }
        },
        Error::Core(e) => from_core(ids, e),
        Error::UnknownId(k, id) => Status::not_found(format!("{} {id} does not exist", kind(k))),
        Error::UnknownNode(node) => Status::not_found(format!(
            "node {node:?} is not an NVMe host NQN (the node plugin reports its host NQN as node_id)"
        )),
        Error::NoTarget => {
            Status::unimplemented("publishing needs the NVMe/TCP target, which is not running")
        }
        Error::OutsideTopology(here) => Status::resource_exhausted(format!(
            "no requisite topology includes this appliance ({})",
            here.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        )),
        Error::SourceTooLarge { source, bound: b, value } => Status::out_of_range(format!(
            "the source holds {source} bytes, more than {} ({value})",
            bound(b)
        )),
        Error::NoSizeInRange {
            cluster,
            required,
            limit,
        } => Status::out_of_range(format!(
            "no multiple of the {cluster}-byte cluster lies in [{required}, {limit}]"
        )),
        Error::ModeNotCreated(v) => Status::invalid_argument(format!(
            "volume {} was not created for that access mode",
            ids.volume(v)
        )),
        Error::PublishedElsewhere {
            volume,
            holders,
            readonly,
        } => Status::failed_precondition(format!(
            "volume {} is published to node(s) {} and its access mode does not allow another{}",
            ids.volume(volume),
            holders.join(", "),
            if readonly { "" } else { " writer" }
        )),
        Error::PublishedOtherwise {
            volume,
            node,
            readonly,
        } => Status::already_exists(format!(
            "volume {} is published to node {node} with readonly={}",
            ids.volume(volume),
            !readonly
        )),
        Error::NotInGroup(v) => Status::failed_precondition(format!(
            "volume {} is in no volume group: group snapshots are taken of exactly the members \
             of one volume group (ModifyVolumeGroupMembership)",
            ids.volume(v)
        )),
        Error::DifferentGroups(a, b) => Status::failed_precondition(format!(
            "the volumes are in different volume groups ({} and {}): group snapshots are taken \
             of exactly the members of one volume group",
            ids.group(a),
            ids.group(b)
        )),
        Error::NotAllMembers { group, missing } => Status::failed_precondition(format!(
            "volume group {} also holds [{}]: a group snapshot covers exactly all members of one \
             volume group",
            ids.group(group),
            missing
                .iter()
                .map(|&v| ids.volume(v))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Error::SnapshotIdsRequired => Status::invalid_argument("snapshot_ids is required"),
        Error::SnapshotIdsMismatch {
            group_snapshot,
            members,
        } => {
            let mut members: Vec<String> = members.iter().map(|&s| ids.snapshot(s)).collect();
            members.sort();
            Status::invalid_argument(format!(
                "snapshot_ids do not match group snapshot {}: it holds [{}]",
                ids.group_snapshot(group_snapshot),
                members.join(", ")
            ))
        }
        Error::BadToken(token) => Status::aborted(format!(
            "starting_token {token:?} is not one this plugin issued; restart the listing"
        )),
        Error::SnapshotsOfDifferentVolumes { base, target } => {
            Status::invalid_argument(format!(
                "base snapshot {} and target snapshot {} are of different volumes",
                ids.snapshot(base),
                ids.snapshot(target)
            ))
        }
        Error::BaseNewerThanTarget { base, target } => Status::failed_precondition(format!(
            "base snapshot {} was taken after target snapshot {}; swap them",
            ids.snapshot(base),
            ids.snapshot(target)
        )),
        Error::OffsetOutOfRange { offset, capacity } => Status::out_of_range(format!(
            "starting_offset {offset} lies outside the volume's {capacity} bytes"
        )),
        Error::EncryptionMismatch { source_encrypted } => {
            Status::invalid_argument(if source_encrypted {
                "parameter encrypted: the content source is encrypted, so a copy of it holds \
                 ciphertext and must be encrypted too (leave encrypted out, or \"true\")"
            } else {
                "parameter encrypted=\"true\": the content source is not encrypted, and its \
                 data cannot be encrypted in place; restore or clone it unencrypted and copy \
                 the data into a new encrypted volume"
            })
        }
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
pub fn from_core(ids: Ids<'_>, e: CoreError) -> Status {
    match e {
        CoreError::NotFound(o) => Status::not_found(format!("{} does not exist", object(ids, o))),
        CoreError::AlreadyExists(o) => Status::already_exists(format!(
            "{} already exists with that name and different arguments",
            object(ids, o)
        )),
        CoreError::ResourceExhausted(limit) => Status::resource_exhausted(match limit {
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
        CoreError::OutOfRange(range) => Status::out_of_range(match range {
            Range::Shrink { current } => {
                format!("volumes only grow: the current size is {current} bytes")
            }
            Range::TooLarge { max } => format!("size exceeds the maximum of {max} bytes"),
            Range::SmallerThanSource { source } => {
                format!("the requested size is smaller than the source's {source} bytes")
            }
            Range::PastEnd { size } => format!("range past the end of the volume ({size} bytes)"),
        }),
        CoreError::FailedPrecondition(p) => Status::failed_precondition(match p {
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
        CoreError::InvalidArgument(f, problem) => Status::invalid_argument(match problem {
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
        CoreError::Corrupt(c) => Status::data_loss(format!(
            "pool metadata is damaged: {}",
            crate::pool_words::corruption(c)
        )),
        // The pool is fine; this firmware is not the one for it: the operator boots another.
        CoreError::Unsupported(u) => Status::failed_precondition(crate::pool_words::unsupported(u)),
        CoreError::ReadOnly(f) => Status::failed_precondition(crate::pool_words::read_only(f)),
        CoreError::Device(kind) => Status::internal(format!("storage device error: {kind}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_core::feature::TEST_FEATURE_X;
    use edgevol_core::{
        Corruption, DeviceErrorKind, Feature, FeatureSet, GroupId, GroupSnapshotId, SnapshotId,
        Unsupported, VolumeId,
    };
    use tonic::Code;

    fn check(status: &Status, code: Code, text: &str) {
        assert_eq!(status.code(), code, "{}", status.message());
        assert!(
            status.message().contains(text),
            "{:?} lacks {text:?}",
            status.message()
        );
    }

    #[test]
    fn every_core_outcome_has_its_code_and_names_csi_ids() {
        let ids = Ids::new("box");
        let v = VolumeId(7);
        let cases = [
            (
                CoreError::NotFound(ObjectRef::Volume(v)),
                Code::NotFound,
                "volume box-v7 does not exist",
            ),
            (
                CoreError::AlreadyExists(ObjectRef::Volume(v)),
                Code::AlreadyExists,
                "box-v7",
            ),
            (
                CoreError::ResourceExhausted(Limit::Clusters {
                    needed: 5,
                    available: 2,
                }),
                Code::ResourceExhausted,
                "5 clusters needed, 2 available",
            ),
            (
                CoreError::OutOfRange(Range::Shrink { current: 10 }),
                Code::OutOfRange,
                "only grow",
            ),
            (
                CoreError::FailedPrecondition(Precondition::VolumeInGroup(GroupId(3))),
                Code::FailedPrecondition,
                "volume group box-g3",
            ),
            (
                CoreError::InvalidArgument(Field::Name, Problem::TooLong { max: 128 }),
                Code::InvalidArgument,
                "name is longer than 128 bytes",
            ),
            (
                CoreError::Corrupt(Corruption::JournalGap(9)),
                Code::DataLoss,
                "journal record 9 is damaged",
            ),
            (
                CoreError::Unsupported(Unsupported::VersionTooNew {
                    found: 5,
                    newest: 4,
                }),
                Code::FailedPrecondition,
                "pool format version 5 is newer than this firmware supports (4)",
            ),
            (
                CoreError::Unsupported(Unsupported::Feature(TEST_FEATURE_X)),
                Code::FailedPrecondition,
                "pool uses incompatible feature test-feature-x (bit 63), this firmware (version",
            ),
            (
                CoreError::ReadOnly(Feature {
                    set: FeatureSet::ReadOnlyCompatible,
                    bit: 5,
                }),
                Code::FailedPrecondition,
                "the pool is read-only: it uses read-only-compatible feature bit 5",
            ),
            (
                CoreError::Device(DeviceErrorKind::Io),
                Code::Internal,
                "I/O error",
            ),
        ];
        for (error, code, text) in cases {
            check(&from_core(ids, error), code, text);
            // Through the operation error too: the same status.
            check(&from_error(ids, Error::Core(error)), code, text);
        }
    }

    #[test]
    fn every_operation_outcome_has_its_code() {
        let ids = Ids::new("box");
        let (v, g) = (VolumeId(7), GroupId(3));
        let cases = [
            (
                Error::Unavailable(PoolUnavailable::NotReady),
                Code::Unavailable,
                "still opening",
            ),
            (
                Error::Unavailable(PoolUnavailable::Poisoned),
                Code::Internal,
                "restarted",
            ),
            (
                Error::Unavailable(PoolUnavailable::TaskFailed),
                Code::Internal,
                "did not finish",
            ),
            (
                Error::UnknownId(Kind::Snapshot, "elsewhere-s1".into()),
                Code::NotFound,
                "snapshot elsewhere-s1 does not exist",
            ),
            (
                Error::UnknownId(Kind::Group, "x".into()),
                Code::NotFound,
                "volume group x does not exist",
            ),
            (
                Error::UnknownNode("kube-node-1".into()),
                Code::NotFound,
                "not an NVMe host NQN",
            ),
            (Error::NoTarget, Code::Unimplemented, "NVMe/TCP target"),
            (
                Error::OutsideTopology([("zone".to_owned(), "a".to_owned())].into()),
                Code::ResourceExhausted,
                "(zone=a)",
            ),
            (
                Error::SourceTooLarge {
                    source: 8,
                    bound: Bound::Limit,
                    value: 4,
                },
                Code::OutOfRange,
                "more than limit_bytes (4)",
            ),
            (
                Error::NoSizeInRange {
                    cluster: 1024,
                    required: 1025,
                    limit: 1030,
                },
                Code::OutOfRange,
                "[1025, 1030]",
            ),
            (
                Error::ModeNotCreated(v),
                Code::InvalidArgument,
                "box-v7 was not created for that access mode",
            ),
            (
                Error::PublishedElsewhere {
                    volume: v,
                    holders: vec!["nqn.a".into(), "nqn.b".into()],
                    readonly: false,
                },
                Code::FailedPrecondition,
                "node(s) nqn.a, nqn.b and its access mode does not allow another writer",
            ),
            (
                Error::PublishedOtherwise {
                    volume: v,
                    node: "nqn.a".into(),
                    readonly: true,
                },
                Code::AlreadyExists,
                "node nqn.a with readonly=false",
            ),
            (
                Error::NotInGroup(v),
                Code::FailedPrecondition,
                "no volume group",
            ),
            (
                Error::DifferentGroups(g, GroupId(4)),
                Code::FailedPrecondition,
                "box-g3 and box-g4",
            ),
            (
                Error::NotAllMembers {
                    group: g,
                    missing: vec![v],
                },
                Code::FailedPrecondition,
                "also holds [box-v7]",
            ),
            (
                Error::SnapshotIdsRequired,
                Code::InvalidArgument,
                "snapshot_ids is required",
            ),
            (
                Error::SnapshotIdsMismatch {
                    group_snapshot: GroupSnapshotId(5),
                    members: vec![SnapshotId(9), SnapshotId(10)],
                },
                Code::InvalidArgument,
                "box-gs5: it holds [box-s10, box-s9]",
            ),
            (
                Error::BadToken("zz".into()),
                Code::Aborted,
                "starting_token \"zz\"",
            ),
            (
                Error::SnapshotsOfDifferentVolumes {
                    base: SnapshotId(1),
                    target: SnapshotId(2),
                },
                Code::InvalidArgument,
                "box-s1 and target snapshot box-s2 are of different volumes",
            ),
            (
                Error::BaseNewerThanTarget {
                    base: SnapshotId(5),
                    target: SnapshotId(2),
                },
                Code::FailedPrecondition,
                "box-s5 was taken after target snapshot box-s2",
            ),
            (
                Error::OffsetOutOfRange {
                    offset: -1,
                    capacity: 4096,
                },
                Code::OutOfRange,
                "starting_offset -1 lies outside the volume's 4096 bytes",
            ),
            (
                Error::EncryptionMismatch {
                    source_encrypted: true,
                },
                Code::InvalidArgument,
                "the content source is encrypted",
            ),
            (
                Error::EncryptionMismatch {
                    source_encrypted: false,
                },
                Code::InvalidArgument,
                "the content source is not encrypted",
            ),
        ];
        for (error, code, text) in cases {
            check(&from_error(ids, error), code, text);
        }
    }
}
