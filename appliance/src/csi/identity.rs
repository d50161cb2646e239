//! CSI Identity: who the plugin is, what it offers, and whether it is ready.

use std::collections::HashMap;
use std::sync::Arc;

use edgevol_driver::identity;
use edgevol_proto::csi::v1::identity_server::Identity;
use edgevol_proto::csi::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

use crate::state::State;

/// The Identity service.
#[derive(Debug, Clone)]
pub struct IdentityService {
    state: Arc<State>,
}

impl IdentityService {
    /// Serves the identity of `state`'s appliance.
    pub fn new(state: Arc<State>) -> Self {
        IdentityService { state }
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        let manifest = HashMap::from([
            ("appliance-id".to_owned(), self.state.appliance_id.clone()),
            (
                "topology-key".to_owned(),
                crate::config::TOPOLOGY_KEY.to_owned(),
            ),
        ]);
        Ok(Response::new(GetPluginInfoResponse {
            name: identity::PLUGIN_NAME.to_owned(),
            vendor_version: identity::VENDOR_VERSION.to_owned(),
            manifest,
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(identity::plugin_capabilities()))
    }

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {
            ready: Some(self.state.is_ready()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn probe_reports_not_ready_until_the_pool_is_open() {
        let state = Arc::new(State::new("box".into(), Default::default()));
        let service = IdentityService::new(state.clone());
        let probe = || async {
            service
                .probe(Request::new(ProbeRequest {}))
                .await
                .unwrap()
                .into_inner()
                .ready
        };
        assert_eq!(probe().await, Some(false));
        let dir = tempfile::tempdir().unwrap();
        let pool = crate::pool::open(&[dir.path().join("pool.img")], true).unwrap();
        state.set_pool(pool);
        assert_eq!(probe().await, Some(true));
    }
}
