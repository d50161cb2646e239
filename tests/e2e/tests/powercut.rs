//! Power cut of the appliance under live I/O (project issue 13, scripts/test-faults-qemu.sh):
//! the appliance firmware image VM (qemu/appliance-vm.sh, emulated NVMe drive) serves a node VM
//! (qemu/node-vm.sh, the real `edgevol-node`); the node writes files on an ext4 volume (each
//! fsynced) and raw batches on a block volume (32 O_DIRECT 4 KiB writes then one fsync), logging
//! what each fsync made durable (qemu/faults-powercut-node.sh). Just before the cut those two
//! pause after their last fsync, and a third writer makes allocating 4 KiB O_DIRECT writes on a
//! third block volume that it fsyncs only after the cut, so the cut always lands on acknowledged,
//! unflushed writes. The host SIGKILLs the appliance VM's QEMU (a power cut: whatever the
//! appliance had not written to its drive is gone) and boots it again from the same disks.
//! Pass: nothing completes while the appliance is off; the node's writers go on by themselves
//! once it is back (no human, no I/O error in the writers or the node's dmesg, every controller
//! reconnected); every byte an fsync acknowledged, before or after the cut, reads back,
//! including the writes acknowledged before the cut and fsynced after it; `fsck.ext4 -n` finds
//! the file system clean. Needs the VMs of the script and its EDGEVOL_E2E_* and EDGEVOL_PC_*
//! variables; ignored otherwise.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use edgevol_e2e::{appliance_channel, env_addr, node_channel, within, Agent, WriterCounts};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::node_client::NodeClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use edgevol_proto::csi::v1::*;
use tonic::transport::Channel;

const MIB: i64 = 1 << 20;
/// Budget of one CSI call (TCG guests on a shared 2-core machine are slow).
const CALL_S: u64 = 120;
/// Durable writes of each writer before the cut, and after it (the node resumed).
const BEFORE_CUT: u64 = 5;
const AFTER_CUT: u64 = 3;
/// Held writes (acknowledged, not flushed) when the cut comes.
const HELD_BEFORE_CUT: u64 = 10;
/// How long nothing may complete while the appliance is off.
const DARK_S: u64 = 5;
/// Seconds between the last held write and the cut: the appliance's sync interval (1 s) plus a
/// margin for a loaded TCG guest (times the load's scale).
const SETTLED_S: u64 = 4;
/// Budgets: writes before the cut, the reboot to READY, the node's resumption.
const WRITES_S: u64 = 120;
const REBOOT_S: u64 = 200;
const RESUME_S: u64 = 180;
/// The node-side script, sent through the agent.
const NODE_SCRIPT: &str = include_str!("../../../qemu/faults-powercut-node.sh");

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

/// The writers' durable-write counts (`sh /tmp/pc.sh counts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    fs: u64,
    raw: u64,
    fs_errors: u64,
    raw_errors: u64,
}

async fn counts(agent: &Agent) -> Counts {
    let c = WriterCounts::read(agent).await;
    let field = |name: &str| c.field(name);
    Counts {
        fs: field("fs"),
        raw: field("raw"),
        fs_errors: field("fs-errors"),
        raw_errors: field("raw-errors"),
    }
}

