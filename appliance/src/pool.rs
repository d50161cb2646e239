//! Opening the pool behind the volumes: core's [`Pool`] on a hal device.
//!
//! A device that holds an edgevol pool is opened (core recovers it). In dev mode a pool file
//! that was never written (created just now, or still fully sparse) is formatted. With
//! `format_blank` (an appliance's first boot), a device whose first MiB is all zero and that
//! carries no known signature (hal's [`check_formattable`]) is formatted too: a new NVMe drive
//! reads as zeros. Anything else that holds no pool is refused, never formatted over.
//!
//! A device is held exclusively: a block device is opened with `O_EXCL`, a file is locked with
//! [`lock_device`] by the daemon for its lifetime and by `edgevold format`, so neither writes
//! under the other.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use edgevol_core::{Corruption, Epoch, FormatOptions, OpenOptions, Pool, Progress};
use edgevol_hal::discovery::check_formattable;
use edgevol_hal::scheduler::Scheduler;
use edgevol_hal::{FileDevice, LinuxBlockDevice};

use crate::config::DEV_POOL_BYTES;
use crate::progress::{human_bytes, Steps};

/// Allocation unit of pools the appliance formats.
pub const CLUSTER_SIZE: u32 = 1 << 20;

/// edgevold's exit status when the pool is intact but this firmware cannot read it
/// ([`PoolError::Unsupported`]): 78, EX_CONFIG of sysexits.h (the box runs firmware that does
/// not match its pool). Restarting the same firmware cannot help: image/init reports it and
/// waits, and on a trial boot rolls back.
pub const UNSUPPORTED_EXIT: u8 = 78;

/// Why the pool could not be opened.
#[derive(Debug)]
pub enum PoolError {
    /// A device could not be opened or created.
    Device {
        /// The device.
        path: PathBuf,
        /// What went wrong.
        error: String,
    },
    /// Another process holds the device: a running edgevold, a mount, device-mapper or md.
    Busy(PathBuf),
    /// More devices than a pool spans.
    SeveralDevices(usize),
    /// The device holds no edgevol pool and is not known blank: refused.
    NotAPool(PathBuf),
    /// The pool is intact but this firmware cannot read it (a newer format version, an
    /// incompatible feature it lacks): nothing was written. The daemon exits with
    /// [`UNSUPPORTED_EXIT`].
    Unsupported {
        /// The device.
        path: PathBuf,
        /// What this firmware lacks.
        error: edgevol_core::Unsupported,
    },
    /// Core refused to format or open the pool.
    Core {
        /// The device.
        path: PathBuf,
        /// Core's error.
        error: edgevol_core::Error,
    },
    /// The final flush at shutdown failed.
    Flush(edgevol_core::Error),
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::Device { path, error } => write!(f, "device {}: {error}", path.display()),
            PoolError::Busy(path) => write!(
                f,
                "device {} is in use (a running edgevold, a mount, or another driver holds it)",
                path.display()
            ),
            PoolError::SeveralDevices(n) => {
                write!(f, "{n} devices given; a pool spans exactly one device")
            }
            PoolError::NotAPool(path) => write!(
                f,
                "device {} holds no edgevol pool and is not blank; refusing to format it",
                path.display()
            ),
            PoolError::Unsupported { path, error } => write!(
                f,
                "pool on {}: {}",
                path.display(),
                crate::pool_words::unsupported(*error)
            ),
            PoolError::Core { path, error } => write!(
                f,
                "pool on {}: {}",
                path.display(),
                crate::pool_words::describe(error)
            ),
            PoolError::Flush(error) => write!(
                f,
                "flush at shutdown: {}",
                crate::pool_words::describe(error)
            ),
        }
    }
}

impl std::error::Error for PoolError {}

/// The device under the pool (hal's: a file or a Linux block device; test builds add hal's
/// fault-injecting variant through hal's `testing` feature).
pub use edgevol_hal::PoolDevice;

/// A freshly formatted pool, writing soft commits in `epoch` from now on.
fn with_epoch(
    mut pool: Pool<PoolDevice>,
    epoch: Option<Epoch>,
) -> Result<Pool<PoolDevice>, edgevol_core::Error> {
    if let Some(epoch) = epoch {
        pool.set_epoch(epoch)?;
    }
    Ok(pool)
}

/// Holds a pool device against other edgevold processes while it lives: an advisory `flock`
/// on a regular file (a block device needs none: it is opened with `O_EXCL`). The daemon keeps
/// one next to its data-dir lock; `edgevold format` keeps one while it formats.
#[derive(Debug)]
pub struct DeviceLock {
    _file: Option<fs::File>,
}

