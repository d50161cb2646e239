//! Filesystems on a volume: signature probe, mkfs, online grow.
//!
//! The probe is blkid(8) in low-level mode (`-p`: reads the superblocks itself, no cache) and
//! answers "blank" only on its documented exit code 2 (nothing detected). Anything it detects —
//! a filesystem, a partition table, LVM, LUKS, RAID metadata — is data we must not format
//! over. mkfs runs without its force flag, so mke2fs/mkfs.xfs repeat their own check.
//!
//! A filesystem that is already there is checked before a read-write mount, the way a boot
//! does: ext4 with `e2fsck -p` (preen: replays the journal, fixes what is safe, exits 4 when a
//! person must decide). XFS has no such check: mount replays its log, and xfs_repair is never
//! run unattended (it refuses a dirty log, and `-L` throws the log away); a damaged XFS fails
//! the mount with the kernel's message. Read-only stages check nothing (a preen writes).

use std::path::Path;

use crate::command::{path_arg, run_checked};
use crate::error::{Error, Result};
use crate::host::Host;

/// Filesystems the plugin formats and grows.
pub const SUPPORTED: &[&str] = &["ext4", "xfs"];

/// The default when neither the capability nor volume_context names one.
pub const DEFAULT_FS: &str = "ext4";

/// What a device holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// No signature at all: safe to format.
    Blank,
    /// A filesystem of this type.
    Filesystem(String),
    /// Something else (partition table, RAID, LVM...), described.
    Other(String),
}

/// Checks a filesystem type name.
pub fn check_supported(fs_type: &str) -> Result<()> {
    if SUPPORTED.contains(&fs_type) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "filesystem type {fs_type:?} is not supported (supported: {})",
            SUPPORTED.join(", ")
        )))
    }
}

/// Probes `device` for signatures.
pub fn probe<H: Host + ?Sized>(host: &H, device: &Path) -> Result<Probe> {
    let args = vec!["-p".into(), "-o".into(), "export".into(), path_arg(device)];
    let out = host
        .run("blkid", &args)
        .map_err(|e| Error::io("running blkid", &e))?;
    match out.code {
        Some(0) => {}
        Some(2) => return Ok(Probe::Blank),
        _ => {
            return Err(Error::Internal(format!(
                "blkid -p {} failed ({:?}): {}",
                device.display(),
                out.code,
                out.stderr.trim()
            )))
        }
    }
    let mut fs_type = None;
    let mut other = Vec::new();
    for line in out.stdout.lines() {
        if let Some((key, value)) = line.split_once('=') {
            match key {
                "TYPE" => fs_type = Some(value.to_owned()),
                "PTTYPE" => other.push(format!("partition table {value}")),
                _ => {}
            }
        }
    }
    match fs_type {
        Some(t) => Ok(Probe::Filesystem(t)),
        None if !other.is_empty() => Ok(Probe::Other(other.join(", "))),
        None => Ok(Probe::Other("an unidentified signature".to_owned())),
    }
}

/// Creates a `fs_type` filesystem on `device`.
pub fn mkfs<H: Host + ?Sized>(host: &H, device: &Path, fs_type: &str) -> Result<()> {
    check_supported(fs_type)?;
    tracing::info!(device = %device.display(), fs_type, "creating filesystem");
    let program = format!("mkfs.{fs_type}");
    let args = vec!["-q".to_owned(), path_arg(device)];
    let out = host
        .run(&program, &args)
        .map_err(|e| Error::io(format!("running {program}"), &e))?;
    if out.success() {
        return Ok(());
    }
    let first = out
        .stderr
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    // mkfs.xfs (xfsprogs >= 5.19) refuses devices under 300 MB: the volume cannot hold the
    // filesystem the capability asks for, which no retry changes.
    if fs_type == "xfs" && first.contains("must be larger than") {
        return Err(Error::FailedPrecondition(format!(
            "{} is too small for xfs: {first}",
            device.display()
        )));
    }
    Err(Error::Internal(format!(
        "{program} {} failed ({:?}): {}",
        args.join(" "),
        out.code,
        out.stderr.trim()
    )))
}

