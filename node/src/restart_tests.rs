//! Restarting `edgevol-node` while volumes are staged and published: the CO's next calls
//! (NodeGetVolumeStats, NodeExpandVolume, NodeUnpublishVolume, NodeUnstageVolume) are served by
//! a new process from the state records and what the kernel shows. Against the fake host, as
//! objects and over the real unix socket with a tonic client; tests/e2e/tests/node_faults.rs
//! does it in QEMU with SIGKILL.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use edgevol_proto::csi::v1::node_client::NodeClient;
use edgevol_proto::csi::v1::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume,
};
use edgevol_proto::csi::v1::volume_usage::Unit;
use edgevol_proto::csi::v1::*;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

use crate::fabrics::{FabricsConfig, HostIdentity};
use crate::host::Host;
use crate::state::StateStore;
use crate::testing::FakeHost;
use crate::volume::{ExpandRequest, PublishRequest, StageRequest, Usage, VolumeConfig, Volumes};
use crate::{build, serve, Args};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b";

fn nqn(n: u32) -> String {
    format!("nqn.2024-01.io.edgevol:box1:v{n}")
}

fn nguid(n: u32) -> String {
    format!("{n:032x}")
}

fn capability(block: bool) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            })
        }),
    }
}

/// The CO's view of one volume on the fake host.
struct Vol {
    id: String,
    block: bool,
    staging: PathBuf,
    target: PathBuf,
    context: HashMap<String, String>,
}

fn vol(host: &FakeHost, n: u32, block: bool) -> Vol {
    host.add_subsystem(&nqn(n), &nguid(n), "", 2048);
    Vol {
        id: format!("v{n}"),
        block,
        staging: host.work.join(format!("staging/v{n}")),
        target: host.work.join(format!("pods/p{n}/v{n}")),
        context: HashMap::from([
            ("transport".into(), "tcp".into()),
            ("targetAddress".into(), "10.0.0.2".into()),
            ("targetPort".into(), "4420".into()),
            ("subsystemNqn".into(), nqn(n)),
            ("nguid".into(), nguid(n)),
        ]),
    }
}

fn p(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

fn volumes_on(host: &Arc<FakeHost>) -> Volumes {
    let store = StateStore::open(host.work.join("state")).unwrap();
    let cfg = VolumeConfig {
        host: HostIdentity {
            nqn: HOSTNQN.into(),
            id: None,
        },
        fabrics: FabricsConfig::default(),
        device_wait: Duration::from_secs(1),
        poll: Duration::from_millis(100),
    };
    let dyn_host: Arc<dyn Host> = host.clone();
    Volumes::new(dyn_host, store, cfg)
}

#[test]
fn a_new_process_serves_what_the_old_one_staged_and_published() {
    let host = Arc::new(FakeHost::new());
    let (a, b) = (vol(&host, 1, false), vol(&host, 2, true));
    {
        let before = volumes_on(&host);
        for v in [&a, &b] {
            let req = crate::csi::request::stage(&NodeStageVolumeRequest {
                volume_id: v.id.clone(),
                publish_context: v.context.clone(),
                staging_target_path: p(&v.staging),
                volume_capability: Some(capability(v.block)),
                ..Default::default()
            })
            .unwrap();
            before.stage(&req).unwrap();
            before
                .publish(&PublishRequest {
                    volume_id: v.id.clone(),
                    staging_path: v.staging.clone(),
                    target_path: v.target.clone(),
                    capability: req.capability.clone(),
                    read_only: false,
                })
                .unwrap();
        }
    } // The process is gone: nothing of it survives but the state directory and the kernel.
    let after = volumes_on(&host);
    let stats = after.stats("v1", &a.target).unwrap();
    assert!(matches!(stats.usage, Usage::Filesystem(_)));
    assert_eq!(stats.abnormal, None);
    assert_eq!(
        after.stats("v2", &b.target).unwrap().usage,
        Usage::Block(2048 * 512)
    );
    host.grow_subsystem(&nqn(1), 4096);
    let grown = after
        .expand(&ExpandRequest {
            volume_id: "v1".into(),
            volume_path: a.target.clone(),
            required_bytes: 4096 * 512,
            limit_bytes: 0,
            access: None,
            key: None,
        })
        .unwrap();
    assert_eq!(grown, 4096 * 512);
    assert_eq!(host.commands_of("resize2fs").len(), 1);
    for v in [&a, &b] {
        after.unpublish(&v.id, &v.target).unwrap();
        after.unstage(&v.id, &v.staging).unwrap();
    }
    assert!(host.mounts().is_empty());
    assert!(host.controller_names().is_empty());
    assert_eq!(
        host.fabrics_writes().len(),
        2,
        "no connect after the restart"
    );
}

#[test]
fn killed_between_recording_a_publication_and_its_bind() {
    // The publication is recorded before the bind; a process that dies in between leaves a
    // record and no mount. The next process completes a retried publish, or unpublishes.
    let host = Arc::new(FakeHost::new());
    let a = vol(&host, 1, false);
    let stage = StageRequest {
        ..crate::csi::request::stage(&NodeStageVolumeRequest {
            volume_id: a.id.clone(),
            publish_context: a.context.clone(),
            staging_target_path: p(&a.staging),
            volume_capability: Some(capability(false)),
            ..Default::default()
        })
        .unwrap()
    };
    let publish = PublishRequest {
        volume_id: a.id.clone(),
        staging_path: a.staging.clone(),
        target_path: a.target.clone(),
        capability: stage.capability.clone(),
        read_only: true,
    };
    {
        let before = volumes_on(&host);
        before.stage(&stage).unwrap();
        host.fail_next("mount"); // the bind: as if the process died before it
        assert!(before.publish(&publish).is_err());
    }
    let after = volumes_on(&host);
    let rec = StateStore::open(host.work.join("state"))
        .unwrap()
        .get("v1")
        .unwrap()
        .unwrap();
    assert_eq!(rec.publications.len(), 1, "asked, not yet done");
    after.publish(&publish).unwrap();
    assert_eq!(
        host.mounts().last().unwrap(),
        &(a.target.clone(), true),
        "bound read-only"
    );
    // And the other way: forgotten by an unpublish that finds no mount to undo.
    after.unpublish("v1", &a.target).unwrap();
    host.fail_next("mount");
    assert!(after.publish(&publish).is_err());
    let again = volumes_on(&host);
    again.unpublish("v1", &a.target).unwrap();
    again.unstage("v1", &a.staging).unwrap();
    assert!(host.controller_names().is_empty());
    assert!(host.mounts().is_empty());
}

/// One plugin process: built from flags like main() does, serving its unix socket.
struct Process {
    channel: Channel,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), String>>,
}

