//! `edgevol keys rotate|revoke|list` as an operator runs them: the real binary against an
//! in-process dev appliance, over mTLS with the dev admin certificate.

use std::path::{Path, PathBuf};
use std::process::Output;

use edgevol_appliance::transport::certificate_sha256;
use edgevol_appliance::{start, Args, Config, Running};
use edgevol_pki::{files, Role, Validity};

use crate::common;

use common::ok;

const NQN_A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-5555-6666-7777-888888888888";
const NQN_B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-5555-6666-7777-888888888888";

async fn appliance(dir: &Path) -> Running {
    let config = Config::from_args(Args {
        dev: true,
        data_dir: Some(dir.to_path_buf()),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        nvme_listen: Some("127.0.0.1:0".parse().unwrap()),
        appliance_id: Some("keys-box".into()),
        ..Args::default()
    })
    .unwrap();
    let running = start(config).await.unwrap();
    common::pool_ready(&running).await;
    running
}

fn fingerprint(pki: &Path, name: &str) -> [u8; 32] {
    let certs = edgevol_pki::tls::load_certs(&pki.join(format!("{name}.pem"))).unwrap();
    certificate_sha256(&certs[0])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs `edgevol keys <args> --appliance .. --ca .. --cert <who>.pem --key <who>.key`.
async fn keys(running: &Running, pki: &Path, who: &str, args: &[&str]) -> Output {
    common::edgevol_as(running.local_addr, pki, who, "keys", args).await
}

/// The row of `node` in a `keys list` table, split into cells.
fn row(list: &str, node: &str) -> Vec<String> {
    let line = list
        .lines()
        .find(|l| l.split_whitespace().next() == Some(node))
        .unwrap_or_else(|| panic!("no row for {node}:\n{list}"));
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_lists_rotates_and_revokes_node_keys() {
    let dir = tempfile::tempdir().unwrap();
    let running = appliance(dir.path()).await;
    let pki: PathBuf = dir.path().join("pki");
    files::issue(&pki, Role::Node, "worker-2", Validity::days(1), false).unwrap();
    let store = running.host_keys.clone();
    let a = store
        .enrol("node", fingerprint(&pki, "node"), NQN_A)
        .unwrap();
    let b = store
        .enrol("worker-2", fingerprint(&pki, "worker-2"), NQN_B)
        .unwrap();
    let secrets: Vec<String> = [&a.key, &b.key]
        .iter()
        .flat_map(|k| [k.host_secret.encode(), k.ctrl_secret.encode()])
        .map(|text| text["DHHC-1:01:".len()..text.len() - 1].to_owned())
        .collect();
    let mut printed = String::new();

    let list = ok(&keys(&running, &pki, "admin", &["list"]).await);
    printed.push_str(&list);
    assert!(list.starts_with("NODE"), "{list}");
    let r = row(&list, "node");
    assert_eq!(&r[..4], ["node", NQN_A, "1", "-"], "{list}");
    assert_eq!(r[6], "never", "{list}");
    assert_eq!(&row(&list, "worker-2")[..4], ["worker-2", NQN_B, "2", "-"]);
    assert!(
        list.contains("2 node(s)") && !list.contains("REVOKED"),
        "{list}"
    );

    let out = ok(&keys(&running, &pki, "admin", &["rotate", "--node", "node"]).await);
    printed.push_str(&out);
    assert!(out.contains("node node: new keys, generation 3"), "{out}");
    let list = ok(&keys(&running, &pki, "admin", &["list"]).await);
    printed.push_str(&list);
    assert_eq!(&row(&list, "node")[..4], ["node", NQN_A, "3", "pending"]);
    assert_eq!(
        store
            .keys_for(NQN_A)
            .iter()
            .map(|k| k.generation)
            .collect::<Vec<_>>(),
        [3, 1]
    );

    let out = ok(&keys(&running, &pki, "admin", &["revoke", "--node", "worker-2"]).await);
    printed.push_str(&out);
    assert!(
        out.contains(&format!("host NQN {NQN_B} no longer authenticates"))
            && out.contains("1 certificate(s)"),
        "{out}"
    );
    assert!(store.keys_for(NQN_B).is_empty());
    let list = ok(&keys(&running, &pki, "admin", &["list"]).await);
    printed.push_str(&list);
    assert!(list.contains("1 node(s)"), "{list}");
    let revoked = row(&list, "worker-2");
    assert_eq!(revoked[0], "worker-2");
    assert_eq!(revoked[2], hex(&fingerprint(&pki, "worker-2")), "{list}");

    // Refusals: exit 1 and the appliance's reason.
    let out = keys(&running, &pki, "admin", &["rotate", "--node", "worker-2"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Rotate: NotFound") && err.contains("worker-2"),
        "{err}"
    );
    let out = keys(&running, &pki, "observer", &["list"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("PermissionDenied") && err.contains("may not call edgevol.v1.HostKeys/List"),
        "{err}"
    );

    for secret in &secrets {
        assert!(!printed.contains(secret.as_str()), "a secret was printed");
    }
    running.stop().await.unwrap();
}
