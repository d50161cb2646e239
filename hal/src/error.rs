//! The rich error every hal device returns from its inherent methods, mapped once onto core's
//! [`DeviceErrorKind`] for the [`BlockDevice`](edgevol_core::BlockDevice) impls.

use std::fmt;
use std::io;
use std::path::PathBuf;

use edgevol_core::{DeviceError, DeviceErrorKind};

/// What a hal device can fail with.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A system call failed.
    Io {
        /// What was being done ("pread", "open", "BLKDISCARD"...).
        op: &'static str,
        /// The device or file, when known.
        path: Option<PathBuf>,
        /// The OS error.
        source: io::Error,
    },
    /// The access starts or ends past the device's end.
    OutOfBounds {
        /// First block (or byte offset for byte-addressed devices) of the access.
        start: u64,
        /// Length of the access in the same unit.
        len: u64,
        /// Capacity in the same unit.
        capacity: u64,
    },
    /// A length or offset is not a whole number of the device's unit.
    Misaligned {
        /// Offending offset or length.
        value: u64,
        /// Required alignment.
        align: u64,
    },
    /// The device refuses writes.
    ReadOnly,
    /// The (simulated) power is off: a fault device cut it. Nothing succeeds until power-on.
    PowerLoss,
    /// A fault device failed this access on purpose.
    #[cfg(feature = "testing")]
    InjectedIo {
        /// The block that was made to fail.
        block: u64,
    },
    /// An NVMe command completed with a non-zero status.
    Nvme {
        /// Admin opcode.
        opcode: u8,
        /// Status field (SCT << 8 | SC, plus DNR/More bits as the kernel returns them).
        status: u32,
    },
    /// Data read back from the device is not what its format says (bad NVMe page).
    Corrupt(&'static str),
    /// The device or kernel does not support this operation (e.g. discard on a device without it).
    Unsupported(&'static str),
    /// Formatting was refused: the device carries data.
    Refused {
        /// The device.
        path: PathBuf,
        /// What was found ("GPT partition table", "ext4 filesystem", ...).
        found: String,
    },
}

impl Error {
    /// An [`Error::Io`] from the last OS error or a given one.
    pub(crate) fn io(op: &'static str, path: Option<&std::path::Path>, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.map(PathBuf::from),
            source,
        }
    }

    /// An [`Error::Io`] from an errno returned by nix.
    #[cfg(target_os = "linux")]
    pub(crate) fn errno(op: &'static str, path: Option<&std::path::Path>, e: nix::Error) -> Self {
        Self::io(op, path, io::Error::from_raw_os_error(e as i32))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io {
                op,
                path: Some(p),
                source,
            } => write!(f, "{op} on {}: {source}", p.display()),
            Self::Io {
                op,
                path: None,
                source,
            } => write!(f, "{op}: {source}"),
            Self::OutOfBounds {
                start,
                len,
                capacity,
            } => {
                write!(f, "access [{start}, +{len}) beyond capacity {capacity}")
            }
            Self::Misaligned { value, align } => write!(f, "{value} is not a multiple of {align}"),
            Self::ReadOnly => f.write_str("device is read-only"),
            Self::PowerLoss => f.write_str("device lost power"),
            #[cfg(feature = "testing")]
            Self::InjectedIo { block } => write!(f, "injected I/O error at block {block}"),
            Self::Nvme { opcode, status } => {
                write!(
                    f,
                    "NVMe admin opcode {opcode:#04x} failed with status {status:#06x}"
                )
            }
            Self::Corrupt(what) => write!(f, "corrupt data: {what}"),
            Self::Unsupported(what) => write!(f, "unsupported: {what}"),
            Self::Refused { path, found } => {
                write!(
                    f,
                    "refusing to format {}: it carries {found} (force to override)",
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl DeviceError for Error {
    fn kind(&self) -> DeviceErrorKind {
        match self {
            Self::Io { source, .. } => match source.raw_os_error() {
                Some(libc::EROFS) | Some(libc::EPERM) | Some(libc::EACCES) => {
                    DeviceErrorKind::ReadOnly
                }
                Some(libc::ENODEV) | Some(libc::ENXIO) => DeviceErrorKind::PowerLoss,
                Some(libc::EINVAL) => DeviceErrorKind::NotAligned,
                _ => DeviceErrorKind::Io,
            },
            Self::OutOfBounds { .. } => DeviceErrorKind::OutOfBounds,
            Self::Misaligned { .. } => DeviceErrorKind::NotAligned,
            Self::ReadOnly => DeviceErrorKind::ReadOnly,
            Self::PowerLoss => DeviceErrorKind::PowerLoss,
            #[cfg(feature = "testing")]
            Self::InjectedIo { .. } => DeviceErrorKind::Io,
            Self::Nvme { .. } | Self::Corrupt(_) => DeviceErrorKind::Io,
            Self::Unsupported(_) | Self::Refused { .. } => DeviceErrorKind::Other,
        }
    }
}

impl From<DeviceErrorKind> for Error {
    fn from(kind: DeviceErrorKind) -> Self {
        match kind {
            DeviceErrorKind::OutOfBounds => Self::OutOfBounds {
                start: 0,
                len: 0,
                capacity: 0,
            },
            DeviceErrorKind::NotAligned => Self::Misaligned { value: 0, align: 0 },
            DeviceErrorKind::ReadOnly => Self::ReadOnly,
            DeviceErrorKind::PowerLoss => Self::PowerLoss,
            _ => Self::Io {
                op: "device",
                path: None,
                source: io::Error::other(kind.to_string()),
            },
        }
    }
}

/// Bounds and alignment check shared by every block backend: `len` bytes from `block` must be
/// whole blocks of `block_size` inside `block_count`.
pub(crate) fn check_blocks(
    block_size: u32,
    block_count: u64,
    block: u64,
    len: usize,
) -> Result<u64, Error> {
    let bs = u64::from(block_size);
    let len = len as u64;
    if !len.is_multiple_of(bs) {
        return Err(Error::Misaligned {
            value: len,
            align: bs,
        });
    }
    let n = len / bs;
    check_range(block_count, block, n)?;
    Ok(n)
}

/// Bounds check of `count` blocks from `block`.
pub(crate) fn check_range(block_count: u64, block: u64, count: u64) -> Result<(), Error> {
    match block.checked_add(count) {
        Some(end) if end <= block_count => Ok(()),
        _ => Err(Error::OutOfBounds {
            start: block,
            len: count,
            capacity: block_count,
        }),
    }
}
