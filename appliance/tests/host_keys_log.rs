//! Data-path secrets never reach the log: enrolments (first, repeated, refused), a rotation, a
//! listing and a revocation are logged with who did what, at the most verbose level, and no
//! secret handed out appears anywhere in it. The start with unauthenticated hosts allowed
//! warns.

mod common;

use common::log_capture::Captured;
use common::{dev_config, DevAppliance};
use edgevol_appliance::start;
use edgevol_pki::{files, Role, Validity};
use edgevol_proto::edgevol::v1::enrolment_client::EnrolmentClient;
use edgevol_proto::edgevol::v1::host_keys_client::HostKeysClient;
use edgevol_proto::edgevol::v1::{EnrolRequest, ListRequest, RevokeRequest, RotateRequest};

const NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:cccccccc-1111-2222-3333-444444444444";

#[tokio::test]
async fn keys_are_never_logged_and_allowing_unauthenticated_hosts_warns() {
    let log = Captured::install();

    let dir = tempfile::tempdir().unwrap();
    let mut config = dev_config(dir.path(), "127.0.0.1:0".parse().unwrap());
    config.host_auth.allow_unauthenticated_hosts = true;
    let app = DevAppliance {
        running: start(config).await.unwrap(),
        dir,
    };
    files::issue(&app.pki(), Role::Node, "intruder", Validity::days(1), false).unwrap();
    let mut handed_out = Vec::new();
    let mut node = EnrolmentClient::new(app.channel("node").await);
    let request = || EnrolRequest {
        host_nqn: NQN.into(),
    };
    handed_out.push(node.enrol(request()).await.unwrap().into_inner());
    handed_out.push(node.enrol(request()).await.unwrap().into_inner());
    let mut intruder = EnrolmentClient::new(app.channel("intruder").await);
    intruder.enrol(request()).await.unwrap_err();
    let mut admin = HostKeysClient::new(app.channel("admin").await);
    let node_name = || "node".to_owned();
    admin
        .rotate(RotateRequest { node: node_name() })
        .await
        .unwrap();
    handed_out.push(node.enrol(request()).await.unwrap().into_inner());
    admin.list(ListRequest {}).await.unwrap();
    admin
        .revoke(RevokeRequest { node: node_name() })
        .await
        .unwrap();
    node.enrol(request()).await.unwrap_err();
    app.running.stop().await.unwrap();

    let text = log.text();
    assert!(
        text.contains("WARN") && text.contains("nvme.allow_unauthenticated_hosts is on"),
        "the start warns:\n{text}"
    );
    assert!(text.contains("node enrolled"), "{text}");
    assert!(
        text.contains("enrolment refused") && text.contains("bound to node \"node\""),
        "a refused claim is logged with the NQN's owner:\n{text}"
    );
    assert!(text.contains("node keys rotated") && text.contains("node keys revoked"));
    assert!(
        text.contains("admin/admin"),
        "with the caller's identity:\n{text}"
    );
    assert_eq!(handed_out.len(), 3);
    assert!(!text.contains("DHHC-1"), "a secret leaked into the log");
    for answer in &handed_out {
        for secret in [&answer.host_secret, &answer.ctrl_secret] {
            let base64 = &secret["DHHC-1:01:".len()..secret.len() - 1];
            assert!(!text.contains(base64), "a secret leaked into the log");
        }
    }
}
