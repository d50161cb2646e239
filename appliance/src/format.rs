//! `edgevold format`: formats a device as a new, empty pool, offline, the way mkfs does: the
//! device must not be held by a running daemon ([`pool::lock_device`], [`pool::open_device`]),
//! anything it holds is refused unless forced, and the data area is deallocated with progress
//! on stderr.

use std::fmt;
use std::path::{Path, PathBuf};

use edgevol_core::limits::{MAX_CLUSTER_SIZE, MIN_CLUSTER_SIZE};
use edgevol_core::{Field, Pool};
use edgevol_hal::discovery::detect_signature;

use crate::naming::uuid_string;
use crate::pool::{self, PoolDevice, PoolError};
use crate::progress::{human_bytes, Reporter};

/// Flags of `edgevold format`.
#[derive(Debug, Clone, clap::Args)]
pub struct FormatArgs {
    /// The block device or pool file to format (it must exist).
    #[arg(long)]
    pub device: PathBuf,
    /// Format over what the device holds: an edgevol pool, a partition table, a filesystem, or
    /// any data in its first MiB. Without it such a device is refused and left untouched.
    #[arg(long)]
    pub force: bool,
    /// Allocation unit: a power of two from 4K to 64M (bytes, or with a K or M suffix).
    #[arg(long, default_value = "1M", value_parser = parse_cluster_size)]
    pub cluster_size: u32,
}

/// Why a format did not happen (or did not finish). Each renders as one line.
#[derive(Debug)]
pub enum FormatError {
    /// The device holds something and `--force` was not given: nothing was written.
    Refused {
        /// The device.
        path: PathBuf,
        /// What it holds.
        found: Contents,
    },
    /// No pool with this cluster size fits the device (too small, or blocks larger than a
    /// cluster).
    DoesNotFit {
        /// The device.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
        /// Its block size in bytes.
        block_size: u32,
        /// The cluster size asked for.
        cluster_size: u32,
    },
    /// Opening, probing or formatting the device failed.
    Pool(PoolError),
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::Refused { path, found } => write!(
                f,
                "refusing to format {}: it holds {found} (--force formats over it)",
                path.display()
            ),
            FormatError::DoesNotFit {
                path,
                size,
                block_size,
                cluster_size,
            } => write!(
                f,
                "a pool of {} clusters does not fit {} ({}, {block_size}-byte blocks)",
                human_bytes(u64::from(*cluster_size)),
                path.display(),
                human_bytes(*size),
            ),
            FormatError::Pool(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for FormatError {}

/// The pool a format made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Formatted {
    /// The new pool's uuid.
    pub uuid: [u8; 16],
    /// Bytes of data clusters.
    pub capacity: u64,
}

/// What a device holds, as a format guard sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contents {
    /// The first [`pool::BLANK_PROBE_BYTES`] read as zeros and hal finds no signature: a new drive.
    Blank,
    /// An edgevol pool with this uuid.
    Pool([u8; 16]),
    /// Anything else, described: a signature hal knows, an edgevol pool this build cannot read,
    /// or unidentified data.
    Foreign(String),
}

impl fmt::Display for Contents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Contents::Blank => f.write_str("nothing (blank)"),
            Contents::Pool(uuid) => write!(f, "edgevol pool {}", uuid_string(*uuid)),
            Contents::Foreign(what) => f.write_str(what),
        }
    }
}

/// Classifies an opened device without writing to it.
pub fn contents(path: &Path, device: &mut PoolDevice) -> Result<Contents, PoolError> {
    let device_err = |error: &dyn fmt::Display| PoolError::Device {
        path: path.to_path_buf(),
        error: error.to_string(),
    };
    match Pool::probe(device) {
        Ok(Some(uuid)) => return Ok(Contents::Pool(uuid)),
        Ok(None) => {}
        Err(edgevol_core::Error::Device(kind)) => return Err(device_err(&kind)),
        Err(e) => {
            return Ok(Contents::Foreign(format!(
                "an edgevol pool this version cannot read ({})",
                crate::pool_words::describe(&e)
            )))
        }
    }
    if let Some(found) = detect_signature(path).map_err(|e| device_err(&e))? {
        return Ok(Contents::Foreign(found));
    }
    if pool::head_is_zero(path).map_err(|e| device_err(&e))? {
        Ok(Contents::Blank)
    } else {
        Ok(Contents::Foreign(
            "data (non-zero bytes in the first MiB, no known signature)".into(),
        ))
    }
}

