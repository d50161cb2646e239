//! The host-key services over real mTLS: who may call them, what they answer, and a store that
//! refuses the start when damaged.

use crate::common;

use std::path::Path;

use common::{dev_config, DevAppliance};
use edgevol_appliance::hostkeys::{Confirmation, Secret};
use edgevol_appliance::{start, DaemonError};
use edgevol_pki::files;
use edgevol_pki::{Role, Validity};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::{GetPluginInfoRequest, ListVolumesRequest};
use edgevol_proto::edgevol::v1::enrolment_client::EnrolmentClient;
use edgevol_proto::edgevol::v1::host_keys_client::HostKeysClient;
use edgevol_proto::edgevol::v1::{
    EnrolRequest, EnrolResponse, ListRequest, RevokeRequest, RotateRequest,
};
use tonic::transport::Channel;
use tonic::Code;

const NQN_A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-1111-2222-3333-444444444444";
const NQN_B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-1111-2222-3333-444444444444";

/// Issues a client certificate `name` with `role` from the appliance's CA.
fn issue(app: &DevAppliance, role: Role, name: &str) {
    files::issue(&app.pki(), role, name, Validity::days(1), false).unwrap();
}

/// SHA-256 of the certificate `name` of the appliance's PKI directory.
fn fingerprint(pki: &Path, name: &str) -> [u8; 32] {
    let certs = edgevol_pki::tls::load_certs(&pki.join(format!("{name}.pem"))).unwrap();
    edgevol_appliance::transport::certificate_sha256(&certs[0])
}

/// The base64 part of a secret's `DHHC-1:hh:<base64>:` representation.
fn base64_of(secret: &Secret) -> String {
    let text = secret.encode();
    text["DHHC-1:01:".len()..text.len() - 1].to_owned()
}

async fn admin(app: &DevAppliance) -> HostKeysClient<Channel> {
    HostKeysClient::new(app.channel("admin").await)
}

