//! The CSI calls each orchestrator makes (deploy/), replayed against the appliance VM and the
//! node VM's real `edgevol-node`: Kubernetes' CreateVolume with the StorageClass parameters,
//! external-provisioner's --extra-create-metadata and the node's topology (WaitForFirstConsumer);
//! Nomad's volume specification (two capabilities); Docker Swarm's scope x sharing x type as
//! access modes (seed 004), each staged and published on the node, and the mounted multi-node
//! writers refused. Needs the VMs of scripts/test-e2e-qemu.sh; ignored otherwise.

use std::collections::HashMap;

use edgevol_e2e::rig::{block_cap, mount_cap, Rig, CALL_SECS, MIB};
use edgevol_e2e::within;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::*;
use tonic::Code;

/// The requisite topology a CO derives from the node's NodeGetInfo.
async fn node_topology(rig: &mut Rig) -> TopologyRequirement {
    let info = within(
        CALL_SECS,
        "NodeGetInfo",
        rig.node.node_get_info(NodeGetInfoRequest {}),
    )
    .await
    .expect("NodeGetInfo")
    .into_inner();
    let topology = info
        .accessible_topology
        .expect("the node reports its topology");
    assert!(
        topology.segments.contains_key("edgevol.io/appliance"),
        "{topology:?}"
    );
    TopologyRequirement {
        requisite: vec![topology.clone()],
        preferred: vec![topology],
    }
}

async fn create(
    rig: &mut Rig,
    name: &str,
    caps: Vec<VolumeCapability>,
    parameters: &[(&str, &str)],
    topology: &TopologyRequirement,
) -> Result<Volume, tonic::Status> {
    let req = CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 32 * MIB,
            limit_bytes: 0,
        }),
        volume_capabilities: caps,
        parameters: parameters
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<HashMap<_, _>>(),
        accessibility_requirements: Some(topology.clone()),
        ..Default::default()
    };
    within(CALL_SECS, "CreateVolume", rig.ctl.create_volume(req))
        .await
        .map(|r| r.into_inner().volume.expect("a volume"))
}

/// Stage and publish `vol` with `cap`, write through it, and take it down.
async fn use_volume(rig: &mut Rig, vol: &Volume, cap: VolumeCapability, tag: &str) {
    let block = matches!(
        cap.access_type,
        Some(volume_capability::AccessType::Block(_))
    );
    let a = rig.attach_as(vol, cap, tag).await;
    let cmd = if block {
        format!(
            "dd if=/dev/urandom of={} bs=1M count=1 conv=fsync 2>/dev/null && sync",
            a.target
        )
    } else {
        format!("echo {tag} > {}/f && sync && cat {}/f", a.target, a.target)
    };
    rig.agent.ok(60, &cmd).await;
    rig.detach_and_delete(&a).await;
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh"]
async fn orchestrator_calls_are_served() {
    let mut rig = Rig::new().await;
    let topology = node_topology(&mut rig).await;

    // Kubernetes: deploy/kubernetes/storageclass.yaml's parameters (the provisioner keeps
    // csi.storage.k8s.io/fstype to itself) plus --extra-create-metadata.
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let vol = create(
        &mut rig,
        "pvc-e2e-k8s",
        vec![cap.clone()],
        &[
            ("provisioning", "thin"),
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("csi.storage.k8s.io/pvc/namespace", "default"),
            ("csi.storage.k8s.io/pv/name", "pvc-e2e-k8s"),
        ],
        &topology,
    )
    .await
    .expect("Kubernetes' CreateVolume");
    assert_eq!(
        vol.volume_context
            .get("csi.storage.k8s.io/pvc/name")
            .map(String::as_str),
        Some("data")
    );
    // Accessible from the node that asked: one of the volume's segments holds only keys the
    // node reports, with its values (the node also reports its presence key, which the
    // appliance's own segment need not carry).
    let node = &topology.requisite[0].segments;
    assert!(
        vol.accessible_topology
            .iter()
            .any(|t| !t.segments.is_empty()
                && t.segments.iter().all(|(k, v)| node.get(k) == Some(v))),
        "volume topology {:?} does not match the node's {node:?}",
        vol.accessible_topology
    );
    use_volume(&mut rig, &vol, cap, "k8s").await;

    // Nomad: deploy/nomad/volume.hcl (single-node-writer and multi-node-reader-only file-system
    // capabilities, ext4, thin); the job claims it single-node-writer.
    let vol = create(
        &mut rig,
        "nomad-e2e-db",
        vec![
            mount_cap("ext4", Mode::SingleNodeWriter),
            mount_cap("ext4", Mode::MultiNodeReaderOnly),
        ],
        &[("provisioning", "thin")],
        &topology,
    )
    .await
    .expect("Nomad's CreateVolume");
    use_volume(
        &mut rig,
        &vol,
        mount_cap("ext4", Mode::SingleNodeWriter),
        "nomad",
    )
    .await;

    // Docker Swarm: --scope x --sharing as seed 004 maps them, --type mount and block (the
    // reader-only modes' CreateVolume is replayed on the host: tests/deploy/grpcio_unix.py).
    let swarm = [
        (
            "single-none-mount",
            mount_cap("ext4", Mode::SingleNodeWriter),
            true,
        ),
        ("single-all-block", block_cap(Mode::SingleNodeWriter), true),
        (
            "multi-onewriter-block",
            block_cap(Mode::MultiNodeSingleWriter),
            true,
        ),
        (
            "multi-all-block",
            block_cap(Mode::MultiNodeMultiWriter),
            true,
        ),
        (
            "multi-onewriter-mount",
            mount_cap("ext4", Mode::MultiNodeSingleWriter),
            false,
        ),
        (
            "multi-all-mount",
            mount_cap("ext4", Mode::MultiNodeMultiWriter),
            false,
        ),
    ];
    for (tag, cap, accepted) in swarm {
        let got = create(
            &mut rig,
            &format!("swarm-e2e-{tag}"),
            vec![cap.clone()],
            &[],
            &topology,
        )
        .await;
        match (got, accepted) {
            (Ok(vol), true) => use_volume(&mut rig, &vol, cap, tag).await,
            (Err(status), false) => {
                assert_eq!(status.code(), Code::InvalidArgument, "{tag}: {status:?}");
                assert!(
                    status.message().contains("cluster filesystem"),
                    "{tag}: {status:?}"
                );
            }
            (got, _) => panic!("swarm {tag}: {got:?}"),
        }
    }
    rig.assert_nothing_left().await;
}
