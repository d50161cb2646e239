//! The node plugin's errors and their one mapping onto gRPC status codes.
//!
//! Messages name the volume, path or device concerned; they never carry secrets (the only
//! secret the node plugin reads, an encrypted volume's passphrase, goes to cryptsetup's stdin
//! and is named by its key, never shown).

use tonic::Status;

/// A failed node operation. Each variant is one CSI outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The request itself is wrong (missing field, relative path, bad publish_context).
    InvalidArgument(String),
    /// The volume (or the path asked about) is not known on this node, or the target refused
    /// to connect it (deleted, or not published to this node).
    NotFound(String),
    /// The volume is already staged/published at that path with an incompatible capability.
    AlreadyExists(String),
    /// The request cannot be served in the current state (staged elsewhere, still published,
    /// capability not supported by the volume, foreign data on the device).
    FailedPrecondition(String),
    /// NodeExpandVolume's capacity_range cannot be met: required beyond what the namespace
    /// offers after a rescan, or a limit below its size (volumes do not shrink).
    OutOfRange(String),
    /// The kernel or the target did not get ready in time; a retry may succeed.
    Unavailable(String),
    /// A host operation failed (a write to sysfs, a command, the state directory).
    Internal(String),
}

impl Error {
    /// An [`Error::Internal`] for a failed host operation `what`.
    pub fn io(what: impl std::fmt::Display, err: &std::io::Error) -> Self {
        Error::Internal(format!("{what}: {err}"))
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, msg) = match self {
            Error::InvalidArgument(m) => ("invalid argument", m),
            Error::NotFound(m) => ("not found", m),
            Error::AlreadyExists(m) => ("already exists", m),
            Error::FailedPrecondition(m) => ("failed precondition", m),
            Error::OutOfRange(m) => ("out of range", m),
            Error::Unavailable(m) => ("unavailable", m),
            Error::Internal(m) => ("internal", m),
        };
        write!(f, "{kind}: {msg}")
    }
}

impl std::error::Error for Error {}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        // Exhaustive on purpose: a new variant does not compile until it is mapped.
        match err {
            Error::InvalidArgument(m) => Status::invalid_argument(m),
            Error::NotFound(m) => Status::not_found(m),
            Error::AlreadyExists(m) => Status::already_exists(m),
            Error::FailedPrecondition(m) => Status::failed_precondition(m),
            Error::OutOfRange(m) => Status::out_of_range(m),
            Error::Unavailable(m) => Status::unavailable(m),
            Error::Internal(m) => Status::internal(m),
        }
    }
}

/// Shorthand.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn every_variant_maps_to_its_code() {
        let rows = [
            (Error::InvalidArgument("a".into()), Code::InvalidArgument),
            (Error::NotFound("a".into()), Code::NotFound),
            (Error::AlreadyExists("a".into()), Code::AlreadyExists),
            (
                Error::FailedPrecondition("a".into()),
                Code::FailedPrecondition,
            ),
            (Error::OutOfRange("a".into()), Code::OutOfRange),
            (Error::Unavailable("a".into()), Code::Unavailable),
            (Error::Internal("a".into()), Code::Internal),
        ];
        for (err, code) in rows {
            let status = Status::from(err);
            assert_eq!(status.code(), code);
            assert_eq!(status.message(), "a");
        }
    }
}