/// Formats `args.device`. Blocking; prints progress to stderr.
pub fn run(args: &FormatArgs) -> Result<Formatted, FormatError> {
    let path = args.device.as_path();
    // Held until the format is done: a daemon starting meanwhile finds the device busy.
    let _lock = pool::lock_device(path).map_err(FormatError::Pool)?;
    let mut device = pool::open_device(path).map_err(FormatError::Pool)?;
    let found = contents(path, &mut device).map_err(FormatError::Pool)?;
    if found != Contents::Blank {
        if !args.force {
            return Err(FormatError::Refused {
                path: path.to_path_buf(),
                found,
            });
        }
        eprintln!("edgevold: formatting over {found} (--force)");
    }
    let block_size = device.block_size();
    let size = device.block_count() * u64::from(block_size);
    eprintln!(
        "edgevold: formatting {} ({}) with {} clusters",
        path.display(),
        human_bytes(size),
        human_bytes(u64::from(args.cluster_size))
    );
    let mut reporter = Reporter::stderr("discarding device blocks");
    let result = pool::format_device(device, path, args.cluster_size, &mut |p| {
        reporter.update(p);
    });
    reporter.finish();
    let pool = result.map_err(|e| match e {
        // Core refuses options only when the layout does not fit (the cluster size was
        // range-checked when parsed), and before it writes anything.
        PoolError::Core {
            error: edgevol_core::Error::InvalidArgument(Field::FormatOptions, _),
            ..
        } => FormatError::DoesNotFit {
            path: path.to_path_buf(),
            size,
            block_size,
            cluster_size: args.cluster_size,
        },
        e => FormatError::Pool(e),
    })?;
    Ok(Formatted {
        uuid: pool.uuid(),
        capacity: pool.capacity().total,
    })
}

/// `--cluster-size`: `65536`, `64K`, `1M`.
fn parse_cluster_size(s: &str) -> Result<u32, String> {
    let (digits, unit) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1 << 20),
        _ => (s, 1),
    };
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| n.is_power_of_two() && (MIN_CLUSTER_SIZE..=MAX_CLUSTER_SIZE).contains(n));
    bytes.ok_or_else(|| format!("{s:?} is not a power of two from 4K to 64M"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::FileExt;

    #[test]
    fn contents_tells_blank_signatures_and_data_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drive.img");
        let classify = |path: &Path| contents(path, &mut pool::open_device(path).unwrap()).unwrap();
        fs::write(&path, vec![0u8; 8 << 20]).unwrap();
        assert_eq!(classify(&path), Contents::Blank);
        let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0x53, 0xEF], 1080).unwrap();
        assert_eq!(
            classify(&path),
            Contents::Foreign("ext2/3/4 filesystem".into())
        );
        f.write_all_at(&[0, 0], 1080).unwrap();
        f.write_all_at(&[1], 777).unwrap();
        assert!(matches!(classify(&path), Contents::Foreign(what) if what.starts_with("data")));
    }

    #[test]
    fn cluster_sizes_parse_with_units_and_are_range_checked() {
        assert_eq!(parse_cluster_size("4096"), Ok(4096));
        assert_eq!(parse_cluster_size("64K"), Ok(64 << 10));
        assert_eq!(parse_cluster_size("1M"), Ok(1 << 20));
        assert_eq!(parse_cluster_size("64m"), Ok(64 << 20));
        for bad in [
            "",
            "M",
            "2K",
            "3M",
            "128M",
            "1G",
            "-4K",
            "1.5M",
            "99999999999999999999",
        ] {
            assert!(parse_cluster_size(bad).is_err(), "{bad:?} accepted");
        }
    }
}
