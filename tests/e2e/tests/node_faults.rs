//! Faults on the node side (project issue 13), against the real `edgevol-node` on the node VM's
//! kernel NVMe/TCP initiator and the appliance firmware image VM (scripts/test-e2e-qemu.sh):
//!
//! * step 3c, [`restart_keeps_staged_and_published_volumes_serviceable`]: the connect options
//!   reach the kernel (sysfs shows fast_io_fail_tmo 90, ctrl_loss_tmo 600, reconnect_delay 2,
//!   kato 5); edgevol-node is SIGKILLed and started again with a volume staged and published;
//!   NodeGetVolumeStats, NodeExpandVolume, NodeUnpublishVolume and NodeUnstageVolume then work,
//!   data intact, and the restart brings a controller whose fast_io_fail_tmo was off (as an
//!   earlier plugin connected it) back to 90.
//! * step 4, [`appliance_gone_unpublish_and_unstage_complete_within_the_bound`]: with a volume
//!   staged, published and holding unwritten data, the appliance VM's QEMU is SIGKILLed (this
//!   is the power cut of step 4); NodeUnpublishVolume and NodeUnstageVolume complete, the
//!   unstage no sooner than fast_io_fail_tmo after the cut (the writes waited for the
//!   appliance) and no later than the documented bound; nothing is left on the node.
//!   edgevol-node runs with `--fast-io-fail-tmo 20` for this test, to keep the run short:
//!   the mechanism is the same at the default 90.
//! * step 4, after the later boot, [`once_the_appliance_is_back_the_co_finishes_the_detach`]:
//!   the node did not reconnect by itself; ControllerUnpublishVolume and DeleteVolume finish
//!   the detach; nothing is left on either VM.
//!
//! Needs the VMs of scripts/test-e2e-qemu.sh; ignored otherwise.

use std::time::{Duration, Instant};

use edgevol_e2e::rig::{df_kib, Attached, Rig, CALL_SECS, MIB};
use edgevol_e2e::within;
use edgevol_proto::csi::v1::volume_usage::Unit;
use edgevol_proto::csi::v1::*;

/// The appliance image's reboot must fit into this many times over: BENCHMARKS.md, 3.8 s.
const DEFAULT_FAST_IO_FAIL_TMO: u64 = 90;
/// `--fast-io-fail-tmo` of the appliance-gone test.
const TEST_FAST_IO_FAIL_TMO: u64 = 20;
/// `keep_alive_tmo` (default): a silent appliance is noticed within about twice this.
const KATO: u64 = 5;
/// Teardown after the kernel failed the I/O (unmount with errors, controller deletion with one
/// reconnect attempt in flight: a TCP SYN to a silent address gives up after about 3 s), plus
/// the slack of TCG guests on a shared 2-core machine (times the load's scale).
const TEARDOWN_SLACK: u64 = 30;

/// The node VM's controller of `a`'s subsystem.
async fn controller_of(rig: &Rig, a: &Attached) -> String {
    let nqn = &a.context["subsystemNqn"];
    let out = rig
        .agent
        .ok(
            10,
            &format!("grep -lx '{nqn}' /sys/class/nvme/nvme*/subsysnqn"),
        )
        .await;
    let path = out.lines().next().unwrap_or_default();
    path.trim_start_matches("/sys/class/nvme/")
        .trim_end_matches("/subsysnqn")
        .to_owned()
}

/// A controller attribute as sysfs shows it.
async fn attr(rig: &Rig, ctrl: &str, name: &str) -> String {
    rig.agent
        .ok(10, &format!("cat /sys/class/nvme/{ctrl}/{name}"))
        .await
        .trim()
        .to_owned()
}

/// Staged-volume records in the node's state directory.
async fn records(rig: &Rig) -> usize {
    let out = rig
        .agent
        .ok(10, "ls /var/lib/edgevol-node | grep -c '^vol-' || true")
        .await;
    out.trim().parse().expect("a count")
}

