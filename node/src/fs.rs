//! Filesystems on a volume: signature probe, mkfs, online grow.
//!
//! The probe is blkid(8) in low-level mode (`-p`: reads the superblocks itself, no cache) and
//! answers "blank" only on its documented exit code 2 (nothing detected). Anything it detects —
//! a filesystem, a partition table, LVM, LUKS, RAID metadata — is data we must not format
//! over. mkfs runs without its force flag, so mke2fs/mkfs.xfs repeat their own check.

use std::path::Path;

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

fn arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Probes `device` for signatures.
pub fn probe<H: Host + ?Sized>(host: &H, device: &Path) -> Result<Probe> {
    let args = vec!["-p".into(), "-o".into(), "export".into(), arg(device)];
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

fn run_checked<H: Host + ?Sized>(host: &H, program: &str, args: Vec<String>) -> Result<()> {
    let out = host
        .run(program, &args)
        .map_err(|e| Error::io(format!("running {program}"), &e))?;
    if out.success() {
        Ok(())
    } else {
        Err(Error::Internal(format!(
            "{program} {} failed ({:?}): {}",
            args.join(" "),
            out.code,
            out.stderr.trim()
        )))
    }
}

/// Creates a `fs_type` filesystem on `device`.
pub fn mkfs<H: Host + ?Sized>(host: &H, device: &Path, fs_type: &str) -> Result<()> {
    check_supported(fs_type)?;
    tracing::info!(device = %device.display(), fs_type, "creating filesystem");
    run_checked(
        host,
        &format!("mkfs.{fs_type}"),
        vec!["-q".into(), arg(device)],
    )
}

/// Makes sure `device` holds a `fs_type` filesystem: formats it only when it is blank.
/// `may_format` is false for read-only access (a blank device cannot be mounted read-only).
pub fn ensure_filesystem<H: Host + ?Sized>(
    host: &H,
    device: &Path,
    fs_type: &str,
    may_format: bool,
) -> Result<()> {
    match probe(host, device)? {
        Probe::Filesystem(t) if t == fs_type => Ok(()),
        Probe::Filesystem(t) => Err(Error::FailedPrecondition(format!(
            "{} holds a {t} filesystem, the volume capability asks for {fs_type}",
            device.display()
        ))),
        Probe::Other(what) => Err(Error::FailedPrecondition(format!(
            "{} holds {what}; refusing to format it",
            device.display()
        ))),
        Probe::Blank if may_format => mkfs(host, device, fs_type),
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
        "ext4" => run_checked(host, "resize2fs", vec![arg(device)]),
        "xfs" => run_checked(host, "xfs_growfs", vec![arg(mount_point)]),
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
