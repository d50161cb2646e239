//! The gRPC side of the host keys: `edgevol.v1.HostKeys` for operators (role admin, by the
//! policy in [`crate::auth`]) and `edgevol.v1.Enrolment` for nodes (role node).
//!
//! Thin handlers: who is calling (from the TLS session), one store call off the reactor, the
//! answer encoded; every refusal becomes a status in [`status`], the one mapping. Nothing here
//! logs a request or response body: the only secrets the appliance sends are in EnrolResponse.

use std::sync::Arc;

use edgevol_pki::Role;
use edgevol_proto::edgevol::v1 as pb;
use tonic::{Request, Response, Status};

use super::{Fingerprint, HostKeys, KeyError, Listing};
use crate::transport::PeerInfo;

/// The one mapping from a key error to what a client is told. Exhaustive: a new error does not
/// compile until it is mapped.
pub fn status(e: &KeyError) -> Status {
    match e {
        KeyError::InvalidNqn(_) | KeyError::InvalidNode(_) => {
            Status::invalid_argument(e.to_string())
        }
        // The claimant learns that the NQN is taken, not by whom.
        KeyError::NqnBound { host_nqn, .. } => {
            Status::permission_denied(format!("host NQN {host_nqn} is bound to another node"))
        }
        KeyError::NodeBound { node, .. } => Status::failed_precondition(format!(
            "{e}: one node holds one NQN; to enrol another, an operator revokes the node \
             (edgevol keys revoke --node {node}) and issues it a new certificate"
        )),
        KeyError::CertificateRevoked { node } => Status::permission_denied(format!(
            "{e}: it may not enrol again; an operator issues node {node:?} a new certificate"
        )),
        KeyError::UnknownNode(_) => Status::not_found(e.to_string()),
        KeyError::Random => Status::internal(e.to_string()),
        // A write that failed (disk full, I/O error) may succeed later; nothing changed.
        KeyError::Store(_) => Status::unavailable(e.to_string()),
    }
}

/// The caller's name, for the log (the auth layer already checked its role).
fn caller<T>(request: &Request<T>) -> String {
    request
        .extensions()
        .get::<PeerInfo>()
        .map_or_else(|| "unknown".to_owned(), PeerInfo::to_string)
}

/// Runs a (blocking: it writes the file) store call off the reactor.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, KeyError> + Send + 'static,
) -> Result<T, Status> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(|e| status(&e)),
        Err(join) => Err(Status::internal(format!("host key task: {join}"))),
    }
}

