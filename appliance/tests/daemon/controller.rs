//! CSI Controller conformance over mTLS to one edgevold: the MUSTs and error rows of each served
//! RPC. The bodies live in cli/tests/controller_suite, which cli/tests/cli/proxy_controller_suite.rs
//! runs through `edgevol proxy` with one appliance and with two: one suite, so they cannot drift.

use crate::common;
use crate::controller_suite;

use common::{dev_config, DevAppliance};
use tonic::transport::Channel;

/// One dev appliance (`test-box`), called directly.
struct Direct {
    app: Option<DevAppliance>,
}

impl Direct {
    fn app(&self) -> &DevAppliance {
        self.app.as_ref().expect("the appliance runs")
    }
}

async fn direct() -> Direct {
    let app = DevAppliance::start().await;
    app.ready().await;
    Direct { app: Some(app) }
}

impl controller_suite::Driver for Direct {
    fn appliances(&self) -> Vec<String> {
        vec![self.app().running.state.appliance_id.clone()]
    }

    async fn channel(&self) -> Channel {
        self.app().channel("controller").await
    }

    async fn restart(&mut self) {
        let DevAppliance { dir, running } = self.app.take().expect("the appliance runs");
        running.stop().await.unwrap();
        let running =
            edgevol_appliance::start(dev_config(dir.path(), "127.0.0.1:0".parse().unwrap()))
                .await
                .unwrap();
        let app = DevAppliance { dir, running };
        app.ready().await;
        self.app = Some(app);
    }

    fn nvme_port(&self, id: &str) -> u16 {
        assert_eq!(id, self.appliances()[0]);
        self.app().running.target.endpoint.port()
    }

    fn stored_mutable_parameters(&self, volume_id: &str) -> Vec<(String, String)> {
        let state = &self.app().running.state;
        let id = edgevol_appliance::csi::ids::Ids::new(&state.appliance_id)
            .parse_volume(volume_id)
            .unwrap();
        let pool = state.pool().unwrap().lock().unwrap();
        pool.volume(id).unwrap().mutable_parameters().to_vec()
    }

    fn group_home(&self, _name: &str) -> String {
        self.appliances()[0].clone()
    }
}

controller_suite::controller_suite!(direct);
