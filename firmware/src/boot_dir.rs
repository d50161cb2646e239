//! The mounted boot partition: the slots' kernel and initramfs, and the boot loaders' files.
//!
//! A slot is written only while the state says [`crate::slots::Status::Writing`], so its files
//! are simply overwritten, synced, and read back: the page cache is dropped first
//! (`POSIX_FADV_DONTNEED` after the sync), so the comparison reads what reached the device, not
//! what we just wrote into memory. The loaders' files (`grubenv`, `syslinux.cfg`, the ADV at the
//! end of `ldlinux.sys`) are rewritten in place at their fixed sizes: the loaders find them by
//! block list, so they must never move.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use ring::digest::{Context, SHA256};

use crate::bootenv::{self, ADV_LEN, GRUBENV_LEN};
use crate::pool_format::PoolFormat;
use crate::slots::{BootEnv, SlotId};

/// Kernel file name in a slot directory.
pub const KERNEL: &str = "vmlinuz";
/// Initramfs file name in a slot directory.
pub const INITRAMFS: &str = "initramfs.gz";
/// The pools the slot's firmware reads ([`PoolFormat::to_line`]); absent in slots written by
/// firmware from before it, which read exactly format version 3.
pub const POOL_FORMAT: &str = "pool-format";

/// A boot-partition operation that failed.
#[derive(Debug)]
pub enum BootDirError {
    /// The OS refused (which file, what it said).
    Io(PathBuf, std::io::Error),
    /// A file read back differs from what was written.
    ReadBackMismatch(PathBuf),
    /// A loader file is not what this firmware wrote (not rewritten: it may be someone else's).
    Unexpected(PathBuf, String),
}

impl fmt::Display for BootDirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootDirError::Io(path, e) => write!(f, "{}: {e}", path.display()),
            BootDirError::ReadBackMismatch(path) => {
                write!(
                    f,
                    "{}: read back differs from what was written",
                    path.display()
                )
            }
            BootDirError::Unexpected(path, what) => write!(f, "{}: {what}", path.display()),
        }
    }
}

impl std::error::Error for BootDirError {}

/// The boot loaders' view, as read from their files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderView {
    /// What GRUB (UEFI) will do.
    pub grub: Result<BootEnv, String>,
    /// syslinux (BIOS): its default slot and its boot-once slot.
    pub syslinux: Result<BootEnv, String>,
}

/// The boot partition mounted at a directory.
#[derive(Debug, Clone)]
pub struct BootDir {
    root: PathBuf,
}

impl BootDir {
    /// The partition mounted at `root`.
    pub fn new(root: &Path) -> BootDir {
        BootDir {
            root: root.to_path_buf(),
        }
    }

    /// The mount point.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A file of a slot.
    pub fn slot_file(&self, slot: SlotId, name: &str) -> PathBuf {
        self.root.join(bootenv::slot_dir(slot)).join(name)
    }

    /// Writes a slot's kernel and initramfs, syncs them, and verifies them by reading them back
    /// from the device.
    pub fn write_slot(
        &self,
        slot: SlotId,
        kernel: &[u8],
        initramfs: &[u8],
    ) -> Result<(), BootDirError> {
        let dir = self.root.join(bootenv::slot_dir(slot));
        std::fs::create_dir_all(&dir).map_err(|e| BootDirError::Io(dir.clone(), e))?;
        for (name, data) in [(KERNEL, kernel), (INITRAMFS, initramfs)] {
            let path = dir.join(name);
            write_synced(&path, data)?;
            verify_from_device(&path, data)?;
        }
        sync_dir(&dir)
    }

    /// Records which pools the slot's firmware reads: written, synced, read back.
    pub fn write_pool_format(&self, slot: SlotId, format: &PoolFormat) -> Result<(), BootDirError> {
        let dir = self.root.join(bootenv::slot_dir(slot));
        std::fs::create_dir_all(&dir).map_err(|e| BootDirError::Io(dir.clone(), e))?;
        let path = dir.join(POOL_FORMAT);
        let line = format.to_line();
        write_synced(&path, line.as_bytes())?;
        verify_from_device(&path, line.as_bytes())?;
        sync_dir(&dir)
    }

    /// Which pools the slot's firmware reads. No file (a slot written by firmware from before
    /// the file, or a factory image) or one that does not parse (a cut while it was written):
    /// exactly format version 3, the least any slot reads, so a check never over-trusts a slot.
    pub fn read_pool_format(&self, slot: SlotId) -> PoolFormat {
        std::fs::read_to_string(self.slot_file(slot, POOL_FORMAT))
            .ok()
            .and_then(|text| PoolFormat::from_line(&text))
            .unwrap_or(PoolFormat::V3_ONLY)
    }

