//! Device discovery for the appliance: candidate block devices from sysfs with size, model and
//! serial, and the format guard that refuses a device carrying a partition table or filesystem
//! signature unless forced.
// Casts: offsets are small constants < 128 KiB.
#![allow(clippy::cast_possible_truncation)]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// One block device the appliance could use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Kernel name (`nvme0n1`, `vdb`, `loop3`).
    pub name: String,
    /// Device node (`/dev/nvme0n1`).
    pub path: PathBuf,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Logical block size.
    pub logical_block_size: u32,
    /// Model, when the driver reports one.
    pub model: Option<String>,
    /// Serial number, when the driver reports one.
    pub serial: Option<String>,
    /// Read-only.
    pub read_only: bool,
    /// Has partitions.
    pub partitioned: bool,
    /// Held by another kernel user (device-mapper, md, bcache...).
    pub held: bool,
}

impl Candidate {
    /// Whether the appliance may offer it without force: writable, not partitioned, not held.
    pub fn is_free(&self) -> bool {
        !self.read_only && !self.partitioned && !self.held && self.size_bytes > 0
    }
}

fn read_trim(p: &Path) -> Option<String> {
    let s = std::fs::read_to_string(p).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// Lists whole-disk block devices under `sys_block` (normally `/sys/block`), skipping RAM disks,
/// zram, device-mapper, md, empty loop devices, and CD-ROMs.
pub fn list_candidates_in(sys_block: &Path, dev_dir: &Path) -> Result<Vec<Candidate>, Error> {
    let mut out = Vec::new();
    let entries =
        std::fs::read_dir(sys_block).map_err(|e| Error::io("readdir", Some(sys_block), e))?;
    for ent in entries.flatten() {
        let name = ent.file_name().to_string_lossy().to_string();
        if ["ram", "zram", "dm-", "md", "sr", "fd", "nbd"]
            .iter()
            .any(|p| name.starts_with(p))
        {
            continue;
        }
        let d = ent.path();
        let sectors: u64 = read_trim(&d.join("size"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if sectors == 0 {
            continue; // empty loop devices, ejected media
        }
        let lbs = read_trim(&d.join("queue/logical_block_size"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(512);
        let partitioned = std::fs::read_dir(&d)
            .map(|it| it.flatten().any(|e| e.path().join("partition").exists()))
            .unwrap_or(false);
        let held = std::fs::read_dir(d.join("holders"))
            .map(|mut it| it.next().is_some())
            .unwrap_or(false);
        out.push(Candidate {
            path: dev_dir.join(&name),
            size_bytes: sectors * 512, // sysfs `size` is always in 512-byte units
            logical_block_size: lbs,
            model: read_trim(&d.join("device/model")),
            serial: read_trim(&d.join("device/serial")).or_else(|| read_trim(&d.join("serial"))),
            read_only: read_trim(&d.join("ro")).as_deref() == Some("1"),
            partitioned,
            held,
            name,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// [`list_candidates_in`] on the running system.
pub fn list_candidates() -> Result<Vec<Candidate>, Error> {
    list_candidates_in(Path::new("/sys/block"), Path::new("/dev"))
}

/// Signatures looked for, as (byte offset, magic, what). Offsets as blkid knows them.
const SIGNATURES: &[(u64, &[u8], &str)] = &[
    (512, b"EFI PART", "GPT partition table"),
    (4096, b"EFI PART", "GPT partition table (4K sectors)"),
    (1080, &[0x53, 0xEF], "ext2/3/4 filesystem"),
    (0, b"XFSB", "XFS filesystem"),
    (65600, b"_BHRfS_M", "btrfs filesystem"),
    (0, b"LUKS\xba\xbe", "LUKS container"),
    (536, b"LVM2 001", "LVM2 physical volume"),
    (4086, b"SWAPSPACE2", "swap area"),
    (32769, b"CD001", "ISO 9660 filesystem"),
    (3, b"NTFS    ", "NTFS filesystem"),
    (54, b"FAT", "FAT filesystem"),
    (82, b"FAT32   ", "FAT32 filesystem"),
    (0x10040, b"ReIsEr", "ReiserFS filesystem"),
];

/// What, if anything, the first 96 KiB of `path` (device or file) carries.
pub fn detect_signature(path: &Path) -> Result<Option<String>, Error> {
    let f = File::open(path).map_err(|e| Error::io("open", Some(path), e))?;
    let mut head = vec![0u8; 96 * 1024];
    let mut n = 0;
    while n < head.len() {
        match f.read_at(&mut head[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("read", Some(path), e)),
        }
    }
    let head = &head[..n];
    for &(off, magic, what) in SIGNATURES {
        let o = off as usize;
        if head.len() >= o + magic.len() && &head[o..o + magic.len()] == magic {
            return Ok(Some(what.to_string()));
        }
    }
    // MBR: boot signature plus at least one non-empty partition entry (a bare 55AA boot sector
    // without partitions, e.g. a FAT volume boot record, is caught above).
    if head.len() >= 512 && head[510] == 0x55 && head[511] == 0xAA {
        let has_part = (0..4).any(|i| head[446 + 16 * i + 4] != 0);
        if has_part {
            return Ok(Some("MBR partition table".to_string()));
        }
    }
    Ok(None)
}

/// Refuses to format `path` if it carries a signature, unless `force`.
pub fn check_formattable(path: &Path, force: bool) -> Result<(), Error> {
    match detect_signature(path)? {
        Some(found) if !force => Err(Error::Refused {
            path: path.to_path_buf(),
            found,
        }),
        Some(found) => {
            log::warn!("formatting {} over {found} (forced)", path.display());
            Ok(())
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(size: usize, writes: &[(usize, &[u8])]) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        let mut data = vec![0u8; size];
        for (o, b) in writes {
            data[*o..*o + b.len()].copy_from_slice(b);
        }
        std::fs::write(f.path(), &data).unwrap();
        f
    }

    #[test]
    fn signatures_refuse_unless_forced() {
        let blank = img(1 << 17, &[]);
        assert_eq!(detect_signature(blank.path()).unwrap(), None);
        check_formattable(blank.path(), false).unwrap();
        type Case<'a> = (&'a [(usize, &'a [u8])], &'a str);
        let cases: [Case; 5] = [
            (&[(512, b"EFI PART")], "GPT partition table"),
            (&[(1080, &[0x53, 0xEF])], "ext2/3/4 filesystem"),
            (&[(0, b"XFSB")], "XFS filesystem"),
            (&[(65600, b"_BHRfS_M")], "btrfs filesystem"),
            (
                &[(510, &[0x55, 0xAA]), (446 + 4, &[0x83])],
                "MBR partition table",
            ),
        ];
        for (writes, what) in cases {
            let f = img(1 << 17, writes);
            assert_eq!(detect_signature(f.path()).unwrap().as_deref(), Some(what));
            let e = check_formattable(f.path(), false).unwrap_err();
            assert!(
                matches!(&e, Error::Refused { found, .. } if found == what),
                "{e}"
            );
            check_formattable(f.path(), true).unwrap();
        }
        // A boot signature with an empty partition table is not a partition table.
        let f = img(4096, &[(510, &[0x55, 0xAA])]);
        assert_eq!(detect_signature(f.path()).unwrap(), None);
    }

    #[test]
    fn lists_fake_sysfs() {
        let sys = tempfile::tempdir().unwrap();
        let mk = |name: &str, size: &str, files: &[(&str, &str)]| {
            let d = sys.path().join(name);
            std::fs::create_dir_all(d.join("queue")).unwrap();
            std::fs::create_dir_all(d.join("holders")).unwrap();
            std::fs::create_dir_all(d.join("device")).unwrap();
            std::fs::write(d.join("size"), size).unwrap();
            for (p, v) in files {
                if let Some(parent) = d.join(p).parent() {
                    std::fs::create_dir_all(parent).unwrap();
                }
                std::fs::write(d.join(p), v).unwrap();
            }
        };
        mk(
            "nvme0n1",
            "2097152\n",
            &[
                ("device/model", "QEMU NVMe Ctrl  \n"),
                ("device/serial", "EDGEVOLTEST01\n"),
                ("queue/logical_block_size", "4096\n"),
                ("ro", "0\n"),
            ],
        );
        mk(
            "vda",
            "1048576\n",
            &[("vda1/partition", "1\n"), ("ro", "0\n")],
        );
        mk("loop0", "0\n", &[]);
        mk("ram0", "8192\n", &[]);
        mk("vdb", "2048\n", &[("holders/dm-0", ""), ("ro", "1\n")]);
        let c = list_candidates_in(sys.path(), Path::new("/dev")).unwrap();
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["nvme0n1", "vda", "vdb"]);
        assert_eq!(c[0].size_bytes, 1 << 30);
        assert_eq!(c[0].logical_block_size, 4096);
        assert_eq!(c[0].model.as_deref(), Some("QEMU NVMe Ctrl"));
        assert_eq!(c[0].serial.as_deref(), Some("EDGEVOLTEST01"));
        assert_eq!(c[0].path, Path::new("/dev/nvme0n1"));
        assert!(c[0].is_free());
        assert!(c[1].partitioned && !c[1].is_free());
        assert!(c[2].held && c[2].read_only && !c[2].is_free());
        // The real system lists without error (contents vary by host).
        list_candidates().unwrap();
    }
}
