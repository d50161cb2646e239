//! edgevol's PKI: who may talk to the appliance, and as what.
//!
//! Every CSI client of the appliance presents a certificate issued by the appliance's CA. The
//! client's **role** travels inside that certificate as a URI subject alternative name,
//! `urn:edgevol:role:<role>` (exactly one per certificate), and its **name** is the subject's
//! common name. Roles are [`Role::Admin`], [`Role::Controller`], [`Role::Observer`] and
//! [`Role::Node`] (a workload host, which may only enrol for its NVMe data-path keys).
//!
//! The crate issues certificates ([`Ca`]), writes them as PEM files ([`files`]), builds the
//! rustls configurations of both ends ([`tls`]), connects clients to the appliance
//! ([`client::MtlsTarget`]) and reads a verified peer's identity back ([`PeerIdentity`]). rustls uses the `ring` provider: the one crypto provider of edgevol.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod ca;
pub mod client;
pub mod files;
mod identity;
mod role;
pub mod tls;

pub use ca::{Ca, Issued, Validity};
pub use identity::{IdentityError, PeerIdentity};
pub use role::{Role, ROLE_URI_PREFIX};

/// Errors of certificate issuance and loading, each naming what it concerns.
#[derive(Debug)]
pub enum PkiError {
    /// A file could not be read or written.
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A file exists and `force` was not given.
    Exists(std::path::PathBuf),
    /// A PEM file held no usable certificate or key.
    BadPem {
        /// The file.
        path: std::path::PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// Certificate generation failed.
    Generate(rcgen::Error),
    /// rustls refused the configuration.
    Tls(String),
}

impl std::fmt::Display for PkiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PkiError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            PkiError::Exists(path) => write!(
                f,
                "{} already exists (pass --force to overwrite)",
                path.display()
            ),
            PkiError::BadPem { path, reason } => write!(f, "{}: {reason}", path.display()),
            PkiError::Generate(e) => write!(f, "certificate generation failed: {e}"),
            PkiError::Tls(e) => write!(f, "TLS configuration refused: {e}"),
        }
    }
}

impl std::error::Error for PkiError {}

impl From<rcgen::Error> for PkiError {
    fn from(e: rcgen::Error) -> Self {
        PkiError::Generate(e)
    }
}
