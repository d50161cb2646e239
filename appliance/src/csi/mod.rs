//! The CSI services of the appliance: thin handlers over the appliance's pool.
//!
//! Every handler has the same shape: request → `TryFrom` into a validated operation → one
//! domain call on the pool ([`call`]) → encode. By concern:
//! - requests: [`validate`] (size limits, uniform INVALID_ARGUMENT messages), [`capability`],
//!   [`params`], [`qos`], [`capacity`], [`source`], and the validated Controller operations in
//!   [`request`] (the GroupController and VolumeGroup services keep theirs next to them);
//! - the domain: [`volumes`] (the Controller's operations), [`topology`], [`ids`] (CSI ids of
//!   core objects), and the operations of [`group_controller`] and [`volume_group`];
//! - [`snapshot_metadata`]: changed-block tracking, streamed by [`metadata_stream`];
//! - answers: [`encode`] (core objects as CSI messages), [`error`] (what an operation fails
//!   with) and [`status`] (the one exhaustive mapping from those errors to gRPC statuses).

pub mod capability;
pub mod capacity;
pub mod controller;
pub mod encode;
pub mod encryption;
pub mod error;
pub mod group_controller;
pub mod identity;
pub mod ids;
pub mod metadata_stream;
pub mod params;
pub mod qos;
pub mod request;
pub mod snapshot_metadata;
pub mod source;
pub mod status;
pub mod topology;
pub mod validate;
pub mod volume_group;
pub mod volumes;

use std::sync::Arc;

use edgevol_core::Pool;
use tonic::service::Routes;
use tonic::Status;

use self::error::Error;
use self::ids::Ids;
use crate::nvme::TargetInfo;
use crate::pool::PoolDevice;
use crate::state::State;

/// Every CSI service the appliance serves, routed. `target` is the running NVMe/TCP target, if
/// any: publishing is offered only with it. `vendor_version` is GetPluginInfo's (see
/// [`identity::IdentityService::new`]).
pub fn routes(state: &Arc<State>, target: Option<TargetInfo>, vendor_version: String) -> Routes {
    let mut routes = Routes::builder();
    routes.add_service(
        edgevol_proto::csi::v1::identity_server::IdentityServer::new(
            identity::IdentityService::new(state.clone(), vendor_version),
        ),
    );
    routes.add_service(
        edgevol_proto::csi::v1::controller_server::ControllerServer::new(
            controller::ControllerService::new(state.clone(), target),
        ),
    );
    routes.add_service(
        edgevol_proto::csi::v1::group_controller_server::GroupControllerServer::new(
            group_controller::GroupControllerService::new(state.clone()),
        ),
    );
    routes.add_service(
        edgevol_proto::csi::v1::snapshot_metadata_server::SnapshotMetadataServer::new(
            snapshot_metadata::SnapshotMetadataService::new(state.clone()),
        ),
    );
    routes.add_service(
        edgevol_proto::volumegroup::controller_server::ControllerServer::new(
            volume_group::VolumeGroupService::new(state.clone()),
        ),
    );
    routes.routes()
}

/// Runs one operation on the pool (serialized with every other pool call, off the reactor),
/// answered once durable: the group commit of every call in flight covers it
/// ([`State::with_pool_committed`]); its failure becomes a status through [`status::from_error`]
/// only.
pub async fn call<T, F>(state: &Arc<State>, f: F) -> Result<T, Status>
where
    F: FnOnce(&State, &mut Pool<PoolDevice>) -> Result<T, Error> + Send + 'static,
    T: Send + 'static,
{
    state
        .with_pool_committed(f)
        .await
        .map_err(|e| status::from_error(Ids::new(&state.appliance_id), e))
}

/// One page of a listing in id order: at most `max` items, and the next page's token (the last
/// item's `token`) if any item is left; no token pointing at an empty page.
pub fn page<T>(
    items: impl Iterator<Item = T>,
    max: usize,
    token: impl Fn(&T) -> String,
) -> (Vec<T>, String) {
    let mut items = items.peekable();
    let taken: Vec<T> = items.by_ref().take(max).collect();
    let next = match (items.peek(), taken.last()) {
        (Some(_), Some(last)) => token(last),
        _ => String::new(),
    };
    (taken, next)
}

#[cfg(test)]
mod tests {
    use super::page;

    #[test]
    fn pages_end_without_a_token_to_an_empty_page() {
        let token = |n: &u32| n.to_string();
        assert_eq!(page(1..=5, 2, token), (vec![1, 2], "2".to_owned()));
        assert_eq!(page(1..=4, 2, token), (vec![1, 2], "2".to_owned()));
        assert_eq!(page(3..=4, 2, token), (vec![3, 4], String::new()));
        assert_eq!(
            page(1..=3, usize::MAX, token),
            (vec![1, 2, 3], String::new())
        );
        assert_eq!(page(0..0, 2, token), (vec![], String::new()));
    }
}