/// Checks the existing `fs_type` filesystem on (unmounted) `device` before a read-write
/// mount: `e2fsck -p` for ext4, nothing for xfs (see the module doc).
pub fn check<H: Host + ?Sized>(host: &H, device: &Path, fs_type: &str) -> Result<()> {
    if fs_type != "ext4" {
        return Ok(());
    }
    let args = vec!["-p".to_owned(), path_arg(device)];
    let out = host
        .run("e2fsck", &args)
        .map_err(|e| Error::io("running e2fsck", &e))?;
    let said = || {
        format!("{} {}", out.stdout.trim(), out.stderr.trim())
            .trim()
            .to_owned()
    };
    match out.code {
        Some(0) => Ok(()),
        // 1: errors corrected; 2: corrected, "reboot" (only meaningful for a mounted root).
        Some(1 | 2) => {
            tracing::warn!(device = %device.display(), output = %said(),
                "e2fsck corrected the filesystem before mounting it");
            Ok(())
        }
        Some(4) => Err(Error::FailedPrecondition(format!(
            "{} holds an ext4 filesystem with errors that e2fsck -p left uncorrected; repair it \
             by hand (e2fsck -f) before staging it: {}",
            device.display(),
            said()
        ))),
        code => Err(Error::Internal(format!(
            "e2fsck -p {} failed ({code:?}): {}",
            device.display(),
            said()
        ))),
    }
}

/// Makes sure `device` holds a `fs_type` filesystem: formats it only when it is blank, and
/// checks one that is already there before a read-write mount. `writable` is false for
/// read-only access (a blank device cannot be mounted read-only, and a check would write).
pub fn ensure_filesystem<H: Host + ?Sized>(
    host: &H,
    device: &Path,
    fs_type: &str,
    writable: bool,
) -> Result<()> {
    match probe(host, device)? {
        Probe::Filesystem(t) if t == fs_type && writable => check(host, device, fs_type),
        Probe::Filesystem(t) if t == fs_type => Ok(()),
        Probe::Filesystem(t) => Err(Error::FailedPrecondition(format!(
            "{} holds a {t} filesystem, the volume capability asks for {fs_type}",
            device.display()
        ))),
        Probe::Other(what) => Err(Error::FailedPrecondition(format!(
            "{} holds {what}; refusing to format it",
            device.display()
        ))),
        Probe::Blank if writable => mkfs(host, device, fs_type),
        Probe::Blank => Err(Error::FailedPrecondition(format!(
            "{} is blank and the access mode is read-only: nothing to mount",
            device.display()
        ))),
    }
}

