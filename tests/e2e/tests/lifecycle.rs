//! The volume life cycle end to end, driven from the host: the appliance VM (firmware image,
//! emulated NVMe drive) over mTLS, the node VM's real `edgevol-node` (Linux NVMe/TCP initiator,
//! mkfs.ext4, mount) through the test agent. Needs the VMs of scripts/test-e2e-qemu.sh, which
//! sets the EDGEVOL_E2E_* variables; ignored otherwise.

use std::path::PathBuf;

use edgevol_e2e::{appliance_channel, env_addr, node_channel, within, Agent};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::node_client::NodeClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use edgevol_proto::csi::v1::volume_content_source::{SnapshotSource, Type as SourceType};
use edgevol_proto::csi::v1::*;
use tonic::transport::Channel;

const MIB: i64 = 1 << 20;
/// Budget of one CSI call (TCG guests on a shared 2-core machine are slow).
const CALL_SECS: u64 = 120;

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

struct Rig {
    ctl: ControllerClient<Channel>,
    node: NodeClient<Channel>,
    agent: Agent,
    node_id: String,
}

/// A volume as the node sees it once staged and published.
struct Attached {
    volume_id: String,
    staging: String,
    target: String,
    block: bool,
}

impl Rig {
    async fn new() -> Rig {
        let pki = PathBuf::from(std::env::var("EDGEVOL_E2E_PKI").expect("EDGEVOL_E2E_PKI"));
        let ctl = ControllerClient::new(
            appliance_channel(env_addr("EDGEVOL_E2E_CSI"), &pki, "controller").await,
        );
        let mut node = NodeClient::new(node_channel(env_addr("EDGEVOL_E2E_NODE_CSI")).await);
        let agent = Agent {
            addr: env_addr("EDGEVOL_E2E_NODE_EXEC"),
        };
        let info = within(
            CALL_SECS,
            "NodeGetInfo",
            node.node_get_info(NodeGetInfoRequest {}),
        )
        .await
        .expect("NodeGetInfo")
        .into_inner();
        assert!(
            info.node_id.starts_with("nqn."),
            "node id {:?}",
            info.node_id
        );
        let hostnqn = agent.ok(10, "cat /etc/nvme/hostnqn").await;
        assert_eq!(info.node_id, hostnqn.trim(), "node_id is the host NQN");
        Rig {
            ctl,
            node,
            agent,
            node_id: info.node_id,
        }
    }

