//! `edgevol firmware status|update|activate|rollback` as an operator runs them: the real binary
//! against an in-process dev appliance whose boot partition is a temp directory laid out as
//! image/build.sh lays it out, over mTLS. The "reboot" is a command that leaves a marker; the
//! next boot is a new daemon on the same directories with the loader's choice on its command
//! line, as GRUB would make it from grubenv.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use edgevol_appliance::config::FirmwareConfig;
use edgevol_appliance::{start, Running};
use edgevol_firmware::bootenv;
use edgevol_firmware::bundle;
use edgevol_firmware::key::SigningKey;
use edgevol_firmware::slots::SlotId;

use crate::common;

use common::ok;

struct Box_ {
    dir: tempfile::TempDir,
    key: SigningKey,
    /// The key as the operator keeps it (PKCS#8 PEM), for `edgevol pki sign-firmware`.
    key_pem: String,
}

impl Box_ {
    fn new() -> Box_ {
        let dir = tempfile::tempdir().unwrap();
        let boot = dir.path().join("boot");
        std::fs::create_dir_all(boot.join("slot-a")).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_edgevol"))
            .args(["firmware", "boot-files", "--out"])
            .arg(&boot)
            .output()
            .unwrap();
        assert!(out.status.success());
        // ldlinux.sys: loader code, then the empty ADV syslinux installs.
        let mut ldlinux = vec![0x90u8; 4096];
        ldlinux.extend_from_slice(&bootenv::adv(None));
        std::fs::write(boot.join("ldlinux.sys"), ldlinux).unwrap();
        std::fs::write(boot.join("slot-a/vmlinuz"), b"kernel 1.0").unwrap();
        std::fs::write(boot.join("slot-a/initramfs.gz"), b"initramfs 1.0").unwrap();
        let (key, key_pem) = SigningKey::generate().unwrap();
        std::fs::write(
            dir.path().join("firmware.pub"),
            key.verifying_key().to_hex(),
        )
        .unwrap();
        std::fs::write(dir.path().join("watchdog"), b"").unwrap();
        Box_ { dir, key, key_pem }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Boots `slot` running `version`: the kernel command line and the image's version file.
    async fn boot(&self, slot: SlotId, version: &str) -> Running {
        std::fs::write(
            self.path("cmdline"),
            format!("console=ttyS0 edgevol.slot={}\n", slot.letter()),
        )
        .unwrap();
        std::fs::write(self.path("version"), format!("{version}\n")).unwrap();
        let _ = std::fs::remove_file(self.path("rebooted"));
        let mut config =
            common::dev_config(&self.path("data"), "127.0.0.1:0".parse().unwrap(), "fw-box");
        config.firmware = Some(FirmwareConfig {
            boot_dir: self.path("boot"),
            public_key: self.path("firmware.pub"),
            version_file: self.path("version"),
            cmdline: self.path("cmdline"),
            health_hold: Duration::from_secs(2),
            watchdog: Some(self.path("watchdog")),
            reboot_command: vec!["touch".into(), self.path("rebooted").display().to_string()],
        });
        let running = start(config).await.unwrap();
        common::pool_ready(&running).await;
        running
    }

    /// What GRUB does at boot: the trial once (cleared first), else the primary.
    fn loader_pick(&self) -> SlotId {
        let path = self.path("boot/grubenv");
        let mut env = bootenv::parse_grubenv(&std::fs::read(&path).unwrap()).unwrap();
        let slot = env.trial.take().unwrap_or(env.primary);
        std::fs::write(&path, bootenv::grubenv(&env)).unwrap();
        slot
    }

    fn bundle(&self, key: &SigningKey, arch: &str, version: &str) -> PathBuf {
        let bytes = bundle::build(
            key,
            arch,
            version,
            format!("kernel {version}").as_bytes(),
            format!("initramfs {version}").as_bytes(),
        )
        .unwrap();
        let id = key.verifying_key().id();
        let path = self.path(&format!("{version}-{arch}-{id}.bundle"));
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

/// Runs `edgevol firmware <args> ...` with the dev certificate of `who`.
async fn firmware(running: &Running, data: &Path, who: &str, args: &[&str]) -> Output {
    common::edgevol_as(running.local_addr, &data.join("pki"), who, "firmware", args).await
}

fn err(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "edgevol succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr.clone()).unwrap()
}

/// How long a test waits for the daemon to reboot or confirm a slot (times the load's scale).
fn patience() -> Duration {
    common::scaled(Duration::from_secs(20))
}

async fn wait_for(path: &Path) {
    let deadline = tokio::time::Instant::now() + patience();
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `firmware status` once it says `want` (its last answer when it never did).
async fn status_saying(running: &Running, data: &Path, want: &str) -> String {
    let deadline = tokio::time::Instant::now() + patience();
    loop {
        let status = ok(&firmware(running, data, "admin", &["status"]).await);
        if status.contains(want) || tokio::time::Instant::now() >= deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_activate_confirm_and_roll_back() {
    let b = Box_::new();
    let data = b.path("data");
    let running = b.boot(SlotId::A, "1.0").await;

    let status = ok(&firmware(&running, &data, "admin", &["status"]).await);
    assert!(
        status.contains("running    slot A (version 1.0), normal boot"),
        "{status}"
    );
    assert!(status.contains("slot B     empty"), "{status}");
    // Admin only: not even an observer may read it.
    let denied = err(&firmware(&running, &data, "observer", &["status"]).await);
    assert!(
        denied.contains("PermissionDenied") || denied.contains("may not call"),
        "{denied}"
    );
    let denied = err(&firmware(&running, &data, "controller", &["rollback"]).await);
    assert!(denied.contains("may not call"), "{denied}");

    // Refused bundles: nothing written.
    let other = SigningKey::generate().unwrap().0;
    let good = b.bundle(&b.key, "x86_64", "2.0");
    let truncated = b.path("truncated.bundle");
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
    for (bad, why) in [
        (truncated, "truncated bundle"),
        (b.bundle(&other, "x86_64", "2.0"), "trusts key"),
        (b.bundle(&b.key, "aarch64", "2.0"), "architecture"),
    ] {
        let e = err(&firmware(&running, &data, "admin", &["update", bad.to_str().unwrap()]).await);
        assert!(e.contains(why) && e.contains("nothing written"), "{e}");
    }
    assert!(
        !b.path("boot/slot-b").exists(),
        "a refused bundle wrote something"
    );
    let e = err(&firmware(&running, &data, "admin", &["activate"]).await);
    assert!(e.contains("nothing to activate"), "{e}");

    // A good one: written into B, armed in both loaders.
    let out = ok(&firmware(
        &running,
        &data,
        "admin",
        &["update", good.to_str().unwrap()],
    )
    .await);
    assert!(out.contains("version 2.0 written to slot B"), "{out}");
    assert_eq!(
        std::fs::read(b.path("boot/slot-b/vmlinuz")).unwrap(),
        b"kernel 2.0"
    );
    let status = ok(&firmware(&running, &data, "admin", &["status"]).await);
    assert!(status.contains("slot B     try-once"), "{status}");
    assert!(
        status
            .contains("next boot  UEFI: slot B once, then slot A; BIOS: slot B once, then slot A"),
        "{status}"
    );
    let out = ok(&firmware(&running, &data, "admin", &["activate"]).await);
    assert!(out.contains("rebooting into slot B"), "{out}");
    wait_for(&b.path("rebooted")).await;
    running.stop().await.unwrap();

    // The trial boot: healthy for the hold, so it confirms itself.
    assert_eq!(b.loader_pick(), SlotId::B);
    let running = b.boot(SlotId::B, "2.0").await;
    let confirmed = status_saying(&running, &data, "slot B     good").await;
    assert!(confirmed.contains("primary    slot B"), "{confirmed}");
    assert!(confirmed.contains("slot A     good"), "{confirmed}");
    assert!(
        !std::fs::read(b.path("watchdog")).unwrap().is_empty(),
        "the watchdog was never petted"
    );

    // And back, by hand.
    let out = ok(&firmware(&running, &data, "admin", &["rollback"]).await);
    assert!(out.contains("the next boot runs slot A"), "{out}");
    let status = ok(&firmware(&running, &data, "admin", &["status"]).await);
    assert!(
        status.contains("rollback requested by an admin"),
        "{status}"
    );
    running.stop().await.unwrap();
    assert_eq!(b.loader_pick(), SlotId::A);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trial_that_never_confirms_rolls_back_and_says_why() {
    let b = Box_::new();
    let data = b.path("data");
    let running = b.boot(SlotId::A, "1.0").await;
    let good = b.bundle(&b.key, "x86_64", "2.0");
    ok(&firmware(
        &running,
        &data,
        "admin",
        &["update", good.to_str().unwrap()],
    )
    .await);
    running.stop().await.unwrap();

    // The trial boot dies before its health hold (stopped at once: a hang the watchdog cuts).
    assert_eq!(b.loader_pick(), SlotId::B);
    let running = b.boot(SlotId::B, "2.0").await;
    running.stop().await.unwrap();

    assert_eq!(b.loader_pick(), SlotId::A);
    let running = b.boot(SlotId::A, "1.0").await;
    let status = ok(&firmware(&running, &data, "admin", &["status"]).await);
    assert!(
        status.contains("running    slot A (version 1.0), rolled back boot"),
        "{status}"
    );
    assert!(status.contains("slot B     bad"), "{status}");
    assert!(
        status
            .contains("slot B (version 2.0): the trial boot ended before its health check passed"),
        "{status}"
    );
    running.stop().await.unwrap();
}

/// Gives the dev pool at `path` (4 KiB blocks) format version 4 with an unknown *compatible*
/// feature bit, as firmware that writes such a feature leaves it: this build still opens it
/// read-write, firmware that reads only version 3 does not. The superblock layout of core's
/// `superblock.rs`, spelled out.
fn make_pool_version_4(path: &Path) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut head = vec![0u8; 8192];
    file.read_exact_at(&mut head, 0).unwrap();
    for copy in 0..2 {
        let sb = &mut head[copy * 4096..copy * 4096 + 100];
        sb[8..12].copy_from_slice(&4u32.to_le_bytes());
        let crc = edgevol_core::crc32c(&sb[..68]);
        sb[68..72].copy_from_slice(&crc.to_le_bytes());
        sb[72..80].copy_from_slice(&(1u64 << 5).to_le_bytes());
        sb[80..96].fill(0);
        let crc = edgevol_core::crc32c(&sb[..96]);
        sb[96..100].copy_from_slice(&crc.to_le_bytes());
    }
    file.write_all_at(&head, 0).unwrap();
    file.sync_all().unwrap();
}

/// What a firmware that reads format versions 3-4 declares (this build, and the one written
/// here as "2.0").
const READS_3_TO_4: &str =
    "edgevol-pool-format 1 versions 3-4 compatible 0x0 read-only-compatible 0x0 incompatible 0x0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_and_rollbacks_that_cannot_read_the_pool_are_refused() {
    let b = Box_::new();
    let data = b.path("data");
    // First boot formats the pool (version 3); then the pool becomes version 4.
    b.boot(SlotId::A, "1.0").await.stop().await.unwrap();
    make_pool_version_4(&data.join("pool.img"));
    let running = b.boot(SlotId::A, "1.0").await;
    assert_eq!(
        std::fs::read_to_string(b.path("boot/slot-a/pool-format")).unwrap(),
        format!("{READS_3_TO_4}\n"),
        "the running slot records what it reads"
    );

    // A bundle declaring nothing reads exactly version 3: refused, nothing written.
    let old = b.bundle(&b.key, "x86_64", "0.9");
    let e = err(&firmware(&running, &data, "admin", &["update", old.to_str().unwrap()]).await);
    assert!(
        e.contains("firmware 0.9 cannot use the pool in use (the pool's format version 4 is newer than it supports (3): it would refuse the pool); bundle refused, nothing written"),
        "{e}"
    );
    assert!(!b.path("boot/slot-b/vmlinuz").exists(), "nothing written");

    // One declaring 3-4, signed by the CLI as an operator does, goes in; its slot records it.
    let kernel = b.path("kernel-2.0");
    let initramfs = b.path("initramfs-2.0");
    std::fs::write(&kernel, b"kernel 2.0").unwrap();
    std::fs::write(&initramfs, b"initramfs 2.0").unwrap();
    let signing = b.path("firmware.key");
    std::fs::write(&signing, &b.key_pem).unwrap();
    let new = b.path("2.0.bundle");
    let out = Command::new(env!("CARGO_BIN_EXE_edgevol"))
        .args([
            "pki",
            "sign-firmware",
            "--version",
            "2.0",
            "--pool-format",
            READS_3_TO_4,
        ])
        .arg("--key")
        .arg(&signing)
        .arg("--kernel")
        .arg(&kernel)
        .arg("--initramfs")
        .arg(&initramfs)
        .arg("--out")
        .arg(&new)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("reads      pool format versions 3-4"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    ok(&firmware(&running, &data, "admin", &["update", new.to_str().unwrap()]).await);
    assert_eq!(
        std::fs::read_to_string(b.path("boot/slot-b/pool-format")).unwrap(),
        format!("{READS_3_TO_4}\n")
    );
    ok(&firmware(&running, &data, "admin", &["activate"]).await);
    wait_for(&b.path("rebooted")).await;
    running.stop().await.unwrap();
    // Slot A is now taken for firmware that reads version 3 only (what a slot written before
    // the record, or by such firmware, is).
    std::fs::remove_file(b.path("boot/slot-a/pool-format")).unwrap();

    assert_eq!(b.loader_pick(), SlotId::B);
    let running = b.boot(SlotId::B, "2.0").await;
    let status = status_saying(&running, &data, "slot B     good").await;
    assert!(status.contains("primary    slot B"), "{status}");
    let e = err(&firmware(&running, &data, "admin", &["rollback"]).await);
    assert!(
        e.contains("slot A (version 1.0) cannot use the pool in use (the pool's format version 4 is newer than it supports (3): it would refuse the pool); rollback refused, nothing changed. With --force it boots anyway"),
        "{e}"
    );
    let unchanged = ok(&firmware(&running, &data, "admin", &["status"]).await);
    assert!(unchanged.contains("primary    slot B"), "{unchanged}");
    let out = ok(&firmware(&running, &data, "admin", &["rollback", "--force"]).await);
    assert!(out.contains("the next boot runs slot A"), "{out}");
    running.stop().await.unwrap();
    assert_eq!(b.loader_pick(), SlotId::A);
}
