//! Statuses the controller produces beyond the transport's table, and the one mapping from core
//! and device errors to NVMe statuses (Linux `blk_to_nvme_status` / `errno_to_nvme_status`).

use edgevol_core::{DeviceErrorKind, Error, Limit};
use edgevol_nvmeof::status::{sct, Status, StatusCode};

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
    /// Capacity Exceeded (thin pool out of clusters): generic 0x81, DNR.
    CapacityExceeded,
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

/// Maps a core error on the data path to the status the host sees.
pub fn from_core(e: &Error) -> TargetStatus {
    match e {
        Error::OutOfRange(_) => StatusCode::LbaOutOfRange.into(),
        Error::ResourceExhausted(Limit::Clusters { .. }) => TargetStatus::CapacityExceeded,
        Error::NotFound(_) => StatusCode::InvalidNamespace.into(),
        // Core reports device errors of its own metadata I/O (commits): not the host's data.
        Error::Device(_) => StatusCode::InternalError.into(),
        _ => StatusCode::InternalError.into(),
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
    match (kind, access) {
        (DeviceErrorKind::ReadOnly, _) => TargetStatus::NamespaceWriteProtected,
        (DeviceErrorKind::OutOfBounds, _) => StatusCode::LbaOutOfRange.into(),
        (DeviceErrorKind::Io, Access::Read) => StatusCode::UnrecoveredReadError.into(),
        (DeviceErrorKind::Io, Access::Write) => StatusCode::WriteFault.into(),
        _ => StatusCode::InternalError.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_codes() {
        // NVME_SC_NS_WRITE_PROTECTED = 0x20, NVME_SC_ASYNC_LIMIT = 0x105.
        let s = TargetStatus::NamespaceWriteProtected.status();
        assert_eq!((s.sct, s.sc, s.dnr), (0, 0x20, true));
        let s = TargetStatus::AerLimitExceeded.status();
        assert_eq!((s.sct, s.sc), (1, 0x05));
        assert_eq!(
            from_core(&Error::Device(DeviceErrorKind::Io)).status(),
            StatusCode::InternalError.status()
        );
    }
}
