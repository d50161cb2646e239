//! Who may call what: the role policy, and the tower layer that applies it to every call
//! before routing and logs each call with the caller's identity.
//!
//! The layer never looks at message bodies, so CSI `secrets` cannot reach the log.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use edgevol_pki::Role;
use tonic::Status;
use tower::{Layer, Service};

use crate::transport::PeerInfo;

/// Services a `controller` client may use: everything a container orchestrator needs. The
/// SnapshotMetadata service belongs here because Kubernetes' external-snapshot-metadata sidecar
/// runs beside the CSI driver and calls with its credentials.
const CO_SERVICES: [&str; 5] = [
    "csi.v1.Identity",
    "csi.v1.Controller",
    "csi.v1.GroupController",
    "volumegroup.Controller",
    SNAPSHOT_METADATA_SERVICE,
];

/// Changed-block metadata: for the CO (the backup path) and admins, not observers. Its answers
/// are read-only but they are a trace of where and when each workload wrote, not the inventory
/// (volumes, capacity, snapshots) the observer role exists to show; and one call can stream the
/// extent list of a whole volume.
pub const SNAPSHOT_METADATA_SERVICE: &str = "csi.v1.SnapshotMetadata";

/// The one service a `node` client may use: enrolment for its data-path keys.
pub const ENROLMENT_SERVICE: &str = "edgevol.v1.Enrolment";

/// Whether `role` may call `/<service>/<method>`.
pub fn allowed(role: Role, service: &str, method: &str) -> bool {
    match role {
        Role::Admin => true,
        Role::Controller => CO_SERVICES.contains(&service),
        Role::Observer => {
            service == "csi.v1.Identity"
                || (CO_SERVICES.contains(&service)
                    && service != SNAPSHOT_METADATA_SERVICE
                    && is_read_only(method))
        }
        // Not even Identity: a node certificate sits on every workload host, so it opens as
        // little of the appliance as possible.
        Role::Node => service == ENROLMENT_SERVICE,
    }
}

/// The List/Get RPCs: `ListVolumes`, `GetCapacity`, `ControllerGetVolume`,
/// `ControllerGetCapabilities`, `GroupControllerGetCapabilities`, `GetVolumeGroupSnapshot`,
/// `ListVolumeGroups`, `ControllerGetVolumeGroup`, ...
pub(crate) fn is_read_only(method: &str) -> bool {
    let rest = method
        .strip_prefix("GroupController")
        .or_else(|| method.strip_prefix("Controller"))
        .unwrap_or(method);
    rest.starts_with("List") || rest.starts_with("Get")
}

/// Checks one call: `Ok` with nothing to say, or the status to answer instead of routing it.
pub fn authorize(peer: Option<&PeerInfo>, path: &str) -> Result<(), Status> {
    let Some(peer) = peer else {
        return Err(Status::unauthenticated("no TLS peer information"));
    };
    let identity = peer
        .identity
        .as_ref()
        .map_err(|e| Status::unauthenticated(e.to_string()))?;
    let (service, method) = path
        .strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .unwrap_or((path, ""));
    if allowed(identity.role, service, method) {
        Ok(())
    } else {
        Err(Status::permission_denied(format!(
            "role {} of client {:?} may not call {service}/{method}",
            identity.role, identity.name
        )))
    }
}

/// Applies [`authorize`] to every request and logs it.
#[derive(Debug, Clone, Copy, Default)]
pub struct AuthLayer;

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Auth { inner }
    }
}