fn timestamp(unix_seconds: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64::try_from(unix_seconds).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `edgevol.v1.Enrolment`.
#[derive(Debug, Clone)]
pub struct EnrolmentService {
    keys: Arc<HostKeys>,
}

impl EnrolmentService {
    /// Enrols nodes into `keys`.
    pub fn new(keys: Arc<HostKeys>) -> Self {
        EnrolmentService { keys }
    }
}

/// The calling node: its name and certificate. Only a node certificate enrols (the auth layer
/// lets an admin call anything, but an admin is not a node).
fn node_caller(peer: Option<&PeerInfo>) -> Result<(String, Fingerprint), Status> {
    let peer = peer.ok_or_else(|| Status::unauthenticated("no TLS peer information"))?;
    let identity = peer
        .identity
        .as_ref()
        .map_err(|e| Status::unauthenticated(e.to_string()))?;
    if identity.role != Role::Node {
        return Err(Status::permission_denied(format!(
            "only a node certificate enrols; client {:?} has role {}",
            identity.name, identity.role
        )));
    }
    let cert = peer
        .cert_sha256
        .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    Ok((identity.name.clone(), cert))
}

#[tonic::async_trait]
impl pb::enrolment_server::Enrolment for EnrolmentService {
    async fn enrol(
        &self,
        request: Request<pb::EnrolRequest>,
    ) -> Result<Response<pb::EnrolResponse>, Status> {
        let peer = request.extensions().get::<PeerInfo>().cloned();
        let (node, cert) = node_caller(peer.as_ref())?;
        let from = peer.map_or_else(String::new, |p| p.remote.to_string());
        let host_nqn = request.into_inner().host_nqn;
        let keys = self.keys.clone();
        let (name, nqn) = (node.clone(), host_nqn.clone());
        let enrolled = tokio::task::spawn_blocking(move || keys.enrol(&name, cert, &nqn))
            .await
            .map_err(|join| Status::internal(format!("host key task: {join}")))?;
        match enrolled {
            Ok(e) => {
                let generation = e.key.generation;
                if e.bound {
                    tracing::info!(
                        node,
                        host_nqn,
                        generation,
                        from,
                        "node enrolled: host NQN bound"
                    );
                } else {
                    tracing::debug!(node, host_nqn, generation, from, "node enrolment repeated");
                }
                Ok(Response::new(pb::EnrolResponse {
                    host_secret: e.key.host_secret.encode().to_string(),
                    ctrl_secret: e.key.ctrl_secret.encode().to_string(),
                    generation,
                }))
            }
            Err(e) => {
                // Here the owner of a claimed NQN is named; the claimant is only told it is taken.
                tracing::warn!(node, host_nqn, from, reason = %e, "enrolment refused");
                Err(status(&e))
            }
        }
    }
}

/// `edgevol.v1.HostKeys`.
#[derive(Debug, Clone)]
pub struct HostKeysService {
    keys: Arc<HostKeys>,
}

impl HostKeysService {
    /// Serves `keys`.
    pub fn new(keys: Arc<HostKeys>) -> Self {
        HostKeysService { keys }
    }
}

fn encode_listing(listing: Listing) -> pb::ListResponse {
    pb::ListResponse {
        nodes: listing
            .nodes
            .into_iter()
            .map(|n| pb::NodeKeys {
                node: n.node,
                host_nqn: n.host_nqn,
                generation: n.generation,
                rotation_pending: n.rotation_pending,
                enrolled: Some(timestamp(n.enrolled)),
                keys_created: Some(timestamp(n.keys_created)),
                last_authenticated: n.last_authenticated.map(timestamp),
            })
            .collect(),
        revoked: listing
            .revoked
            .into_iter()
            .map(|r| pb::RevokedCertificate {
                node: r.node,
                sha256: hex(&r.sha256),
                revoked: Some(timestamp(r.revoked)),
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl pb::host_keys_server::HostKeys for HostKeysService {
    async fn rotate(
        &self,
        request: Request<pb::RotateRequest>,
    ) -> Result<Response<pb::RotateResponse>, Status> {
        let by = caller(&request);
        let node = request.into_inner().node;
        let keys = self.keys.clone();
        let name = node.clone();
        let generation = blocking(move || keys.rotate(&name)).await?;
        tracing::info!(node, generation, by, "node keys rotated: new pair pending");
        Ok(Response::new(pb::RotateResponse { generation }))
    }

    async fn revoke(
        &self,
        request: Request<pb::RevokeRequest>,
    ) -> Result<Response<pb::RevokeResponse>, Status> {
        let by = caller(&request);
        let node = request.into_inner().node;
        let keys = self.keys.clone();
        let revoked = blocking(move || keys.revoke(&node)).await?;
        tracing::warn!(
            node = revoked.node,
            host_nqn = revoked.host_nqn,
            certificates = revoked.certificates,
            by,
            "node keys revoked: its host NQN no longer authenticates"
        );
        Ok(Response::new(pb::RevokeResponse {
            host_nqn: revoked.host_nqn,
            revoked_certificates: u32::try_from(revoked.certificates).unwrap_or(u32::MAX),
        }))
    }

    async fn list(
        &self,
        _request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        Ok(Response::new(encode_listing(self.keys.list())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostkeys::StoreError;
    use tonic::Code;

    #[test]
    fn each_error_has_its_code_and_never_names_the_owner_to_a_claimant() {
        let io = || StoreError::Io {
            path: "/d/host-keys.tmp".into(),
            op: "write",
            source: std::io::Error::other("disk full"),
        };
        let cases = [
            (KeyError::InvalidNqn("x".into()), Code::InvalidArgument),
            (KeyError::InvalidNode("bad".into()), Code::InvalidArgument),
            (
                KeyError::NqnBound {
                    host_nqn: "nqn.x".into(),
                    owner: "node-secret-owner".into(),
                },
                Code::PermissionDenied,
            ),
            (
                KeyError::NodeBound {
                    node: "n".into(),
                    host_nqn: "nqn.y".into(),
                },
                Code::FailedPrecondition,
            ),
            (
                KeyError::CertificateRevoked { node: "n".into() },
                Code::PermissionDenied,
            ),
            (KeyError::UnknownNode("n".into()), Code::NotFound),
            (KeyError::Random, Code::Internal),
            (KeyError::Store(io()), Code::Unavailable),
        ];
        for (e, code) in cases {
            let s = status(&e);
            assert_eq!(s.code(), code, "{e}");
            assert!(
                !s.message().contains("node-secret-owner"),
                "{}",
                s.message()
            );
        }
        let s = status(&KeyError::NodeBound {
            node: "n".into(),
            host_nqn: "nqn.y".into(),
        });
        assert!(
            s.message().contains("nqn.y") && s.message().contains("edgevol keys revoke --node n"),
            "{}",
            s.message()
        );
    }

    #[test]
    fn only_a_node_certificate_enrols() {
        use edgevol_pki::{IdentityError, PeerIdentity};
        let peer = |identity, cert_sha256| PeerInfo {
            remote: "192.0.2.9:700".parse().unwrap(),
            identity,
            cert_sha256,
        };
        let id = |role| {
            Ok(PeerIdentity {
                name: "n1".into(),
                role,
            })
        };
        let ok = node_caller(Some(&peer(id(Role::Node), Some([5; 32])))).unwrap();
        assert_eq!(ok, ("n1".to_owned(), [5; 32]));
        for role in [Role::Admin, Role::Controller, Role::Observer] {
            let e = node_caller(Some(&peer(id(role), Some([5; 32])))).unwrap_err();
            assert_eq!(e.code(), Code::PermissionDenied, "{role}");
            assert!(
                e.message().contains(&format!("has role {role}")),
                "{}",
                e.message()
            );
        }
        let e = node_caller(Some(&peer(id(Role::Node), None))).unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated);
        let e = node_caller(Some(&peer(Err(IdentityError::NoRole), Some([5; 32])))).unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated);
        assert_eq!(node_caller(None).unwrap_err().code(), Code::Unauthenticated);
    }

    #[test]
    fn listings_carry_times_and_fingerprints_and_no_secret_field() {
        use crate::hostkeys::{NodeInfo, RevokedCert};
        let listing = Listing {
            nodes: vec![NodeInfo {
                node: "node-a".into(),
                host_nqn: "nqn.a".into(),
                generation: 4,
                rotation_pending: true,
                enrolled: 10,
                keys_created: 20,
                last_authenticated: None,
            }],
            revoked: vec![RevokedCert {
                node: "node-b".into(),
                sha256: [0xab; 32],
                revoked: 30,
            }],
        };
        let pb = encode_listing(listing);
        let n = &pb.nodes[0];
        assert_eq!((n.generation, n.rotation_pending), (4, true));
        assert_eq!(n.enrolled.as_ref().map(|t| t.seconds), Some(10));
        assert_eq!(n.keys_created.as_ref().map(|t| t.seconds), Some(20));
        assert_eq!(n.last_authenticated, None, "never: unset");
        assert_eq!(pb.revoked[0].sha256, "ab".repeat(32));
        assert_eq!(pb.revoked[0].revoked.as_ref().map(|t| t.seconds), Some(30));
    }
}
