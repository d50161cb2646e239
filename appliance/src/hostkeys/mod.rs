//! Data-path keys: who holds which DH-HMAC-CHAP secret.
//!
//! Every node (a workload host running `edgevol-node`) has a `node` certificate whose common
//! name is its name. With it, the node enrols its host NQN: the first enrolment binds that NQN
//! to the node, for good (no other certificate can claim it), and the node receives its key
//! pair: a host secret (the host proves itself) and a controller secret (the appliance proves
//! itself, for bidirectional authentication). The NVMe/TCP target asks [`HostKeys::keys_for`]
//! which pairs authenticate a host NQN and tells [`HostKeys::confirm`] which one a host used;
//! an operator rotates and revokes pairs with an admin certificate.
//!
//! - [`secret`]: making secrets (32 random bytes, SHA-256 key transform; the type and its
//!   `DHHC-1` representation are nvmeof's) and keeping them in the store;
//! - [`table`]: the nodes, their bindings and pairs, the revoked certificates: pure operations;
//! - [`file`]: the table on disk (`DATA_DIR/host-keys`, 0600, checksummed, replaced atomically);
//! - [`store`]: [`HostKeys`], each change durable before it is answered;
//! - [`service`]: the gRPC services over it.

pub mod file;
pub mod secret;
pub mod service;
pub mod store;
pub mod table;

use std::fmt;

pub use edgevol_nvmeof::auth::Secret;
pub use file::StoreError;
pub use store::{Enrolment, HostKey, HostKeys, Listing, NodeInfo, RevokeHook, RevokedHost};
pub use table::{Confirmation, Fingerprint, Revocation, RevokedCert};

/// Why a key operation was refused or failed. Names nodes and NQNs, never a secret.
#[derive(Debug)]
pub enum KeyError {
    /// Not an NVMe qualified name.
    InvalidNqn(String),
    /// Not a valid node name (the check's message).
    InvalidNode(String),
    /// The NQN is bound to another node.
    NqnBound {
        /// The NQN claimed.
        host_nqn: String,
        /// The node it is bound to.
        owner: String,
    },
    /// The node is bound to another NQN.
    NodeBound {
        /// The node.
        node: String,
        /// The NQN bound to it.
        host_nqn: String,
    },
    /// The certificate presented was revoked with its node's keys.
    CertificateRevoked {
        /// The node it belonged to.
        node: String,
    },
    /// No enrolled node of that name.
    UnknownNode(String),
    /// The system random source failed.
    Random,
    /// The store could not be written.
    Store(StoreError),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::InvalidNqn(nqn) => write!(f, "{nqn:?} is not an NVMe qualified name"),
            KeyError::InvalidNode(e) => write!(f, "node name: {e}"),
            KeyError::NqnBound { host_nqn, owner } => {
                write!(f, "host NQN {host_nqn} is bound to node {owner:?}")
            }
            KeyError::NodeBound { node, host_nqn } => {
                write!(f, "node {node:?} is bound to host NQN {host_nqn}")
            }
            KeyError::CertificateRevoked { node } => {
                write!(f, "this certificate of node {node:?} was revoked")
            }
            KeyError::UnknownNode(node) => write!(f, "node {node:?} has not enrolled"),
            KeyError::Random => {
                f.write_str("no key could be made: the system random source failed")
            }
            KeyError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for KeyError {}
