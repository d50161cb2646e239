//! Opening the pool behind the volumes: the devices named in the config, formatted on first
//! use in dev mode.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::config::DEV_POOL_BYTES;

/// Why the pool could not be opened.
#[derive(Debug)]
pub enum PoolError {
    /// A device could not be opened or created.
    Device {
        /// The device.
        path: PathBuf,
        /// What the OS said.
        error: io::Error,
    },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::Device { path, error } => write!(f, "device {}: {error}", path.display()),
        }
    }
}

impl std::error::Error for PoolError {}

/// Opens (and in dev mode first creates) the pool on `devices`. Blocking: run it off the reactor.
pub fn open(devices: &[PathBuf], dev: bool) -> Result<(), PoolError> {
    for path in devices {
        if dev {
            create_sparse(path, DEV_POOL_BYTES)?;
        }
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|error| PoolError::Device {
                path: path.clone(),
                error,
            })?;
    }
    Ok(())
}

/// Creates a sparse file of `bytes` unless the file exists.
fn create_sparse(path: &Path, bytes: u64) -> Result<(), PoolError> {
    let err = |error| PoolError::Device {
        path: path.to_path_buf(),
        error,
    };
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(file) => {
            file.set_len(bytes).map_err(err)?;
            file.sync_all().map_err(err)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(err(e)),
    }
}
