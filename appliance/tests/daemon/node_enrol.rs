//! edgevol-node's enrolment client against a real dev appliance over mTLS: a node certificate
//! gets its keys (the same until a rotation), a second node certificate cannot take the same
//! host NQN, an unreachable appliance is UNAVAILABLE.

use crate::common;

use std::time::Duration;

use common::DevAppliance;
use edgevol_node::error::Error;
use edgevol_node::keys::{DhchapKeys, EnrolConfig, GrpcEnroller, KeySource};
use edgevol_pki::{files, Role, Validity};

const NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-1111-2222-3333-444444444444";
const OTHER_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-1111-2222-3333-444444444444";

fn enroller(app: &DevAppliance, address: String, name: &str) -> GrpcEnroller {
    GrpcEnroller::new(&EnrolConfig {
        address,
        server_name: None,
        ca: app.pki().join("ca.pem"),
        cert: app.pki().join(format!("{name}.pem")),
        key: app.pki().join(format!("{name}.key")),
        // The call's deadline; an unreachable appliance is refused at once, not by it.
        timeout: common::scaled(Duration::from_secs(5)),
    })
    .unwrap()
}

/// The enroller blocks (its own runtime): call it off this test's runtime.
async fn enrol(e: std::sync::Arc<GrpcEnroller>, nqn: &'static str) -> Result<DhchapKeys, Error> {
    tokio::task::spawn_blocking(move || e.enrol(nqn))
        .await
        .unwrap()
}

#[tokio::test]
async fn the_node_certificate_enrols_and_another_node_cannot_take_its_nqn() {
    let app = DevAppliance::start().await;
    files::issue(&app.pki(), Role::Node, "node-b", Validity::days(1), false).unwrap();
    let address = app.addr().to_string();
    let node = std::sync::Arc::new(enroller(&app, address.clone(), "node"));

    let keys = enrol(node.clone(), NQN).await.unwrap();
    assert!(keys.host.expose().starts_with("DHHC-1:01:"));
    assert!(keys.ctrl.expose().starts_with("DHHC-1:01:"));
    assert_ne!(keys.host, keys.ctrl);
    assert!(keys.generation >= 1);
    // What the appliance's target holds for the NQN is what the node got.
    let held = app.running.host_keys.keys_for(NQN);
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].generation, keys.generation);
    assert_eq!(held[0].host_secret.encode().as_str(), keys.host.expose());
    assert_eq!(held[0].ctrl_secret.encode().as_str(), keys.ctrl.expose());
    // Enrolment is idempotent: a restarted plugin gets the same keys.
    assert_eq!(enrol(node.clone(), NQN).await.unwrap(), keys);

    // Another node's certificate claiming the NQN: refused, with what to do.
    let b = std::sync::Arc::new(enroller(&app, address.clone(), "node-b"));
    let e = enrol(b.clone(), NQN).await.unwrap_err();
    let Error::FailedPrecondition(msg) = &e else {
        panic!("{e}")
    };
    assert!(
        msg.contains("bound to another node") && msg.contains(NQN),
        "{msg}"
    );
    assert!(!msg.contains("DHHC-1"), "{msg}");
    // The node asking for a second NQN: refused too.
    let e = enrol(node.clone(), OTHER_NQN).await.unwrap_err();
    assert!(
        matches!(&e, Error::FailedPrecondition(m) if m.contains("bound to another host NQN")),
        "{e}"
    );
    // The second node enrols its own NQN and gets its own keys.
    let b_keys = enrol(b, OTHER_NQN).await.unwrap();
    assert_ne!(b_keys.host, keys.host);

    // Nothing listens: UNAVAILABLE.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = closed.local_addr().unwrap().to_string();
    drop(closed);
    let gone = std::sync::Arc::new(enroller(&app, dead, "node"));
    let e = enrol(gone, NQN).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e}");

    app.running.stop().await.unwrap();
}
