//! Data-path authentication end to end (issue 15): the appliance image with its shipped
//! configuration (every host must authenticate with DH-HMAC-CHAP) and a node VM whose
//! `edgevol-node` holds a `node` certificate from the appliance's CA. Run by
//! scripts/test-e2e-qemu.sh's step 5, one test per node VM (`--exact`):
//!
//! - on the 6.12 kernel (NVMe in-band authentication), the CO's whole flow: the plugin enrols,
//!   connects with `dhchap_secret` + `dhchap_ctrl_secret`, a file written is read back after the
//!   volume was unstaged and staged again (a second authenticated connect); the node's log says
//!   keys were used, the kernel that it authenticated the controller, the appliance that the
//!   node's pair authenticated;
//! - on the 6.1 kernel (no CONFIG_NVME_AUTH), the same node's NodeStageVolume fails with the
//!   plugin's FAILED_PRECONDITION naming CONFIG_NVME_AUTH, and nothing is left connected.
//!
//! Besides the EDGEVOL_E2E_* variables of the rig: EDGEVOL_E2E_NODE_LOG and
//! EDGEVOL_E2E_APPLIANCE_LOG (the VMs' console logs) and EDGEVOL_E2E_NODE_NAME (the node
//! certificate's name). Ignored unless run by the script.

use std::path::PathBuf;

use edgevol_e2e::rig::{capability, paths, Attached, Rig, CALL_SECS, MIB};
use edgevol_e2e::{appliance_channel, env_addr, within};
use edgevol_proto::edgevol::v1::host_keys_client::HostKeysClient;
use edgevol_proto::edgevol::v1::ListRequest;

/// What the plugin logs for each connect (fabrics.rs), and the value saying keys were used.
const CONNECT_LINE: &str = "connecting NVMe/TCP controller";
const WITH_KEYS: &str = "authentication=\"DH-HMAC-CHAP bidirectional\"";
/// The start of every DH-HMAC-CHAP secret's representation: never in a log or an error.
const SECRET_PREFIX: &str = "DHHC-1:";

fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} not set: run scripts/test-e2e-qemu.sh"))
}

/// A VM's console log without the ANSI colours of the plugin's log lines.
fn console_log(var: &str) -> String {
    let path = PathBuf::from(env(var));
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = String::from_utf8_lossy(&raw);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI sequence: ESC [ parameters final-byte (0x40..=0x7e).
            for c in chars.by_ref() {
                if ('\u{40}'..='\u{7e}').contains(&c) && c != '[' {
                    break;
                }
            }
        } else if c != '\r' {
            out.push(c);
        }
    }
    out
}

/// The node's NVMe controllers (none expected once a volume is unstaged or refused).
async fn controllers(rig: &Rig) -> String {
    rig.agent
        .ok(
            10,
            "ls /sys/class/nvme-fabrics/ctl 2>/dev/null; ls /sys/class/nvme",
        )
        .await
}

