//! The mount table (`/proc/self/mountinfo`) and mount/umount through mount(8).
//!
//! mount(8) rather than mount(2): CSI `mount_flags` are mount(8) option strings (`noatime`,
//! `discard`, `nouuid`...) that it splits into MS_* flags and filesystem data, and a read-only
//! bind needs a bind followed by a remount, which it knows how to do. Every mount decision
//! asks the kernel's table first, so a retried call after a crash sees what really is mounted.

use std::path::{Path, PathBuf};

use crate::command::{path_arg, run_checked};
use crate::error::{Error, Result};
use crate::host::Host;

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `major:minor` of the mounted filesystem's device.
    pub dev: String,
    /// Root of the mount within that filesystem (`/` for a whole filesystem; the bind source's
    /// path within it otherwise).
    pub root: String,
    /// Mount point.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`/`ro`, `nosuid`...).
    pub options: Vec<String>,
    /// Filesystem type.
    pub fs_type: String,
    /// Mount source (`/dev/nvme1n1`, `udev`...).
    pub source: String,
}

impl MountEntry {
    /// True when this mount is read-only.
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// Undoes mountinfo's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` \).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let oct = &bytes[i + 1..i + 4];
            if oct.iter().all(|b| (b'0'..=b'7').contains(b)) {
                let v = oct
                    .iter()
                    .fold(0u16, |acc, b| acc * 8 + u16::from(b - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text. Malformed lines are an error: a table we cannot read is not an
/// empty table.
pub fn parse_mountinfo(text: &str) -> Result<Vec<MountEntry>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || Error::Internal(format!("mountinfo line {}: malformed: {line:?}", n + 1));
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-").ok_or_else(bad)?;
        if sep < 6 || fields.len() < sep + 3 {
            return Err(bad());
        }
        out.push(MountEntry {
            dev: fields[2].to_owned(),
            root: unescape(fields[3]),
            mount_point: PathBuf::from(unescape(fields[4])),
            options: fields[5].split(',').map(str::to_owned).collect(),
            fs_type: fields[sep + 1].to_owned(),
            source: unescape(fields[sep + 2]),
        });
    }
    Ok(out)
}

/// The current mount table.
pub fn table<H: Host + ?Sized>(host: &H) -> Result<Vec<MountEntry>> {
    let text = host
        .mountinfo()
        .map_err(|e| Error::io("reading /proc/self/mountinfo", &e))?;
    parse_mountinfo(&text)
}

/// The topmost mount at `path`, if any.
pub fn mount_at<'a>(table: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    table.iter().rev().find(|m| m.mount_point == path)
}

/// Mounts filesystem `fs_type` on `device` at `target` with mount(8) `options`.
pub fn mount_fs<H: Host + ?Sized>(
    host: &H,
    device: &Path,
    target: &Path,
    fs_type: &str,
    options: &[String],
) -> Result<()> {
    let mut args = vec!["-t".to_owned(), fs_type.to_owned()];
    if !options.is_empty() {
        args.push("-o".to_owned());
        args.push(options.join(","));
    }
    args.push(path_arg(device));
    args.push(path_arg(target));
    run_checked(host, "mount", args)
}

/// Bind-mounts `source` (a directory or a device node) on `target`, then remounts it
/// read-only when asked (a bind ignores `ro` on the first call).
pub fn bind<H: Host + ?Sized>(
    host: &H,
    source: &Path,
    target: &Path,
    read_only: bool,
) -> Result<()> {
    run_checked(
        host,
        "mount",
        vec!["--bind".to_owned(), path_arg(source), path_arg(target)],
    )?;
    if read_only {
        remount_read_only(host, target)?;
    }
    Ok(())
}

/// Makes the bind mount at `target` read-only.
pub fn remount_read_only<H: Host + ?Sized>(host: &H, target: &Path) -> Result<()> {
    run_checked(
        host,
        "mount",
        vec![
            "-o".to_owned(),
            "remount,bind,ro".to_owned(),
            path_arg(target),
        ],
    )
}

/// Unmounts the topmost mount at `target`.
pub fn unmount<H: Host + ?Sized>(host: &H, target: &Path) -> Result<()> {
    run_checked(host, "umount", vec![path_arg(target)])
}

/// Unmounts everything stacked at `target` and checks the kernel agrees.
pub fn unmount_all<H: Host + ?Sized>(host: &H, target: &Path) -> Result<()> {
    // A stack deeper than a few mounts is not ours; refuse to loop forever.
    for _ in 0..8 {
        if mount_at(&table(host)?, target).is_none() {
            return Ok(());
        }
        unmount(host, target)?;
    }
    Err(Error::Internal(format!(
        "{} is still mounted after repeated umount",
        target.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
36 22 259:1 / /var/lib/kubelet/plugins/csi.edgevol.io/staging/pv1 rw,noatime shared:7 - ext4 /dev/nvme1n1 rw
37 22 259:1 / /var/lib/kubelet/pods/p\\040q/volumes/pv1 ro,relatime shared:7 master:3 - ext4 /dev/nvme1n1 rw
38 22 0:5 /nvme2n1 /pods/blk/dev rw,nosuid - devtmpfs udev rw,size=1000k
";

    #[test]
    fn parses_fields_optional_tags_and_escapes() {
        let t = parse_mountinfo(SAMPLE).unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(t[1].dev, "259:1");
        assert_eq!(t[1].fs_type, "ext4");
        assert_eq!(t[1].source, "/dev/nvme1n1");
        assert!(!t[1].read_only());
        // Two optional fields, and an escaped space in the mount point.
        assert_eq!(
            t[2].mount_point,
            PathBuf::from("/var/lib/kubelet/pods/p q/volumes/pv1")
        );
        assert!(t[2].read_only());
        assert_eq!(t[2].fs_type, "ext4");
        assert_eq!(t[3].root, "/nvme2n1");
        assert_eq!(t[3].fs_type, "devtmpfs");
        assert_eq!(t[3].source, "udev");
    }

    #[test]
    fn malformed_lines_are_errors() {
        assert!(parse_mountinfo("22 1 8:1 / / rw shared:1 ext4 /dev/sda1 rw\n").is_err());
        assert!(parse_mountinfo("22 1 8:1 / - ext4\n").is_err());
        assert!(parse_mountinfo("\n").unwrap().is_empty());
    }

    #[test]
    fn topmost_mount_wins() {
        let text = "\
1 0 8:1 / /a rw - ext4 /dev/sda1 rw
2 1 259:3 / /a ro - xfs /dev/nvme3n1 rw
";
        let t = parse_mountinfo(text).unwrap();
        assert_eq!(mount_at(&t, Path::new("/a")).unwrap().dev, "259:3");
        assert!(mount_at(&t, Path::new("/b")).is_none());
    }

    #[test]
    fn unescape_handles_backslash_and_trailing() {
        assert_eq!(unescape("a\\134b"), "a\\b");
        assert_eq!(unescape("a\\04"), "a\\04");
        assert_eq!(unescape("tab\\011"), "tab\t");
    }
}