/// Locks `path` if it is a regular file. A path that does not exist (yet) is not locked: opening
/// it reports that.
pub fn lock_device(path: &Path) -> Result<DeviceLock, PoolError> {
    let device_err = |error: &dyn fmt::Display| PoolError::Device {
        path: path.to_path_buf(),
        error: error.to_string(),
    };
    match fs::metadata(path) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Ok(DeviceLock { _file: None }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(DeviceLock { _file: None }),
        Err(e) => return Err(device_err(&e)),
    }
    // A handle of its own: flock belongs to an open file description, and hal's FileDevice
    // keeps its handle private.
    let file = fs::File::open(path).map_err(|e| device_err(&e))?;
    match file.try_lock() {
        Ok(()) => Ok(DeviceLock { _file: Some(file) }),
        Err(fs::TryLockError::WouldBlock) => Err(PoolError::Busy(path.to_path_buf())),
        Err(fs::TryLockError::Error(e)) => Err(device_err(&e)),
    }
}

/// The daemon's locks on its `devices`, taken at start; in dev mode the pool file is created
/// first, so it is locked before it is formatted.
pub fn lock_devices(devices: &[PathBuf], dev: bool) -> Result<Vec<DeviceLock>, PoolError> {
    devices
        .iter()
        .map(|path| {
            if dev {
                create_sparse(path, DEV_POOL_BYTES).map_err(|e| PoolError::Device {
                    path: path.clone(),
                    error: e.to_string(),
                })?;
            }
            lock_device(path)
        })
        .collect()
}

/// How much of a device must read as zeros, from its start, before `format_blank` formats it.
pub const BLANK_PROBE_BYTES: usize = 1 << 20;

/// Opens the pool on `devices` (formatting a never-written dev pool file first). Blocking: run
/// it off the reactor.
pub fn open(devices: &[PathBuf], dev: bool) -> Result<Pool<PoolDevice>, PoolError> {
    open_with(devices, dev, false)
}

/// As [`open`]; with `format_blank`, also formats a blank device (first MiB all zero, no
/// signature) instead of refusing it. A device holding anything else is still refused.
pub fn open_with(
    devices: &[PathBuf],
    dev: bool,
    format_blank: bool,
) -> Result<Pool<PoolDevice>, PoolError> {
    // Soft journal frames of this boot are replayed (a daemon crash loses nothing), those of an
    // earlier boot only if sealed (see `crate::sync`).
    let epoch = crate::sync::boot_epoch();
    let path = match devices {
        [one] => one,
        _ => return Err(PoolError::SeveralDevices(devices.len())),
    };
    let device_err = |error: &dyn fmt::Display| PoolError::Device {
        path: path.clone(),
        error: error.to_string(),
    };
    let created = dev && create_sparse(path, DEV_POOL_BYTES).map_err(|e| device_err(&e))?;
    let meta = fs::metadata(path).map_err(|e| device_err(&e))?;
    // A file with no allocated blocks was never written: it cannot hold anyone's data.
    let never_written = created || (meta.is_file() && meta.blocks() == 0);
    // Probed before the device is opened for the pool: an edgevol pool starts with its
    // superblocks, so it is never blank and is never formatted over.
    // A never-written file reads as zeros: blank, like a new drive (only dev mode formats it
    // without looking, below).
    let blank =
        format_blank && !(dev && never_written) && is_blank(path).map_err(|e| device_err(&e))?;
    let device = open_device(path)?;
    let core_err = |error| PoolError::Core {
        path: path.clone(),
        error,
    };
    if dev && never_written {
        // Nothing was ever written, so there is nothing to deallocate.
        tracing::info!(device = %path.display(), "formatting a new pool");
        return Pool::format(device, FormatOptions::new(new_uuid()?, CLUSTER_SIZE))
            .and_then(|pool| with_epoch(pool, epoch))
            .map_err(core_err);
    }
    if blank {
        tracing::info!(device = %path.display(), "formatting a new pool: deallocating the data area");
        let mut steps = Steps::default();
        let pool = format_device(device, path, CLUSTER_SIZE, &mut |p| {
            if let Some(percent) = steps.next(p) {
                tracing::info!(
                    device = %path.display(),
                    "formatting: {percent}% of {} deallocated",
                    human_bytes(p.total)
                );
            }
        });
        return with_epoch(pool?, epoch).map_err(core_err);
    }
    match Pool::open_with(device, OpenOptions { epoch }) {
        Ok(pool) => {
            if let Some(feature) = pool.read_only() {
                tracing::warn!(
                    device = %path.display(),
                    "pool opened read-only, every write and change is refused: {}",
                    crate::pool_words::read_only(feature)
                );
            }
            Ok(pool)
        }
        Err(edgevol_core::Error::Corrupt(Corruption::NoSuperblock)) => {
            Err(PoolError::NotAPool(path.clone()))
        }
        Err(edgevol_core::Error::Unsupported(error)) => Err(PoolError::Unsupported {
            path: path.clone(),
            error,
        }),
        Err(e) => Err(core_err(e)),
    }
}

