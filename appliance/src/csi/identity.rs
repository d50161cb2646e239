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
    vendor_version: String,
}

impl IdentityService {
    /// Serves the identity of `state`'s appliance; `vendor_version` is what GetPluginInfo
    /// reports: the running firmware's version on an appliance image (so an operator sees an
    /// update take effect), else the daemon's own ([`identity::VENDOR_VERSION`]).
    pub fn new(state: Arc<State>, vendor_version: String) -> Self {
        IdentityService {
            state,
            vendor_version,
        }
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
            vendor_version: self.vendor_version.clone(),
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
        // A pool poisoned by a panic serves nothing until edgevold restarts (and recovers it
        // from its journal): the spec's "plugin is unhealthy".
        if self.state.pool().is_some_and(|p| p.is_poisoned()) {
            return Err(Status::failed_precondition(
                "the pool was poisoned by a panic and serves nothing: restart edgevold",
            ));
        }
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
        let service = IdentityService::new(state.clone(), identity::VENDOR_VERSION.into());
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

    #[tokio::test]
    async fn plugin_info_reports_the_version_it_was_given() {
        let state = Arc::new(State::new("box".into(), Default::default()));
        let info = IdentityService::new(state, "1.0.0-fw7".into())
            .get_plugin_info(Request::new(GetPluginInfoRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.vendor_version, "1.0.0-fw7");
        assert_eq!(info.manifest["appliance-id"], "box");
    }

    #[tokio::test]
    async fn probe_reports_a_poisoned_pool_as_unhealthy() {
        let state = Arc::new(State::new("box".into(), Default::default()));
        let dir = tempfile::tempdir().unwrap();
        state.set_pool(crate::pool::open(&[dir.path().join("pool.img")], true).unwrap());
        let poisoner = state.clone();
        let _ = std::thread::spawn(move || {
            let _held = poisoner.pool().unwrap().lock().unwrap();
            panic!("injected: poisons the pool lock");
        })
        .join();
        let err = IdentityService::new(state, identity::VENDOR_VERSION.into())
            .probe(Request::new(ProbeRequest {}))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(
            err.message().contains("restart edgevold"),
            "{}",
            err.message()
        );
    }
}