    /// Makes the loaders do what `env` says: GRUB's `grubenv`, syslinux's `DEFAULT` and its
    /// boot-once ADV. The trial is armed last in each loader, after its primary.
    pub fn write_env(&self, env: &BootEnv) -> Result<(), BootDirError> {
        let grubenv = self.root.join("grubenv");
        let current = read_exact_file(&grubenv, GRUBENV_LEN)?;
        bootenv::parse_grubenv(&current)
            .map_err(|e| BootDirError::Unexpected(grubenv.clone(), e.to_string()))?;
        rewrite_in_place(&grubenv, 0, &bootenv::grubenv(env))?;

        let cfg = self.root.join("syslinux.cfg");
        let new_cfg = bootenv::syslinux_cfg(env.primary);
        let current = read_exact_file(&cfg, new_cfg.len())?;
        if bootenv::parse_syslinux_primary(&String::from_utf8_lossy(&current)).is_none() {
            return Err(BootDirError::Unexpected(
                cfg,
                "not a syslinux.cfg this firmware wrote".into(),
            ));
        }
        rewrite_in_place(&cfg, 0, new_cfg.as_bytes())?;

        let ldlinux = self.root.join("ldlinux.sys");
        let at = self.adv_offset(&ldlinux)?;
        rewrite_in_place(&ldlinux, at, &bootenv::adv(env.trial))
    }

    /// What the loaders will boot next, read from their files.
    pub fn read_env(&self) -> LoaderView {
        let grubenv = self.root.join("grubenv");
        let grub = read_exact_file(&grubenv, GRUBENV_LEN)
            .map_err(|e| e.to_string())
            .and_then(|b| bootenv::parse_grubenv(&b).map_err(|e| e.to_string()));
        let syslinux = (|| {
            let cfg = std::fs::read_to_string(self.root.join("syslinux.cfg"))
                .map_err(|e| e.to_string())?;
            let primary = bootenv::parse_syslinux_primary(&cfg)
                .ok_or_else(|| "syslinux.cfg: no DEFAULT slot".to_string())?;
            let ldlinux = self.root.join("ldlinux.sys");
            let at = self.adv_offset(&ldlinux).map_err(|e| e.to_string())?;
            let adv = read_at(&ldlinux, at, ADV_LEN).map_err(|e| e.to_string())?;
            let trial = bootenv::parse_adv(&adv).map_err(|e| e.to_string())?;
            Ok(BootEnv { primary, trial })
        })();
        LoaderView { grub, syslinux }
    }