#[tokio::test]
async fn admins_rotate_revoke_and_list_without_ever_seeing_a_secret() {
    let app = DevAppliance::start().await;
    let keys = app.running.host_keys.clone();
    issue(&app, Role::Node, "node-b");
    let a = keys
        .enrol("node", fingerprint(&app.pki(), "node"), NQN_A)
        .unwrap();
    keys.enrol("node-b", fingerprint(&app.pki(), "node-b"), NQN_B)
        .unwrap();
    let mut c = admin(&app).await;

    let listed = c.list(ListRequest {}).await.unwrap().into_inner();
    let names: Vec<(&str, &str, u64, bool)> = listed
        .nodes
        .iter()
        .map(|n| {
            (
                n.node.as_str(),
                n.host_nqn.as_str(),
                n.generation,
                n.rotation_pending,
            )
        })
        .collect();
    assert_eq!(
        names,
        [("node", NQN_A, 1, false), ("node-b", NQN_B, 2, false)]
    );
    let n = &listed.nodes[0];
    assert!(n.enrolled.is_some() && n.keys_created.is_some());
    assert_eq!(n.last_authenticated, None, "never authenticated yet");
    assert!(listed.revoked.is_empty());

    // Rotation: the new pair is pending, the old one still authenticates.
    let rotated = c
        .rotate(RotateRequest {
            node: "node".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rotated.generation, 3);
    let generations =
        |nqn| -> Vec<u64> { keys.keys_for(nqn).iter().map(|k| k.generation).collect() };
    assert_eq!(generations(NQN_A), [3, 1]);
    let listed = c.list(ListRequest {}).await.unwrap().into_inner();
    assert_eq!(
        (listed.nodes[0].generation, listed.nodes[0].rotation_pending),
        (3, true)
    );
    // The target reports the host's authentication with the new pair: the old one goes.
    assert_eq!(
        keys.confirm(NQN_A, 3).unwrap(),
        Confirmation::Completed { dropped: 1 }
    );
    assert_eq!(generations(NQN_A), [3]);
    let listed = c.list(ListRequest {}).await.unwrap().into_inner();
    assert!(!listed.nodes[0].rotation_pending);
    assert!(listed.nodes[0].last_authenticated.is_some());

    // Revocation, told to the target's hook.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    keys.on_revoke(std::sync::Arc::new(move |host| {
        tx.send(host.host_nqn.clone()).unwrap();
    }));
    let revoked = c
        .revoke(RevokeRequest {
            node: "node-b".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (revoked.host_nqn.as_str(), revoked.revoked_certificates),
        (NQN_B, 1)
    );
    assert_eq!(rx.recv().await.as_deref(), Some(NQN_B));
    assert!(keys.keys_for(NQN_B).is_empty());
    let listed = c.list(ListRequest {}).await.unwrap().into_inner();
    assert_eq!(listed.nodes.len(), 1);
    assert_eq!(listed.revoked.len(), 1);
    assert_eq!(listed.revoked[0].node, "node-b");
    let hex: String = fingerprint(&app.pki(), "node-b")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(listed.revoked[0].sha256, hex);

    // Errors name what is wrong.
    let e = c
        .rotate(RotateRequest {
            node: "node-b".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(
        e.message().contains("\"node-b\" has not enrolled"),
        "{}",
        e.message()
    );
    let e = c
        .revoke(RevokeRequest {
            node: "../x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // Nothing answered or listed carries a secret.
    let debug = format!("{listed:?} {rotated:?} {revoked:?}");
    for secret in [&a.key.host_secret, &a.key.ctrl_secret] {
        assert!(!debug.contains(&base64_of(secret)), "{debug}");
    }
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn only_admins_manage_keys_and_node_certificates_reach_nothing_else() {
    let app = DevAppliance::start().await;
    for name in ["controller", "observer", "node"] {
        let mut c = HostKeysClient::new(app.channel(name).await);
        let e = c.list(ListRequest {}).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{name}");
        assert_eq!(
            e.message(),
            format!("role {name} of client \"{name}\" may not call edgevol.v1.HostKeys/List")
        );
        let e = c
            .rotate(RotateRequest {
                node: "node".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{name}");
    }
    // A node certificate sits on every workload host: it opens no CSI service, not even Identity.
    let node = app.channel("node").await;
    let e = IdentityClient::new(node.clone())
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert_eq!(
        e.message(),
        "role node of client \"node\" may not call csi.v1.Identity/GetPluginInfo"
    );
    let e = ControllerClient::new(node)
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn a_damaged_store_refuses_the_start_and_an_intact_one_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let config = || dev_config(dir.path(), "127.0.0.1:0".parse().unwrap());
    let running = start(config()).await.unwrap();
    let pki = dir.path().join("pki");
    running
        .host_keys
        .enrol("node", fingerprint(&pki, "node"), NQN_A)
        .unwrap();
    running.stop().await.unwrap();

    // Kept across a restart.
    let running = start(config()).await.unwrap();
    assert_eq!(running.host_keys.keys_for(NQN_A).len(), 1);
    running.stop().await.unwrap();

    // One flipped byte: the daemon does not start, and says why and what to do.
    let path = dir.path().join("host-keys");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let e = start(config()).await.unwrap_err();
    assert!(matches!(e, DaemonError::HostKeys(_)), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("host-keys") && text.contains("checksum") && text.contains("backup"),
        "{text}"
    );
    assert!(!text.contains('\n'), "one line: {text}");
}

async fn enrol(
    app: &DevAppliance,
    cert: &str,
    host_nqn: &str,
) -> Result<EnrolResponse, tonic::Status> {
    EnrolmentClient::new(app.channel(cert).await)
        .enrol(EnrolRequest {
            host_nqn: host_nqn.into(),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// The secrets of an answer, parsed: they must be valid `DHHC-1:01:` secrets of 32 bytes.
fn secrets(answer: &EnrolResponse) -> (Secret, Secret) {
    let parse = |text: &str| {
        assert!(text.starts_with("DHHC-1:01:"), "SHA-256 transform");
        let secret = Secret::parse(text).unwrap();
        assert_eq!(secret.key_len(), 32);
        secret
    };
    (parse(&answer.host_secret), parse(&answer.ctrl_secret))
}

#[tokio::test]
async fn a_node_certificate_enrols_its_nqn_and_gets_the_same_keys_until_a_rotation() {
    let app = DevAppliance::start().await;
    let keys = app.running.host_keys.clone();
    let first = enrol(&app, "node", NQN_A).await.unwrap();
    assert_eq!(first.generation, 1);
    let (host, ctrl) = secrets(&first);
    assert!(!host.ct_eq(&ctrl), "host and controller secrets differ");
    // What the target will check the host against is what the node was given.
    let served = keys.keys_for(NQN_A);
    assert_eq!(served.len(), 1);
    assert_eq!(served[0].generation, 1);
    assert!(served[0].host_secret.ct_eq(&host) && served[0].ctrl_secret.ct_eq(&ctrl));
    // Idempotent: the same answer, on a new connection too.
    assert_eq!(enrol(&app, "node", NQN_A).await.unwrap(), first);

    // Rotation: Enrol answers the new pair; both authenticate until the host uses the new one.
    admin(&app)
        .await
        .rotate(RotateRequest {
            node: "node".into(),
        })
        .await
        .unwrap();
    let second = enrol(&app, "node", NQN_A).await.unwrap();
    assert_eq!(second.generation, 2);
    let (host2, ctrl2) = secrets(&second);
    assert!(!host2.ct_eq(&host) && !ctrl2.ct_eq(&ctrl), "new secrets");
    let served: Vec<u64> = keys.keys_for(NQN_A).iter().map(|k| k.generation).collect();
    assert_eq!(served, [2, 1]);
    // The host authenticating with its old pair changes nothing...
    assert_eq!(keys.confirm(NQN_A, 1).unwrap(), Confirmation::Current);
    assert_eq!(keys.keys_for(NQN_A).len(), 2);
    // ...with the new one, the old pair stops working.
    assert_eq!(
        keys.confirm(NQN_A, 2).unwrap(),
        Confirmation::Completed { dropped: 1 }
    );
    let served = keys.keys_for(NQN_A);
    assert_eq!(served.len(), 1);
    assert!(served[0].host_secret.ct_eq(&host2));
    assert_eq!(enrol(&app, "node", NQN_A).await.unwrap(), second);

    // An NQN is not a name: anything that is not one is refused before anything is stored.
    let e = enrol(&app, "node", "node-a").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn an_nqn_belongs_to_the_node_that_enrolled_it_first() {
    let app = DevAppliance::start().await;
    issue(&app, Role::Node, "intruder");
    let owner = enrol(&app, "node", NQN_A).await.unwrap();

    // Another node certificate claiming the NQN: refused, without learning whose it is.
    let e = enrol(&app, "intruder", NQN_A).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert_eq!(
        e.message(),
        format!("host NQN {NQN_A} is bound to another node")
    );
    // The intruder got no binding, and the owner's keys are unchanged.
    let listed = admin(&app)
        .await
        .list(ListRequest {})
        .await
        .unwrap()
        .into_inner();
    let nodes: Vec<&str> = listed.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(nodes, ["node"]);
    assert_eq!(enrol(&app, "node", NQN_A).await.unwrap(), owner);

    // One node, one NQN: the owner cannot take a second one.
    let e = enrol(&app, "node", NQN_B).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().contains(NQN_A) && e.message().contains("edgevol keys revoke --node node"),
        "{}",
        e.message()
    );
    // The intruder may enrol an NQN nobody holds.
    assert_eq!(enrol(&app, "intruder", NQN_B).await.unwrap().generation, 2);
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn only_node_certificates_enrol() {
    let app = DevAppliance::start().await;
    for name in ["controller", "observer"] {
        let e = enrol(&app, name, NQN_A).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{name}");
        assert_eq!(
            e.message(),
            format!("role {name} of client \"{name}\" may not call edgevol.v1.Enrolment/Enrol")
        );
    }
    // An admin may call anything, but is no node.
    let e = enrol(&app, "admin", NQN_A).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert_eq!(
        e.message(),
        "only a node certificate enrols; client \"admin\" has role admin"
    );
    assert!(app.running.host_keys.keys_for(NQN_A).is_empty());
    assert!(app.running.host_keys.list().nodes.is_empty());
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn a_revoked_node_loses_its_keys_and_its_certificate_may_not_enrol_again() {
    let app = DevAppliance::start().await;
    let keys = app.running.host_keys.clone();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    keys.on_revoke(std::sync::Arc::new(move |host| {
        tx.send((host.node.clone(), host.host_nqn.clone())).unwrap();
    }));
    let before = enrol(&app, "node", NQN_A).await.unwrap();
    let revoked = admin(&app)
        .await
        .revoke(RevokeRequest {
            node: "node".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(revoked.host_nqn, NQN_A);
    assert_eq!(rx.recv().await, Some(("node".to_owned(), NQN_A.to_owned())));
    assert!(
        keys.keys_for(NQN_A).is_empty(),
        "the target refuses the NQN"
    );

    // The same certificate cannot simply enrol again (a stolen node would).
    let e = enrol(&app, "node", NQN_A).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().contains("was revoked"), "{}", e.message());
    assert!(keys.keys_for(NQN_A).is_empty());

    // A newly issued certificate of the node enrols: new keys, a new generation, and it may
    // bind another NQN (a reinstalled host).
    files::issue(&app.pki(), Role::Node, "node", Validity::days(1), true).unwrap();
    let after = enrol(&app, "node", NQN_B).await.unwrap();
    assert_eq!(after.generation, 2);
    assert_ne!(after.host_secret, before.host_secret);
    assert_eq!(keys.keys_for(NQN_B).len(), 1);
    app.running.stop().await.unwrap();
}
