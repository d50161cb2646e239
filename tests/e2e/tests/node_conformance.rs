//! CSI Node conformance against the real plugin: every row of the spec's error tables for
//! NodeStageVolume, NodeUnstageVolume, NodePublishVolume, NodeUnpublishVolume,
//! NodeGetVolumeStats and NodeExpandVolume, the general INVALID_ARGUMENT rows, and the
//! idempotency of stage, publish, unpublish and unstage, checked on the node VM's kernel (NVMe/TCP
//! initiator, mounts) and not only on the answers. Volumes come from the appliance VM over mTLS
//! as a CO would get them. Also what csi-sanity does not check: NodeExpandVolume really growing
//! ext4 and xfs. Each test names the rows it checks ("Condition -> code", as in the spec).
//! Every test leaves nothing behind: no volume on the appliance, no controller or mount on the
//! node. Needs the VMs of scripts/test-e2e-qemu.sh; ignored otherwise.
//!
//! Rows that no test here can reach: "Permission denied" (7) and "Not authenticated" (16) are
//! about `secrets`, which the node plugin reads only for an encrypted volume's passphrase and
//! answers otherwise (missing or malformed: INVALID_ARGUMENT; opening no key slot:
//! FAILED_PRECONDITION, see docs/encryption.md); "Call not implemented" (12) has no subject,
//! the plugin serving every Node RPC. "Operation pending for volume" (10 ABORTED) is
//! a MAY: the plugin serializes its operations instead, and the test of concurrent identical
//! stages shows both succeed with one mount.

use std::future::Future;

use edgevol_e2e::rig::{
    block_cap, df_kib, is_block, mount_cap, paths, Attached, Rig, CALL_SECS, MIB,
};
use edgevol_e2e::within;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use edgevol_proto::csi::v1::*;
use tonic::{Code, Response, Status};

/// Awaits a call that must fail with `want`, its message naming `mention`.
async fn refused<T>(
    what: &str,
    call: impl Future<Output = Result<Response<T>, Status>>,
    want: Code,
    mention: &str,
) {
    match within(CALL_SECS, what, call).await {
        Ok(_) => panic!("{what}: succeeded; the spec row wants {want:?}"),
        Err(s) => {
            assert_eq!(s.code(), want, "{what}: {}", s.message());
            assert!(
                s.message().contains(mention),
                "{what}: {:?} should mention {mention:?}",
                s.message()
            );
        }
    }
}

/// Awaits a call that must succeed.
async fn ok<T>(what: &str, call: impl Future<Output = Result<Response<T>, Status>>) -> T {
    match within(CALL_SECS, what, call).await {
        Ok(r) => r.into_inner(),
        Err(s) => panic!("{what}: {:?}: {}", s.code(), s.message()),
    }
}

/// How many mounts sit at `path` in the node VM.
async fn mounts_at(rig: &Rig, path: &str) -> usize {
    let out = rig
        .agent
        .ok(10, &format!("awk '$2 == \"{path}\"' /proc/mounts"))
        .await;
    out.lines().count()
}

/// How many NVMe controllers the node VM has.
async fn controllers(rig: &Rig) -> usize {
    let out = rig.agent.ok(10, "ls /sys/class/nvme").await;
    out.split_whitespace()
        .filter(|n| n.starts_with("nvme"))
        .count()
}

fn stats(volume_id: &str, path: &str) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: path.into(),
        staging_target_path: String::new(),
    }
}

fn unpublish(volume_id: &str, target: &str) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.into(),
    }
}

fn unstage(volume_id: &str, staging: &str) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.into(),
    }
}

