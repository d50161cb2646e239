//! The `edgevol proxy` command over several appliances: `--appliance ID=HOST:PORT` and a
//! `--config` file together, `--node-socket` as a Swarm plugin uses it, and the refusal of
//! unnamed appliances in a fleet.

use std::convert::Infallible;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common;
use crate::fleet;

use bytes::Bytes;
use common::{create_ok, unix_channel};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::node_client::NodeClient;
use edgevol_proto::csi::v1::{GetPluginInfoRequest, NodeGetInfoRequest, TopologyRequirement};
use fleet::{create, home, start_fleet, stop_all, topology};
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixListener;
use tonic::Code;

/// The proxy process, killed (by its own pid) when the test ends.
struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A stand-in node plugin answering every call UNIMPLEMENTED "fake node plugin".
fn fake_node_plugin(listener: UnixListener) {
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    let status = tonic::Status::unimplemented("fake node plugin");
                    Ok::<_, Infallible>(status.into_http::<()>().map(|()| Empty::<Bytes>::new()))
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

#[tokio::test]
async fn the_proxy_command_serves_flags_and_config_file_appliances_and_the_node_socket() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "[[appliance]]\nid = \"box-a\"\naddress = \"{}\"\nserver_name = \"localhost\"\n",
            boxes[0].addr
        ),
    )
    .unwrap();
    let node_socket = dir.path().join("node.sock");
    fake_node_plugin(UnixListener::bind(&node_socket).unwrap());
    let pki = dir.path().join("pki");
    let socket = dir.path().join("csi.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_edgevol"))
        .arg("proxy")
        .arg("--listen")
        .arg(format!("unix://{}", socket.display()))
        .arg("--config")
        .arg(&config)
        .arg("--appliance")
        .arg(format!("box-b={}", boxes[1].addr))
        .arg("--server-name")
        .arg("localhost")
        .arg("--ca")
        .arg(pki.join("ca.pem"))
        .arg("--cert")
        .arg(pki.join("controller.pem"))
        .arg("--key")
        .arg(pki.join("controller.key"))
        .arg("--node-socket")
        .arg(&node_socket)
        .env("RUST_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _proxy = Proxy(child);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "proxy never listened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let channel = unix_channel(socket).await;

    let info = IdentityClient::new(channel.clone())
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "csi.edgevol.io");
    let status = NodeClient::new(channel.clone())
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unimplemented, "fake node plugin")
    );
    let mut c = ControllerClient::new(channel);
    for id in ["box-a", "box-b"] {
        let mut r = create(&format!("on-{id}"), 1 << 20);
        r.accessibility_requirements = Some(TopologyRequirement {
            requisite: vec![topology(&[("edgevol.io/appliance", id)])],
            preferred: vec![],
        });
        let v = create_ok(&mut c, r).await;
        assert_eq!(home(&v.volume_id), id, "served from the {id} entry");
    }

    stop_all(&mut boxes).await;
}

#[test]
fn several_appliances_must_each_be_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_edgevol"))
        .args(["proxy", "--listen"])
        .arg(format!("unix://{}", dir.path().join("csi.sock").display()))
        .args([
            "--appliance",
            "127.0.0.1:9500",
            "--appliance",
            "127.0.0.2:9500",
        ])
        .args(["--ca", "/nonexistent/ca.pem"])
        .args([
            "--cert",
            "/nonexistent/c.pem",
            "--key",
            "/nonexistent/c.key",
        ])
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("name each one: --appliance ID=HOST:PORT"),
        "{err}"
    );
}
