//! Health of the pool's device: the NVMe SMART / Health log when the pool sits on an NVMe
//! namespace (`/dev/nvmeXnY`), nothing otherwise. A file or another kind of block device has no
//! such log, and the exporter says so (`edgevol_nvme_smart_available 0`) instead of inventing
//! values.

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use edgevol_hal::nvme::SmartLog;

/// What the pool device is, and its health log if it has one.
#[derive(Debug, Clone)]
pub struct DeviceHealth {
    /// The device as configured.
    pub path: PathBuf,
    /// `nvme`, `block` or `file`.
    pub kind: &'static str,
    /// The SMART log, if the device is an NVMe namespace and the log could be read.
    pub smart: Option<SmartLog>,
}

/// Whether `path` is an NVMe namespace block device (`nvme0n1`, not the `nvme0` char device).
fn is_nvme_namespace(path: &Path) -> bool {
    let real = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let name = real.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let is_block = fs::metadata(&real).is_ok_and(|m| m.file_type().is_block_device());
    is_block && name.starts_with("nvme") && name.contains('n')
}

/// Looks at `path` (blocking: the SMART log is an admin command). The device is opened
/// read-only and without `O_EXCL`, beside the pool's own descriptor.
pub fn probe(path: &Path) -> DeviceHealth {
    let meta = fs::metadata(path);
    let kind = match &meta {
        Ok(_) if is_nvme_namespace(path) => "nvme",
        Ok(m) if m.file_type().is_block_device() => "block",
        _ => "file",
    };
    let smart = (kind == "nvme")
        .then(|| {
            let file = fs::File::open(path).map_err(|e| e.to_string())?;
            edgevol_hal::nvme::smart_log(&file).map_err(|e| e.to_string())
        })
        .and_then(|r| match r {
            Ok(log) => Some(log),
            Err(e) => {
                tracing::debug!(device = %path.display(), error = %e, "SMART log unavailable");
                None
            }
        });
    DeviceHealth {
        path: path.to_path_buf(),
        kind,
        smart,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_pool_has_no_smart_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool.img");
        fs::write(&path, b"x").unwrap();
        let h = probe(&path);
        assert_eq!(h.kind, "file");
        assert!(h.smart.is_none());
    }
}