/// Opens `path` for a pool: a block device with `O_EXCL` (refused while mounted or held by
/// device-mapper, md or another edgevold), a regular file as is (see [`lock_device`]). Never
/// creates anything.
pub fn open_device(path: &Path) -> Result<PoolDevice, PoolError> {
    let device_err = |error: &dyn fmt::Display| PoolError::Device {
        path: path.to_path_buf(),
        error: error.to_string(),
    };
    let meta = fs::metadata(path).map_err(|e| device_err(&e))?;
    if meta.file_type().is_block_device() {
        match LinuxBlockDevice::open(path) {
            Ok(d) => {
                match d.scheduler() {
                    Scheduler::Bypassed { was } => tracing::info!(
                        device = %path.display(), %was,
                        "I/O scheduler set to none: direct I/O goes straight to the driver"
                    ),
                    Scheduler::Kept { current, why } => tracing::warn!(
                        device = %path.display(), %current, %why,
                        "I/O scheduler left in place: each direct I/O may wait for a kblockd worker"
                    ),
                    Scheduler::Unchanged => {}
                }
                Ok(PoolDevice::Block(d))
            }
            Err(edgevol_hal::Error::Io { source, .. })
                if source.kind() == io::ErrorKind::ResourceBusy =>
            {
                Err(PoolError::Busy(path.to_path_buf()))
            }
            Err(e) => Err(device_err(&e)),
        }
    } else if meta.is_file() {
        Ok(PoolDevice::File(
            FileDevice::open(path).map_err(|e| device_err(&e))?,
        ))
    } else {
        Err(device_err(&"neither a regular file nor a block device"))
    }
}

/// Formats `device` (at `path`) as a new pool and deallocates its data area, reporting
/// progress. Durable when it returns.
pub fn format_device(
    device: PoolDevice,
    path: &Path,
    cluster_size: u32,
    progress: &mut dyn FnMut(Progress),
) -> Result<Pool<PoolDevice>, PoolError> {
    let options = FormatOptions::new(new_uuid()?, cluster_size);
    Pool::format_discarding(device, options, progress).map_err(|error| PoolError::Core {
        path: path.to_path_buf(),
        error,
    })
}

