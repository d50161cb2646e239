//! The CSI side of the QEMU end-to-end tests: the appliance's Controller over mTLS and the node
//! VM's real `edgevol-node` through the agent, with the steps a CO takes (create, controller
//! publish, stage, publish and back) and the checks that nothing is left. Every call has a
//! budget ([`CALL_SECS`]).

use std::collections::HashMap;
use std::path::PathBuf;

use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::node_client::NodeClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use edgevol_proto::csi::v1::volume_content_source::{SnapshotSource, Type as SourceType};
use edgevol_proto::csi::v1::*;
use tonic::transport::Channel;

use crate::{appliance_channel, env_addr, node_channel, within, Agent};

/// One MiB.
pub const MIB: i64 = 1 << 20;
/// Budget of one CSI call (TCG guests on a shared 2-core machine are slow).
pub const CALL_SECS: u64 = 120;

/// A mount capability of `fs_type` in `mode`.
pub fn mount_cap(fs_type: &str, mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            ..Default::default()
        })),
    }
}

/// A block capability in `mode`.
pub fn block_cap(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

/// SINGLE_NODE_WRITER, block or ext4.
pub fn capability(block: bool) -> VolumeCapability {
    if block {
        block_cap(Mode::SingleNodeWriter)
    } else {
        mount_cap("ext4", Mode::SingleNodeWriter)
    }
}

/// True for a block capability.
pub fn is_block(cap: &VolumeCapability) -> bool {
    matches!(cap.access_type, Some(AccessType::Block(_)))
}

/// The host, the appliance VM and the node VM, as scripts/test-e2e-qemu.sh set them up.
#[derive(Debug)]
pub struct Rig {
    /// CSI Controller of the appliance (mTLS, role controller).
    pub ctl: ControllerClient<Channel>,
    /// CSI Node of the node VM's edgevol-node.
    pub node: NodeClient<Channel>,
    /// The node VM's shell.
    pub agent: Agent,
    /// NodeGetInfo's node id (the host NQN).
    pub node_id: String,
}

/// A volume as the node sees it once staged and published.
#[derive(Debug, Clone)]
pub struct Attached {
    /// Volume id.
    pub volume_id: String,
    /// Staging path.
    pub staging: String,
    /// Target path of the one publication.
    pub target: String,
    /// The capability it was staged and published with.
    pub cap: VolumeCapability,
    /// ControllerPublishVolume's publish_context.
    pub context: HashMap<String, String>,
    /// CreateVolume's volume_context.
    pub volume_context: HashMap<String, String>,
}

impl Attached {
    /// True for block access.
    pub fn block(&self) -> bool {
        is_block(&self.cap)
    }
}

/// Staging and target paths for `tag`, as kubelet lays them out.
pub fn paths(tag: &str, block: bool) -> (String, String) {
    let staging = format!("/var/lib/kubelet/plugins/edgevol/staging/{tag}");
    let pod = format!("/var/lib/kubelet/pods/{tag}");
    let target = if block {
        format!("{pod}/volumeDevices/dev")
    } else {
        format!("{pod}/volumes/mnt")
    };
    (staging, target)
}

impl Rig {
    /// Connects both sides from the EDGEVOL_E2E_* variables and checks the node id.
    pub async fn new() -> Rig {
        let pki = PathBuf::from(std::env::var("EDGEVOL_E2E_PKI").expect("EDGEVOL_E2E_PKI"));
        let ctl = ControllerClient::new(
            appliance_channel(env_addr("EDGEVOL_E2E_CSI"), &pki, "controller").await,
        );
        Rig::with_controller(ctl).await
    }

    /// Connects the node side from the EDGEVOL_E2E_NODE_* variables, with `ctl` as the CSI
    /// Controller (e.g. `edgevol proxy` in front of several appliances).
    pub async fn with_controller(ctl: ControllerClient<Channel>) -> Rig {
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

    /// SIGKILLs the node VM's edgevol-node and starts it again with its boot flags plus
    /// `flags` (qemu/node-guest.sh's restart mode), then reconnects the CSI Node client.
    /// Returns the guest's "restarted OLD -> NEW".
    pub async fn restart_node(&mut self, flags: &str) -> String {
        let out = self
            .agent
            .ok(
                60,
                &format!("sh /etc/edgevol-node-guest.sh restart {flags}"),
            )
            .await;
        assert!(out.contains("restarted "), "restart said {out:?}");
        self.node = NodeClient::new(node_channel(env_addr("EDGEVOL_E2E_NODE_CSI")).await);
        out.trim().to_owned()
    }

    /// CreateVolume of `bytes` with `cap`, optionally from a snapshot.
    pub async fn create_as(
        &mut self,
        name: &str,
        bytes: i64,
        cap: VolumeCapability,
        from: Option<&str>,
    ) -> Volume {
        self.create_with(name, bytes, cap, from, HashMap::new())
            .await
    }

    /// CreateVolume of `bytes` with `cap` and `parameters`, optionally from a snapshot.
    pub async fn create_with(
        &mut self,
        name: &str,
        bytes: i64,
        cap: VolumeCapability,
        from: Option<&str>,
        parameters: HashMap<String, String>,
    ) -> Volume {
        let req = CreateVolumeRequest {
            parameters,
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap],
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

    /// CreateVolume, SINGLE_NODE_WRITER block or ext4.
    pub async fn create(
        &mut self,
        name: &str,
        bytes: i64,
        block: bool,
        from: Option<&str>,
    ) -> Volume {
        self.create_as(name, bytes, capability(block), from).await
    }

    /// ControllerPublishVolume to this node; returns the publish_context.
    pub async fn controller_publish(
        &mut self,
        volume_id: &str,
        cap: &VolumeCapability,
    ) -> HashMap<String, String> {
        let context = within(
            CALL_SECS,
            "ControllerPublishVolume",
            self.ctl
                .controller_publish_volume(ControllerPublishVolumeRequest {
                    volume_id: volume_id.into(),
                    node_id: self.node_id.clone(),
                    volume_capability: Some(cap.clone()),
                    readonly: false,
                    ..Default::default()
                }),
        )
        .await
        .expect("ControllerPublishVolume")
        .into_inner()
        .publish_context;
        // A replicated volume's context holds each leg's keys, prefixed `leg<i>.`.
        let prefix = if context.contains_key("replicas") {
            "leg0."
        } else {
            ""
        };
        for key in ["targetAddress", "targetPort", "subsystemNqn"] {
            assert!(
                context.contains_key(&format!("{prefix}{key}")),
                "publish_context lacks {prefix}{key}: {context:?}"
            );
        }
        context
    }

    /// ControllerUnpublishVolume from this node.
    pub async fn controller_unpublish(&mut self, volume_id: &str) {
        within(
            CALL_SECS,
            "ControllerUnpublishVolume",
            self.ctl
                .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                    volume_id: volume_id.into(),
                    node_id: self.node_id.clone(),
                    ..Default::default()
                }),
        )
        .await
        .expect("ControllerUnpublishVolume");
    }

    /// DeleteVolume.
    pub async fn delete(&mut self, volume_id: &str) {
        within(
            CALL_SECS,
            "DeleteVolume",
            self.ctl.delete_volume(DeleteVolumeRequest {
                volume_id: volume_id.into(),
                ..Default::default()
            }),
        )
        .await
        .expect("DeleteVolume");
    }

    /// ControllerPublish to this node, NodeStage, NodePublish (SINGLE_NODE_WRITER).
    pub async fn attach(&mut self, volume: &Volume, block: bool, tag: &str) -> Attached {
        self.attach_as(volume, capability(block), tag).await
    }

    /// ControllerPublish to this node, NodeStage and NodePublish with `cap`.
    pub async fn attach_as(
        &mut self,
        volume: &Volume,
        cap: VolumeCapability,
        tag: &str,
    ) -> Attached {
        let context = self.controller_publish(&volume.volume_id, &cap).await;
        let (staging, target) = paths(tag, is_block(&cap));
        let a = Attached {
            volume_id: volume.volume_id.clone(),
            staging,
            target,
            cap,
            context,
            volume_context: volume.volume_context.clone(),
        };
        self.agent
            .ok(
                10,
                &format!("mkdir -p {} /var/lib/kubelet/pods/{tag}", a.staging),
            )
            .await;
        within(
            CALL_SECS,
            "NodeStageVolume",
            self.node.node_stage_volume(self.stage_req(&a)),
        )
        .await
        .expect("NodeStageVolume");
        within(
            CALL_SECS,
            "NodePublishVolume",
            self.node
                .node_publish_volume(self.publish_req(&a, &a.target, false)),
        )
        .await
        .expect("NodePublishVolume");
        a
    }

    /// The NodeStageVolume request that stages `a`.
    pub fn stage_req(&self, a: &Attached) -> NodeStageVolumeRequest {
        NodeStageVolumeRequest {
            volume_id: a.volume_id.clone(),
            publish_context: a.context.clone(),
            staging_target_path: a.staging.clone(),
            volume_capability: Some(a.cap.clone()),
            volume_context: a.volume_context.clone(),
            ..Default::default()
        }
    }

    /// A NodePublishVolume request of `a` at `target`.
    pub fn publish_req(
        &self,
        a: &Attached,
        target: &str,
        readonly: bool,
    ) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: a.volume_id.clone(),
            publish_context: a.context.clone(),
            staging_target_path: a.staging.clone(),
            target_path: target.into(),
            volume_capability: Some(a.cap.clone()),
            readonly,
            volume_context: a.volume_context.clone(),
            ..Default::default()
        }
    }

    /// NodeUnpublishVolume of `volume_id` at `target` (must succeed).
    pub async fn node_unpublish(&mut self, volume_id: &str, target: &str) {
        within(
            CALL_SECS,
            "NodeUnpublishVolume",
            self.node.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: volume_id.into(),
                target_path: target.into(),
            }),
        )
        .await
        .expect("NodeUnpublishVolume");
    }

    /// NodeUnstageVolume of `volume_id` at `staging` (must succeed).
    pub async fn node_unstage(&mut self, volume_id: &str, staging: &str) {
        within(
            CALL_SECS,
            "NodeUnstageVolume",
            self.node.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: volume_id.into(),
                staging_target_path: staging.into(),
            }),
        )
        .await
        .expect("NodeUnstageVolume");
    }

    /// The node VM's mount table.
    pub async fn mounts(&self) -> String {
        self.agent.ok(10, "cat /proc/mounts").await
    }

    /// NodeUnpublish, NodeUnstage, ControllerUnpublish, DeleteVolume; nothing stays mounted.
    pub async fn detach_and_delete(&mut self, a: &Attached) {
        self.node_unpublish(&a.volume_id, &a.target).await;
        self.node_unstage(&a.volume_id, &a.staging).await;
        let mounts = self.mounts().await;
        assert!(
            !mounts.contains(&a.staging) && !mounts.contains(&a.target),
            "still mounted:\n{mounts}"
        );
        self.controller_unpublish(&a.volume_id).await;
        self.delete(&a.volume_id).await;
    }

    /// CreateSnapshot of `volume_id`.
    pub async fn snapshot(&mut self, volume_id: &str, name: &str) -> Snapshot {
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

    /// DeleteSnapshot.
    pub async fn delete_snapshot(&mut self, snapshot_id: &str) {
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

    /// ControllerExpandVolume of `a` to `bytes`; checks the answer.
    pub async fn controller_expand(&mut self, a: &Attached, bytes: i64) {
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
                    volume_capability: Some(a.cap.clone()),
                    ..Default::default()
                }),
        )
        .await
        .expect("ControllerExpandVolume")
        .into_inner();
        assert_eq!(r.capacity_bytes, bytes);
        assert_eq!(r.node_expansion_required, !a.block());
    }

    /// The NodeExpandVolume request a CO sends for `a` at `volume_path` after growing it.
    pub fn node_expand_req(
        &self,
        a: &Attached,
        volume_path: &str,
        bytes: i64,
    ) -> NodeExpandVolumeRequest {
        NodeExpandVolumeRequest {
            volume_id: a.volume_id.clone(),
            volume_path: volume_path.into(),
            staging_target_path: a.staging.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            volume_capability: Some(a.cap.clone()),
            ..Default::default()
        }
    }

    /// ControllerExpandVolume then NodeExpandVolume at the target; returns what the node
    /// reports.
    pub async fn expand(&mut self, a: &Attached, bytes: i64) -> i64 {
        self.controller_expand(a, bytes).await;
        let req = self.node_expand_req(a, &a.target, bytes);
        within(
            CALL_SECS,
            "NodeExpandVolume",
            self.node.node_expand_volume(req),
        )
        .await
        .expect("NodeExpandVolume")
        .into_inner()
        .capacity_bytes
    }

    /// Every volume the appliance lists (the first page, all of them at these tests' sizes).
    pub async fn list_volumes(&mut self) -> Vec<list_volumes_response::Entry> {
        within(
            CALL_SECS,
            "ListVolumes",
            self.ctl.list_volumes(ListVolumesRequest::default()),
        )
        .await
        .expect("ListVolumes")
        .into_inner()
        .entries
    }

    /// The id of the one volume the appliance lists; panics, naming `whose` ("the update
    /// test"), when it lists any other number.
    pub async fn only_volume(&mut self, whose: &str) -> String {
        let vols = self.list_volumes().await;
        assert_eq!(vols.len(), 1, "{whose}'s volume, and only it: {vols:?}");
        vols[0].volume.as_ref().expect("a volume").volume_id.clone()
    }

    /// Asserts the node has no NVMe controller and no kubelet mount left, and the appliance no
    /// volume or snapshot.
    pub async fn assert_nothing_left(&mut self) {
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
        let mounts = self.mounts().await;
        assert!(
            !mounts.contains("/var/lib/kubelet/"),
            "kubelet mounts left on the node:\n{mounts}"
        );
        let vols = self.list_volumes().await;
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

/// The size column of busybox `df -k PATH` (header, then "dev 1K-blocks used available use%
/// mount").
pub fn df_kib(df: &str) -> u64 {
    let line = df
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("df said {df:?}"));
    line.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("df line {line:?}"))
}