    async fn create(&mut self, name: &str, bytes: i64, block: bool, from: Option<&str>) -> Volume {
        let req = CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability(block)],
            volume_content_source: from.map(|snap| VolumeContentSource {
                r#type: Some(SourceType::Snapshot(SnapshotSource {
                    snapshot_id: snap.into(),
                })),
            }),
            ..Default::default()
        };
        within(CALL_SECS, "CreateVolume", self.ctl.create_volume(req))
            .await
            .expect("CreateVolume")
            .into_inner()
            .volume
            .expect("a volume")
    }

    /// ControllerPublish to this node, NodeStage, NodePublish.
    async fn attach(&mut self, volume: &Volume, block: bool, tag: &str) -> Attached {
        let context = within(
            CALL_SECS,
            "ControllerPublishVolume",
            self.ctl
                .controller_publish_volume(ControllerPublishVolumeRequest {
                    volume_id: volume.volume_id.clone(),
                    node_id: self.node_id.clone(),
                    volume_capability: Some(capability(block)),
                    readonly: false,
                    ..Default::default()
                }),
        )
        .await
        .expect("ControllerPublishVolume")
        .into_inner()
        .publish_context;
        for key in ["targetAddress", "targetPort", "subsystemNqn"] {
            assert!(
                context.contains_key(key),
                "publish_context lacks {key}: {context:?}"
            );
        }
        let staging = format!("/var/lib/kubelet/plugins/edgevol/staging/{tag}");
        let pod = format!("/var/lib/kubelet/pods/{tag}");
        let target = if block {
            format!("{pod}/volumeDevices/dev")
        } else {
            format!("{pod}/volumes/mnt")
        };
        self.agent
            .ok(10, &format!("mkdir -p {staging} {pod}"))
            .await;
        within(
            CALL_SECS,
            "NodeStageVolume",
            self.node.node_stage_volume(NodeStageVolumeRequest {
                volume_id: volume.volume_id.clone(),
                publish_context: context.clone(),
                staging_target_path: staging.clone(),
                volume_capability: Some(capability(block)),
                volume_context: volume.volume_context.clone(),
                ..Default::default()
            }),
        )
        .await
        .expect("NodeStageVolume");
        within(
            CALL_SECS,
            "NodePublishVolume",
            self.node.node_publish_volume(NodePublishVolumeRequest {
                volume_id: volume.volume_id.clone(),
                publish_context: context,
                staging_target_path: staging.clone(),
                target_path: target.clone(),
                volume_capability: Some(capability(block)),
                readonly: false,
                volume_context: volume.volume_context.clone(),
                ..Default::default()
            }),
        )
        .await
        .expect("NodePublishVolume");
        Attached {
            volume_id: volume.volume_id.clone(),
            staging,
            target,
            block,
        }
    }

    /// NodeUnpublish, NodeUnstage, ControllerUnpublish, DeleteVolume.
    async fn detach_and_delete(&mut self, a: &Attached) {
        within(
            CALL_SECS,
            "NodeUnpublishVolume",
            self.node.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: a.volume_id.clone(),
                target_path: a.target.clone(),
            }),
        )
        .await
        .expect("NodeUnpublishVolume");
        within(
            CALL_SECS,
            "NodeUnstageVolume",
            self.node.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: a.volume_id.clone(),
                staging_target_path: a.staging.clone(),
            }),
        )
        .await
        .expect("NodeUnstageVolume");
        let mounts = self.agent.ok(10, "cat /proc/mounts").await;
        assert!(
            !mounts.contains(&a.staging) && !mounts.contains(&a.target),
            "still mounted:\n{mounts}"
        );
        within(
            CALL_SECS,
            "ControllerUnpublishVolume",
            self.ctl
                .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                    volume_id: a.volume_id.clone(),
                    node_id: self.node_id.clone(),
                    ..Default::default()
                }),
        )
        .await
        .expect("ControllerUnpublishVolume");
        within(
            CALL_SECS,
            "DeleteVolume",
            self.ctl.delete_volume(DeleteVolumeRequest {
                volume_id: a.volume_id.clone(),
                ..Default::default()
            }),
        )
        .await
        .expect("DeleteVolume");
    }

    async fn snapshot(&mut self, volume_id: &str, name: &str) -> Snapshot {
        within(
            CALL_SECS,
            "CreateSnapshot",
            self.ctl.create_snapshot(CreateSnapshotRequest {
                source_volume_id: volume_id.into(),
                name: name.into(),
                ..Default::default()
            }),
        )
        .await
        .expect("CreateSnapshot")
        .into_inner()
        .snapshot
        .expect("a snapshot")
    }

    async fn delete_snapshot(&mut self, snapshot_id: &str) {
        within(
            CALL_SECS,
            "DeleteSnapshot",
            self.ctl.delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: snapshot_id.into(),
                ..Default::default()
            }),
        )
        .await
        .expect("DeleteSnapshot");
    }

    /// ControllerExpandVolume then NodeExpandVolume; returns what the node reports.
    async fn expand(&mut self, a: &Attached, bytes: i64) -> i64 {
        let r = within(
            CALL_SECS,
            "ControllerExpandVolume",
            self.ctl
                .controller_expand_volume(ControllerExpandVolumeRequest {
                    volume_id: a.volume_id.clone(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: bytes,
                        limit_bytes: 0,
                    }),
                    volume_capability: Some(capability(a.block)),
                    ..Default::default()
                }),
        )
        .await
        .expect("ControllerExpandVolume")
        .into_inner();
        assert_eq!(r.capacity_bytes, bytes);
        assert_eq!(r.node_expansion_required, !a.block);
        within(
            CALL_SECS,
            "NodeExpandVolume",
            self.node.node_expand_volume(NodeExpandVolumeRequest {
                volume_id: a.volume_id.clone(),
                volume_path: a.target.clone(),
                staging_target_path: a.staging.clone(),
                capacity_range: Some(CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                volume_capability: Some(capability(a.block)),
                ..Default::default()
            }),
        )
        .await
        .expect("NodeExpandVolume")
        .into_inner()
        .capacity_bytes
    }

    /// Asserts the node has no NVMe controller left and the appliance no volume or snapshot.
    async fn assert_nothing_left(&mut self) {
        let ctrls = self
            .agent
            .ok(
                10,
                "ls /sys/class/nvme-fabrics/ctl 2>/dev/null; ls /sys/class/nvme",
            )
            .await;
        assert!(
            !ctrls.split_whitespace().any(|n| n.starts_with("nvme")),
            "NVMe controllers still connected on the node: {ctrls}"
        );
        let vols = within(
            CALL_SECS,
            "ListVolumes",
            self.ctl.list_volumes(ListVolumesRequest::default()),
        )
        .await
        .expect("ListVolumes")
        .into_inner()
        .entries;
        assert!(vols.is_empty(), "volumes left behind: {vols:?}");
        let snaps = within(
            CALL_SECS,
            "ListSnapshots",
            self.ctl.list_snapshots(ListSnapshotsRequest::default()),
        )
        .await
        .expect("ListSnapshots")
        .into_inner()
        .entries;
        assert!(snaps.is_empty(), "snapshots left behind: {snaps:?}");
    }
}

