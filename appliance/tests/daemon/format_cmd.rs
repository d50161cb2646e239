//! `edgevold format` on file devices, as an operator runs it (stderr not a terminal): progress
//! lines up to 100%, a pool the daemon's code opens, refusals that change nothing, `--force`, and
//! the data area really deallocated.

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::DevAppliance;
use edgevol_appliance::naming::uuid_string;
use edgevol_appliance::pool;

use crate::common;

const SIZE: u64 = 64 << 20;

fn edgevold(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_edgevold"))
        .args(args)
        .env("RUST_LOG", "off")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + common::scaled(Duration::from_secs(60));
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("edgevold {args:?} did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn format(path: &Path, force: bool) -> Output {
    let mut args = vec!["format", "--device", path.to_str().unwrap()];
    if force {
        args.push("--force");
    }
    edgevold(&args)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A successful format: exit 0, progress lines at rising 10% steps ending at 100%, and the
/// uuid it printed.
fn formatted(out: &Output) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let steps: Vec<u32> = err
        .lines()
        .filter_map(|l| l.strip_prefix("discarding device blocks:"))
        .map(|rest| {
            rest.trim_start()
                .split('%')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(steps.last(), Some(&100), "progress reaches 100%: {err}");
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "rising: {err}");
    assert!(steps.iter().all(|s| s % 10 == 0), "10% steps: {err}");
    assert!(steps.len() >= 5, "a line per step, not just the end: {err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let uuid = stdout
        .split("edgevol pool ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no uuid in {stdout:?}"));
    uuid.to_owned()
}

/// Refused: exit 1, one line naming what the device holds.
fn assert_refused(out: &Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {err}");
    assert!(
        lines[0].starts_with("edgevold: error: refusing to format"),
        "{err}"
    );
    assert!(lines[0].contains(needle), "{needle:?} not in {err}");
    assert!(lines[0].contains("--force"), "{err}");
}

/// The uuid of the pool on `path`, opened by the daemon's own code.
fn open_uuid(path: &Path) -> String {
    let pool = pool::open(&[path.to_path_buf()], false).unwrap();
    uuid_string(pool.uuid())
}

fn sparse(path: &Path) {
    fs::File::create(path).unwrap().set_len(SIZE).unwrap();
}

/// Fills the whole file with pseudo-random bytes (so every block is allocated).
fn filled(path: &Path, seed: u64) {
    let mut x = seed | 1;
    let data: Vec<u8> = (0..SIZE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect();
    fs::write(path, data).unwrap();
}

fn allocated(path: &Path) -> u64 {
    fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn a_blank_file_is_formatted_with_progress_then_refused_then_forced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool.img");
    sparse(&path);
    let uuid = formatted(&format(&path, false));
    assert_eq!(open_uuid(&path), uuid, "the daemon's code opens it");

    let before = fs::read(&path).unwrap();
    assert_refused(&format(&path, false), &format!("edgevol pool {uuid}"));
    assert_eq!(fs::read(&path).unwrap(), before, "nothing changed");
    assert_eq!(open_uuid(&path), uuid, "the pool is intact");

    let out = format(&path, true);
    let again = formatted(&out);
    assert_ne!(again, uuid, "a new pool");
    assert!(
        stderr(&out).contains(&format!("formatting over edgevol pool {uuid} (--force)")),
        "{}",
        stderr(&out)
    );
    assert_eq!(open_uuid(&path), again);
}

#[test]
fn foreign_data_is_refused_unless_forced_and_the_data_area_is_deallocated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");

    filled(&path, 7);
    let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[0x53, 0xEF], 1080).unwrap();
    drop(f);
    let before = fs::read(&path).unwrap();
    assert_refused(&format(&path, false), "ext2/3/4 filesystem");
    assert_eq!(fs::read(&path).unwrap(), before, "nothing changed");

    filled(&path, 8);
    let before = fs::read(&path).unwrap();
    assert_refused(
        &format(&path, false),
        "data (non-zero bytes in the first MiB",
    );
    assert_eq!(fs::read(&path).unwrap(), before, "nothing changed");

    let full = allocated(&path);
    assert!(full >= SIZE, "filled: {full}");
    let uuid = formatted(&format(&path, true));
    let after = allocated(&path);
    // Only the superblocks and the first checkpoint stay written.
    assert!(
        after < SIZE / 8,
        "holes punched: {full} -> {after} bytes allocated"
    );
    let tail = fs::read(&path)
        .unwrap()
        .split_off(usize::try_from(SIZE / 2).unwrap());
    assert!(tail.iter().all(|b| *b == 0), "old data gone");
    assert_eq!(open_uuid(&path), uuid);
}

#[tokio::test]
async fn a_device_held_by_a_running_daemon_is_refused_until_it_stops() {
    let app = DevAppliance::start().await;
    app.ready().await;
    let path = app.dir.path().join("pool.img");
    let uuid = uuid_string(app.running.state.pool().unwrap().lock().unwrap().uuid());
    let out = format(&path, true);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with(&format!(
            "edgevold: error: device {} is in use",
            path.display()
        )),
        "{}",
        stderr(&out)
    );
    let DevAppliance { dir, running } = app;
    running.stop().await.unwrap();
    assert_eq!(open_uuid(&path), uuid, "untouched");
    assert_ne!(formatted(&format(&path, true)), uuid, "free once stopped");

    let missing = dir.path().join("missing.img");
    let out = format(&missing, false);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with(&format!("edgevold: error: device {}", missing.display())),
        "{}",
        stderr(&out)
    );
}
