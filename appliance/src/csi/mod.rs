//! The CSI services of the appliance: thin handlers over the appliance's state.
//!
//! Shared by every handler: [`ids`] (CSI ids of core objects), [`validate`] (size limits and
//! uniform INVALID_ARGUMENT messages) and [`status`] (core errors as gRPC statuses).

pub mod capability;
pub mod controller;
pub mod group_controller;
pub mod identity;
pub mod ids;
pub mod params;
pub mod qos;
pub mod status;
pub mod validate;
pub mod volume_group;

use std::sync::Arc;

use tonic::service::Routes;

use crate::state::State;

/// Every CSI service the appliance serves, routed.
pub fn routes(state: &Arc<State>) -> Routes {
    let mut routes = Routes::builder();
    routes.add_service(
        edgevol_proto::csi::v1::identity_server::IdentityServer::new(
            identity::IdentityService::new(state.clone()),
        ),
    );
    routes.add_service(
        edgevol_proto::csi::v1::controller_server::ControllerServer::new(
            controller::ControllerService::new(state.clone()),
        ),
    );
    routes.add_service(
        edgevol_proto::csi::v1::group_controller_server::GroupControllerServer::new(
            group_controller::GroupControllerService::new(state.clone()),
        ),
    );
    routes.add_service(
        edgevol_proto::volumegroup::controller_server::ControllerServer::new(
            volume_group::VolumeGroupService::new(state.clone()),
        ),
    );
    routes.routes()
}