/// An Attached for `volume` with `cap`, controller-published to this node, not yet staged.
async fn prepared(rig: &mut Rig, volume: &Volume, cap: VolumeCapability, tag: &str) -> Attached {
    let context = rig.controller_publish(&volume.volume_id, &cap).await;
    let (staging, target) = paths(tag, is_block(&cap));
    rig.agent
        .ok(
            10,
            &format!("mkdir -p {staging} /var/lib/kubelet/pods/{tag}"),
        )
        .await;
    Attached {
        volume_id: volume.volume_id.clone(),
        staging,
        target,
        cap,
        context,
        volume_context: volume.volume_context.clone(),
    }
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh"]
async fn general_rows_missing_and_invalid_fields_are_invalid_argument() {
    // "Missing required field -> 3 INVALID_ARGUMENT" for every REQUIRED field of the six RPCs,
    // and "Invalid or unsupported field in the request -> 3 INVALID_ARGUMENT". Nothing may reach
    // the kernel: the node has no controller and no mount afterwards.
    let mut rig = Rig::new().await;
    let n = &mut rig.node;
    let a = Attached {
        volume_id: "e2e-conf-none".into(),
        staging: "/var/lib/kubelet/plugins/edgevol/staging/invalid".into(),
        target: "/var/lib/kubelet/pods/invalid/volumes/mnt".into(),
        cap: mount_cap("ext4", Mode::SingleNodeWriter),
        context: [
            ("transport", "tcp"),
            ("targetAddress", "192.168.77.1"),
            ("targetPort", "4420"),
            ("subsystemNqn", "nqn.2024-11.io.edgevol:nobox:v999"),
            ("nguid", "000102030405060708090a0b0c0d0e0f"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
        volume_context: Default::default(),
    };
    let stage = NodeStageVolumeRequest {
        volume_id: a.volume_id.clone(),
        publish_context: a.context.clone(),
        staging_target_path: a.staging.clone(),
        volume_capability: Some(a.cap.clone()),
        ..Default::default()
    };
    let with = |f: &dyn Fn(&mut NodeStageVolumeRequest)| {
        let mut r = stage.clone();
        f(&mut r);
        r
    };
    let stage_rows: Vec<(NodeStageVolumeRequest, &str)> = vec![
        // Missing required fields.
        (with(&|r| r.volume_id.clear()), "volume_id"),
        (
            with(&|r| r.staging_target_path.clear()),
            "staging_target_path",
        ),
        (with(&|r| r.volume_capability = None), "volume_capability"),
        (
            with(&|r| r.volume_capability.as_mut().unwrap().access_mode = None),
            "access_mode",
        ),
        (
            with(&|r| r.volume_capability.as_mut().unwrap().access_type = None),
            "access_type",
        ),
        // Invalid or unsupported fields.
        (with(&|r| r.volume_id = "v".repeat(129)), "volume_id"),
        (
            with(&|r| r.staging_target_path = "relative/staging".into()),
            "absolute",
        ),
        (
            with(&|r| {
                r.volume_capability.as_mut().unwrap().access_mode = Some(AccessMode { mode: 42 });
            }),
            "access_mode",
        ),
        (
            with(&|r| {
                r.volume_capability.as_mut().unwrap().access_type =
                    Some(AccessType::Mount(MountVolume {
                        fs_type: "btrfs".into(),
                        ..Default::default()
                    }));
            }),
            "btrfs",
        ),
        (
            with(&|r| {
                r.publish_context.insert("transport".into(), "rdma".into());
            }),
            "transport",
        ),
        (
            with(&|r| {
                r.publish_context
                    .insert("targetAddress".into(), "appliance.local".into());
            }),
            "targetAddress",
        ),
        (
            with(&|r| {
                r.publish_context.remove("subsystemNqn");
            }),
            "subsystemNqn",
        ),
        (
            with(&|r| {
                r.publish_context.insert("nguid".into(), "not-hex".into());
            }),
            "nguid",
        ),
    ];
    for (req, field) in stage_rows {
        refused(
            &format!("NodeStageVolume without/with bad {field}"),
            n.node_stage_volume(req),
            Code::InvalidArgument,
            field,
        )
        .await;
    }

    for (req, field) in [
        (unstage("", &a.staging), "volume_id"),
        (unstage(&a.volume_id, ""), "staging_target_path"),
        (unstage(&a.volume_id, "relative/staging"), "absolute"),
    ] {
        refused(
            &format!("NodeUnstageVolume without/with bad {field}"),
            n.node_unstage_volume(req),
            Code::InvalidArgument,
            field,
        )
        .await;
    }

    let publish = NodePublishVolumeRequest {
        volume_id: a.volume_id.clone(),
        publish_context: a.context.clone(),
        staging_target_path: a.staging.clone(),
        target_path: a.target.clone(),
        volume_capability: Some(a.cap.clone()),
        ..Default::default()
    };
    for (req, field) in [
        (
            NodePublishVolumeRequest {
                volume_id: String::new(),
                ..publish.clone()
            },
            "volume_id",
        ),
        (
            NodePublishVolumeRequest {
                target_path: String::new(),
                ..publish.clone()
            },
            "target_path",
        ),
        (
            NodePublishVolumeRequest {
                volume_capability: None,
                ..publish.clone()
            },
            "volume_capability",
        ),
        // A missing REQUIRED field comes before the staging path, whose own row is
        // FAILED_PRECONDITION: csi-sanity's publish with neither of them.
        (
            NodePublishVolumeRequest {
                volume_capability: None,
                staging_target_path: String::new(),
                ..publish.clone()
            },
            "volume_capability",
        ),
        (
            NodePublishVolumeRequest {
                target_path: "pods/relative".into(),
                ..publish.clone()
            },
            "absolute",
        ),
        (
            NodePublishVolumeRequest {
                target_path: a.staging.clone(),
                ..publish.clone()
            },
            "differ",
        ),
    ] {
        refused(
            &format!("NodePublishVolume without/with bad {field}"),
            n.node_publish_volume(req),
            Code::InvalidArgument,
            field,
        )
        .await;
    }

    for (req, field) in [
        (unpublish("", &a.target), "volume_id"),
        (unpublish(&a.volume_id, ""), "target_path"),
        (unpublish(&a.volume_id, "pods/relative"), "absolute"),
    ] {
        refused(
            &format!("NodeUnpublishVolume without/with bad {field}"),
            n.node_unpublish_volume(req),
            Code::InvalidArgument,
            field,
        )
        .await;
    }

    for (req, field) in [
        (stats("", &a.target), "volume_id"),
        (stats(&a.volume_id, ""), "volume_path"),
    ] {
        refused(
            &format!("NodeGetVolumeStats without {field}"),
            n.node_get_volume_stats(req),
            Code::InvalidArgument,
            field,
        )
        .await;
    }

    let expand = NodeExpandVolumeRequest {
        volume_id: a.volume_id.clone(),
        volume_path: a.target.clone(),
        ..Default::default()
    };
    for (req, field) in [
        (
            NodeExpandVolumeRequest {
                volume_id: String::new(),
                ..expand.clone()
            },
            "volume_id",
        ),
        (
            NodeExpandVolumeRequest {
                volume_path: String::new(),
                ..expand.clone()
            },
            "volume_path",
        ),
        (
            NodeExpandVolumeRequest {
                capacity_range: Some(CapacityRange {
                    required_bytes: 2 * MIB,
                    limit_bytes: MIB,
                }),
                ..expand.clone()
            },
            "limit_bytes",
        ),
        (
            NodeExpandVolumeRequest {
                capacity_range: Some(CapacityRange {
                    required_bytes: -1,
                    limit_bytes: 0,
                }),
                ..expand.clone()
            },
            "negative",
        ),
        (
            NodeExpandVolumeRequest {
                volume_capability: Some(VolumeCapability {
                    access_mode: Some(AccessMode {
                        mode: Mode::SingleNodeWriter as i32,
                    }),
                    access_type: None,
                }),
                ..expand.clone()
            },
            "access_type",
        ),
    ] {
        refused(
            &format!("NodeExpandVolume without/with bad {field}"),
            n.node_expand_volume(req),
            Code::InvalidArgument,
            field,
        )
        .await;
    }
    assert_eq!(controllers(&rig).await, 0, "a refused request connected");
    rig.assert_nothing_left().await;
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh"]
async fn rows_of_a_volume_that_does_not_exist() {
    // NodeUnstageVolume, NodeUnpublishVolume, NodePublishVolume, NodeGetVolumeStats,
    // NodeExpandVolume: "Volume does not exist -> 5 NOT_FOUND". Another mount at the path is
    // left alone. And "not staged/published there -> 0 OK" (idempotent unstage and unpublish).
    let mut rig = Rig::new().await;
    let id = "e2e-conf-missing";
    let (staging, _) = paths("foreign", false);
    let (_, target) = paths("foreign", false);
    rig.agent
        .ok(
            10,
            &format!(
                "mkdir -p {staging} {target} && mount -t tmpfs e2e-foreign {staging} && \
                 mount -t tmpfs e2e-foreign {target} && echo keep > {staging}/f && \
                 echo keep > {target}/f"
            ),
        )
        .await;
    let n = &mut rig.node;
    refused(
        "NodeUnstageVolume at another mount",
        n.node_unstage_volume(unstage(id, &staging)),
        Code::NotFound,
        id,
    )
    .await;
    refused(
        "NodeUnpublishVolume at another mount",
        n.node_unpublish_volume(unpublish(id, &target)),
        Code::NotFound,
        id,
    )
    .await;
    refused(
        "NodeGetVolumeStats at another mount",
        n.node_get_volume_stats(stats(id, &target)),
        Code::NotFound,
        id,
    )
    .await;
    // csi-sanity's "should fail when volume is not found" (volume_path "some/path").
    refused(
        "NodeGetVolumeStats of some/path",
        n.node_get_volume_stats(stats(id, "some/path")),
        Code::NotFound,
        "some/path",
    )
    .await;
    let expand = NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: "some/path".into(),
        ..Default::default()
    };
    refused(
        "NodeExpandVolume of some/path",
        n.node_expand_volume(expand.clone()),
        Code::NotFound,
        "some/path",
    )
    .await;
    refused(
        "NodeExpandVolume at another mount",
        n.node_expand_volume(NodeExpandVolumeRequest {
            volume_path: target.clone(),
            ..expand
        }),
        Code::NotFound,
        id,
    )
    .await;
    let (other_staging, other_target) = paths("never-staged", false);
    refused(
        "NodePublishVolume of a volume never staged",
        n.node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: other_staging.clone(),
            target_path: other_target.clone(),
            volume_capability: Some(mount_cap("ext4", Mode::SingleNodeWriter)),
            ..Default::default()
        }),
        Code::NotFound,
        id,
    )
    .await;
    for path in [&staging, &target] {
        assert_eq!(mounts_at(&rig, path).await, 1, "{path} was touched");
        assert_eq!(
            rig.agent.ok(10, &format!("cat {path}/f")).await.trim(),
            "keep"
        );
    }
    // Not staged or published there: OK, twice.
    for _ in 0..2 {
        ok(
            "NodeUnstageVolume where nothing is staged",
            rig.node.node_unstage_volume(unstage(id, &other_staging)),
        )
        .await;
        ok(
            "NodeUnpublishVolume where nothing is published",
            rig.node.node_unpublish_volume(unpublish(id, &other_target)),
        )
        .await;
    }
    rig.agent
        .ok(
            10,
            &format!("umount {target} && umount {staging} && rm -rf /var/lib/kubelet/pods/foreign {staging}"),
        )
        .await;
    rig.assert_nothing_left().await;
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh"]
async fn stage_and_publish_rows_of_a_mount_volume() {
    let mut rig = Rig::new().await;
    let vol = rig
        .create_as(
            "e2e-conf-fs",
            64 * MIB,
            mount_cap("ext4", Mode::SingleNodeWriter),
            None,
        )
        .await;
    let a = prepared(
        &mut rig,
        &vol,
        mount_cap("ext4", Mode::SingleNodeWriter),
        "conf-fs",
    )
    .await;
    let id = a.volume_id.clone();

    // NodeStageVolume idempotency, and "Operation pending for volume" (10 ABORTED is a MAY):
    // two identical stages at once both succeed, with one controller and one mount.
    let mut second = rig.node.clone();
    let req = rig.stage_req(&a);
    let (r1, r2) = within(2 * CALL_SECS, "two concurrent NodeStageVolume", async {
        tokio::join!(
            rig.node.node_stage_volume(req.clone()),
            second.node_stage_volume(req.clone())
        )
    })
    .await;
    r1.expect("first of two concurrent NodeStageVolume");
    r2.expect("second of two concurrent NodeStageVolume");
    ok(
        "NodeStageVolume again",
        rig.node.node_stage_volume(req.clone()),
    )
    .await;
    assert_eq!(mounts_at(&rig, &a.staging).await, 1, "one staging mount");
    assert_eq!(controllers(&rig).await, 1, "one controller");

    // NodeStageVolume "Volume published but is incompatible -> 6 ALREADY_EXISTS".
    let mut as_block = req.clone();
    as_block.volume_capability = Some(block_cap(Mode::SingleNodeWriter));
    refused(
        "NodeStageVolume again as block",
        rig.node.node_stage_volume(as_block),
        Code::AlreadyExists,
        &id,
    )
    .await;
    let mut other_flags = req.clone();
    if let Some(AccessType::Mount(m)) = other_flags
        .volume_capability
        .as_mut()
        .and_then(|c| c.access_type.as_mut())
    {
        m.mount_flags = vec!["noatime".into()];
    }
    refused(
        "NodeStageVolume again with other mount flags",
        rig.node.node_stage_volume(other_flags),
        Code::AlreadyExists,
        &id,
    )
    .await;
    // NodeStageVolume "Exceeds capabilities -> 9 FAILED_PRECONDITION": a filesystem written
    // from several nodes.
    let mut multi = req.clone();
    multi.volume_capability = Some(mount_cap("ext4", Mode::MultiNodeMultiWriter));
    refused(
        "NodeStageVolume ext4 MULTI_NODE_MULTI_WRITER",
        rig.node.node_stage_volume(multi),
        Code::FailedPrecondition,
        "multi-node",
    )
    .await;
    // One staging path per volume (the CO's duty): another one is FAILED_PRECONDITION.
    let mut elsewhere = req.clone();
    elsewhere.staging_target_path = paths("conf-fs-elsewhere", false).0;
    refused(
        "NodeStageVolume at a second staging path",
        rig.node.node_stage_volume(elsewhere),
        Code::FailedPrecondition,
        "already staged",
    )
    .await;

    // NodePublishVolume idempotency (T1=T2, P1=P2 -> OK).
    let t1 = a.target.clone();
    for _ in 0..2 {
        ok(
            "NodePublishVolume T1",
            rig.node
                .node_publish_volume(rig.publish_req(&a, &t1, false)),
        )
        .await;
    }
    assert_eq!(mounts_at(&rig, &t1).await, 1, "one publication at T1");
    rig.agent
        .ok(30, &format!("echo conformance > {t1}/file && sync"))
        .await;
    // T1=T2, P1!=P2 -> 6 ALREADY_EXISTS ("Volume published but is incompatible").
    let mut t1_block = rig.publish_req(&a, &t1, false);
    t1_block.volume_capability = Some(block_cap(Mode::SingleNodeWriter));
    refused(
        "NodePublishVolume T1 again as block",
        rig.node.node_publish_volume(t1_block),
        Code::AlreadyExists,
        &id,
    )
    .await;
    refused(
        "NodePublishVolume T1 again read-only",
        rig.node.node_publish_volume(rig.publish_req(&a, &t1, true)),
        Code::AlreadyExists,
        "read-write",
    )
    .await;
    let mut t1_snsw = rig.publish_req(&a, &t1, false);
    t1_snsw.volume_capability = Some(mount_cap("ext4", Mode::SingleNodeSingleWriter));
    refused(
        "NodePublishVolume T1 again SINGLE_NODE_SINGLE_WRITER",
        rig.node.node_publish_volume(t1_snsw),
        Code::AlreadyExists,
        "SingleNodeSingleWriter",
    )
    .await;
    rig.agent
        .ok(
            10,
            &format!("touch {t1}/still-writable && rm {t1}/still-writable"),
        )
        .await;
    let t2 = paths("conf-fs-t2", false).1;
    ok(
        "NodePublishVolume T2 read-only",
        rig.node.node_publish_volume(rig.publish_req(&a, &t2, true)),
    )
    .await;
    let (code, _) = rig.agent.sh(10, &format!("touch {t2}/denied")).await;
    assert_ne!(code, 0, "a read-only publication is writable");
    assert_eq!(
        rig.agent.ok(10, &format!("cat {t2}/file")).await.trim(),
        "conformance"
    );
    refused(
        "NodePublishVolume T2 again read-write",
        rig.node
            .node_publish_volume(rig.publish_req(&a, &t2, false)),
        Code::AlreadyExists,
        "read-only",
    )
    .await;
    // "Exceeds capabilities -> 9 FAILED_PRECONDITION": block access to a volume staged with a
    // filesystem.
    let t3 = paths("conf-fs-t3", true).1;
    let mut t3_block = rig.publish_req(&a, &t3, false);
    t3_block.volume_capability = Some(block_cap(Mode::SingleNodeWriter));
    refused(
        "NodePublishVolume T3 as block",
        rig.node.node_publish_volume(t3_block),
        Code::FailedPrecondition,
        "block",
    )
    .await;
    // "Staging target path not set -> 9 FAILED_PRECONDITION".
    let mut unstaged = rig.publish_req(&a, &paths("conf-fs-t4", false).1, false);
    unstaged.staging_target_path.clear();
    refused(
        "NodePublishVolume without staging_target_path",
        rig.node.node_publish_volume(unstaged),
        Code::FailedPrecondition,
        "staging_target_path",
    )
    .await;
    // "Non MULTI_NODE_..., T1!=T2 -> FAILED_PRECONDITION" is a SHOULD the plugin departs from
    // for SINGLE_NODE_WRITER on purpose: it is what COs without SINGLE_NODE_MULTI_WRITER send for
    // a volume several pods of one node share (Kubernetes ReadWriteOnce), and the spec keeps it
    // "to permit older COs to continue working". SINGLE_NODE_SINGLE_WRITER is the mode that
    // refuses a second writer (publish_to_a_second_target_follows_the_access_mode).
    let t4 = paths("conf-fs-t4", false).1;
    ok(
        "NodePublishVolume T4 read-write (SINGLE_NODE_WRITER)",
        rig.node
            .node_publish_volume(rig.publish_req(&a, &t4, false)),
    )
    .await;

    // NodeGetVolumeStats at the staging path and a target; "Volume does not exist -> 5
    // NOT_FOUND" for another volume id, a path the volume is not at, and a relative path.
    for path in [&a.staging, &t1] {
        let s = ok(
            "NodeGetVolumeStats",
            rig.node.node_get_volume_stats(stats(&id, path)),
        )
        .await;
        let bytes = s
            .usage
            .iter()
            .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
            .expect("a bytes usage");
        assert!(bytes.total > 50 * MIB && bytes.used > 0, "{s:?}");
        let cond = s.volume_condition.expect("VOLUME_CONDITION is advertised");
        assert!(!cond.abnormal, "{cond:?}");
    }
    for (vid, path) in [
        ("e2e-conf-other", t1.as_str()),
        (id.as_str(), "/var/lib/kubelet"),
        (id.as_str(), "var/lib/kubelet/pods/conf-fs/volumes/mnt"),
    ] {
        refused(
            "NodeGetVolumeStats of a volume not there",
            rig.node.node_get_volume_stats(stats(vid, path)),
            Code::NotFound,
            vid,
        )
        .await;
    }

    // Unstage while published: the reference counting the spec makes the CO's duty is
    // enforced, nothing torn down.
    refused(
        "NodeUnstageVolume while published",
        rig.node.node_unstage_volume(unstage(&id, &a.staging)),
        Code::FailedPrecondition,
        "unpublish",
    )
    .await;
    assert_eq!(controllers(&rig).await, 1);
    // NodeUnpublishVolume "Volume does not exist -> 5 NOT_FOUND": another volume's id at T1
    // leaves T1 mounted.
    refused(
        "NodeUnpublishVolume of another volume at T1",
        rig.node
            .node_unpublish_volume(unpublish("e2e-conf-other", &t1)),
        Code::NotFound,
        "e2e-conf-other",
    )
    .await;
    assert_eq!(mounts_at(&rig, &t1).await, 1);
    // NodeUnpublishVolume idempotency: twice OK, the target is gone.
    for t in [&t1, &t1, &t2, &t4] {
        ok(
            "NodeUnpublishVolume",
            rig.node.node_unpublish_volume(unpublish(&id, t)),
        )
        .await;
        assert_eq!(mounts_at(&rig, t).await, 0);
    }
    rig.agent
        .ok(
            10,
            &format!("test ! -e {t1} && test ! -e {t2} && test ! -e {t4}"),
        )
        .await;
    refused(
        "NodeGetVolumeStats at an unpublished target",
        rig.node.node_get_volume_stats(stats(&id, &t1)),
        Code::NotFound,
        &id,
    )
    .await;
    // NodeUnstageVolume idempotency: twice OK; the controller goes with the last stage.
    for _ in 0..2 {
        rig.node_unstage(&id, &a.staging).await;
        assert_eq!(mounts_at(&rig, &a.staging).await, 0);
        assert_eq!(controllers(&rig).await, 0);
    }

    // NodeStageVolume "Exceeds capabilities -> 9 FAILED_PRECONDITION": the volume holds ext4
    // and the capability asks xfs (nothing formatted over it).
    let mut as_xfs = rig.stage_req(&a);
    as_xfs.volume_capability = Some(mount_cap("xfs", Mode::SingleNodeWriter));
    refused(
        "NodeStageVolume of an ext4 volume as xfs",
        rig.node.node_stage_volume(as_xfs),
        Code::FailedPrecondition,
        "ext4",
    )
    .await;
    rig.node_unstage(&id, &a.staging).await;
    ok(
        "NodeStageVolume ext4 again",
        rig.node.node_stage_volume(rig.stage_req(&a)),
    )
    .await;
    assert_eq!(
        rig.agent
            .ok(10, &format!("cat {}/file", a.staging))
            .await
            .trim(),
        "conformance",
        "the data survived every refusal"
    );
    rig.node_unstage(&id, &a.staging).await;

    // NodeStageVolume "Volume does not exist -> 5 NOT_FOUND": for this node once it is
    // unpublished from it (the target refuses the host), and once the appliance deleted it;
    // the node keeps nothing of either attempt.
    rig.controller_unpublish(&id).await;
    refused(
        "NodeStageVolume of a volume not published to this node",
        rig.node.node_stage_volume(rig.stage_req(&a)),
        Code::NotFound,
        &a.context["subsystemNqn"],
    )
    .await;
    assert_eq!(controllers(&rig).await, 0);
    rig.delete(&id).await;
    refused(
        "NodeStageVolume of a deleted volume",
        rig.node.node_stage_volume(rig.stage_req(&a)),
        Code::NotFound,
        &a.context["subsystemNqn"],
    )
    .await;
    assert_eq!(controllers(&rig).await, 0);
    assert_eq!(mounts_at(&rig, &a.staging).await, 0);
    rig.node_unstage(&id, &a.staging).await;
    rig.agent
        .ok(10, "rm -rf /var/lib/kubelet/pods/conf-fs* /var/lib/kubelet/plugins/edgevol/staging/conf-fs*")
        .await;
    rig.assert_nothing_left().await;
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh"]
async fn publish_to_a_second_target_follows_the_access_mode() {
    // NodePublishVolume's table for a plugin with SINGLE_NODE_MULTI_WRITER, T1!=T2:
    // SINGLE_NODE_SINGLE_WRITER -> 9 FAILED_PRECONDITION; SINGLE_NODE_MULTI_WRITER -> OK;
    // MULTI_NODE_... -> OK. On a block volume: the bind of the device node is the publication.
    let mut rig = Rig::new().await;
    let vol = rig
        .create_as(
            "e2e-conf-blk",
            32 * MIB,
            block_cap(Mode::SingleNodeWriter),
            None,
        )
        .await;
    let base = prepared(
        &mut rig,
        &vol,
        block_cap(Mode::SingleNodeWriter),
        "conf-blk",
    )
    .await;
    let t2 = paths("conf-blk-t2", true).1;
    for mode in [
        Mode::SingleNodeSingleWriter,
        Mode::SingleNodeMultiWriter,
        Mode::MultiNodeMultiWriter,
    ] {
        let a = Attached {
            cap: block_cap(mode),
            ..base.clone()
        };
        ok(
            &format!("NodeStageVolume {mode:?}"),
            rig.node.node_stage_volume(rig.stage_req(&a)),
        )
        .await;
        ok(
            &format!("NodePublishVolume T1 {mode:?}"),
            rig.node
                .node_publish_volume(rig.publish_req(&a, &a.target, false)),
        )
        .await;
        let second = rig
            .node
            .node_publish_volume(rig.publish_req(&a, &t2, false));
        if mode == Mode::SingleNodeSingleWriter {
            refused(
                "NodePublishVolume T2 read-write, SINGLE_NODE_SINGLE_WRITER",
                second,
                Code::FailedPrecondition,
                "SINGLE_NODE_SINGLE_WRITER",
            )
            .await;
            assert_eq!(mounts_at(&rig, &t2).await, 0);
            // A reader is no second writer.
            ok(
                "NodePublishVolume T2 read-only, SINGLE_NODE_SINGLE_WRITER",
                rig.node.node_publish_volume(rig.publish_req(&a, &t2, true)),
            )
            .await;
        } else {
            ok(&format!("NodePublishVolume T2 {mode:?}"), second).await;
        }
        let size = rig
            .agent
            .ok(10, &format!("blockdev --getsize64 {t2}"))
            .await;
        assert_eq!(size.trim(), (32 * MIB).to_string(), "T2 is the volume");
        for t in [&a.target, &t2] {
            rig.node_unpublish(&a.volume_id, t).await;
        }
        rig.node_unstage(&a.volume_id, &a.staging).await;
        assert_eq!(controllers(&rig).await, 0);
    }
    rig.controller_unpublish(&base.volume_id).await;
    rig.delete(&base.volume_id).await;
    rig.agent
        .ok(10, "rm -rf /var/lib/kubelet/pods/conf-blk* /var/lib/kubelet/plugins/edgevol/staging/conf-blk")
        .await;
    rig.assert_nothing_left().await;
}

/// Writes 8 MiB of random data and a note into `dir`, returns their checksums' file.
async fn write_data(rig: &Rig, dir: &str, tag: &str) -> String {
    let sums = format!("/tmp/{tag}.sums");
    rig.agent
        .ok(
            120,
            &format!(
                "cd {dir} && dd if=/dev/urandom of=data.bin bs=1M count=8 2>/dev/null && \
                 echo {tag} > note && sync && sha256sum data.bin note > {sums}"
            ),
        )
        .await;
    sums
}

/// Checks the data [`write_data`] wrote, read back from the device.
async fn check_data(rig: &Rig, dir: &str, sums: &str) {
    rig.agent
        .ok(
            120,
            &format!("echo 3 > /proc/sys/vm/drop_caches; cd {dir} && sha256sum -c {sums}"),
        )
        .await;
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh"]
async fn node_expand_rows_and_an_ext4_grown_online() {
    let mut rig = Rig::new().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let vol = rig
        .create_as("e2e-conf-grow-ext4", 64 * MIB, cap.clone(), None)
        .await;
    let a = rig.attach_as(&vol, cap, "conf-grow-ext4").await;
    let id = a.volume_id.clone();
    let sums = write_data(&rig, &a.target, "ext4").await;
    let before = df_kib(&rig.agent.ok(10, &format!("df -k {}", a.target)).await);
    assert!(
        before * 1024 < 64 * MIB as u64,
        "made at 64 MiB: {before} KiB"
    );

    // "Exceeds capabilities -> 3 INVALID_ARGUMENT": a capability the volume is not staged with.
    for (other, mention) in [
        (block_cap(Mode::SingleNodeWriter), "block"),
        (mount_cap("xfs", Mode::SingleNodeWriter), "xfs"),
    ] {
        let mut req = rig.node_expand_req(&a, &a.target, 0);
        req.volume_capability = Some(other);
        refused(
            &format!("NodeExpandVolume as {mention}"),
            rig.node.node_expand_volume(req),
            Code::InvalidArgument,
            mention,
        )
        .await;
    }
    // "Unsupported capacity_range -> 11 OUT_OF_RANGE": a limit below the size (no shrinking).
    let mut shrink = rig.node_expand_req(&a, &a.target, 0);
    shrink.capacity_range = Some(CapacityRange {
        required_bytes: 16 * MIB,
        limit_bytes: 32 * MIB,
    });
    refused(
        "NodeExpandVolume with limit_bytes under the size",
        rig.node.node_expand_volume(shrink),
        Code::OutOfRange,
        "limit_bytes",
    )
    .await;
    // "Volume does not exist -> 5 NOT_FOUND": another id, a path the volume is not at, and
    // csi-sanity's relative "some/path".
    for (vid, path) in [
        ("e2e-conf-other", a.target.as_str()),
        (id.as_str(), "/var/lib/kubelet"),
        (id.as_str(), "some/path"),
    ] {
        let mut req = rig.node_expand_req(&a, path, 0);
        req.volume_id = vid.into();
        refused(
            "NodeExpandVolume of a volume not there",
            rig.node.node_expand_volume(req),
            Code::NotFound,
            if path == "some/path" { path } else { vid },
        )
        .await;
    }
    assert_eq!(
        df_kib(&rig.agent.ok(10, &format!("df -k {}", a.target)).await),
        before,
        "a refused expansion changed the filesystem"
    );

    // The real thing: made at 64 MiB, grown online to 160 MiB while published.
    let node_bytes = rig.expand(&a, 160 * MIB).await;
    assert!(
        node_bytes >= 160 * MIB,
        "NodeExpandVolume said {node_bytes}"
    );
    let after = df_kib(&rig.agent.ok(10, &format!("df -k {}", a.target)).await);
    assert!(
        after > before * 2 && after * 1024 > 140 * MIB as u64,
        "ext4: df {before} KiB before, {after} KiB after growing to 160 MiB"
    );
    check_data(&rig, &a.target, &sums).await;
    // Idempotent: again (at the staging path this time) is OK and changes nothing.
    let again = ok(
        "NodeExpandVolume again at the staging path",
        rig.node
            .node_expand_volume(rig.node_expand_req(&a, &a.staging, 160 * MIB)),
    )
    .await;
    assert_eq!(again.capacity_bytes, node_bytes);
    assert_eq!(
        df_kib(&rig.agent.ok(10, &format!("df -k {}", a.target)).await),
        after
    );

    // "Volume in use -> 9 FAILED_PRECONDITION": staged read-only, the filesystem cannot grow.
    rig.node_unpublish(&id, &a.target).await;
    rig.node_unstage(&id, &a.staging).await;
    let ro = Attached {
        cap: mount_cap("ext4", Mode::SingleNodeReaderOnly),
        ..a.clone()
    };
    ok(
        "NodeStageVolume read-only",
        rig.node.node_stage_volume(rig.stage_req(&ro)),
    )
    .await;
    refused(
        "NodeExpandVolume of a read-only stage",
        rig.node
            .node_expand_volume(rig.node_expand_req(&ro, &ro.staging, 160 * MIB)),
        Code::FailedPrecondition,
        "read-only",
    )
    .await;
    check_data(&rig, &ro.staging, &sums).await;
    rig.node_unstage(&id, &ro.staging).await;
    rig.controller_unpublish(&id).await;
    rig.delete(&id).await;
    rig.agent
        .ok(10, "rm -rf /var/lib/kubelet/pods/conf-grow-ext4 /var/lib/kubelet/plugins/edgevol/staging/conf-grow-ext4")
        .await;
    rig.assert_nothing_left().await;
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh"]
async fn node_expand_grows_an_xfs_online() {
    // xfs (mkfs.xfs wants 300 MB at least): made at 320 MiB, grown to 448 MiB with xfs_growfs
    // on the mount while published; df shows it, the data is intact.
    let mut rig = Rig::new().await;
    let cap = mount_cap("xfs", Mode::SingleNodeWriter);
    let vol = rig
        .create_as("e2e-conf-grow-xfs", 320 * MIB, cap.clone(), None)
        .await;
    let a = rig.attach_as(&vol, cap, "conf-grow-xfs").await;
    let mounts = rig.mounts().await;
    assert!(
        mounts
            .lines()
            .any(|l| l.contains(&a.staging) && l.contains(" xfs ")),
        "{} is not an xfs mount:\n{mounts}",
        a.staging
    );
    let sums = write_data(&rig, &a.target, "xfs").await;
    let before = df_kib(&rig.agent.ok(10, &format!("df -k {}", a.target)).await);
    assert!(
        before * 1024 < 320 * MIB as u64,
        "made at 320 MiB: {before} KiB"
    );
    let node_bytes = rig.expand(&a, 448 * MIB).await;
    assert!(
        node_bytes >= 448 * MIB,
        "NodeExpandVolume said {node_bytes}"
    );
    let after = df_kib(&rig.agent.ok(10, &format!("df -k {}", a.target)).await);
    assert!(
        after >= before + 120 * 1024,
        "xfs: df {before} KiB before, {after} KiB after growing by 128 MiB"
    );
    let s = ok(
        "NodeGetVolumeStats",
        rig.node
            .node_get_volume_stats(stats(&a.volume_id, &a.target)),
    )
    .await;
    let total: i64 = s
        .usage
        .iter()
        .filter(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .map(|u| u.total)
        .sum();
    assert_eq!(total as u64 / 1024, after, "stats agree with df");
    check_data(&rig, &a.target, &sums).await;
    rig.detach_and_delete(&a).await;
    rig.agent
        .ok(10, "rm -rf /var/lib/kubelet/pods/conf-grow-xfs /var/lib/kubelet/plugins/edgevol/staging/conf-grow-xfs")
        .await;
    rig.assert_nothing_left().await;
}
