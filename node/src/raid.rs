//! md RAID1 over the legs of a replicated volume, through mdadm(8) and what md shows in sysfs.
//!
//! The array is created once, when no leg carries an md superblock yet (new legs read as
//! zeros, so `--assume-clean` needs no initial resync), with a 1 MiB data offset that the
//! controller side adds to every leg: the md device offers exactly the requested capacity.
//! Afterwards it is only ever assembled from its legs (`--run`: degraded when a leg is missing)
//! and a returning leg is re-added, so md resyncs just what its write-intent bitmap marks.
//!
//! The array is found by its members, not by a name under /dev/md (udev may not run): the md
//! device whose `slaves/` holds one of the legs' disks.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::host::{CmdOutput, Host};

/// The program.
pub const MDADM: &str = "mdadm";

/// Bytes between the start of a leg and the array's data: md's superblock (at 4 KiB) and its
/// internal write-intent bitmap live there. The controller side makes each leg this much larger
/// than the volume.
pub const DATA_OFFSET_BYTES: u64 = edgevol_driver::fleet::MD_DATA_OFFSET_BYTES;

/// mdadm's `--data-offset` for [`DATA_OFFSET_BYTES`] (a bare number would be KiB).
const DATA_OFFSET_ARG: &str = "--data-offset=1M";

/// The md array name of a volume: `ev` and 12 hex digits of a hash of the volume id. Short, as
/// metadata 1.2 keeps at most 32 bytes of `homehost:name`, and the same on every node and after
/// every restart.
pub fn array_name(volume_id: &str) -> String {
    format!("ev{:012x}", fnv1a(0xcbf2_9ce4_8422_2325, volume_id) >> 16)
}

/// The md array UUID of the array `name` (mdadm's `xxxxxxxx:xxxxxxxx:xxxxxxxx:xxxxxxxx`): derived
/// from the name, so an array keeps it on every node and after every restart, and the legs of a
/// volume restored or cloned from another one (they carry that volume's superblock) are told
/// apart from that volume's own array.
pub fn array_uuid(name: &str) -> String {
    let (a, b) = (
        fnv1a(0xcbf2_9ce4_8422_2325, name),
        fnv1a(0x8422_2325_cbf2_9ce4, name),
    );
    format!(
        "{:08x}:{:08x}:{:08x}:{:08x}",
        a >> 32,
        a & 0xffff_ffff,
        b >> 32,
        b & 0xffff_ffff
    )
}

/// FNV-1a of `text` with the standard basis: a short stable name for a volume id.
pub(crate) fn fnv1a_64(text: &str) -> u64 {
    fnv1a(0xcbf2_9ce4_8422_2325, text)
}

/// FNV-1a, 64 bits: stable across Rust versions (unlike the std hasher).
fn fnv1a(basis: u64, text: &str) -> u64 {
    let mut h = basis;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// One member as md shows it (`md/dev-<disk>/state`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The member's disk (`nvme1n1`).
    pub disk: String,
    /// Its comma-separated state flags (`in_sync`, `faulty`, `spare`, ...).
    pub state: String,
}

impl Member {
    /// True when md no longer writes to it.
    pub fn faulty(&self) -> bool {
        self.state.split(',').any(|f| f == "faulty")
    }

    /// True when it holds all the data.
    pub fn in_sync(&self) -> bool {
        self.state.split(',').any(|f| f == "in_sync")
    }
}

/// What md says about an array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayStatus {
    /// The md device (`md127`).
    pub md: String,
    /// `major:minor`.
    pub dev: String,
    /// The array's size in bytes.
    pub size_bytes: u64,
    /// `md/array_state`: `clean`, `active`, ... or `inactive` (assembled in part by udev's
    /// incremental assembly, not started).
    pub state: String,
    /// `md/degraded`: how many members the array is short of.
    pub degraded: u32,
    /// `md/sync_action`: `idle`, `resync`, `recover`, ...
    pub sync_action: String,
    /// `md/sync_completed`: sectors done and in all, while a sync runs.
    pub sync_completed: Option<(u64, u64)>,
    /// The members md knows.
    pub members: Vec<Member>,
}

