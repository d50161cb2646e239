//! A firmware update of the appliance while a node writes (project issue 19,
//! scripts/test-firmware-qemu.sh step 2): the appliance firmware image VM serves a node VM
//! (qemu/node-vm.sh, the real `edgevol-node` with its default connect options: ctrl_loss_tmo
//! 600 s, fast_io_fail_tmo 90 s) an ext4 volume on which the node writes 256 KiB files, each
//! fsynced, and logs what each fsync made durable (qemu/faults-powercut-node.sh's `fs` writer).
//!
//! * [`before_the_update_a_node_writes`]: the volume is created, staged and published, the writer
//!   runs in the background and has made files durable. The script then updates the appliance
//!   and activates the update: the appliance reboots into its new slot (a trial boot) while the
//!   node's writes wait.
//! * [`after_the_update_the_node_resumes_and_its_data_verifies`]: the writer goes on by itself
//!   (the kernel reconnected within its ctrl_loss_tmo: "Successfully reconnected" in dmesg), no
//!   write or fsync failed, every fsynced file reads back with the page cache dropped, and the
//!   node's dmesg has no I/O or file-system error; then the volume is detached and deleted and
//!   nothing is left on either VM.
//!
//! Needs the VMs and EDGEVOL_E2E_* variables of the script; ignored otherwise.

use std::time::{Duration, Instant};

use edgevol_e2e::rig::{paths, Rig, MIB};
use edgevol_e2e::{Agent, WriterCounts};

/// The node-side writer, sent through the agent to /tmp/pc.sh.
const NODE_SCRIPT: &str = include_str!("../../../qemu/faults-powercut-node.sh");
/// The volume's name and its kubelet-style paths' tag.
const TAG: &str = "fw-update";
/// Durable writes before the update, and after it (the node resumed).
const BEFORE: u64 = 5;
const AFTER: u64 = 5;
/// Budgets: the writes before the update; after it, the node's resumption (the script has
/// waited for READY already; the kernel retries every reconnect_delay, 2 s, under TCG with two
/// VMs on a shared 2-core machine).
const WRITES_S: u64 = 120;
const RESUME_S: u64 = 180;

/// The writer's durable files and failed writes.
async fn counts(agent: &Agent) -> (u64, u64) {
    let c = WriterCounts::read(agent).await;
    (c.field("fs"), c.field("fs-errors"))
}

/// Polls until the writer has `at_least` durable files; panics with `what` after `secs`.
async fn wait_files(agent: &Agent, at_least: u64, secs: u64, what: &str) -> u64 {
    let t = Instant::now();
    loop {
        let (files, errors) = counts(agent).await;
        assert_eq!(
            errors,
            0,
            "{what}: the writer saw failed writes or fsyncs:\n{}",
            agent.ok(10, "cat /tmp/pc-fs.err").await
        );
        if files >= at_least {
            return files;
        }
        assert!(
            t.elapsed() < edgevol_e2e::scaled_secs(secs),
            "{what}: {files} durable files, not {at_least}, within {:?}",
            edgevol_e2e::scaled_secs(secs)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
#[ignore = "needs the VMs of scripts/test-firmware-qemu.sh"]
async fn before_the_update_a_node_writes() {
    let mut rig = Rig::new().await;
    rig.agent
        .ok(
            20,
            &format!(
                "cat >/tmp/pc.sh <<'EDGEVOL-PC-EOF'\n{NODE_SCRIPT}EDGEVOL-PC-EOF\ndmesg -c >/dev/null"
            ),
        )
        .await;
    let volume = rig.create(TAG, 64 * MIB, false, None).await;
    let a = rig.attach(&volume, false, TAG).await;
    // In the background, its output in files: the agent answers once sh exits.
    rig.agent
        .ok(
            20,
            &format!(
                "sh /tmp/pc.sh fs {} </dev/null >/tmp/pc-fs.out 2>&1 &\necho $! >/tmp/pc.pids",
                a.target
            ),
        )
        .await;
    let files = wait_files(&rig.agent, BEFORE, WRITES_S, "before the update").await;
    eprintln!("firmware update: {files} files durable on the node before the update");
}

#[tokio::test]
#[ignore = "needs the VMs of scripts/test-firmware-qemu.sh, after the appliance's update"]
async fn after_the_update_the_node_resumes_and_its_data_verifies() {
    let mut rig = Rig::new().await;
    let (at_ready, _) = counts(&rig.agent).await;
    let t = Instant::now();
    let resumed = wait_files(&rig.agent, at_ready + AFTER, RESUME_S, "after the update").await;
    eprintln!(
        "firmware update: the node's writer went on by itself: {resumed} files durable, \
         {AFTER} more in {:.0} s once the appliance was back",
        t.elapsed().as_secs_f64()
    );
    rig.agent
        .ok(
            90,
            "touch /tmp/pc-stop; for p in $(cat /tmp/pc.pids); do \
             while kill -0 $p 2>/dev/null; do sleep 0.2; done; done",
        )
        .await;
    let (files, errors) = counts(&rig.agent).await;
    assert_eq!(
        errors,
        0,
        "the writer saw failed writes or fsyncs:\n{}",
        rig.agent.ok(10, "cat /tmp/pc-fs.err").await
    );

    let (staging, target) = paths(TAG, false);
    let out = rig
        .agent
        .ok(180, &format!("sh /tmp/pc.sh verify-fs {target}"))
        .await;
    let verdict = out
        .lines()
        .find(|l| l.starts_with("verified "))
        .unwrap_or_else(|| panic!("no verdict in:\n{out}"));
    assert_eq!(
        verdict,
        format!("verified {files} bad 0"),
        "every fsynced file reads back:\n{out}"
    );
    eprintln!("firmware update: {verdict} (page cache dropped)");

    let dmesg = rig.agent.ok(10, "dmesg").await;
    let errors = edgevol_e2e::storage_errors(&dmesg);
    assert!(
        errors.is_empty(),
        "I/O or file system errors in the node's dmesg:\n{}",
        errors.join("\n")
    );
    let reconnects: Vec<&str> = dmesg
        .lines()
        .filter(|l| l.contains("Successfully reconnected"))
        .collect();
    assert!(
        !reconnects.is_empty(),
        "the node's controller never reconnected (did the appliance reboot?):\n{dmesg}"
    );
    eprintln!("firmware update: node dmesg: {}", reconnects.join("; "));

    let id = rig.only_volume("the update test").await;
    rig.node_unpublish(&id, &target).await;
    rig.node_unstage(&id, &staging).await;
    rig.controller_unpublish(&id).await;
    rig.delete(&id).await;
    rig.assert_nothing_left().await;
}
