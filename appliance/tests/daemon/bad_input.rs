//! Bad start-up input: one clear line naming the culprit, a non-zero exit, never a panic and
//! never a daemon left running.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn edgevold(args: &[&str], cwd: &Path) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_edgevold"))
        .args(args)
        .current_dir(cwd)
        .env("RUST_LOG", "off")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A refused start exits at once; one that starts would run until killed.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("edgevold {args:?} kept running: it should have refused to start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn assert_refused(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit status {:?}", out.status);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected, got: {stderr}");
    assert!(lines[0].starts_with("edgevold: error: "), "{stderr}");
    assert!(lines[0].contains(needle), "{needle:?} not in {stderr}");
}

#[test]
fn malformed_toml_names_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.toml"),
        "listen = \"127.0.0.1:1\"\ndevices = [\n",
    )
    .unwrap();
    let out = edgevold(&["--config", "bad.toml"], dir.path());
    assert_refused(&out, "bad.toml at line");
}

#[test]
fn a_missing_certificate_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = edgevold(
        &[
            "--dev",
            "--data-dir",
            "d",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            "/nonexistent/server.pem",
        ],
        dir.path(),
    );
    assert_refused(&out, "/nonexistent/server.pem: No such file or directory");
}

#[test]
fn an_unusable_data_dir_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("plain-file"), b"x").unwrap();
    let out = edgevold(
        &[
            "--dev",
            "--data-dir",
            "plain-file",
            "--listen",
            "127.0.0.1:0",
        ],
        dir.path(),
    );
    assert_refused(&out, "data dir plain-file");
    // A missing data dir is created (tests/first_start.rs), unless a file stands in the way.
    let out = edgevold(
        &[
            "--data-dir",
            "plain-file/state",
            "--device",
            "/nonexistent/pool.img",
            "--nvme-advertise",
            "192.0.2.1",
        ],
        dir.path(),
    );
    assert_refused(&out, "data dir plain-file: File exists");
}

#[test]
fn a_port_in_use_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = edgevold(&["--dev", "--data-dir", "d", "--listen", &addr], dir.path());
    assert_refused(&out, &format!("listen {addr}: Address already in use"));
}

#[test]
fn a_data_dir_in_use_by_another_daemon_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    std::fs::create_dir(&data).unwrap();
    let lock = std::fs::File::create(data.join("edgevold.lock")).unwrap();
    lock.lock().unwrap();
    let out = edgevold(
        &["--dev", "--data-dir", "d", "--listen", "127.0.0.1:0"],
        dir.path(),
    );
    assert_refused(&out, "is held by another edgevold");
}

#[test]
fn a_device_with_foreign_data_is_refused_not_formatted() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let mut data = vec![0u8; 8 << 20];
    data[510] = 0x55;
    data[511] = 0xaa; // an MBR signature
    std::fs::write(&disk, &data).unwrap();
    let out = edgevold(
        &[
            "--dev",
            "--data-dir",
            "d",
            "--listen",
            "127.0.0.1:0",
            "--device",
            "disk.img",
        ],
        dir.path(),
    );
    assert_refused(
        &out,
        "holds no edgevol pool and is not blank; refusing to format it",
    );
    assert_eq!(std::fs::read(&disk).unwrap(), data);
}
