//! `edgevol pki init` / `edgevol pki issue` as an operator runs them.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use edgevol_pki::{PeerIdentity, Role};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

fn edgevol(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgevol"))
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn init_and_issue_write_0600_keys_and_refuse_to_overwrite_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = edgevol(&[
        "pki",
        "init",
        "--dir",
        d,
        "--san",
        "box.example",
        "--san",
        "10.0.0.5",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&dir.path().join("ca.key")), 0o600);
    assert_eq!(mode(&dir.path().join("server.key")), 0o600);

    let out = edgevol(&["pki", "init", "--dir", d, "--san", "box.example"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("already exists (pass --force to overwrite)"),
        "{stderr}"
    );

    let out = edgevol(&[
        "pki",
        "issue",
        "--dir",
        d,
        "--role",
        "controller",
        "--name",
        "kube",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&dir.path().join("kube.key")), 0o600);
    let pem = std::fs::read(dir.path().join("kube.pem")).unwrap();
    let id = PeerIdentity::from_der(&CertificateDer::from_pem_slice(&pem).unwrap()).unwrap();
    assert_eq!((id.name.as_str(), id.role), ("kube", Role::Controller));

    let out = edgevol(&[
        "pki", "issue", "--dir", d, "--role", "admin", "--name", "kube",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let out = edgevol(&[
        "pki", "issue", "--dir", d, "--role", "admin", "--name", "kube", "--force",
    ]);
    assert!(out.status.success());
    let pem = std::fs::read(dir.path().join("kube.pem")).unwrap();
    let id = PeerIdentity::from_der(&CertificateDer::from_pem_slice(&pem).unwrap()).unwrap();
    assert_eq!(id.role, Role::Admin);

    let out = edgevol(&["pki", "issue", "--dir", d, "--role", "root", "--name", "x"]);
    assert_eq!(out.status.code(), Some(2), "clap refuses an unknown role");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown role \"root\""));
    let out = edgevol(&[
        "pki", "issue", "--dir", d, "--role", "admin", "--name", "../x",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid name"));
}

#[test]
fn issue_makes_node_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    assert!(
        edgevol(&["pki", "init", "--dir", d, "--san", "box.example"])
            .status
            .success()
    );
    let out = edgevol(&[
        "pki", "issue", "--dir", d, "--role", "node", "--name", "worker-7",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("node client \"worker-7\""));
    assert_eq!(mode(&dir.path().join("worker-7.key")), 0o600);
    let pem = std::fs::read(dir.path().join("worker-7.pem")).unwrap();
    let id = PeerIdentity::from_der(&CertificateDer::from_pem_slice(&pem).unwrap()).unwrap();
    assert_eq!((id.name.as_str(), id.role), ("worker-7", Role::Node));
}

#[test]
fn server_issues_another_appliances_certificate_from_the_site_ca() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    assert!(edgevol(&["pki", "init", "--dir", d, "--san", "box-a.lan"])
        .status
        .success());
    let server = [
        "pki",
        "server",
        "--dir",
        d,
        "--name",
        "box-b",
        "--san",
        "box-b.lan",
    ];
    let out = edgevol(&server);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&dir.path().join("box-b.key")), 0o600);
    let out = edgevol(&server);
    assert_eq!(out.status.code(), Some(1));
    let out = edgevol(&["pki", "server", "--dir", d, "--name", "ca", "--san", "x"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the CA's own files are not a name"
    );
}
