//! Linux block devices (`/dev/nvmeXnY`, `/dev/vdX`, `/dev/loopN`, ...): geometry from ioctls,
//! `O_DIRECT` I/O, `BLKDISCARD`/`BLKZEROOUT`, `fdatasync` as the flush (the kernel turns it into a
//! cache flush / NVMe Flush command when the drive has a volatile write cache).
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::error::Error;
use crate::fdio::BlockFile;
use crate::scheduler::{self, Scheduler};

mod ioctl {
    // <linux/fs.h>: BLKGETSIZE64 is _IOR(0x12, 114, size_t); the others are _IO(0x12, n) taking a
    // pointer argument, hence the `_bad` variants.
    nix::ioctl_read!(blkgetsize64, 0x12, 114, u64);
    nix::ioctl_read_bad!(blksszget, nix::request_code_none!(0x12, 104), libc::c_int);
    nix::ioctl_read_bad!(blkpbszget, nix::request_code_none!(0x12, 123), libc::c_uint);
    nix::ioctl_read_bad!(blkroget, nix::request_code_none!(0x12, 94), libc::c_int);
    nix::ioctl_write_ptr_bad!(blkdiscard, nix::request_code_none!(0x12, 119), [u64; 2]);
    nix::ioctl_write_ptr_bad!(blkzeroout, nix::request_code_none!(0x12, 127), [u64; 2]);
}

/// How to open a [`LinuxBlockDevice`].
#[derive(Debug, Clone)]
pub struct BlockOptions {
    /// `O_EXCL`: fail with EBUSY if the device is mounted or held by another exclusive opener
    /// (device-mapper, md, another edgevol). Default true.
    pub exclusive: bool,
    /// Open read-only (or the kernel reports the device read-only). Default false.
    pub read_only: bool,
    /// `O_DIRECT`. Default true: a storage daemon must not double-cache or see late write errors.
    pub direct: bool,
    /// Block size exposed to core; must be a multiple of the logical block size. Default: the
    /// logical block size.
    pub block_size: Option<u32>,
    /// Select the `none` I/O scheduler when opened for writing (see [`crate::scheduler`]).
    /// Default true.
    pub bypass_scheduler: bool,
}

impl Default for BlockOptions {
    fn default() -> Self {
        Self {
            exclusive: true,
            read_only: false,
            direct: true,
            block_size: None,
            bypass_scheduler: true,
        }
    }
}

/// An open Linux block device.
#[derive(Debug)]
pub struct LinuxBlockDevice {
    io: BlockFile,
    size_bytes: u64,
    logical_block_size: u32,
    physical_block_size: u32,
    scheduler: Scheduler,
}

