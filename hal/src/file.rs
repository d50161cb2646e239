//! A device in a regular file: sparse (created with `set_len`), `O_DIRECT` where the filesystem
//! supports it (so the page cache neither doubles memory nor hides write errors until fsync), with
//! bounce buffers for callers whose buffers are not aligned. `discard` punches holes.
// Casts: lengths are bounded by in-memory buffer sizes (usize) checked before the cast.
#![allow(clippy::cast_possible_truncation)]

use std::fs::{File, OpenOptions};
use std::path::Path;

use crate::buf::AlignedBuf;
use crate::error::Error;
use crate::fdio::BlockFile;

/// Whether to open with `O_DIRECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectIo {
    /// Use `O_DIRECT` if the filesystem accepts it (probed with one aligned read), else buffered.
    Auto,
    /// Require `O_DIRECT`; opening fails where the filesystem refuses it.
    Required,
    /// Buffered I/O through the page cache.
    Off,
}

/// How to open a [`FileDevice`].
#[derive(Debug, Clone)]
pub struct FileOptions {
    /// Block size exposed to core (power of two, >= 512). Default 4096.
    pub block_size: u32,
    /// `O_DIRECT` policy. Default [`DirectIo::Auto`].
    pub direct: DirectIo,
    /// Create the file (or grow it) sparse to this many bytes. Default: open an existing file.
    pub create_size: Option<u64>,
    /// Open read-only. Default false.
    pub read_only: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        Self {
            block_size: 4096,
            direct: DirectIo::Auto,
            create_size: None,
            read_only: false,
        }
    }
}

/// A [`BlockDevice`](edgevol_core::BlockDevice) in a regular file. The capacity is the file length rounded down to blocks.
#[derive(Debug)]
pub struct FileDevice {
    io: BlockFile,
}

impl FileDevice {
    /// Opens an existing file with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_with(path, &FileOptions::default())
    }

    /// Creates (or grows) a sparse file of `size` bytes and opens it with default options.
    pub fn create(path: impl AsRef<Path>, size: u64) -> Result<Self, Error> {
        Self::open_with(
            path,
            &FileOptions {
                create_size: Some(size),
                ..FileOptions::default()
            },
        )
    }

    /// Opens with explicit options.
    pub fn open_with(path: impl AsRef<Path>, opts: &FileOptions) -> Result<Self, Error> {
        let path = path.as_ref();
        let bs = opts.block_size;
        if !(bs.is_power_of_two() && bs >= 512) {
            return Err(Error::Misaligned {
                value: u64::from(bs),
                align: 512,
            });
        }
        if let Some(size) = opts.create_size {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| Error::io("create", Some(path), e))?;
            let len = f
                .metadata()
                .map_err(|e| Error::io("stat", Some(path), e))?
                .len();
            if len < size {
                f.set_len(size)
                    .map_err(|e| Error::io("ftruncate", Some(path), e))?;
            }
        }
        let (file, direct) = match opts.direct {
            DirectIo::Off => (open_file(path, opts.read_only, false)?, false),
            DirectIo::Required => (open_file(path, opts.read_only, true)?, true),
            DirectIo::Auto => match open_file(path, opts.read_only, true) {
                Ok(f) if direct_read_works(&f, bs) => (f, true),
                Ok(_) | Err(_) => (open_file(path, opts.read_only, false)?, false),
            },
        };
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", Some(path), e))?
            .len();
        Ok(Self {
            io: BlockFile {
                file,
                path: path.to_path_buf(),
                block_size: bs,
                block_count: len / u64::from(bs),
                direct_align: direct.then_some(bs as usize),
                read_only: opts.read_only,
            },
        })
    }

    /// Whether the file lives in memory (tmpfs): its reads and writes are copies that never
    /// wait on a drive, with `O_DIRECT` or without.
    pub fn in_memory(&self) -> bool {
        use nix::sys::statfs::{fstatfs, TMPFS_MAGIC};
        fstatfs(&self.io.file).is_ok_and(|s| s.filesystem_type() == TMPFS_MAGIC)
    }

    /// Punches a hole over `count` blocks from `block` (reads return zeros). Where the filesystem
    /// cannot punch holes, writes zeros instead.
    pub fn discard_blocks(&self, block: u64, count: u64) -> Result<(), Error> {
        let [offset, len] = self.io.byte_range(block, count)?;
        match punch_hole(&self.io.file, offset, len) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => self.zero_fill(block, count),
            Err(e) => Err(Error::io("fallocate(PUNCH_HOLE)", Some(&self.io.path), e)),
        }
    }

    fn zero_fill(&self, block: u64, count: u64) -> Result<(), Error> {
        let bs = u64::from(self.block_size());
        crate::buf::write_zeros(bs, block, count, |b, zeros| self.write_blocks(b, zeros))
    }
}

fn open_file(path: &Path, read_only: bool, direct: bool) -> Result<File, Error> {
    let mut o = OpenOptions::new();
    o.read(true).write(!read_only);
    #[cfg(target_os = "linux")]
    if direct {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_DIRECT);
    }
    #[cfg(not(target_os = "linux"))]
    if direct {
        return Err(Error::Unsupported("O_DIRECT outside Linux"));
    }
    o.open(path).map_err(|e| {
        Error::io(
            if direct { "open(O_DIRECT)" } else { "open" },
            Some(path),
            e,
        )
    })
}