fn args(host: &FakeHost) -> Args {
    let w = |x: &str| p(&host.work.join(x));
    std::fs::write(
        host.work.join("uuid"),
        "6f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b\n",
    )
    .unwrap();
    Args::parse_from([
        "edgevol-node".to_owned(),
        format!("--endpoint=unix://{}", w("csi/csi.sock")),
        format!("--node-id-file={}", w("etc/hostnqn")),
        format!("--hostid-file={}", w("etc/hostid")),
        format!("--state-dir={}", w("state")),
        format!("--uuid-source={}", w("uuid")),
    ])
}

async fn start(host: &Arc<FakeHost>) -> Process {
    let args = args(host);
    let dyn_host: Arc<dyn Host> = host.clone();
    let plugin = build(&args, dyn_host).unwrap();
    let sock = plugin.socket.clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(plugin, async {
        let _ = rx.await;
    }));
    // A stale socket of the previous process may still be there: wait for a connection.
    let channel = loop {
        let path = sock.clone();
        let attempt =
            Endpoint::try_from("http://[::]:50051")
                .unwrap()
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await;
        match attempt {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    Process {
        channel,
        stop: tx,
        server,
    }
}

impl Process {
    fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }

    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.server.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_socket_a_restarted_plugin_serves_the_cos_next_calls() {
    let host = Arc::new(FakeHost::new());
    let (a, b) = (vol(&host, 1, false), vol(&host, 2, true));
    let first = start(&host).await;
    let mut node = first.node();
    for v in [&a, &b] {
        node.node_stage_volume(NodeStageVolumeRequest {
            volume_id: v.id.clone(),
            publish_context: v.context.clone(),
            staging_target_path: p(&v.staging),
            volume_capability: Some(capability(v.block)),
            ..Default::default()
        })
        .await
        .unwrap();
        node.node_publish_volume(NodePublishVolumeRequest {
            volume_id: v.id.clone(),
            publish_context: v.context.clone(),
            staging_target_path: p(&v.staging),
            target_path: p(&v.target),
            volume_capability: Some(capability(v.block)),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    first.stop().await;

    let second = start(&host).await;
    let mut node = second.node();
    let stats = node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: a.id.clone(),
            volume_path: p(&a.target),
            staging_target_path: p(&a.staging),
        })
        .await
        .unwrap()
        .into_inner();
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .unwrap();
    assert_eq!(bytes.total, 1 << 30);
    let condition = stats.volume_condition.unwrap();
    assert!(!condition.abnormal, "{}", condition.message);
    let stats = node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: b.id.clone(),
            volume_path: p(&b.target),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.usage[0].total, 2048 * 512);

    host.grow_subsystem(&nqn(1), 8192);
    let grown = node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: a.id.clone(),
            volume_path: p(&a.target),
            capacity_range: Some(CapacityRange {
                required_bytes: 8192 * 512,
                limit_bytes: 0,
            }),
            staging_target_path: p(&a.staging),
            volume_capability: Some(capability(false)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 8192 * 512);

    for v in [&a, &b] {
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: v.id.clone(),
            target_path: p(&v.target),
        })
        .await
        .unwrap();
        node.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: p(&v.staging),
        })
        .await
        .unwrap();
        assert!(!v.target.exists());
    }
    second.stop().await;
    assert!(host.mounts().is_empty());
    assert!(host.controller_names().is_empty());
    assert!(StateStore::open(host.work.join("state"))
        .unwrap()
        .all()
        .unwrap()
        .is_empty());
    assert_eq!(host.fabrics_writes().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_bounds_controllers_an_earlier_plugin_connected() {
    // The upgrade path of issue 13: volumes staged by a plugin that connected without
    // fast_io_fail_tmo keep their controllers across the restart; the new process sets it.
    let host = Arc::new(FakeHost::new());
    let a = vol(&host, 1, false);
    let first = start(&host).await;
    first
        .node()
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: a.id.clone(),
            publish_context: a.context.clone(),
            staging_target_path: p(&a.staging),
            volume_capability: Some(capability(false)),
            ..Default::default()
        })
        .await
        .unwrap();
    first.stop().await;
    host.write_attr(
        &host.sys_root().join("class/nvme/nvme0/fast_io_fail_tmo"),
        "-1",
    )
    .unwrap();
    assert_eq!(host.attr("nvme0", "fast_io_fail_tmo"), "off");
    let second = start(&host).await;
    assert_eq!(host.attr("nvme0", "fast_io_fail_tmo"), "90");
    second.stop().await;
}