impl LinuxBlockDevice {
    /// Opens with default options (exclusive, direct, read-write).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_with(path, &BlockOptions::default())
    }

    /// Opens with explicit options.
    pub fn open_with(path: impl AsRef<Path>, opts: &BlockOptions) -> Result<Self, Error> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| Error::io("stat", Some(path), e))?;
        if !meta.file_type().is_block_device() {
            return Err(Error::Unsupported(
                "not a block device (use FileDevice for files)",
            ));
        }
        let mut flags = libc::O_CLOEXEC;
        if opts.direct {
            flags |= libc::O_DIRECT;
        }
        if opts.exclusive {
            flags |= libc::O_EXCL;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .custom_flags(flags)
            .open(path)
            .map_err(|e| Error::io("open", Some(path), e))?;
        let fd = file.as_raw_fd();
        let mut size_bytes = 0u64;
        // SAFETY: fd is open for the duration of the call; the kernel writes one u64.
        unsafe { ioctl::blkgetsize64(fd, &mut size_bytes) }
            .map_err(|e| Error::errno("BLKGETSIZE64", Some(path), e))?;
        let mut lbs: libc::c_int = 0;
        // SAFETY: fd is open; the kernel writes one int.
        unsafe { ioctl::blksszget(fd, &mut lbs) }
            .map_err(|e| Error::errno("BLKSSZGET", Some(path), e))?;
        let mut pbs: libc::c_uint = 0;
        // SAFETY: fd is open; the kernel writes one unsigned int.
        unsafe { ioctl::blkpbszget(fd, &mut pbs) }
            .map_err(|e| Error::errno("BLKPBSZGET", Some(path), e))?;
        let mut ro: libc::c_int = 0;
        // SAFETY: fd is open; the kernel writes one int.
        unsafe { ioctl::blkroget(fd, &mut ro) }
            .map_err(|e| Error::errno("BLKROGET", Some(path), e))?;
        let logical =
            u32::try_from(lbs).map_err(|_| Error::Corrupt("negative logical block size"))?;
        let block_size = opts.block_size.unwrap_or(logical);
        if !block_size.is_power_of_two()
            || block_size < logical
            || !block_size.is_multiple_of(logical)
        {
            return Err(Error::Misaligned {
                value: u64::from(block_size),
                align: u64::from(logical),
            });
        }
        let scheduler = if opts.bypass_scheduler && !opts.read_only {
            scheduler::bypass(meta.rdev())
        } else {
            Scheduler::Unchanged
        };
        Ok(Self {
            io: BlockFile {
                file,
                path: path.to_path_buf(),
                block_size,
                block_count: size_bytes / u64::from(block_size),
                direct_align: opts.direct.then_some(logical as usize),
                read_only: opts.read_only || ro != 0,
            },
            size_bytes,
            logical_block_size: logical,
            physical_block_size: pbs,
            scheduler,
        })
    }

    /// Size in bytes (BLKGETSIZE64).
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    /// Logical block size (BLKSSZGET): the smallest `O_DIRECT` unit.
    pub fn logical_block_size(&self) -> u32 {
        self.logical_block_size
    }
    /// Physical block size (BLKPBSZGET): writes smaller than this are read-modify-write.
    pub fn physical_block_size(&self) -> u32 {
        self.physical_block_size
    }
    /// What opening did to the device's I/O scheduler.
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }
    /// The open file (for NVMe passthrough ioctls on the same descriptor).
    pub fn file(&self) -> &File {
        &self.io.file
    }

    /// `BLKDISCARD` (NVMe Dataset Management / deallocate). [`Error::Unsupported`] if the device
    /// has no discard.
    pub fn discard_blocks(&self, block: u64, count: u64) -> Result<(), Error> {
        let range = self.io.byte_range(block, count)?;
        if count == 0 {
            return Ok(());
        }
        // SAFETY: fd is open; the kernel reads two u64 (start, length) from `range`.
        match unsafe { ioctl::blkdiscard(self.io.file.as_raw_fd(), &range) } {
            Ok(_) => Ok(()),
            Err(nix::Error::EOPNOTSUPP) => Err(Error::Unsupported("BLKDISCARD on this device")),
            Err(e) => Err(Error::errno("BLKDISCARD", Some(&self.io.path), e)),
        }
    }

    /// `BLKZEROOUT` (NVMe Write Zeroes, or written zeros where the device lacks it).
    pub fn zero_blocks(&self, block: u64, count: u64) -> Result<(), Error> {
        let range = self.io.byte_range(block, count)?;
        if count == 0 {
            return Ok(());
        }
        // SAFETY: fd is open; the kernel reads two u64 (start, length) from `range`.
        unsafe { ioctl::blkzeroout(self.io.file.as_raw_fd(), &range) }
            .map(drop)
            .map_err(|e| Error::errno("BLKZEROOUT", Some(&self.io.path), e))
    }
}

