//! Statuses the controller produces beyond the transport's table, and the one mapping from core,
//! device and pool errors to NVMe statuses (Linux `blk_to_nvme_status` / `errno_to_nvme_status`).
//!
//! [`from_core`] names every core error (no `_` arm: a new core error does not compile until it
//! is placed here), [`from_device`] every device error kind core defines today (the kind is
//! `#[non_exhaustive]`, so the compiler requires one more arm for kinds added later), and
//! `From<PoolUnavailable>` every way the pool handle can refuse a call.

use edgevol_core::{DeviceErrorKind, Error, Limit, Precondition, Range};
use edgevol_nvmeof::status::{sct, Status, StatusCode};

use crate::state::PoolUnavailable;

/// Controller-level outcomes, by meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetStatus {
    /// A transport or parser status.
    Code(StatusCode),
    /// Write to a write-protected namespace (read-only publication): generic 0x20, DNR.
    NamespaceWriteProtected,
    /// Asynchronous Event Request Limit Exceeded: command specific 0x05, DNR.
    AerLimitExceeded,
    /// Feature Identifier Not Saveable: command specific 0x0d, DNR.
    FeatureNotSaveable,
    /// Capacity Exceeded (thin pool out of clusters or metadata room): generic 0x81, DNR.
    CapacityExceeded,
    /// Namespace Not Ready (the pool is still opening): generic 0x82, retryable.
    NamespaceNotReady,
}

impl TargetStatus {
    /// The wire status.
    pub const fn status(self) -> Status {
        let (sct, sc, dnr) = match self {
            TargetStatus::Code(c) => return c.status(),
            TargetStatus::NamespaceWriteProtected => (sct::GENERIC, 0x20, true),
            TargetStatus::AerLimitExceeded => (sct::COMMAND_SPECIFIC, 0x05, true),
            TargetStatus::FeatureNotSaveable => (sct::COMMAND_SPECIFIC, 0x0d, true),
            TargetStatus::CapacityExceeded => (sct::GENERIC, 0x81, true),
            TargetStatus::NamespaceNotReady => (sct::GENERIC, 0x82, false),
        };
        Status {
            sct,
            sc,
            more: false,
            dnr,
        }
    }
}

impl From<StatusCode> for TargetStatus {
    fn from(c: StatusCode) -> Self {
        TargetStatus::Code(c)
    }
}

/// The pool handle refused the call.
impl From<PoolUnavailable> for TargetStatus {
    fn from(e: PoolUnavailable) -> Self {
        match e {
            // Hosts retry: the namespace becomes ready once recovery ends.
            PoolUnavailable::NotReady => TargetStatus::NamespaceNotReady,
            // Nothing the host did: retryable, so it resumes once edgevold is restarted.
            PoolUnavailable::Poisoned | PoolUnavailable::TaskFailed => {
                StatusCode::InternalError.into()
            }
        }
    }
}