/// Some filesystems accept `O_DIRECT` at open and fail at the first I/O: probe with one read.
fn direct_read_works(f: &File, block_size: u32) -> bool {
    use std::os::unix::fs::FileExt;
    let mut b = AlignedBuf::with_align(block_size as usize, block_size as usize);
    f.read_at(&mut b, 0).is_ok()
}

#[cfg(target_os = "linux")]
fn punch_hole(f: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use nix::fcntl::{fallocate, FallocateFlags};
    let off = i64::try_from(offset).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let len = i64::try_from(len).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    fallocate(
        f,
        FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
        off,
        len,
    )
    .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
}

#[cfg(not(target_os = "linux"))]
fn punch_hole(_f: &File, _offset: u64, _len: u64) -> std::io::Result<()> {
    Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))
}

forward_block_file!(FileDevice);

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_core::{BlockDevice, DeviceError, DeviceErrorKind};
    use std::os::unix::fs::MetadataExt;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// The file system type `/proc/self/mounts` gives for `dir` (its longest mount point).
    fn mounted_type(dir: &Path) -> String {
        let dir = dir.canonicalize().unwrap();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        mounts
            .lines()
            .filter_map(|l| {
                let mut f = l.split(' ');
                let (point, kind) = (f.nth(1)?, f.next()?);
                dir.starts_with(point)
                    .then(|| (point.len(), kind.to_owned()))
            })
            .max()
            .map(|(_, kind)| kind)
            .unwrap()
    }

    #[test]
    fn a_file_on_tmpfs_is_memory_and_one_on_a_drive_is_not() {
        let shm = Path::new("/dev/shm");
        let source = Path::new(env!("CARGO_MANIFEST_DIR"));
        for parent in [shm, source] {
            if !parent.is_dir() {
                continue;
            }
            let dir = tempfile::tempdir_in(parent).unwrap();
            let d = FileDevice::create(dir.path().join("dev.img"), 1 << 20).unwrap();
            let tmpfs = mounted_type(dir.path()) == "tmpfs";
            assert_eq!(d.in_memory(), tmpfs, "{}", parent.display());
        }
    }

    #[test]
    fn sparse_create_read_write_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev.img");
        let mut d = FileDevice::create(&p, 64 << 20).unwrap();
        assert_eq!(d.block_count(), (64 << 20) / 4096);
        // Sparse: a 64 MiB device costs (almost) nothing until written.
        assert!(std::fs::metadata(&p).unwrap().blocks() * 512 < 1 << 20);
        let data = pattern(3 * 4096, 7);
        d.write(10, &data).unwrap();
        // Unaligned caller buffer: bounced when O_DIRECT is on.
        let mut unaligned = vec![0u8; 3 * 4096 + 1];
        d.read(10, &mut unaligned[1..]).unwrap();
        assert_eq!(&unaligned[1..], &data[..]);
        d.write(12, &unaligned[1..4097]).unwrap();
        d.flush().unwrap();
        drop(d);
        let mut d = FileDevice::open(&p).unwrap();
        let mut back = vec![0u8; 4096];
        d.read(12, &mut back).unwrap();
        assert_eq!(&back[..], &data[..4096]);
        d.read(11, &mut back).unwrap();
        assert_eq!(&back[..], &data[4096..8192]);
    }

    #[test]
    fn discard_punches_holes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev.img");
        let mut d = FileDevice::create(&p, 16 << 20).unwrap();
        d.write(0, &pattern(256 * 4096, 1)).unwrap();
        d.flush().unwrap();
        let used = std::fs::metadata(&p).unwrap().blocks() * 512;
        assert!(used >= 1 << 20, "written data allocated: {used}");
        d.discard(0, 256).unwrap();
        d.flush().unwrap();
        let after = std::fs::metadata(&p).unwrap().blocks() * 512;
        let mut b = vec![1u8; 4096];
        d.read(100, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0), "discarded blocks read zeros");
        assert!(after < used, "hole punched: {used} -> {after}");
    }

    #[test]
    fn errors_and_direct_policy() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev.img");
        let mut d = FileDevice::create(&p, 1 << 20).unwrap();
        assert_eq!(
            d.write(255, &[0; 8192]).unwrap_err().kind(),
            DeviceErrorKind::OutOfBounds
        );
        assert_eq!(
            d.read(0, &mut [0; 100]).unwrap_err().kind(),
            DeviceErrorKind::NotAligned
        );
        assert_eq!(
            d.discard(250, 7).unwrap_err().kind(),
            DeviceErrorKind::OutOfBounds
        );
        let buffered = FileDevice::open_with(
            &p,
            &FileOptions {
                direct: DirectIo::Off,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(!buffered.is_direct());
        let mut ro = FileDevice::open_with(
            &p,
            &FileOptions {
                read_only: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            ro.write(0, &[0; 4096]).unwrap_err().kind(),
            DeviceErrorKind::ReadOnly
        );
        let e = FileDevice::open(dir.path().join("missing")).unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e}");
        // /dev/shm is tmpfs: O_DIRECT is either honoured or cleanly refused, never an I/O error.
        if let Ok(f) = tempfile::NamedTempFile::new_in("/dev/shm") {
            let mut d = FileDevice::create(f.path(), 1 << 20).unwrap();
            d.write(3, &pattern(4096, 9)).unwrap();
            let mut b = vec![0; 4096];
            d.read(3, &mut b).unwrap();
            assert_eq!(b, pattern(4096, 9));
            println!("tmpfs O_DIRECT: {}", d.is_direct());
        }
    }
}
