//! What a first start leaves behind and writes: a missing data directory is created, private;
//! the log written to a pipe or a file is plain text, without terminal colour codes.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Runs edgevold in `cwd` with stdout and stderr to pipes (not a terminal) and info logging. The
/// starts below stop at their TLS files, after the data directory step: no daemon keeps running.
fn edgevold(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgevold"))
        .args(args)
        .current_dir(cwd)
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_missing_data_dir_is_created_private_and_the_log_has_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let out = edgevold(
        &[
            "--data-dir",
            "var/lib/edgevol",
            "--device",
            "pool.img",
            "--nvme-advertise",
            "192.0.2.1",
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let data = dir.path().join("var/lib/edgevol");
    let meta = std::fs::metadata(&data).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o777, 0o700, "private");
    assert!(stderr.contains("created the data directory"), "{stderr}");
    // It went on to the next step: the TLS files, which this start does not have.
    assert!(stderr.contains("edgevold: error: TLS"), "{stderr}");
    assert!(
        !out.stderr.contains(&0x1b),
        "an ESC byte (colour code) in a log that is not a terminal: {stderr:?}"
    );
}
