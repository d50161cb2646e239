//! The plugin over its real unix socket with a tonic client: Identity, NodeGetInfo,
//! NodeGetCapabilities, and the INVALID_ARGUMENT / NOT_FOUND rows that never reach the host
//! (sysfs and /dev roots point at empty temp dirs), for a plain and for an encrypted volume.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use edgevol_node::host::LinuxHost;
use edgevol_node::{build, serve, Args};
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::node_client::NodeClient;
use edgevol_proto::csi::v1::node_service_capability::rpc::Type as Rpc;
use edgevol_proto::csi::v1::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, MountVolume,
};
use edgevol_proto::csi::v1::*;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

struct Running {
    _dir: tempfile::TempDir,
    channel: Channel,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<Result<(), String>>,
    hostnqn: PathBuf,
}

async fn start() -> Running {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["sys", "dev"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(d.join("uuid"), "6f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b\n").unwrap();
    let sock = d.join("csi/csi.sock");
    let p = |x: &str| d.join(x).to_string_lossy().into_owned();
    let args = Args::parse_from([
        "edgevol-node".to_owned(),
        format!("--endpoint=unix://{}", sock.display()),
        format!("--node-id-file={}", p("etc/nvme/hostnqn")),
        format!("--hostid-file={}", p("etc/nvme/hostid")),
        format!("--state-dir={}", p("state")),
        format!("--uuid-source={}", p("uuid")),
        "--max-volumes-per-node=16".to_owned(),
        "--topology=edgevol.io/appliance=box1".to_owned(),
        "--ctrl-loss-tmo=-1".to_owned(),
    ]);
    // No module is ever loaded into the machine running the test.
    let host = Arc::new(LinuxHost::new(d.join("sys"), d.join("dev")).with_modprobe(d.join("none")));
    let plugin = build(&args, host).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(plugin, async {
        let _ = rx.await;
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
    let path = sock.clone();
    let channel = Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .unwrap();
    Running {
        hostnqn: d.join("etc/nvme/hostnqn"),
        _dir: dir,
        channel,
        stop: Some(tx),
        server,
    }
}

impl Running {
    async fn stop(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        self.server.await.unwrap().unwrap();
    }
}

fn code<T>(res: Result<tonic::Response<T>, tonic::Status>) -> (Code, String) {
    match res {
        Ok(_) => panic!("expected an error"),
        Err(s) => {
            assert!(
                !s.message().contains("s3cr3t"),
                "secret leaked: {}",
                s.message()
            );
            (s.code(), s.message().to_owned())
        }
    }
}

fn mount_cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

fn publish_context() -> HashMap<String, String> {
    HashMap::from([
        ("transport".into(), "tcp".into()),
        ("targetAddress".into(), "10.0.0.2".into()),
        ("targetPort".into(), "4420".into()),
        (
            "subsystemNqn".into(),
            "nqn.2024-01.io.edgevol:box1:vol1".into(),
        ),
        ("nguid".into(), "0123456789abcdef0123456789abcdef".into()),
        ("uuid".into(), "9f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b".into()),
    ])
}

/// The secrets of a request to an encrypted volume: its passphrase (never echoed: see [`code`]).
fn passphrase() -> HashMap<String, String> {
    HashMap::from([("encryptionPassphrase".into(), "s3cr3t-passphrase".into())])
}

/// NodeStageVolume as the CO sends it, of an encrypted volume (its context and passphrase) or
/// a plain one.
fn stage(encrypted: bool, volume_id: &str, path: &str) -> NodeStageVolumeRequest {
    let mut req = NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        publish_context: publish_context(),
        staging_target_path: path.into(),
        volume_capability: Some(mount_cap()),
        secrets: HashMap::from([("token".into(), "s3cr3t".into())]),
        volume_context: HashMap::new(),
    };
    if encrypted {
        req.volume_context.insert("encrypted".into(), "true".into());
        req.secrets.extend(passphrase());
    }
    req
}

#[tokio::test]
async fn identity_info_and_capabilities() {
    let r = start().await;
    let mut id = IdentityClient::new(r.channel.clone());
    let info = id
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "csi.edgevol.io");
    assert!(!info.vendor_version.is_empty());
    let probe = id.probe(ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));

    let mut node = NodeClient::new(r.channel.clone());
    let info = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        info.node_id,
        "nqn.2014-08.org.nvmexpress:uuid:6f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b"
    );
    assert_eq!(
        std::fs::read_to_string(&r.hostnqn).unwrap().trim(),
        info.node_id,
        "persisted"
    );
    assert_eq!(info.max_volumes_per_node, 16);
    assert_eq!(
        info.accessible_topology.unwrap().segments,
        HashMap::from([
            ("edgevol.io/appliance".to_owned(), "box1".to_owned()),
            ("appliance.edgevol.io/box1".to_owned(), "true".to_owned()),
        ])
    );
    let caps = node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut got: Vec<i32> = caps
        .capabilities
        .iter()
        .map(|c| match c.r#type {
            Some(node_service_capability::Type::Rpc(ref rpc)) => rpc.r#type,
            None => -1,
        })
        .collect();
    got.sort_unstable();
    let want = [
        Rpc::StageUnstageVolume,
        Rpc::GetVolumeStats,
        Rpc::ExpandVolume,
        Rpc::VolumeCondition,
        Rpc::SingleNodeMultiWriter,
    ]
    .map(|r| r as i32);
    assert_eq!(got, want);
    r.stop().await;
}