/// Maps a core error on the data path to the status the host sees.
pub fn from_core(e: &Error) -> TargetStatus {
    let internal = TargetStatus::Code(StatusCode::InternalError);
    match *e {
        // The volume was deleted under a connected host.
        Error::NotFound(_) => StatusCode::InvalidNamespace.into(),
        Error::OutOfRange(range) => match range {
            Range::PastEnd { .. } => StatusCode::LbaOutOfRange.into(),
            // Sizes of control operations, never of an I/O command: still the range is wrong.
            Range::Shrink { .. } | Range::TooLarge { .. } | Range::SmallerThanSource { .. } => {
                StatusCode::LbaOutOfRange.into()
            }
        },
        Error::ResourceExhausted(limit) => match limit {
            // A thin pool out of clusters, or out of room to record where they went: the host
            // sees ENOSPC (Linux `NVME_SC_CAP_EXCEEDED`), not a retryable internal error.
            Limit::Clusters { .. } | Limit::Metadata => TargetStatus::CapacityExceeded,
            // Object counts: control operations only.
            Limit::Volumes
            | Limit::Snapshots
            | Limit::Groups
            | Limit::GroupSnapshots
            | Limit::GroupMembers
            | Limit::PublishedHosts => internal,
        },
        Error::FailedPrecondition(p) => match p {
            // Control-plane states no I/O command runs into: a bug if one does.
            Precondition::VolumeInGroup(_)
            | Precondition::VolumePublished(_)
            | Precondition::SnapshotInGroupSnapshot(_)
            | Precondition::PublishedToOtherHost(_) => internal,
        },
        // Creations and arguments of control operations: a bug if an I/O command gets one.
        Error::AlreadyExists(_) | Error::InvalidArgument(..) => internal,
        // Damaged metadata: nothing the host can fix or retry into success soon.
        Error::Corrupt(_) => internal,
        // A pool mounted read-only (a read-only-compatible feature this firmware lacks): the
        // whole namespace is write protected until other firmware runs, as a read-only
        // publication's is (NVMe base spec, Generic Command Status 20h, Namespace is Write
        // Protected, DNR: Linux nvmet's nvmet_io_cmd_check_access answers it for every I/O
        // command but Read and Flush; core's flush of a read-only pool succeeds likewise).
        Error::ReadOnly(_) => TargetStatus::NamespaceWriteProtected,
        // Only refused at open: a mounted pool never answers an I/O command with it.
        Error::Unsupported(_) => internal,
        // Core reports device errors of its own metadata I/O (commits): not the host's data.
        Error::Device(_) => internal,
    }
}

/// Which way a failed device access went: a medium error is a read or a write fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Reading data (or a copy-on-write source).
    Read,
    /// Writing data (or a zero-fill / copy-on-write target).
    Write,
}

