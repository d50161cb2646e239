//! The two halves of the driver answer Identity alike: edgevold (over mTLS) and edgevol-node (on
//! its unix socket), run side by side, report the same name, vendor version and plugin
//! capabilities, as the spec asks of every instance of one plugin version.

use crate::common;

use std::sync::Arc;

use clap::Parser;
use common::DevAppliance;
use edgevol_node::host::LinuxHost;
use edgevol_node::{build, serve, Args};
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

/// edgevol-node on a unix socket in `dir`, its sysfs and /dev roots empty (Identity needs none).
async fn node_plugin(dir: &std::path::Path) -> (Channel, tokio::sync::oneshot::Sender<()>) {
    for sub in ["sys", "dev"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::write(dir.join("uuid"), "6f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b\n").unwrap();
    let sock = dir.join("csi.sock");
    let p = |x: &str| dir.join(x).to_string_lossy().into_owned();
    let args = Args::parse_from([
        "edgevol-node".to_owned(),
        format!("--endpoint=unix://{}", sock.display()),
        format!("--node-id-file={}", p("hostnqn")),
        format!("--hostid-file={}", p("hostid")),
        format!("--state-dir={}", p("state")),
        format!("--uuid-source={}", p("uuid")),
    ]);
    let plugin = build(
        &args,
        Arc::new(LinuxHost::new(dir.join("sys"), dir.join("dev"))),
    )
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(plugin, async {
        let _ = stopped.await;
    }));
    // The server binds its socket soon; a generous deadline for a busy machine.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while !sock.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the plugin never bound {}",
            sock.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let channel = Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_| {
            let sock = sock.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(sock).await?)) }
        }))
        .await
        .unwrap();
    (channel, stop)
}

/// Capabilities as comparable text (prost names the enum values), in the order given.
fn services(r: GetPluginCapabilitiesResponse) -> Vec<String> {
    r.capabilities
        .into_iter()
        .map(|c| format!("{c:?}"))
        .collect()
}

#[tokio::test]
async fn appliance_and_node_plugin_answer_identity_alike() {
    let app = DevAppliance::start().await;
    let node_dir = tempfile::tempdir().unwrap();
    let (node_channel, stop) = node_plugin(node_dir.path()).await;
    let mut controller = IdentityClient::new(app.channel("controller").await);
    let mut node = IdentityClient::new(node_channel);

    let c = controller
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let n = node
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((&c.name, &c.vendor_version), (&n.name, &n.vendor_version));
    assert_eq!(c.name, "csi.edgevol.io");
    assert!(!c.vendor_version.is_empty());

    let c = controller
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let n = node
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let (c, n) = (services(c), services(n));
    assert_eq!(c, n, "controller and node report different capabilities");
    for want in [
        "ControllerService",
        "VolumeAccessibilityConstraints",
        "GroupControllerService",
    ] {
        assert!(
            c.iter().any(|s| s.contains(want)),
            "{want} missing from {c:?}"
        );
    }
    let _ = stop.send(());
    app.running.stop().await.unwrap();
}
