//! The volume life cycle end to end, driven from the host: the appliance VM (firmware image,
//! emulated NVMe drive) over mTLS, the node VM's real `edgevol-node` (Linux NVMe/TCP initiator,
//! mkfs.ext4, mount) through the test agent. Needs the VMs of scripts/test-e2e-qemu.sh, which
//! sets the EDGEVOL_E2E_* variables; ignored otherwise.

use edgevol_e2e::rig::{df_kib, Rig, CALL_SECS, MIB};
use edgevol_e2e::within;
use edgevol_proto::csi::v1::*;

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