fn assert_no_controller(ls: &str, when: &str) {
    assert!(
        !ls.split_whitespace().any(|n| n.starts_with("nvme")),
        "NVMe controllers connected on the node {when}: {ls}"
    );
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh (step 5)"]
async fn node_with_keys_enrols_stages_writes_and_reads_back_authenticated() {
    let mut rig = Rig::new().await;
    let release = rig.agent.ok(10, "uname -r").await;
    assert!(release.starts_with("6.12."), "the node runs {release}");

    let vol = rig.create("auth-fs", 32 * MIB, false, None).await;
    let a = rig.attach(&vol, false, "auth-fs").await;
    for (k, v) in &a.context {
        assert!(
            !v.contains(SECRET_PREFIX),
            "publish_context {k} carries a secret"
        );
    }

    // The kernel holds both keys of the controller (read in the guest, never printed) and has
    // verified the appliance's answer with the controller key (bidirectional).
    let keyed = rig
        .agent
        .ok(
            10,
            "for c in /sys/class/nvme/nvme*; do \
               grep -q '^DHHC-1:' $c/dhchap_secret && grep -q '^DHHC-1:' $c/dhchap_ctrl_secret \
               && echo keyed $(basename $c); done; true",
        )
        .await;
    assert!(
        keyed.contains("keyed nvme"),
        "no controller holds DH-HMAC-CHAP keys: {keyed:?}"
    );
    let dmesg = rig
        .agent
        .ok(10, "dmesg | grep 'nvme.*authenticated'; true")
        .await;
    assert!(
        dmesg.contains("authenticated with hash") && dmesg.contains("controller authenticated"),
        "the kernel did not report a bidirectional authentication:\n{dmesg}"
    );
    eprintln!("node kernel:\n{}", dmesg.trim_end());

    // A file written through the authenticated connection...
    let t = a.target.clone();
    rig.agent
        .ok(
            90,
            &format!(
                "cd {t} && dd if=/dev/urandom of=data.bin bs=1M count=4 2>/dev/null && \
                 echo authenticated > note && sync && sha256sum data.bin note > /tmp/auth.sums"
            ),
        )
        .await;
    // ... read back after a disconnect and a second authenticated connect.
    rig.node_unpublish(&a.volume_id, &a.target).await;
    rig.node_unstage(&a.volume_id, &a.staging).await;
    assert_no_controller(&controllers(&rig).await, "after NodeUnstageVolume");
    within(
        CALL_SECS,
        "NodeStageVolume (again)",
        rig.node.node_stage_volume(rig.stage_req(&a)),
    )
    .await
    .expect("NodeStageVolume (again)");
    within(
        CALL_SECS,
        "NodePublishVolume (again)",
        rig.node
            .node_publish_volume(rig.publish_req(&a, &a.target, false)),
    )
    .await
    .expect("NodePublishVolume (again)");
    let out = rig
        .agent
        .ok(
            60,
            &format!("cd {t} && sha256sum -c /tmp/auth.sums && cat note"),
        )
        .await;
    assert!(
        out.trim_end().ends_with("authenticated"),
        "read back:\n{out}"
    );

    rig.detach_and_delete(&a).await;
    rig.assert_nothing_left().await;

    // The node's log: every connect used keys (two stages: two lines at least), no secret.
    let node_log = console_log("EDGEVOL_E2E_NODE_LOG");
    let connects: Vec<&str> = node_log
        .lines()
        .filter(|l| l.contains(CONNECT_LINE))
        .collect();
    assert!(
        connects.len() >= 2,
        "expected two connects in the node's log, found {connects:#?}"
    );
    for l in &connects {
        assert!(
            l.contains(WITH_KEYS) && l.contains("key_generation="),
            "a connect without keys: {l}"
        );
    }
    assert!(
        !node_log.contains(SECRET_PREFIX),
        "a secret in the node's log"
    );

    // The appliance: the node enrolled with its NQN, and its pair authenticated on the data path;
    // no transaction failed; no secret in its log.
    let pki = PathBuf::from(env("EDGEVOL_E2E_PKI"));
    let mut keys =
        HostKeysClient::new(appliance_channel(env_addr("EDGEVOL_E2E_CSI"), &pki, "admin").await);
    let list = within(CALL_SECS, "HostKeys.List", keys.list(ListRequest {}))
        .await
        .expect("HostKeys.List")
        .into_inner();
    let name = env("EDGEVOL_E2E_NODE_NAME");
    let node = list
        .nodes
        .iter()
        .find(|n| n.node == name)
        .unwrap_or_else(|| panic!("node {name} not enrolled: {list:?}"));
    assert_eq!(node.host_nqn, rig.node_id, "the NQN bound to {name}");
    assert!(node.generation >= 1 && !node.rotation_pending, "{node:?}");
    assert!(
        node.last_authenticated.is_some(),
        "the appliance saw no authentication of {name}: {node:?}"
    );
    eprintln!("appliance HostKeys.List: {node:?}");
    // The console copies edgevold's log with `tail -f` (and TCG guests lag): wait for the line.
    let created = |log: &str| {
        log.lines()
            .any(|l| l.contains("controller created") && l.contains(&rig.node_id))
    };
    let mut alog = console_log("EDGEVOL_E2E_APPLIANCE_LOG");
    let deadline = std::time::Instant::now() + edgevol_e2e::scaled_secs(30);
    while std::time::Instant::now() < deadline {
        if created(&alog) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        alog = console_log("EDGEVOL_E2E_APPLIANCE_LOG");
    }
    assert!(
        created(&alog),
        "no controller of {} in the appliance's log",
        rig.node_id
    );
    assert!(
        !alog.contains("authentication failed"),
        "a failed authentication in the appliance's log"
    );
    assert!(
        !alog.contains(SECRET_PREFIX),
        "a secret in the appliance's log"
    );
}

#[tokio::test]
#[ignore = "needs the QEMU VMs of scripts/test-e2e-qemu.sh (step 5)"]
async fn kernel_without_nvme_auth_fails_the_stage_clearly() {
    let mut rig = Rig::new().await;
    let release = rig.agent.ok(10, "uname -r").await;
    assert!(release.starts_with("6.1."), "the node runs {release}");

    let vol = rig.create("auth-61", 16 * MIB, true, None).await;
    let cap = capability(true);
    let context = rig.controller_publish(&vol.volume_id, &cap).await;
    let (staging, target) = paths("auth-61", true);
    let a = Attached {
        volume_id: vol.volume_id.clone(),
        staging,
        target,
        cap,
        context,
        volume_context: vol.volume_context.clone(),
    };
    rig.agent.ok(10, &format!("mkdir -p {}", a.staging)).await;
    let err = within(
        CALL_SECS,
        "NodeStageVolume",
        rig.node.node_stage_volume(rig.stage_req(&a)),
    )
    .await
    .expect_err("NodeStageVolume on a kernel without NVMe authentication");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("CONFIG_NVME_AUTH"),
        "the message does not name CONFIG_NVME_AUTH: {}",
        err.message()
    );
    assert!(
        !err.message().contains(SECRET_PREFIX),
        "a secret in the error"
    );
    eprintln!("NodeStageVolume on {}: {}", release.trim(), err.message());

    // Nothing connected, nothing staged, and the kernel was not asked to connect.
    assert_no_controller(&controllers(&rig).await, "after the refused stage");
    rig.node_unstage(&a.volume_id, &a.staging).await;
    let node_log = console_log("EDGEVOL_E2E_NODE_LOG");
    assert!(
        !node_log.contains(CONNECT_LINE),
        "the plugin tried to connect on a kernel without NVMe authentication"
    );
    assert!(
        !node_log.contains(SECRET_PREFIX),
        "a secret in the node's log"
    );

    rig.controller_unpublish(&a.volume_id).await;
    rig.delete(&a.volume_id).await;
    rig.assert_nothing_left().await;
}