impl ArrayStatus {
    /// The member on `disk`, if md has it.
    pub fn member(&self, disk: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.disk == disk)
    }

    /// True while md copies data onto a member.
    pub fn syncing(&self) -> bool {
        self.sync_action != "idle"
    }
}

fn read_trimmed(path: &Path) -> io::Result<String> {
    Ok(fs::read_to_string(path)?.trim().to_owned())
}

/// An md attribute an inactive array may not show: `default` when it is missing.
fn read_or(path: &Path, default: &str) -> io::Result<String> {
    match read_trimmed(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(default.to_owned()),
        other => other,
    }
}

/// Parses `sync_completed`: `none`, or `done / total`.
pub fn parse_sync_completed(text: &str) -> Option<(u64, u64)> {
    let (done, total) = text.split_once('/')?;
    Some((done.trim().parse().ok()?, total.trim().parse().ok()?))
}

/// The md device (`md127`) that has one of `disks` as a member, if any.
pub fn find_array<H: Host + ?Sized>(host: &H, disks: &[&str]) -> io::Result<Option<String>> {
    let block = host.sys_root().join("block");
    let entries = match fs::read_dir(&block) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let md = entry?.file_name().to_string_lossy().into_owned();
        if !md.starts_with("md") {
            continue;
        }
        if disks
            .iter()
            .any(|d| block.join(&md).join("slaves").join(d).exists())
        {
            return Ok(Some(md));
        }
    }
    Ok(None)
}

/// Reads an array's state from `/sys/block/<md>`.
pub fn status<H: Host + ?Sized>(host: &H, md: &str) -> io::Result<ArrayStatus> {
    let dir = host.sys_root().join("block").join(md);
    let sectors: u64 = read_trimmed(&dir.join("size"))?
        .parse()
        .map_err(|_| io::Error::other(format!("{}/size: not a number", dir.display())))?;
    let degraded = read_or(&dir.join("md/degraded"), "0")?
        .parse()
        .map_err(|_| io::Error::other(format!("{}/md/degraded: not a number", dir.display())))?;
    let mut members = Vec::new();
    for entry in fs::read_dir(dir.join("md"))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(disk) = name.strip_prefix("dev-") else {
            continue;
        };
        members.push(Member {
            disk: disk.to_owned(),
            state: read_trimmed(&entry.path().join("state"))?,
        });
    }
    members.sort_by(|a, b| a.disk.cmp(&b.disk));
    Ok(ArrayStatus {
        md: md.to_owned(),
        dev: read_trimmed(&dir.join("dev"))?,
        size_bytes: sectors.saturating_mul(512),
        state: read_or(&dir.join("md/array_state"), "inactive")?,
        degraded,
        sync_action: read_or(&dir.join("md/sync_action"), "idle")?,
        sync_completed: parse_sync_completed(&read_or(&dir.join("md/sync_completed"), "none")?),
        members,
    })
}

/// Runs mdadm; a node without it is FAILED_PRECONDITION saying what to install.
fn run_mdadm<H: Host + ?Sized>(host: &H, what: &str, args: &[String]) -> Result<CmdOutput> {
    host.run(MDADM, args).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            Error::FailedPrecondition(format!(
                "{what}: mdadm is not installed on this node; replicated volumes need it \
                 (Debian/Ubuntu: apt-get install mdadm) and the raid1 kernel module"
            ))
        } else {
            Error::io(format!("{what}: running mdadm"), &e)
        }
    })
}

fn failed(what: &str, args: &[String], out: &CmdOutput) -> Error {
    Error::Internal(format!(
        "{what}: mdadm {} failed ({}): {}",
        args.join(" "),
        out.code
            .map_or_else(|| "killed by a signal".to_owned(), |c| format!("exit {c}")),
        out.stderr.trim()
    ))
}