#[tokio::test]
async fn invalid_argument_and_not_found_rows() {
    invalid_argument_and_not_found_rows_of(false).await;
}

/// The same rows answer alike for an encrypted volume (what only it answers, such as a missing
/// passphrase, is tested with the plugin's encryption).
#[tokio::test]
async fn invalid_argument_and_not_found_rows_of_an_encrypted_volume() {
    invalid_argument_and_not_found_rows_of(true).await;
}

async fn invalid_argument_and_not_found_rows_of(encrypted: bool) {
    let r = start().await;
    let mut node = NodeClient::new(r.channel.clone());
    let check = |(c, m): (Code, String), want: Code, text: &str| {
        assert_eq!(c, want, "{m}");
        assert!(m.contains(text), "{m:?} should mention {text:?}");
    };

    check(
        code(
            node.node_stage_volume(stage(encrypted, "", "/stage/v1"))
                .await,
        ),
        Code::InvalidArgument,
        "volume_id",
    );
    check(
        code(node.node_stage_volume(stage(encrypted, "v1", "")).await),
        Code::InvalidArgument,
        "staging_target_path",
    );
    check(
        code(
            node.node_stage_volume(stage(encrypted, "v1", "stage/v1"))
                .await,
        ),
        Code::InvalidArgument,
        "absolute",
    );
    let mut no_cap = stage(encrypted, "v1", "/stage/v1");
    no_cap.volume_capability = None;
    check(
        code(node.node_stage_volume(no_cap).await),
        Code::InvalidArgument,
        "volume_capability",
    );
    for key in ["transport", "targetAddress", "targetPort", "subsystemNqn"] {
        let mut req = stage(encrypted, "v1", "/stage/v1");
        req.publish_context.remove(key);
        check(
            code(node.node_stage_volume(req).await),
            Code::InvalidArgument,
            key,
        );
    }
    let mut no_ids = stage(encrypted, "v1", "/stage/v1");
    no_ids.publish_context.remove("nguid");
    no_ids.publish_context.remove("uuid");
    check(
        code(node.node_stage_volume(no_ids).await),
        Code::InvalidArgument,
        "nguid",
    );
    let mut bad_nguid = stage(encrypted, "v1", "/stage/v1");
    bad_nguid
        .publish_context
        .insert("nguid".into(), "xyz".into());
    check(
        code(node.node_stage_volume(bad_nguid).await),
        Code::InvalidArgument,
        "nguid",
    );
    let mut btrfs = stage(encrypted, "v1", "/stage/v1");
    btrfs.volume_context.insert("fsType".into(), "btrfs".into());
    check(
        code(node.node_stage_volume(btrfs).await),
        Code::InvalidArgument,
        "btrfs",
    );

    let unstage = NodeUnstageVolumeRequest {
        volume_id: "v1".into(),
        staging_target_path: "rel".into(),
    };
    check(
        code(node.node_unstage_volume(unstage).await),
        Code::InvalidArgument,
        "absolute",
    );

    let publish = NodePublishVolumeRequest {
        volume_id: "v1".into(),
        staging_target_path: "/stage/v1".into(),
        target_path: String::new(),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    };
    check(
        code(node.node_publish_volume(publish.clone()).await),
        Code::InvalidArgument,
        "target_path",
    );
    let unstaged = NodePublishVolumeRequest {
        target_path: "/pods/a/v1".into(),
        staging_target_path: String::new(),
        ..publish.clone()
    };
    check(
        code(node.node_publish_volume(unstaged.clone()).await),
        Code::FailedPrecondition,
        "staging_target_path",
    );
    // A missing required field comes before the staging path: csi-sanity's NodePublishVolume
    // without volume_capability (and, on a plugin that stages, without a staging path either).
    for (req, field) in [
        (
            NodePublishVolumeRequest {
                volume_capability: None,
                ..unstaged.clone()
            },
            "volume_capability",
        ),
        (
            NodePublishVolumeRequest {
                volume_id: String::new(),
                ..unstaged.clone()
            },
            "volume_id",
        ),
        (
            NodePublishVolumeRequest {
                target_path: String::new(),
                ..unstaged.clone()
            },
            "target_path",
        ),
    ] {
        check(
            code(node.node_publish_volume(req).await),
            Code::InvalidArgument,
            field,
        );
    }
    let unknown = NodePublishVolumeRequest {
        target_path: "/pods/a/v1".into(),
        ..publish
    };
    check(
        code(node.node_publish_volume(unknown).await),
        Code::NotFound,
        "not staged",
    );

    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: String::new(),
        target_path: "/pods/a/v1".into(),
    };
    check(
        code(node.node_unpublish_volume(unpublish).await),
        Code::InvalidArgument,
        "volume_id",
    );

    // csi-sanity's "should fail when volume is not found": a relative volume_path is not where
    // any volume is, so NOT_FOUND; only a missing one is INVALID_ARGUMENT.
    let stats = NodeGetVolumeStatsRequest {
        volume_id: "v1".into(),
        volume_path: "some/path".into(),
        staging_target_path: String::new(),
    };
    check(
        code(node.node_get_volume_stats(stats.clone()).await),
        Code::NotFound,
        "some/path",
    );
    let no_path = NodeGetVolumeStatsRequest {
        volume_path: String::new(),
        ..stats.clone()
    };
    check(
        code(node.node_get_volume_stats(no_path).await),
        Code::InvalidArgument,
        "volume_path",
    );
    let stats = NodeGetVolumeStatsRequest {
        volume_path: "/pods/a/v1".into(),
        ..stats
    };
    check(
        code(node.node_get_volume_stats(stats).await),
        Code::NotFound,
        "v1",
    );

    let expand = NodeExpandVolumeRequest {
        volume_id: "v1".into(),
        volume_path: "/pods/a/v1".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 10,
            limit_bytes: 5,
        }),
        secrets: if encrypted {
            passphrase()
        } else {
            HashMap::new()
        },
        ..Default::default()
    };
    check(
        code(node.node_expand_volume(expand.clone()).await),
        Code::InvalidArgument,
        "limit_bytes",
    );
    let expand = NodeExpandVolumeRequest {
        capacity_range: None,
        ..expand
    };
    check(
        code(node.node_expand_volume(expand.clone()).await),
        Code::NotFound,
        "v1",
    );
    let relative = NodeExpandVolumeRequest {
        volume_path: "some/path".into(),
        ..expand.clone()
    };
    check(
        code(node.node_expand_volume(relative).await),
        Code::NotFound,
        "some/path",
    );
    let no_path = NodeExpandVolumeRequest {
        volume_path: String::new(),
        ..expand
    };
    check(
        code(node.node_expand_volume(no_path).await),
        Code::InvalidArgument,
        "volume_path",
    );
    r.stop().await;
}