    /// The ADV is the last two sectors of `ldlinux.sys`; refuse a file without one there.
    fn adv_offset(&self, ldlinux: &Path) -> Result<u64, BootDirError> {
        let len = std::fs::metadata(ldlinux)
            .map_err(|e| BootDirError::Io(ldlinux.to_path_buf(), e))?
            .len();
        let at = len
            .checked_sub(ADV_LEN as u64)
            .ok_or_else(|| BootDirError::Unexpected(ldlinux.to_path_buf(), "too short".into()))?;
        let adv = read_at(ldlinux, at, ADV_LEN)?;
        if bootenv::parse_adv(&adv) == Err(bootenv::BootEnvError::BadAdv) {
            return Err(BootDirError::Unexpected(
                ldlinux.to_path_buf(),
                "no syslinux ADV in its last two sectors".into(),
            ));
        }
        Ok(at)
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BootDirError + '_ {
    move |e| BootDirError::Io(path.to_path_buf(), e)
}

fn write_synced(path: &Path, data: &[u8]) -> Result<(), BootDirError> {
    let mut file = File::create(path).map_err(io(path))?;
    file.write_all(data).map_err(io(path))?;
    file.sync_all().map_err(io(path))
}

/// Drops the file's cached pages (written back by the sync before) and compares the digest of
/// what the device returns with the digest of `expected`.
fn verify_from_device(path: &Path, expected: &[u8]) -> Result<(), BootDirError> {
    let mut file = File::open(path).map_err(io(path))?;
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)
        .map_err(|e| BootDirError::Io(path.to_path_buf(), e.into()))?;
    let mut context = Context::new(&SHA256);
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0usize;
    loop {
        let n = file.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        context.update(&buf[..n]);
        total += n;
    }
    let want = ring::digest::digest(&SHA256, expected);
    if total != expected.len() || context.finish().as_ref() != want.as_ref() {
        return Err(BootDirError::ReadBackMismatch(path.to_path_buf()));
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), BootDirError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

fn read_exact_file(path: &Path, len: usize) -> Result<Vec<u8>, BootDirError> {
    let actual = std::fs::metadata(path).map_err(io(path))?.len();
    if actual != len as u64 {
        return Err(BootDirError::Unexpected(
            path.to_path_buf(),
            format!("{actual} bytes, expected {len}"),
        ));
    }
    read_at(path, 0, len)
}

fn read_at(path: &Path, at: u64, len: usize) -> Result<Vec<u8>, BootDirError> {
    let mut file = File::open(path).map_err(io(path))?;
    file.seek(SeekFrom::Start(at)).map_err(io(path))?;
    let mut buf = vec![0u8; len];
    file.read_exact(&mut buf).map_err(io(path))?;
    Ok(buf)
}

/// Overwrites `data.len()` bytes at `at` without truncating or moving the file, and syncs.
fn rewrite_in_place(path: &Path, at: u64, data: &[u8]) -> Result<(), BootDirError> {
    let mut file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io(path))?;
    file.seek(SeekFrom::Start(at)).map_err(io(path))?;
    file.write_all(data).map_err(io(path))?;
    file.sync_all().map_err(io(path))?;
    if read_at(path, at, data.len())? != data {
        return Err(BootDirError::ReadBackMismatch(path.to_path_buf()));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A boot partition as image/build.sh lays it out: factory loader files, an ldlinux.sys
    /// with an empty ADV at its end, slot A filled.
    pub(crate) fn factory(dir: &Path) -> BootDir {
        let env = BootEnv {
            primary: SlotId::A,
            trial: None,
        };
        std::fs::write(dir.join("grubenv"), bootenv::grubenv(&env)).unwrap();
        std::fs::write(dir.join("syslinux.cfg"), bootenv::syslinux_cfg(SlotId::A)).unwrap();
        let mut ldlinux = vec![0x90u8; 4096];
        ldlinux.extend_from_slice(&bootenv::adv(None));
        std::fs::write(dir.join("ldlinux.sys"), ldlinux).unwrap();
        let boot = BootDir::new(dir);
        boot.write_slot(SlotId::A, b"kernel-a", b"initramfs-a")
            .unwrap();
        boot
    }

    #[test]
    fn a_slot_is_written_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let boot = factory(dir.path());
        boot.write_slot(SlotId::B, b"kernel-b", &[7u8; 3 << 20])
            .unwrap();
        assert_eq!(
            std::fs::read(boot.slot_file(SlotId::B, KERNEL)).unwrap(),
            b"kernel-b"
        );
        assert_eq!(
            std::fs::read(boot.slot_file(SlotId::B, INITRAMFS))
                .unwrap()
                .len(),
            3 << 20
        );
        // A shorter rewrite leaves no stale tail.
        boot.write_slot(SlotId::B, b"k2", b"i2").unwrap();
        assert_eq!(
            std::fs::read(boot.slot_file(SlotId::B, INITRAMFS)).unwrap(),
            b"i2"
        );
    }

    #[test]
    fn env_is_rewritten_in_place_for_both_loaders() {
        let dir = tempfile::tempdir().unwrap();
        let boot = factory(dir.path());
        let factory_view = boot.read_env();
        let factory_env = BootEnv {
            primary: SlotId::A,
            trial: None,
        };
        assert_eq!(factory_view.grub, Ok(factory_env));
        assert_eq!(factory_view.syslinux, Ok(factory_env));
        let ldlinux_len = std::fs::metadata(dir.path().join("ldlinux.sys"))
            .unwrap()
            .len();
        let head = std::fs::read(dir.path().join("ldlinux.sys")).unwrap()[..4096].to_vec();
        for env in [
            BootEnv {
                primary: SlotId::A,
                trial: Some(SlotId::B),
            },
            BootEnv {
                primary: SlotId::B,
                trial: None,
            },
        ] {
            boot.write_env(&env).unwrap();
            let view = boot.read_env();
            assert_eq!(view.grub, Ok(env));
            assert_eq!(view.syslinux, Ok(env));
        }
        let ldlinux = std::fs::read(dir.path().join("ldlinux.sys")).unwrap();
        assert_eq!(ldlinux.len() as u64, ldlinux_len);
        assert_eq!(ldlinux[..4096], head[..], "the loader code is untouched");
    }

    #[test]
    fn foreign_loader_files_are_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let boot = factory(dir.path());
        std::fs::write(dir.path().join("ldlinux.sys"), vec![0u8; 8192]).unwrap();
        let env = BootEnv {
            primary: SlotId::A,
            trial: Some(SlotId::B),
        };
        assert!(matches!(
            boot.write_env(&env),
            Err(BootDirError::Unexpected(..))
        ));
        assert_eq!(
            std::fs::read(dir.path().join("ldlinux.sys")).unwrap(),
            vec![0u8; 8192]
        );
        std::fs::write(dir.path().join("grubenv"), b"something else").unwrap();
        assert!(matches!(
            boot.write_env(&env),
            Err(BootDirError::Unexpected(..))
        ));
    }
}
