//! CSI Identity of the node plugin.

use std::collections::HashMap;

use edgevol_proto::csi::v1::identity_server::Identity;
use edgevol_proto::csi::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

use edgevol_driver::identity;

/// The Identity service.
#[derive(Debug, Clone, Default)]
pub struct IdentityService;

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: identity::PLUGIN_NAME.to_owned(),
            vendor_version: identity::VENDOR_VERSION.to_owned(),
            manifest: HashMap::from([("component".to_owned(), "node".to_owned())]),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        // The whole driver's capabilities, though this instance serves no Controller: the spec
        // asks every instance of one plugin version for the same set, and orchestrators (Nomad)
        // read it here to decide whether volumes need ControllerPublishVolume.
        Ok(Response::new(identity::plugin_capabilities()))
    }

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        // Ready once serving: the host NQN and state directory were checked at start.
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}