/// Polls the counts until `done` holds; panics with `what` after `secs`.
async fn wait_counts(
    agent: &Agent,
    secs: u64,
    what: &str,
    done: impl Fn(Counts) -> bool,
) -> Counts {
    let t = Instant::now();
    loop {
        let c = counts(agent).await;
        if done(c) {
            return c;
        }
        assert!(
            t.elapsed() < edgevol_e2e::scaled_secs(secs),
            "{what}: not within {:?} (writers at {c:?})",
            edgevol_e2e::scaled_secs(secs)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// ControllerPublish to the node, NodeStage, NodePublish; returns the node's target path.
async fn attach(
    ctl: &mut ControllerClient<Channel>,
    node: &mut NodeClient<Channel>,
    agent: &Agent,
    node_id: &str,
    volume: &Volume,
    block: bool,
    tag: &str,
) -> String {
    let context = within(
        CALL_S,
        "ControllerPublishVolume",
        ctl.controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: node_id.into(),
            volume_capability: Some(capability(block)),
            readonly: false,
            ..Default::default()
        }),
    )
    .await
    .expect("ControllerPublishVolume")
    .into_inner()
    .publish_context;
    let staging = format!("/var/lib/kubelet/plugins/edgevol/staging/{tag}");
    let pod = format!("/var/lib/kubelet/pods/{tag}");
    let target = if block {
        format!("{pod}/volumeDevices/dev")
    } else {
        format!("{pod}/volumes/mnt")
    };
    agent.ok(10, &format!("mkdir -p {staging} {pod}")).await;
    within(
        CALL_S,
        "NodeStageVolume",
        node.node_stage_volume(NodeStageVolumeRequest {
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
        CALL_S,
        "NodePublishVolume",
        node.node_publish_volume(NodePublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            publish_context: context,
            staging_target_path: staging,
            target_path: target.clone(),
            volume_capability: Some(capability(block)),
            readonly: false,
            volume_context: volume.volume_context.clone(),
            ..Default::default()
        }),
    )
    .await
    .expect("NodePublishVolume");
    target
}

/// Starts the held writes (`sh /tmp/pc.sh hold`), lets at least `at_least` of them be
/// acknowledged, stops them; returns how many were.
async fn held_writes(agent: &Agent, at_least: u64) -> u64 {
    agent.ok(10, "touch /tmp/pc-hold-go").await;
    let t = Instant::now();
    loop {
        let n: u64 = agent
            .ok(10, "cat /tmp/pc-hold.state 2>/dev/null || echo 0")
            .await
            .trim()
            .parse()
            .unwrap_or(0);
        if n >= at_least {
            break;
        }
        assert!(
            t.elapsed() < edgevol_e2e::scaled_secs(WRITES_S),
            "only {n} held writes acknowledged within {:?}",
            edgevol_e2e::scaled_secs(WRITES_S)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    agent
        .ok(
            60,
            "touch /tmp/pc-hold-stop; while [ ! -e /tmp/pc-hold.stopped ]; do sleep 0.1; done",
        )
        .await;
    agent
        .ok(10, "cat /tmp/pc-hold.state")
        .await
        .trim()
        .parse()
        .expect("held count")
}

/// `verified N bad M` of a verify step.
fn verified(out: &str) -> (u64, u64) {
    let line = out
        .lines()
        .find(|l| l.starts_with("verified "))
        .unwrap_or_else(|| panic!("no verdict in:\n{out}"));
    let w: Vec<&str> = line.split_whitespace().collect();
    (
        w[1].parse().expect("verified N"),
        w[3].parse().expect("bad M"),
    )
}

#[tokio::test]
#[ignore = "needs the VMs of scripts/test-faults-qemu.sh"]
async fn power_cut_of_the_appliance_under_fsynced_writes() {
    let pki = PathBuf::from(std::env::var("EDGEVOL_E2E_PKI").expect("EDGEVOL_E2E_PKI"));
    let pidfile = PathBuf::from(
        std::env::var("EDGEVOL_PC_APPLIANCE_PIDFILE").expect("EDGEVOL_PC_APPLIANCE_PIDFILE"),
    );
    let reboot = std::env::var("EDGEVOL_PC_REBOOT").expect("EDGEVOL_PC_REBOOT: the boot command");
    let csi = env_addr("EDGEVOL_E2E_CSI");
    let mut ctl = ControllerClient::new(appliance_channel(csi, &pki, "controller").await);
    let mut node = NodeClient::new(node_channel(env_addr("EDGEVOL_E2E_NODE_CSI")).await);
    let agent = Agent {
        addr: env_addr("EDGEVOL_E2E_NODE_EXEC"),
    };
    let node_id = within(
        CALL_S,
        "NodeGetInfo",
        node.node_get_info(NodeGetInfoRequest {}),
    )
    .await
    .expect("NodeGetInfo")
    .into_inner()
    .node_id;
    agent
        .ok(
            20,
            &format!("cat >/tmp/pc.sh <<'EDGEVOL-PC-EOF'\n{NODE_SCRIPT}EDGEVOL-PC-EOF\ndmesg -c >/dev/null"),
        )
        .await;

    // An ext4 volume (the node plugin formats and mounts it) and two block volumes.
    let mut volumes = Vec::new();
    for (name, block) in [("pc-fs", false), ("pc-raw", true), ("pc-hold", true)] {
        let volume = within(
            CALL_S,
            "CreateVolume",
            ctl.create_volume(CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: 256 * MIB,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![capability(block)],
                ..Default::default()
            }),
        )
        .await
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("a volume");
        let target = attach(&mut ctl, &mut node, &agent, &node_id, &volume, block, name).await;
        volumes.push(target);
    }
    let (dir, dev, hold) = (volumes[0].clone(), volumes[1].clone(), volumes[2].clone());
    let mounts = agent.ok(10, "cat /proc/mounts").await;
    let fs_dev = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(dir.as_str()))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("{dir} not mounted:\n{mounts}"))
        .to_owned();
    eprintln!("powercut: ext4 {fs_dev} at {dir}, block volume at {dev}");

    // The writers in the background (output to files: the agent answers when sh exits), and
    // the held writes on the third volume, which wait for their start.
    agent
        .ok(
            20,
            &format!(
                "sh /tmp/pc.sh fs {dir} </dev/null >/tmp/pc-fs.out 2>&1 &\n\
                 echo $! >/tmp/pc.pids\n\
                 sh /tmp/pc.sh raw {dev} </dev/null >/tmp/pc-raw.out 2>&1 &\n\
                 echo $! >>/tmp/pc.pids\n\
                 sh /tmp/pc.sh hold {hold} </dev/null >/tmp/pc-hold.out 2>&1 &\n\
                 echo $! >>/tmp/pc.pids"
            ),
        )
        .await;
    let before = wait_counts(&agent, WRITES_S, "durable writes before the cut", |c| {
        c.fs >= BEFORE_CUT && c.raw >= BEFORE_CUT
    })
    .await;
    // The fsyncing writers pause (so that no Flush reaches the pool from now on), the held
    // writes start; once HELD_BEFORE_CUT of them are acknowledged they stop, and the cut comes
    // SETTLED_S later: longer than the appliance's sync interval (1 s), so the power-loss window
    // has passed over them though the host never flushed them, and they must survive.
    agent
        .ok(
            60,
            "touch /tmp/pc-pause; \
             while [ ! -e /tmp/pc-fs.paused ] || [ ! -e /tmp/pc-raw.paused ]; do sleep 0.1; done",
        )
        .await;
    held_writes(&agent, HELD_BEFORE_CUT).await;
    tokio::time::sleep(edgevol_e2e::scaled_secs(SETTLED_S)).await;

    // The power cut: SIGKILL of the appliance VM's QEMU.
    let pid = std::fs::read_to_string(&pidfile)
        .expect("the appliance VM's pidfile")
        .trim()
        .to_owned();
    let status = Command::new("kill")
        .args(["-9", &pid])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -9 {pid}");
    let cut = Instant::now();
    // A writer may log a write that completed just before the cut a moment after it: settle.
    tokio::time::sleep(edgevol_e2e::scaled_secs(1)).await;
    let held_count = || async {
        agent
            .ok(10, "cat /tmp/pc-hold.state")
            .await
            .trim()
            .parse::<u64>()
            .expect("held count")
    };
    let at_cut = counts(&agent).await;
    let held = held_count().await;
    eprintln!(
        "powercut: appliance VM (pid {pid}) killed; fsynced before: {before:?}, at the cut: \
         {at_cut:?}; {held} held writes acknowledged, not flushed"
    );
    tokio::time::sleep(Duration::from_secs(DARK_S)).await;
    let dark = counts(&agent).await;
    assert_eq!(
        (dark.fs, dark.raw),
        (at_cut.fs, at_cut.raw),
        "the writers went on while paused"
    );
    assert_eq!(
        held_count().await,
        held,
        "held writes completed while the appliance was off: the cut did not cut"
    );

    // The appliance boots again from the same disks; the node must resume by itself.
    let booted = tokio::task::spawn_blocking(move || {
        Command::new("timeout")
            .args([
                "--kill-after=10",
                &REBOOT_S.to_string(),
                "bash",
                "-c",
                &reboot,
            ])
            .status()
    })
    .await
    .unwrap()
    .expect("the reboot command");
    assert!(
        booted.success(),
        "the appliance VM did not boot again: {booted}"
    );
    let ready = cut.elapsed();
    agent
        .ok(10, "rm -f /tmp/pc-pause; touch /tmp/pc-release")
        .await;
    let resumed = wait_counts(
        &agent,
        RESUME_S,
        "the node resumes I/O after the appliance is back",
        |c| c.fs >= at_cut.fs + AFTER_CUT && c.raw >= at_cut.raw + AFTER_CUT,
    )
    .await;
    eprintln!(
        "powercut: appliance ready {:.0} s after the cut, node resumed {:.0} s after the cut: {resumed:?}",
        ready.as_secs_f64(),
        cut.elapsed().as_secs_f64()
    );

    // Stop the writers, then read back everything an fsync acknowledged, and judge it all.
    agent
        .ok(
            90,
            "touch /tmp/pc-stop; for p in $(cat /tmp/pc.pids); do \
             while kill -0 $p 2>/dev/null; do sleep 0.2; done; done",
        )
        .await;
    let mut failures = Vec::new();
    let last = counts(&agent).await;
    if (last.fs_errors, last.raw_errors) != (0, 0) {
        failures.push(format!(
            "the writers saw failed writes or fsyncs:\n{}",
            agent
                .ok(10, "cat /tmp/pc-fs.err /tmp/pc-raw.err 2>/dev/null; true")
                .await
        ));
    }
    let fs_out = agent
        .ok(180, &format!("sh /tmp/pc.sh verify-fs {dir}"))
        .await;
    let raw_out = agent
        .ok(180, &format!("sh /tmp/pc.sh verify-raw {dev}"))
        .await;
    let hold_out = agent
        .ok(60, &format!("sh /tmp/pc.sh verify-hold {hold}"))
        .await;
    let (fs_ok, fs_bad) = verified(&fs_out);
    let (raw_ok, raw_bad) = verified(&raw_out);
    let (hold_ok, hold_bad) = verified(&hold_out);
    eprintln!(
        "powercut: files {fs_ok} verified, {fs_bad} bad; raw batches {raw_ok} verified, \
         {raw_bad} bad; held writes {hold_ok} verified, {hold_bad} bad"
    );
    if (fs_ok, fs_bad) != (last.fs, 0) {
        failures.push(format!(
            "of {} fsynced files, {fs_bad} do not read back:\n{fs_out}",
            last.fs
        ));
    }
    if (raw_ok, raw_bad) != (last.raw, 0) {
        failures.push(format!(
            "of {} fsynced raw batches, {raw_bad} do not read back:\n{raw_out}",
            last.raw
        ));
    }
    if hold_bad != 0 || hold_ok < held {
        failures.push(format!(
            "of the {held} writes acknowledged more than {SETTLED_S} s before the cut (never \
             flushed by the host, so only the appliance's periodic sync made them durable), \
             {hold_bad} do not read back, {hold_ok} do:\n{hold_out}"
        ));
    }
    let dmesg = agent.ok(10, "dmesg").await;
    let errors = edgevol_e2e::storage_errors(&dmesg);
    if !errors.is_empty() {
        failures.push(format!(
            "I/O or file system errors in the node's dmesg:\n{}",
            errors.join("\n")
        ));
    }
    let reconnected = dmesg
        .lines()
        .filter(|l| l.contains("Successfully reconnected"))
        .count();
    if reconnected < volumes.len() {
        failures.push(format!(
            "each of the {} controllers reconnects after the cut ({reconnected} in dmesg):\n{dmesg}",
            volumes.len()
        ));
    }

    // The file system as the node left it: read-only (journal committed), then fsck -n.
    let (rc, fsck) = agent
        .sh(
            180,
            &format!("mount -o remount,ro {dir} && e2fsck -fn {fs_dev}"),
        )
        .await;
    eprintln!("powercut: e2fsck -fn {fs_dev}: rc {rc}");
    if rc != 0 {
        failures.push(format!("fsck.ext4 -n is not clean (rc {rc}):\n{fsck}"));
    }
    assert!(
        failures.is_empty(),
        "power cut: {} failure(s):\n{}",
        failures.len(),
        failures.join("\n---\n")
    );
}

/// The test image's trigger (scripts/test-faults-qemu.sh): its edgevold is SIGKILLed once it
/// has logged the creation of a volume of this size.
const CRASH_TRIGGER_BYTES: i64 = 7 * MIB;
/// Held writes (acknowledged, not flushed) when the daemon is killed.
const HELD_BEFORE_CRASH: u64 = 10;

/// edgevold killed on the appliance image (SIGKILL, as a panic or an OOM kill ends it) while a
/// node holds writes it acknowledged and never flushed: the image's init starts it again in the
/// same boot (no reboot, which would drop this boot's journal frames), every held write and every
/// fsynced batch reads back, and the node resumes without an I/O error. Runs before the power cut
/// on the same VMs; leaves nothing behind.
#[tokio::test]
#[ignore = "needs the VMs of scripts/test-faults-qemu.sh and its test image"]
async fn a_daemon_crash_on_the_appliance_loses_no_acknowledged_write() {
    let log =
        PathBuf::from(std::env::var("EDGEVOL_PC_APPLIANCE_LOG").expect("EDGEVOL_PC_APPLIANCE_LOG"));
    let mut rig = edgevol_e2e::rig::Rig::new().await;
    let agent = rig.agent;
    agent
        .ok(
            20,
            &format!("cat >/tmp/pc.sh <<'EDGEVOL-PC-EOF'\n{NODE_SCRIPT}EDGEVOL-PC-EOF\ndmesg -c >/dev/null"),
        )
        .await;
    let raw_vol = rig.create("crash-raw", 256 * MIB, true, None).await;
    let hold_vol = rig.create("crash-hold", 256 * MIB, true, None).await;
    let raw = rig.attach(&raw_vol, true, "crash-raw").await;
    let hold = rig.attach(&hold_vol, true, "crash-hold").await;
    agent
        .ok(
            20,
            &format!(
                "sh /tmp/pc.sh raw {} </dev/null >/tmp/pc-raw.out 2>&1 &\n\
                 echo $! >/tmp/pc.pids\n\
                 sh /tmp/pc.sh hold {} </dev/null >/tmp/pc-hold.out 2>&1 &\n\
                 echo $! >>/tmp/pc.pids",
                raw.target, hold.target
            ),
        )
        .await;
    let before = wait_counts(&agent, WRITES_S, "durable batches before the crash", |c| {
        c.raw >= BEFORE_CUT
    })
    .await;
    // The raw writer pauses after an fsync; the held writes are acknowledged and stop; the
    // trigger follows at once (within the appliance's 1 s sync interval when the machine
    // allows: then only the journal frames of this boot hold them).
    agent
        .ok(
            60,
            "touch /tmp/pc-pause; while [ ! -e /tmp/pc-raw.paused ]; do sleep 0.1; done",
        )
        .await;
    let held = held_writes(&agent, HELD_BEFORE_CRASH).await;
    // The trigger. Its answer may be lost with the daemon: only the kill matters.
    let trigger = rig.ctl.create_volume(CreateVolumeRequest {
        name: "crash-trigger".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: CRASH_TRIGGER_BYTES,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability(true)],
        ..Default::default()
    });
    let _ = tokio::time::timeout(Duration::from_secs(CALL_S), trigger).await;
    let crashed = Instant::now();
    let console = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("EDGEVOL-APPLIANCE RESTARTED") {
            break text;
        }
        assert!(
            crashed.elapsed() < edgevol_e2e::scaled_secs(REBOOT_S),
            "edgevold was not started again within {:?} (console {}):\n{}",
            edgevol_e2e::scaled_secs(REBOOT_S),
            log.display(),
            text.lines()
                .filter(|l| l.contains("EDGEVOL-APPLIANCE") || l.contains("test build"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        console.contains("edgevold (test build): SIGKILL on the trigger"),
        "the trigger did not kill edgevold"
    );
    assert_eq!(
        console.matches("EDGEVOL-APPLIANCE BOOTED").count(),
        1,
        "the box rebooted instead of restarting its daemon in the same boot"
    );
    eprintln!(
        "daemon crash: {held} held writes acknowledged; edgevold started again {:.0} s after \
         the trigger: {}",
        crashed.elapsed().as_secs_f64(),
        console
            .lines()
            .filter(|l| l.contains("DAEMON-EXITED") || l.contains("RESTARTED"))
            .collect::<Vec<_>>()
            .join("; ")
    );

    agent
        .ok(10, "rm -f /tmp/pc-pause; touch /tmp/pc-release")
        .await;
    let resumed = wait_counts(
        &agent,
        RESUME_S,
        "the node resumes after the restart",
        |c| c.raw >= before.raw + AFTER_CUT,
    )
    .await;
    agent
        .ok(
            90,
            "touch /tmp/pc-stop; for p in $(cat /tmp/pc.pids); do \
             while kill -0 $p 2>/dev/null; do sleep 0.2; done; done",
        )
        .await;
    let last = counts(&agent).await;
    assert_eq!(
        last.raw_errors,
        0,
        "failed writes or fsyncs:\n{}",
        agent.ok(10, "cat /tmp/pc-raw.err").await
    );
    let (raw_ok, raw_bad) = verified(
        &agent
            .ok(180, &format!("sh /tmp/pc.sh verify-raw {}", raw.target))
            .await,
    );
    let hold_out = agent
        .ok(60, &format!("sh /tmp/pc.sh verify-hold {}", hold.target))
        .await;
    let (hold_ok, hold_bad) = verified(&hold_out);
    eprintln!(
        "daemon crash: resumed {resumed:?}; raw batches {raw_ok} verified, {raw_bad} bad; held \
         writes {hold_ok} verified, {hold_bad} bad"
    );
    assert_eq!(
        (raw_ok, raw_bad),
        (last.raw, 0),
        "fsynced batches read back"
    );
    assert_eq!(
        (hold_ok, hold_bad),
        (held, 0),
        "every write acknowledged before the crash reads back:\n{hold_out}"
    );
    let dmesg = agent.ok(10, "dmesg").await;
    let errors = edgevol_e2e::storage_errors(&dmesg);
    assert!(
        errors.is_empty(),
        "I/O errors on the node:\n{}",
        errors.join("\n")
    );

    // Nothing left, for the power cut that follows on the same VMs.
    for a in [&raw, &hold] {
        rig.detach_and_delete(a).await;
    }
    for v in rig.list_volumes().await {
        let v = v.volume.expect("a volume");
        assert_eq!(
            v.capacity_bytes, CRASH_TRIGGER_BYTES,
            "a volume left: {v:?}"
        );
        rig.delete(&v.volume_id).await;
    }
    rig.assert_nothing_left().await;
    agent.ok(10, "rm -f /tmp/pc-* /tmp/pc.pids").await;
}