/// Grows a mounted filesystem to its device's size: resize2fs takes the device (online resize
/// of a mounted ext4), xfs_growfs the mount point.
pub fn grow<H: Host + ?Sized>(
    host: &H,
    fs_type: &str,
    device: &Path,
    mount_point: &Path,
) -> Result<()> {
    match fs_type {
        "ext4" => run_checked(host, "resize2fs", vec![path_arg(device)]),
        "xfs" => run_checked(host, "xfs_growfs", vec![path_arg(mount_point)]),
        other => Err(Error::FailedPrecondition(format!(
            "cannot grow a {other} filesystem"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeHost;

    #[test]
    fn probe_reads_blkid_answers() {
        let host = FakeHost::new();
        let dev = host.dev_root().join("nvme1n1");
        assert_eq!(probe(&host, &dev).unwrap(), Probe::Blank);
        host.set_signature("nvme1n1", "TYPE=xfs\nUUID=abc\n");
        assert_eq!(probe(&host, &dev).unwrap(), Probe::Filesystem("xfs".into()));
        host.set_signature("nvme1n1", "PTTYPE=gpt\n");
        assert_eq!(
            probe(&host, &dev).unwrap(),
            Probe::Other("partition table gpt".into())
        );
        host.fail_next("blkid");
        assert!(probe(&host, &dev).is_err());
    }

    #[test]
    fn formats_only_blank_devices() {
        let host = FakeHost::new();
        let dev = host.dev_root().join("nvme1n1");
        ensure_filesystem(&host, &dev, "ext4", true).unwrap();
        assert_eq!(host.commands_of("mkfs.ext4").len(), 1);
        // Now it holds ext4: no second mkfs.
        ensure_filesystem(&host, &dev, "ext4", true).unwrap();
        assert_eq!(host.commands_of("mkfs.ext4").len(), 1);
        let err = ensure_filesystem(&host, &dev, "xfs", true).unwrap_err();
        assert!(matches!(err, Error::FailedPrecondition(_)), "{err}");
        assert!(host.commands_of("mkfs.xfs").is_empty());
        host.set_signature("nvme1n1", "PTTYPE=dos\n");
        assert!(matches!(
            ensure_filesystem(&host, &dev, "ext4", true),
            Err(Error::FailedPrecondition(_))
        ));
        let blank = host.dev_root().join("nvme2n1");
        assert!(matches!(
            ensure_filesystem(&host, &blank, "ext4", false),
            Err(Error::FailedPrecondition(_))
        ));
        assert!(matches!(
            check_supported("btrfs"),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn an_existing_ext4_is_preened_before_a_read_write_mount_and_xfs_is_not() {
        let host = FakeHost::new();
        let dev = host.dev_root().join("nvme1n1");
        let dev_arg = dev.to_string_lossy().into_owned();
        // Freshly made: no check.
        ensure_filesystem(&host, &dev, "ext4", true).unwrap();
        assert!(host.commands_of("e2fsck").is_empty());
        // Already there: preened before a read-write mount, not before a read-only one.
        ensure_filesystem(&host, &dev, "ext4", true).unwrap();
        assert_eq!(
            host.commands_of("e2fsck"),
            vec![vec!["-p".to_owned(), dev_arg]]
        );
        ensure_filesystem(&host, &dev, "ext4", false).unwrap();
        assert_eq!(host.commands_of("e2fsck").len(), 1);
        // Corrected (1, 2) is fine; uncorrected (4) is the operator's; anything else is ours.
        for code in [1, 2] {
            host.fail_next_with("e2fsck", code, "");
            ensure_filesystem(&host, &dev, "ext4", true).unwrap();
        }
        host.fail_next_with("e2fsck", 4, "UNEXPECTED INCONSISTENCY; RUN fsck MANUALLY.");
        let err = ensure_filesystem(&host, &dev, "ext4", true).unwrap_err();
        assert!(
            matches!(&err, Error::FailedPrecondition(m) if m.contains("RUN fsck MANUALLY")),
            "{err}"
        );
        host.fail_next_with("e2fsck", 8, "e2fsck: Device or resource busy");
        assert!(matches!(
            ensure_filesystem(&host, &dev, "ext4", true),
            Err(Error::Internal(_))
        ));

        let xfs = host.dev_root().join("nvme2n1");
        ensure_filesystem(&host, &xfs, "xfs", true).unwrap();
        ensure_filesystem(&host, &xfs, "xfs", true).unwrap();
        assert_eq!(host.commands_of("mkfs.xfs").len(), 1);
        assert_eq!(host.commands_of("e2fsck").len(), 5, "no fsck of xfs");
    }

    #[test]
    fn mkfs_xfs_on_a_too_small_volume_is_a_failed_precondition() {
        let host = FakeHost::new();
        let dev = host.dev_root().join("nvme1n1");
        host.fail_next_with(
            "mkfs.xfs",
            1,
            "Filesystem must be larger than 300MB.\nUsage: ...",
        );
        let err = ensure_filesystem(&host, &dev, "xfs", true).unwrap_err();
        assert!(
            matches!(&err, Error::FailedPrecondition(m) if m.contains("300MB")),
            "{err}"
        );
        assert_eq!(probe(&host, &dev).unwrap(), Probe::Blank, "nothing written");
        host.fail_next_with("mkfs.xfs", 1, "mkfs.xfs: cannot open: Device busy");
        assert!(matches!(
            ensure_filesystem(&host, &dev, "xfs", true),
            Err(Error::Internal(_))
        ));
        ensure_filesystem(&host, &dev, "xfs", true).unwrap();
        assert_eq!(probe(&host, &dev).unwrap(), Probe::Filesystem("xfs".into()));
    }

    #[test]
    fn grow_picks_the_tool() {
        let host = FakeHost::new();
        let dev = host.dev_root().join("nvme1n1");
        grow(&host, "ext4", &dev, Path::new("/stage")).unwrap();
        grow(&host, "xfs", &dev, Path::new("/stage")).unwrap();
        assert_eq!(
            host.commands_of("resize2fs")[0],
            vec![dev.to_string_lossy().into_owned()]
        );
        assert_eq!(host.commands_of("xfs_growfs")[0], vec!["/stage".to_owned()]);
        host.fail_next("resize2fs");
        assert!(grow(&host, "ext4", &dev, Path::new("/stage")).is_err());
    }
}