/// Maps a device error kind on the data path to a status: a failing medium is a media error
/// (Unrecovered Read Error / Write Fault, retryable: the host may try another path or later),
/// as Linux `blk_to_nvme_status` maps BLK_STS_MEDIUM and BLK_STS_IOERR.
pub fn from_device(kind: DeviceErrorKind, access: Access) -> TargetStatus {
    let internal = TargetStatus::Code(StatusCode::InternalError);
    match (kind, access) {
        (DeviceErrorKind::ReadOnly, _) => TargetStatus::NamespaceWriteProtected,
        (DeviceErrorKind::OutOfBounds, _) => StatusCode::LbaOutOfRange.into(),
        (DeviceErrorKind::Io, Access::Read) => StatusCode::UnrecoveredReadError.into(),
        (DeviceErrorKind::Io, Access::Write) => StatusCode::WriteFault.into(),
        // Our own misaligned access: a bug, not the host's.
        (DeviceErrorKind::NotAligned, _) => internal,
        // The drive is gone or failed otherwise: nothing the host did.
        (DeviceErrorKind::PowerLoss | DeviceErrorKind::Other, _) => internal,
        // `DeviceErrorKind` is `#[non_exhaustive]`: a kind core adds later is an internal error
        // until it is given its own row above.
        (_, _) => internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_core::{Corruption, Field, ObjectRef, Problem, VolumeId};

    fn wire(s: TargetStatus) -> (u8, u8, bool) {
        let s = s.status();
        (s.sct, s.sc, s.dnr)
    }

    const INTERNAL: (u8, u8, bool) = (0, 0x06, false);

    #[test]
    fn linux_codes() {
        // NVME_SC_NS_WRITE_PROTECTED = 0x20, NVME_SC_ASYNC_LIMIT = 0x105, NVME_SC_CAP_EXCEEDED =
        // 0x81, NVME_SC_NS_NOT_READY = 0x82.
        assert_eq!(wire(TargetStatus::NamespaceWriteProtected), (0, 0x20, true));
        assert_eq!(wire(TargetStatus::AerLimitExceeded).0, 1);
        assert_eq!(wire(TargetStatus::AerLimitExceeded).1, 0x05);
        assert_eq!(wire(TargetStatus::CapacityExceeded), (0, 0x81, true));
        assert_eq!(wire(TargetStatus::NamespaceNotReady), (0, 0x82, false));
    }

    #[test]
    fn not_found_is_invalid_namespace() {
        let s = from_core(&Error::NotFound(ObjectRef::Volume(VolumeId(3))));
        assert_eq!(wire(s), (0, 0x0b, true));
    }

    #[test]
    fn already_exists_is_internal() {
        let s = from_core(&Error::AlreadyExists(ObjectRef::Volume(VolumeId(3))));
        assert_eq!(wire(s), INTERNAL);
    }

    #[test]
    fn resource_exhausted_is_capacity_exceeded_for_space_only() {
        for space in [
            Limit::Clusters {
                needed: 2,
                available: 1,
            },
            Limit::Metadata,
        ] {
            let s = from_core(&Error::ResourceExhausted(space));
            assert_eq!(s, TargetStatus::CapacityExceeded, "{space:?}");
        }
        let s = from_core(&Error::ResourceExhausted(Limit::Volumes));
        assert_eq!(wire(s), INTERNAL);
    }

    #[test]
    fn out_of_range_is_lba_out_of_range() {
        for range in [
            Range::PastEnd { size: 4096 },
            Range::Shrink { current: 1 },
            Range::TooLarge { max: 1 },
            Range::SmallerThanSource { source: 1 },
        ] {
            let s = from_core(&Error::OutOfRange(range));
            assert_eq!(wire(s), (0, 0x80, true), "{range:?}");
        }
    }

    #[test]
    fn failed_precondition_is_internal() {
        let s = from_core(&Error::FailedPrecondition(Precondition::VolumePublished(
            VolumeId(1),
        )));
        assert_eq!(wire(s), INTERNAL);
    }

    #[test]
    fn invalid_argument_is_internal() {
        let s = from_core(&Error::InvalidArgument(Field::Size, Problem::Empty));
        assert_eq!(wire(s), INTERNAL);
    }

    #[test]
    fn corrupt_metadata_is_internal() {
        let s = from_core(&Error::Corrupt(Corruption::JournalGap(9)));
        assert_eq!(wire(s), INTERNAL);
    }

    #[test]
    fn a_read_only_pool_is_write_protected_and_unsupported_is_internal() {
        let f = edgevol_core::Feature {
            set: edgevol_core::FeatureSet::ReadOnlyCompatible,
            bit: 5,
        };
        // Generic 0x20 (Namespace is Write Protected), do not retry.
        assert_eq!(wire(from_core(&Error::ReadOnly(f))), (0, 0x20, true));
        let u = edgevol_core::Unsupported::VersionTooNew {
            found: 5,
            newest: 4,
        };
        assert_eq!(wire(from_core(&Error::Unsupported(u))), INTERNAL);
    }

    #[test]
    fn core_device_errors_are_internal_not_media() {
        // Core's own metadata I/O: never blamed on the host's data.
        let s = from_core(&Error::Device(DeviceErrorKind::Io));
        assert_eq!(wire(s), INTERNAL);
    }

    #[test]
    fn data_device_errors_by_kind_and_direction() {
        let rows = [
            (DeviceErrorKind::Io, Access::Read, (2, 0x81, false)),
            (DeviceErrorKind::Io, Access::Write, (2, 0x80, false)),
            (DeviceErrorKind::ReadOnly, Access::Write, (0, 0x20, true)),
            (DeviceErrorKind::OutOfBounds, Access::Read, (0, 0x80, true)),
            (DeviceErrorKind::NotAligned, Access::Write, INTERNAL),
            (DeviceErrorKind::PowerLoss, Access::Read, INTERNAL),
            (DeviceErrorKind::Other, Access::Write, INTERNAL),
        ];
        for (kind, access, want) in rows {
            assert_eq!(wire(from_device(kind, access)), want, "{kind:?} {access:?}");
        }
    }

    #[test]
    fn an_unavailable_pool_is_not_ready_or_internal() {
        assert_eq!(
            TargetStatus::from(PoolUnavailable::NotReady),
            TargetStatus::NamespaceNotReady
        );
        for e in [PoolUnavailable::Poisoned, PoolUnavailable::TaskFailed] {
            assert_eq!(wire(TargetStatus::from(e)), INTERNAL, "{e:?}");
        }
    }
}