forward_block_file!(LinuxBlockDevice);

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use edgevol_core::BlockDevice;
    use std::path::PathBuf;
    use std::process::Command;

    /// A loop device over a sparse temp file, detached on drop. `None` (with the reason printed)
    /// where the host cannot make one (no root, no loop driver, container without /dev/loop*).
    /// Loop devices are a host-wide resource: tests that use one run one at a time, so two
    /// `losetup --find` calls never race for the same device.
    pub(crate) struct Loop {
        pub(crate) dev: PathBuf,
        _dir: tempfile::TempDir,
        _serial: std::sync::MutexGuard<'static, ()>,
    }

    static LOOP_SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    impl Loop {
        pub(crate) fn new(size: u64, sector: u32) -> Option<Self> {
            let serial = LOOP_SERIAL
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let dir = tempfile::tempdir().ok()?;
            let img = dir.path().join("loop.img");
            File::create(&img).ok()?.set_len(size).ok()?;
            let out = Command::new("losetup")
                .args([
                    "--find",
                    "--show",
                    "--direct-io=on",
                    "--sector-size",
                    &sector.to_string(),
                ])
                .arg(&img)
                .output();
            match out {
                Ok(o) if o.status.success() => {
                    let dev = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_string());
                    Some(Self {
                        dev,
                        _dir: dir,
                        _serial: serial,
                    })
                }
                Ok(o) => {
                    println!(
                        "SKIP loop-device test: losetup failed: {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    );
                    None
                }
                Err(e) => {
                    println!("SKIP loop-device test: cannot run losetup: {e}");
                    None
                }
            }
        }
    }

    impl Drop for Loop {
        fn drop(&mut self) {
            let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
        }
    }

    #[test]
    fn opening_for_a_pool_selects_the_none_scheduler_and_says_what_it_was() {
        let Some(lo) = Loop::new(8 << 20, 4096) else {
            return;
        };
        let name = lo.dev.file_name().unwrap().to_str().unwrap().to_owned();
        let sysfs = PathBuf::from(format!("/sys/block/{name}/queue/scheduler"));
        let active = || {
            let list = std::fs::read_to_string(&sysfs).unwrap();
            scheduler::active(&list).map(str::to_owned)
        };
        if std::fs::write(&sysfs, "mq-deadline").is_err() {
            println!("SKIP scheduler test: cannot select mq-deadline on {name}");
            return;
        }
        // Read-only, or asked not to: left alone.
        for opts in [
            BlockOptions {
                read_only: true,
                ..Default::default()
            },
            BlockOptions {
                bypass_scheduler: false,
                ..Default::default()
            },
        ] {
            let d = LinuxBlockDevice::open_with(&lo.dev, &opts).unwrap();
            assert_eq!(*d.scheduler(), Scheduler::Unchanged);
            assert_eq!(active().as_deref(), Some("mq-deadline"));
        }
        let d = LinuxBlockDevice::open(&lo.dev).unwrap();
        let was = "mq-deadline".to_owned();
        assert_eq!(*d.scheduler(), Scheduler::Bypassed { was });
        assert_eq!(active().as_deref(), Some("none"));
        drop(d);
        // Already none: nothing to do.
        let d = LinuxBlockDevice::open(&lo.dev).unwrap();
        assert_eq!(*d.scheduler(), Scheduler::Unchanged);
    }

    #[test]
    fn loop_device_geometry_io_discard() {
        let Some(lo) = Loop::new(32 << 20, 4096) else {
            return;
        };
        let mut d = LinuxBlockDevice::open(&lo.dev).unwrap();
        assert_eq!(d.size_bytes(), 32 << 20);
        assert_eq!(d.logical_block_size(), 4096);
        assert_eq!(BlockDevice::block_count(&d), (32 << 20) / 4096);
        // Exclusive open: a second O_EXCL opener is refused.
        let e = LinuxBlockDevice::open(&lo.dev).unwrap_err();
        assert!(
            matches!(&e, Error::Io { source, .. } if source.raw_os_error() == Some(libc::EBUSY)),
            "{e}"
        );
        let data: Vec<u8> = (0..8 * 4096u32).map(|i| (i % 253) as u8).collect();
        d.write(100, &data).unwrap();
        d.flush().unwrap();
        let mut back = vec![0u8; data.len() + 1];
        d.read(100, &mut back[1..]).unwrap(); // unaligned: bounced
        assert_eq!(&back[1..], &data[..]);
        d.discard(100, 4).unwrap();
        d.read(100, &mut back[1..]).unwrap();
        assert!(
            back[1..4 * 4096 + 1].iter().all(|&b| b == 0),
            "loop discard punches a hole"
        );
        assert_eq!(&back[4 * 4096 + 1..], &data[4 * 4096..]);
        d.zero_blocks(104, 4).unwrap();
        d.read(104, &mut back[1..4 * 4096 + 1]).unwrap();
        assert!(back[1..4 * 4096 + 1].iter().all(|&b| b == 0));
        assert!(matches!(
            d.write(8191, &data[..8192]),
            Err(Error::OutOfBounds { .. })
        ));
    }

    #[test]
    fn loop_device_block_size_override_and_not_a_block_device() {
        let f = tempfile::NamedTempFile::new().unwrap();
        assert!(matches!(
            LinuxBlockDevice::open(f.path()),
            Err(Error::Unsupported(_))
        ));
        let Some(lo) = Loop::new(8 << 20, 512) else {
            return;
        };
        let opts = BlockOptions {
            block_size: Some(4096),
            ..Default::default()
        };
        let mut d = LinuxBlockDevice::open_with(&lo.dev, &opts).unwrap();
        assert_eq!(d.logical_block_size(), 512);
        assert_eq!(BlockDevice::block_size(&d), 4096);
        d.write(3, &[0x5A; 4096]).unwrap();
        let mut b = [0u8; 4096];
        d.read(3, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0x5A));
        let bad = BlockOptions {
            block_size: Some(256),
            ..Default::default()
        };
        drop(d);
        let e = LinuxBlockDevice::open_with(&lo.dev, &bad);
        assert!(matches!(e, Err(Error::Misaligned { .. })), "{e:?}");
    }
}