/// The service of [`AuthLayer`].
#[derive(Debug, Clone)]
pub struct Auth<S> {
    inner: S,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> Service<http::Request<B>> for Auth<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let peer = req.extensions().get::<PeerInfo>();
        let path = req.uri().path().to_owned();
        let who = peer.map_or_else(|| "unknown".to_owned(), PeerInfo::to_string);
        match authorize(peer, &path) {
            Ok(()) => {
                tracing::info!(peer = %who, method = %path, "call");
                let started = std::time::Instant::now();
                let fut = self.inner.call(req);
                Box::pin(async move {
                    let res = fut.await;
                    if let Ok(resp) = &res {
                        // Errors answered before any message carry grpc-status in the headers;
                        // the others in trailers, which this layer does not read.
                        let code = resp
                            .headers()
                            .get("grpc-status")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("0");
                        tracing::debug!(peer = %who, method = %path, grpc_status = code,
                            elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX), "done");
                    }
                    res
                })
            }
            Err(status) => {
                tracing::warn!(peer = %who, method = %path, code = ?status.code(),
                    reason = status.message(), "call refused");
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_pki::{IdentityError, PeerIdentity};

    fn peer(identity: Result<PeerIdentity, IdentityError>) -> PeerInfo {
        PeerInfo {
            remote: "192.0.2.1:5000".parse().unwrap(),
            identity,
            cert_sha256: None,
        }
    }

    #[test]
    fn calls_without_a_usable_identity_are_unauthenticated() {
        let status = authorize(None, "/csi.v1.Identity/Probe").unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        let status = authorize(
            Some(&peer(Err(IdentityError::NoRole))),
            "/csi.v1.Identity/Probe",
        )
        .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("no role"), "{}", status.message());
        let observer = peer(Ok(PeerIdentity {
            name: "grafana".into(),
            role: Role::Observer,
        }));
        assert!(authorize(Some(&observer), "/csi.v1.Identity/Probe").is_ok());
        let status = authorize(Some(&observer), "/csi.v1.Controller/DeleteVolume").unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            status.message(),
            "role observer of client \"grafana\" may not call csi.v1.Controller/DeleteVolume"
        );
    }

    #[test]
    fn the_policy_matches_the_roles() {
        // Expected answers for admin, controller, observer, node.
        let cases = [
            ("csi.v1.Identity", "Probe", [true, true, true, false]),
            (
                "csi.v1.Controller",
                "CreateVolume",
                [true, true, false, false],
            ),
            (
                "csi.v1.Controller",
                "ListVolumes",
                [true, true, true, false],
            ),
            (
                "csi.v1.Controller",
                "ControllerGetVolume",
                [true, true, true, false],
            ),
            (
                "csi.v1.Controller",
                "ControllerPublishVolume",
                [true, true, false, false],
            ),
            (
                "csi.v1.Controller",
                "GetCapacity",
                [true, true, true, false],
            ),
            (
                "csi.v1.GroupController",
                "GetVolumeGroupSnapshot",
                [true, true, true, false],
            ),
            (
                "csi.v1.GroupController",
                "GroupControllerGetCapabilities",
                [true, true, true, false],
            ),
            (
                "csi.v1.GroupController",
                "CreateVolumeGroupSnapshot",
                [true, true, false, false],
            ),
            (
                "volumegroup.Controller",
                "ListVolumeGroups",
                [true, true, true, false],
            ),
            (
                "volumegroup.Controller",
                "DeleteVolumeGroup",
                [true, true, false, false],
            ),
            (
                "csi.v1.Controller",
                "GetSnapshot",
                [true, true, true, false],
            ),
            // Changed-block metadata: the CO's sidecar and admins only (see the constant).
            (
                "csi.v1.SnapshotMetadata",
                "GetMetadataAllocated",
                [true, true, false, false],
            ),
            (
                "csi.v1.SnapshotMetadata",
                "GetMetadataDelta",
                [true, true, false, false],
            ),
            ("csi.v1.Node", "NodeGetInfo", [true, false, false, false]),
            ("edgevol.Admin", "FormatPool", [true, false, false, false]),
            ("edgevol.v1.Enrolment", "Enrol", [true, false, false, true]),
            ("edgevol.v1.HostKeys", "Rotate", [true, false, false, false]),
            ("edgevol.v1.HostKeys", "Revoke", [true, false, false, false]),
            ("edgevol.v1.HostKeys", "List", [true, false, false, false]),
            // Firmware: admin only, reads included (the status names versions and slots).
            ("edgevol.v1.Firmware", "Status", [true, false, false, false]),
            ("edgevol.v1.Firmware", "Update", [true, false, false, false]),
            (
                "edgevol.v1.Firmware",
                "Rollback",
                [true, false, false, false],
            ),
            // A look-alike of the enrolment service is not it.
            (
                "edgevol.v1.EnrolmentX",
                "Enrol",
                [true, false, false, false],
            ),
        ];
        assert_eq!(Role::ALL.len(), 4, "a new role needs a column here");
        for (service, method, expect) in cases {
            for (role, want) in Role::ALL.into_iter().zip(expect) {
                assert_eq!(
                    allowed(role, service, method),
                    want,
                    "{role} {service}/{method}"
                );
            }
        }
    }
}