fn mdadm<H: Host + ?Sized>(host: &H, what: &str, args: Vec<String>) -> Result<String> {
    let out = run_mdadm(host, what, &args)?;
    if out.success() {
        return Ok(out.stdout);
    }
    Err(failed(what, &args, &out))
}

fn paths(devices: &[PathBuf]) -> Vec<String> {
    devices.iter().map(|d| d.display().to_string()).collect()
}

/// True when `device` carries an md superblock (`mdadm --examine` succeeds).
/// Only mdadm's own "No md superblock detected" counts as none: a leg that could not be read
/// must never be taken for a new one (the array would be created over it).
pub fn has_superblock<H: Host + ?Sized>(host: &H, device: &Path) -> Result<bool> {
    Ok(examine(host, device)?.is_some())
}

/// `mdadm --examine` of `device`: its output, or `None` when it carries no md superblock.
fn examine<H: Host + ?Sized>(host: &H, device: &Path) -> Result<Option<String>> {
    let what = format!("examining {}", device.display());
    let args = vec!["--examine".to_owned(), device.display().to_string()];
    let out = run_mdadm(host, &what, &args)?;
    if out.success() {
        return Ok(Some(out.stdout));
    }
    if out.stderr.contains("No md superblock detected") {
        return Ok(None);
    }
    Err(failed(&what, &args, &out))
}

/// The `Array UUID` line of `mdadm --examine`.
fn examined_uuid(examine: &str) -> Option<&str> {
    examine
        .lines()
        .find_map(|l| l.trim().strip_prefix("Array UUID :"))
        .map(str::trim)
}

/// Creates the RAID1 `name` over `legs` (`None`: a leg missing now, added later with a full
/// sync). Only for legs that never held an array: they read as zeros, hence `--assume-clean`.
pub fn create<H: Host + ?Sized>(host: &H, name: &str, legs: &[Option<PathBuf>]) -> Result<()> {
    let mut args = vec![
        "--create".to_owned(),
        format!("/dev/md/{name}"),
        "--run".to_owned(),
        "--level=1".to_owned(),
        format!("--raid-devices={}", legs.len()),
        "--metadata=1.2".to_owned(),
        "--bitmap=internal".to_owned(),
        "--assume-clean".to_owned(),
        DATA_OFFSET_ARG.to_owned(),
        format!("--uuid={}", array_uuid(name)),
    ];
    args.extend(legs.iter().map(|l| match l {
        Some(p) => p.display().to_string(),
        None => "missing".to_owned(),
    }));
    mdadm(host, &format!("creating md array {name}"), args).map(drop)
}

/// Assembles the array `name` from the legs present (`--run`: degraded if one is missing).
/// Legs whose superblock carries another array's UUID were copied from another volume (a
/// snapshot restored, a clone): they get this array's own UUID as they are assembled, or mdadm
/// would refuse them while the source volume's array runs on this node, and take them for that
/// array's members elsewhere.
pub fn assemble<H: Host + ?Sized>(host: &H, name: &str, legs: &[PathBuf]) -> Result<()> {
    let mut args = vec![
        "--assemble".to_owned(),
        format!("/dev/md/{name}"),
        "--run".to_owned(),
    ];
    let uuid = array_uuid(name);
    if let Some(first) = legs.first() {
        let examined = examine(host, first)?.unwrap_or_default();
        if examined_uuid(&examined) != Some(uuid.as_str()) {
            tracing::info!(array = name, from = ?examined_uuid(&examined), to = %uuid,
                "legs copied from another volume's array: giving the array its own UUID");
            args.push("--update=uuid".to_owned());
            args.push(format!("--uuid={uuid}"));
        }
    }
    args.extend(paths(legs));
    mdadm(host, &format!("assembling md array {name}"), args).map(drop)
}

/// Starts an array that was assembled in part and left inactive (by udev's incremental
/// assembly, waiting for its other legs): degraded, with the legs it has.
pub fn run<H: Host + ?Sized>(host: &H, md_device: &Path) -> Result<()> {
    let args = vec!["--run".to_owned(), md_device.display().to_string()];
    mdadm(host, &format!("starting {}", md_device.display()), args).map(drop)
}