async fn stats(rig: &mut Rig, a: &Attached) -> NodeGetVolumeStatsResponse {
    within(
        CALL_SECS,
        "NodeGetVolumeStats",
        rig.node.node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: a.volume_id.clone(),
            volume_path: a.target.clone(),
            staging_target_path: a.staging.clone(),
        }),
    )
    .await
    .expect("NodeGetVolumeStats")
    .into_inner()
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh"]
async fn restart_keeps_staged_and_published_volumes_serviceable() {
    let mut rig = Rig::new().await;
    let vol = rig
        .create("e2e-faults-restart", 64 * MIB, false, None)
        .await;
    let a = rig.attach(&vol, false, "faults-restart").await;
    let ctrl = controller_of(&rig, &a).await;
    // The connect options as the kernel took them (ctrl_loss_tmo reads back as attempts times
    // reconnect_delay: 300 x 2).
    for (name, want) in [
        ("fast_io_fail_tmo", DEFAULT_FAST_IO_FAIL_TMO.to_string()),
        ("ctrl_loss_tmo", "600".to_owned()),
        ("reconnect_delay", "2".to_owned()),
        ("kato", KATO.to_string()),
    ] {
        assert_eq!(attr(&rig, &ctrl, name).await, want, "{ctrl}/{name}");
    }
    let t = a.target.clone();
    rig.agent
        .ok(
            60,
            &format!(
                "cd {t} && dd if=/dev/urandom of=data.bin bs=1M count=4 conv=fsync 2>/dev/null \
                 && sha256sum data.bin > /tmp/restart.sums"
            ),
        )
        .await;
    let kib_before = df_kib(&rig.agent.ok(10, &format!("df -k {t}")).await);
    // As a plugin before issue 13 would have left the controller: I/O queued for ctrl_loss_tmo.
    rig.agent
        .ok(
            10,
            &format!("echo -1 > /sys/class/nvme/{ctrl}/fast_io_fail_tmo"),
        )
        .await;
    assert_eq!(attr(&rig, &ctrl, "fast_io_fail_tmo").await, "off");

    let started = Instant::now();
    let said = rig.restart_node("").await;
    eprintln!("{said} in {:?}", started.elapsed());
    assert_eq!(
        attr(&rig, &ctrl, "fast_io_fail_tmo").await,
        DEFAULT_FAST_IO_FAIL_TMO.to_string(),
        "the restarted plugin adopts its volume's controller"
    );
    assert_eq!(attr(&rig, &ctrl, "state").await, "live");

    let s = stats(&mut rig, &a).await;
    let condition = s.volume_condition.expect("a volume condition");
    assert!(!condition.abnormal, "{}", condition.message);
    let bytes = s
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .expect("byte usage");
    assert!(
        bytes.used >= 4 * MIB && bytes.total > 32 * MIB,
        "usage {bytes:?}"
    );

    assert_eq!(rig.expand(&a, 96 * MIB).await, 96 * MIB);
    let kib_after = df_kib(&rig.agent.ok(10, &format!("df -k {t}")).await);
    assert!(
        kib_after > kib_before + 24 * 1024,
        "ext4 did not grow: {kib_before} -> {kib_after} KiB"
    );
    rig.agent
        .ok(30, &format!("cd {t} && sha256sum -c /tmp/restart.sums"))
        .await;

    // And a second restart, then the CO's way out.
    rig.restart_node("").await;
    rig.detach_and_delete(&a).await;
    assert_eq!(records(&rig).await, 0, "staged-volume record left");
    rig.assert_nothing_left().await;
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh; kills the appliance VM"]
async fn appliance_gone_unpublish_and_unstage_complete_within_the_bound() {
    let pidfile = std::env::var("EDGEVOL_E2E_APPLIANCE_PIDFILE")
        .expect("EDGEVOL_E2E_APPLIANCE_PIDFILE: run scripts/test-e2e-qemu.sh");
    let mut rig = Rig::new().await;
    rig.restart_node(&format!("--fast-io-fail-tmo {TEST_FAST_IO_FAIL_TMO}"))
        .await;
    let vol = rig.create("e2e-faults-gone", 64 * MIB, false, None).await;
    let a = rig.attach(&vol, false, "faults-gone").await;
    let ctrl = controller_of(&rig, &a).await;
    assert_eq!(
        attr(&rig, &ctrl, "fast_io_fail_tmo").await,
        TEST_FAST_IO_FAIL_TMO.to_string()
    );
    let t = a.target.clone();
    // Durable data, then data only in the page cache: the unmount will have to write it.
    rig.agent
        .ok(
            60,
            &format!(
                "cd {t} && dd if=/dev/urandom of=kept bs=1M count=2 conv=fsync 2>/dev/null && \
                 dd if=/dev/urandom of=dirty bs=1M count=4 2>/dev/null && \
                 grep -E '^(Dirty|Writeback):' /proc/meminfo"
            ),
        )
        .await;

    let pid = std::fs::read_to_string(&pidfile)
        .unwrap_or_else(|e| panic!("{pidfile}: {e}"))
        .trim()
        .to_owned();
    let status = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -9 {pid} (the appliance VM)");
    let cut = Instant::now();
    eprintln!("appliance VM (QEMU pid {pid}) killed");

    rig.node_unpublish(&a.volume_id, &a.target).await;
    let unpublished = cut.elapsed();
    within(
        CALL_SECS,
        "NodeUnstageVolume",
        rig.node.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: a.volume_id.clone(),
            staging_target_path: a.staging.clone(),
        }),
    )
    .await
    .expect("NodeUnstageVolume of a volume whose appliance is gone");
    let unstaged = cut.elapsed();
    let bound = Duration::from_secs(2 * KATO + TEST_FAST_IO_FAIL_TMO)
        + edgevol_e2e::scaled_secs(TEARDOWN_SLACK);
    eprintln!(
        "after the cut: NodeUnpublishVolume returned at {unpublished:?}, NodeUnstageVolume at \
         {unstaged:?} (fast_io_fail_tmo {TEST_FAST_IO_FAIL_TMO} s, bound {bound:?})"
    );
    let dmesg = rig
        .agent
        .ok(
            10,
            "dmesg | grep -E 'nvme|EXT4|I/O error|failfast' | tail -n 25",
        )
        .await;
    eprintln!("node dmesg:\n{dmesg}");
    assert!(
        unstaged >= Duration::from_secs(TEST_FAST_IO_FAIL_TMO),
        "the unstage gave up on the appliance before fast_io_fail_tmo ({unstaged:?}): an \
         appliance back from a reboot in that time would have lost the unwritten data"
    );
    assert!(
        unstaged <= bound,
        "NodeUnstageVolume took {unstaged:?} after the cut, beyond the bound {bound:?}"
    );

    let mounts = rig.mounts().await;
    assert!(
        !mounts.contains(&a.staging) && !mounts.contains(&a.target),
        "still mounted:\n{mounts}"
    );
    let ctrls = rig.agent.ok(10, "ls /sys/class/nvme").await;
    assert!(
        !ctrls.split_whitespace().any(|n| n.starts_with("nvme")),
        "controllers left: {ctrls}"
    );
    assert_eq!(records(&rig).await, 0, "staged-volume record left");
    let stuck = rig
        .agent
        .ok(
            10,
            "for s in /proc/[0-9]*/status; do grep -q '^State:.*D' $s 2>/dev/null && \
             grep '^Name:' $s; done; true",
        )
        .await;
    assert!(
        !stuck.contains("umount") && !stuck.contains("edgevol-node"),
        "processes stuck on the lost device:\n{stuck}"
    );
    // The volume's CO-side detach waits for the appliance (the next test); the node runs on
    // its default flags again.
    rig.restart_node("").await;
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh, after the appliance VM's reboot"]
async fn once_the_appliance_is_back_the_co_finishes_the_detach() {
    let mut rig = Rig::new().await;
    let ctrls = rig.agent.ok(10, "ls /sys/class/nvme").await;
    assert!(
        !ctrls.split_whitespace().any(|n| n.starts_with("nvme")),
        "the node reconnected a controller it had given up: {ctrls}"
    );
    let id = rig.only_volume("the appliance-gone test").await;
    rig.controller_unpublish(&id).await;
    rig.delete(&id).await;
    rig.assert_nothing_left().await;
}