fn df_kib(df: &str) -> u64 {
    // busybox `df -k PATH`: header, then "dev 1K-blocks used available use% mount".
    let line = df
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("df said {df:?}"));
    line.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("df line {line:?}"))
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh"]
async fn mount_volume_life_cycle() {
    let mut rig = Rig::new().await;
    let vol = rig.create("e2e-fs", 64 * MIB, false, None).await;
    assert_eq!(vol.capacity_bytes, 64 * MIB);
    let a = rig.attach(&vol, false, "fs").await;
    let t = a.target.clone();
    let mounts = rig.agent.ok(10, "cat /proc/mounts").await;
    assert!(
        mounts
            .lines()
            .any(|l| l.contains(&t) && l.contains(" ext4 ")),
        "{t} is not an ext4 mount:\n{mounts}"
    );

    // A host NQN the volume is not published to is refused by the target.
    let subsys = rig
        .agent
        .ok(10, "cat /sys/class/nvme/nvme*/subsysnqn | head -1")
        .await;
    let (code, out) = rig
        .agent
        .sh(
            60,
            &format!(
                "echo 'nqn={},transport=tcp,traddr=192.168.77.1,trsvcid=4420,hostnqn=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000e2' > /dev/nvme-fabrics",
                subsys.trim()
            ),
        )
        .await;
    assert_ne!(code, 0, "an unpublished host NQN connected: {out}");

    // Data, then a snapshot, then more data that the clone must not see.
    rig.agent
        .ok(
            90,
            &format!(
                "cd {t} && dd if=/dev/urandom of=data.bin bs=1M count=8 2>/dev/null && \
                 echo before > note && mkdir -p dir && echo nested > dir/f && sync && \
                 sha256sum data.bin note dir/f > /tmp/fs.sums && cat /tmp/fs.sums"
            ),
        )
        .await;
    let snap = rig.snapshot(&vol.volume_id, "e2e-fs-snap").await;
    assert_eq!(snap.source_volume_id, vol.volume_id);
    rig.agent
        .ok(
            60,
            &format!("cd {t} && echo after > note && echo new > later && sync"),
        )
        .await;

    let clone = rig
        .create("e2e-fs-clone", 64 * MIB, false, Some(&snap.snapshot_id))
        .await;
    let c = rig.attach(&clone, false, "fs-clone").await;
    let out = rig
        .agent
        .ok(
            90,
            &format!(
                "cd {} && sha256sum -c /tmp/fs.sums && test ! -e later && cat note",
                c.target
            ),
        )
        .await;
    assert!(
        out.trim_end().ends_with("before"),
        "clone is not the snapshot point:\n{out}"
    );
    let out = rig.agent.ok(10, &format!("cat {t}/note")).await;
    assert_eq!(out.trim(), "after", "the source kept its own writes");

    // Grow the source: controller then node; df must show it.
    let before = df_kib(&rig.agent.ok(10, &format!("df -k {t}")).await);
    let node_bytes = rig.expand(&a, 160 * MIB).await;
    assert!(
        node_bytes == 0 || node_bytes >= 160 * MIB,
        "NodeExpandVolume said {node_bytes}"
    );
    let after = df_kib(&rig.agent.ok(10, &format!("df -k {t}")).await);
    assert!(
        after > before * 2 && after * 1024 > 140 * MIB as u64,
        "df: {before} KiB before, {after} KiB after growing to 160 MiB"
    );
    let stats = within(
        CALL_SECS,
        "NodeGetVolumeStats",
        rig.node.node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: a.volume_id.clone(),
            volume_path: t.clone(),
            staging_target_path: a.staging.clone(),
        }),
    )
    .await
    .expect("NodeGetVolumeStats")
    .into_inner();
    let total: i64 = stats
        .usage
        .iter()
        .filter(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .map(|u| u.total)
        .sum();
    assert_eq!(total as u64 / 1024, after, "stats agree with df");
    rig.agent
        .ok(
            60,
            &format!("cd {t} && sha256sum -c /tmp/fs.sums 2>&1 | grep -q 'data.bin: OK'"),
        )
        .await;

    rig.detach_and_delete(&c).await;
    rig.detach_and_delete(&a).await;
    rig.delete_snapshot(&snap.snapshot_id).await;
    rig.assert_nothing_left().await;
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh"]
async fn block_volume_life_cycle() {
    let mut rig = Rig::new().await;
    let vol = rig.create("e2e-blk", 32 * MIB, true, None).await;
    let a = rig.attach(&vol, true, "blk").await;
    let t = a.target.clone();
    let size = rig.agent.ok(10, &format!("blockdev --getsize64 {t}")).await;
    assert_eq!(size.trim(), (32 * MIB).to_string(), "block target size");
    let sum = |path: &str| {
        format!(
            "echo 3 > /proc/sys/vm/drop_caches; dd if={path} bs=1M count=16 2>/dev/null | sha256sum | cut -d' ' -f1"
        )
    };
    rig.agent
        .ok(
            90,
            &format!(
                "dd if=/dev/urandom of=/tmp/blk.bin bs=1M count=16 2>/dev/null && \
                 dd if=/tmp/blk.bin of={t} bs=1M conv=fsync 2>/dev/null && sync"
            ),
        )
        .await;
    let want = rig
        .agent
        .ok(10, "sha256sum /tmp/blk.bin | cut -d' ' -f1")
        .await;
    let got = rig.agent.ok(60, &sum(&t)).await;
    assert_eq!(got, want, "read back through the initiator");

    let snap = rig.snapshot(&vol.volume_id, "e2e-blk-snap").await;
    rig.agent
        .ok(
            60,
            &format!("dd if=/dev/zero of={t} bs=1M count=1 conv=fsync 2>/dev/null"),
        )
        .await;
    let clone = rig
        .create("e2e-blk-clone", 32 * MIB, true, Some(&snap.snapshot_id))
        .await;
    let c = rig.attach(&clone, true, "blk-clone").await;
    let got = rig.agent.ok(60, &sum(&c.target)).await;
    assert_eq!(got, want, "the clone holds the snapshot point");
    let changed = rig.agent.ok(60, &sum(&t)).await;
    assert_ne!(changed, want, "the source kept its own write");

    let node_bytes = rig.expand(&a, 48 * MIB).await;
    assert!(
        node_bytes == 0 || node_bytes >= 48 * MIB,
        "NodeExpandVolume said {node_bytes}"
    );
    let size = rig.agent.ok(10, &format!("blockdev --getsize64 {t}")).await;
    assert_eq!(size.trim(), (48 * MIB).to_string(), "grown block device");

    rig.detach_and_delete(&c).await;
    rig.detach_and_delete(&a).await;
    rig.delete_snapshot(&snap.snapshot_id).await;
    rig.assert_nothing_left().await;
}