/// Stops the array.
pub fn stop<H: Host + ?Sized>(host: &H, md_device: &Path) -> Result<()> {
    let args = vec!["--stop".to_owned(), md_device.display().to_string()];
    mdadm(host, &format!("stopping {}", md_device.display()), args).map(drop)
}

/// Takes every failed member out of the array (before a leg can come back into its slot).
pub fn remove_failed<H: Host + ?Sized>(host: &H, md_device: &Path) -> Result<()> {
    let args = vec![
        md_device.display().to_string(),
        "--remove".to_owned(),
        "failed".to_owned(),
    ];
    mdadm(host, "removing failed members", args).map(drop)
}

/// Takes out the members whose device is gone (a leg's controller the kernel deleted): their
/// slots are free again for the leg under its new device name.
pub fn remove_detached<H: Host + ?Sized>(host: &H, md_device: &Path) -> Result<()> {
    let args = vec![
        md_device.display().to_string(),
        "--remove".to_owned(),
        "detached".to_owned(),
    ];
    mdadm(host, "removing members whose device is gone", args).map(drop)
}

/// Puts a leg that was a member back: md resyncs only what the bitmap marked while it was away.
pub fn re_add<H: Host + ?Sized>(host: &H, md_device: &Path, leg: &Path) -> Result<()> {
    let args = vec![
        md_device.display().to_string(),
        "--re-add".to_owned(),
        leg.display().to_string(),
    ];
    mdadm(
        host,
        &format!("re-adding {} to the array", leg.display()),
        args,
    )
    .map(drop)
}

/// Adds a leg that never was a member (or cannot be re-added): md copies everything onto it.
pub fn add<H: Host + ?Sized>(host: &H, md_device: &Path, leg: &Path) -> Result<()> {
    let args = vec![
        md_device.display().to_string(),
        "--add".to_owned(),
        leg.display().to_string(),
    ];
    mdadm(
        host,
        &format!("adding {} to the array", leg.display()),
        args,
    )
    .map(drop)
}

/// Grows the array to its members' size (after every leg grew).
pub fn grow_to_max<H: Host + ?Sized>(host: &H, md_device: &Path) -> Result<()> {
    let args = vec![
        "--grow".to_owned(),
        md_device.display().to_string(),
        "--size=max".to_owned(),
    ];
    mdadm(host, &format!("growing {}", md_device.display()), args).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_uuids_are_mdadm_shaped_stable_and_distinct() {
        let u = array_uuid("ev0123456789ab");
        assert_eq!(u, array_uuid("ev0123456789ab"));
        assert_ne!(u, array_uuid("ev0123456789ac"));
        assert_eq!(u.len(), 35);
        assert!(u
            .split(':')
            .all(|g| g.len() == 8 && g.bytes().all(|b| b.is_ascii_hexdigit())));
        let examined =
            "          Magic : a92b4efc\n     Array UUID : 55555555:66666666:77777777:88888888\n";
        assert_eq!(
            examined_uuid(examined),
            Some("55555555:66666666:77777777:88888888")
        );
    }

    #[test]
    fn array_names_are_short_stable_and_distinct() {
        let a = array_name("box-1-v3+box-2-v9");
        assert_eq!(a, array_name("box-1-v3+box-2-v9"));
        assert_ne!(a, array_name("box-1-v3+box-2-v8"));
        assert_eq!(a.len(), 14);
        assert!(a.starts_with("ev") && a[2..].bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn sync_progress_and_member_flags() {
        assert_eq!(parse_sync_completed("none"), None);
        assert_eq!(parse_sync_completed("128 / 4096"), Some((128, 4096)));
        let m = Member {
            disk: "nvme1n1".into(),
            state: "faulty,write_error".into(),
        };
        assert!(m.faulty() && !m.in_sync());
        let m = Member {
            disk: "nvme1n1".into(),
            state: "in_sync".into(),
        };
        assert!(!m.faulty() && m.in_sync());
    }
}