/// Whether `path` reads as zeros over its first [`BLANK_PROBE_BYTES`] (or all of it, if
/// shorter) and hal finds no signature on it.
fn is_blank(path: &Path) -> Result<bool, String> {
    if !head_is_zero(path)? {
        return Ok(false);
    }
    match check_formattable(path, false) {
        Ok(()) => Ok(true),
        Err(edgevol_hal::Error::Refused { .. }) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// Whether the first [`BLANK_PROBE_BYTES`] of `path` (or all of it, if shorter) read as zeros.
pub(crate) fn head_is_zero(path: &Path) -> Result<bool, String> {
    let file = fs::File::open(path).map_err(|e| e.to_string())?;
    let mut head = vec![0u8; BLANK_PROBE_BYTES];
    let mut n = 0;
    while n < head.len() {
        match file.read_at(&mut head[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(head[..n].iter().all(|b| *b == 0))
}

/// Creates a sparse file of `bytes`; `false` if it already existed.
fn create_sparse(path: &Path, bytes: u64) -> io::Result<bool> {
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(file) => {
            file.set_len(bytes)?;
            file.sync_all()?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// A random pool UUID from the kernel.
fn new_uuid() -> Result<[u8; 16], PoolError> {
    let source = "/proc/sys/kernel/random/uuid";
    let text = fs::read_to_string(source).map_err(|e| PoolError::Device {
        path: source.into(),
        error: e.to_string(),
    })?;
    let hex: Vec<u8> = text.trim().bytes().filter(|b| *b != b'-').collect();
    let mut uuid = [0u8; 16];
    for (byte, pair) in uuid.iter_mut().zip(hex.chunks(2)) {
        let digits = std::str::from_utf8(pair).unwrap_or("");
        *byte = u8::from_str_radix(digits, 16).map_err(|_| PoolError::Device {
            path: source.into(),
            error: format!("unexpected content {text:?}"),
        })?;
    }
    Ok(uuid)
}

/// Test builds: rewrites both superblocks of the pool file at `path` (4 KiB blocks) as `version`
/// with `features`, the layout of core's `superblock.rs` spelled out: what a pool written by
/// other firmware looks like to this one.
#[cfg(test)]
pub(crate) fn restamp(path: &Path, version: u32, features: edgevol_core::Features) {
    let crc = edgevol_core::crc32c;
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut bytes = vec![0u8; 8192];
    file.read_exact_at(&mut bytes, 0).unwrap();
    for copy in 0..2 {
        let sb = &mut bytes[copy * 4096..copy * 4096 + 100];
        sb[8..12].copy_from_slice(&version.to_le_bytes());
        let c = crc(&sb[..68]);
        sb[68..72].copy_from_slice(&c.to_le_bytes());
        sb[72..80].copy_from_slice(&features.compatible.to_le_bytes());
        sb[80..88].copy_from_slice(&features.read_only_compatible.to_le_bytes());
        sb[88..96].copy_from_slice(&features.incompatible.to_le_bytes());
        let c = crc(&sb[..96]);
        sb[96..100].copy_from_slice(&c.to_le_bytes());
    }
    file.write_all_at(&bytes, 0).unwrap();
    file.sync_all().unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_core::{Feature, FeatureSet, Features};

    /// The metadata area of a dev pool file (its first 64 MiB; the file is sparse and large).
    fn head(path: &Path) -> Vec<u8> {
        let mut bytes = vec![0u8; 64 << 20];
        fs::File::open(path)
            .unwrap()
            .read_exact_at(&mut bytes, 0)
            .unwrap();
        bytes
    }

    /// A dev pool file, formatted and closed.
    fn a_pool(dir: &Path) -> PathBuf {
        let path = dir.join("pool.img");
        drop(open(std::slice::from_ref(&path), true).unwrap());
        path
    }

    #[test]
    fn a_pool_this_firmware_cannot_read_is_refused_in_words_and_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = a_pool(dir.path());
        let unknown = Feature {
            set: FeatureSet::Incompatible,
            bit: 5,
        };
        let cases = [
            (4, Features::NONE.with(unknown), "pool uses incompatible feature bit 5 (unknown to this firmware), this firmware (version "),
            (5, Features::NONE, "pool format version 5 is newer than this firmware supports (4)"),
        ];
        for (version, features, words) in cases {
            restamp(&path, version, features);
            let before = head(&path);
            for dev in [true, false] {
                let e = open_with(std::slice::from_ref(&path), dev, true).unwrap_err();
                assert!(matches!(e, PoolError::Unsupported { .. }), "{e:?}");
                let text = e.to_string();
                assert!(text.contains(words), "{text}");
                assert!(
                    !text.contains("Unsupported") && !text.contains("Corrupt"),
                    "{text}"
                );
            }
            assert!(
                head(&path) == before,
                "nothing written, nothing formatted over"
            );
        }
    }

    #[test]
    fn an_unknown_read_only_compatible_feature_opens_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = a_pool(dir.path());
        let unknown = Feature {
            set: FeatureSet::ReadOnlyCompatible,
            bit: 5,
        };
        restamp(&path, 4, Features::NONE.with(unknown));
        let mut pool = open(std::slice::from_ref(&path), false).unwrap();
        assert_eq!(pool.read_only(), Some(unknown));
        let e = pool
            .create_volume(edgevol_core::VolumeSpec::new("v", 1 << 20))
            .unwrap_err();
        assert_eq!(e, edgevol_core::Error::ReadOnly(unknown));
        assert!(
            crate::pool_words::describe(&e)
                .starts_with("the pool is read-only: it uses read-only-compatible feature bit 5"),
            "{}",
            crate::pool_words::describe(&e)
        );
    }

    #[test]
    fn a_dev_pool_is_formatted_once_then_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool.img");
        let pool = open(std::slice::from_ref(&path), true).unwrap();
        let uuid = pool.uuid();
        assert!(pool.capacity().total > 0);
        drop(pool);
        let pool = open(std::slice::from_ref(&path), true).unwrap();
        assert_eq!(pool.uuid(), uuid, "reopened, not reformatted");
    }

    #[test]
    fn foreign_data_is_never_formatted_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let mut data = vec![0u8; 64 << 20];
        data[..4].copy_from_slice(b"\x7fELF");
        fs::write(&path, &data).unwrap();
        for dev in [true, false] {
            match open(std::slice::from_ref(&path), dev) {
                Err(PoolError::NotAPool(p)) => assert_eq!(p, path),
                other => panic!("expected NotAPool, got {other:?}"),
            }
        }
        assert_eq!(fs::read(&path).unwrap(), data, "untouched");
        match open_with(std::slice::from_ref(&path), false, true) {
            Err(PoolError::NotAPool(p)) => assert_eq!(p, path),
            other => panic!("format_blank must refuse foreign data, got {other:?}"),
        }
        assert_eq!(fs::read(&path).unwrap(), data, "untouched");
        let two = [path.clone(), path.clone()];
        assert!(matches!(
            open(&two, true),
            Err(PoolError::SeveralDevices(2))
        ));
    }

    /// A written (not sparse) all-zero device: what a new drive looks like.
    fn zeroed(path: &Path, bytes: usize) {
        fs::write(path, vec![0u8; bytes]).unwrap();
        assert!(
            fs::metadata(path).unwrap().blocks() > 0,
            "allocated, not sparse"
        );
    }

    #[test]
    fn format_blank_formats_a_zeroed_device_once_then_reopens_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drive.img");
        zeroed(&path, 64 << 20);
        let one = std::slice::from_ref(&path);
        match open(one, false) {
            Err(PoolError::NotAPool(_)) => {}
            other => panic!("without format_blank a blank drive is refused, got {other:?}"),
        }
        let pool = open_with(one, false, true).unwrap();
        let uuid = pool.uuid();
        assert!(pool.capacity().total > 0);
        drop(pool);
        // The data area was deallocated: the file's blocks were given back.
        let allocated = fs::metadata(&path).unwrap().blocks() * 512;
        assert!(allocated < 16 << 20, "{allocated} bytes still allocated");
        for format_blank in [true, false] {
            let pool = open_with(one, false, format_blank).unwrap();
            assert_eq!(pool.uuid(), uuid, "reopened, not reformatted");
        }
    }

    #[test]
    fn a_device_lock_is_exclusive_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool.img");
        let one = std::slice::from_ref(&path);
        let locks = lock_devices(one, true).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().len(),
            DEV_POOL_BYTES,
            "created"
        );
        match lock_device(&path) {
            Err(PoolError::Busy(p)) => assert_eq!(p, path),
            other => panic!("expected Busy, got {other:?}"),
        }
        assert!(matches!(lock_devices(one, true), Err(PoolError::Busy(_))));
        // The holder itself opens (and here formats) the device it locked.
        let pool = open(one, true).unwrap();
        drop(locks);
        let _again = lock_device(&path).unwrap();
        drop(pool);
        assert!(open(one, true).is_ok(), "locks are for other processes");
        assert!(
            lock_device(&dir.path().join("missing.img")).is_ok(),
            "nothing to lock"
        );
    }

    #[test]
    fn format_blank_formats_a_never_written_sparse_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool.img");
        fs::File::create(&path).unwrap().set_len(64 << 20).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().blocks(), 0, "sparse");
        let one = std::slice::from_ref(&path);
        match open(one, false) {
            Err(PoolError::NotAPool(_)) => {}
            other => panic!("without format_blank it is refused, got {other:?}"),
        }
        let pool = open_with(one, false, true).unwrap();
        let uuid = pool.uuid();
        drop(pool);
        assert_eq!(open(one, false).unwrap().uuid(), uuid, "reopened");
        // A sparse file with data in its first MiB is someone's: still refused.
        let data = dir.path().join("data.img");
        let f = fs::File::create(&data).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(b"x", 4096).unwrap();
        drop(f);
        match open_with(std::slice::from_ref(&data), false, true) {
            Err(PoolError::NotAPool(_)) => {}
            other => panic!("expected NotAPool, got {other:?}"),
        }
        assert_eq!(fs::read(&data).unwrap()[4096], b'x', "untouched");
    }

    #[test]
    fn format_blank_refuses_any_data_in_the_first_mib() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drive.img");
        // No signature hal knows, but not blank: someone's data.
        for offset in [0usize, 4096, BLANK_PROBE_BYTES - 1] {
            zeroed(&path, 64 << 20);
            let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&[0x5a], offset as u64).unwrap();
            drop(f);
            match open_with(std::slice::from_ref(&path), false, true) {
                Err(PoolError::NotAPool(_)) => {}
                other => panic!("byte at {offset}: expected NotAPool, got {other:?}"),
            }
            let data = fs::read(&path).unwrap();
            assert_eq!(data[offset], 0x5a, "untouched");
            assert_eq!(data.iter().filter(|b| **b != 0).count(), 1, "untouched");
        }
    }
}
