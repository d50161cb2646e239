//! A block device's I/O scheduler (`queue/scheduler` in sysfs), set to `none` for a pool.
//!
//! Why: with an elevator (`mq-deadline`, the kernel's default for single-queue devices such as
//! virtio-blk and SATA), a direct I/O submitted without a plug (`pread`/`pwrite` on `O_DIRECT`,
//! or an io_uring with one or two requests) is queued and dispatched by a kblockd worker: one
//! more thread wake-up and context switch per I/O. The kernel's own target plugs its bios and so
//! dispatches in place. With `none` the request goes from our system call to the driver. The
//! volume manager orders and batches its own I/O; NVMe drives already default to `none`.

use std::fs;
use std::io;
use std::path::PathBuf;

/// What opening did to the device's scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheduler {
    /// Already `none`, or has no scheduler to choose (not asked, or no `queue/scheduler`).
    Unchanged,
    /// Was `was`, now `none`.
    Bypassed { was: String },
    /// Left as `current`: `none` is not offered, or sysfs refused the change (read-only in a
    /// container). I/O works as before, through the scheduler.
    Kept { current: String, why: String },
}

/// The active entry of a `queue/scheduler` file (`mq-deadline kyber [none]` → `none`).
pub fn active(list: &str) -> Option<&str> {
    list.split_whitespace()
        .find_map(|s| s.strip_prefix('[').and_then(|s| s.strip_suffix(']')))
}

/// The `queue/scheduler` file of the device `rdev` (a partition's is its disk's).
fn path(rdev: u64) -> PathBuf {
    let dev = PathBuf::from(format!(
        "/sys/dev/block/{}:{}",
        nix::sys::stat::major(rdev),
        nix::sys::stat::minor(rdev)
    ));
    if dev.join("partition").exists() {
        dev.join("../queue/scheduler")
    } else {
        dev.join("queue/scheduler")
    }
}

/// Selects `none` for the block device `rdev` and says what it found.
pub fn bypass(rdev: u64) -> Scheduler {
    let file = path(rdev);
    let Ok(list) = fs::read_to_string(&file) else {
        return Scheduler::Unchanged;
    };
    let Some(current) = active(&list).map(str::to_owned) else {
        return Scheduler::Unchanged;
    };
    if current == "none" {
        return Scheduler::Unchanged;
    }
    if !list.split_whitespace().any(|s| s == "none") {
        let why = format!("'none' is not among '{}'", list.trim());
        return Scheduler::Kept { current, why };
    }
    let set = fs::write(&file, "none").and_then(|()| {
        let now = fs::read_to_string(&file)?;
        match active(&now) {
            Some("none") => Ok(()),
            _ => Err(io::Error::other(format!("still '{}'", now.trim()))),
        }
    });
    match set {
        Ok(()) => Scheduler::Bypassed { was: current },
        Err(e) => Scheduler::Kept {
            current,
            why: format!("{}: {e}", file.display()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_active_scheduler_is_the_bracketed_one() {
        assert_eq!(
            active("[mq-deadline] kyber bfq none\n"),
            Some("mq-deadline")
        );
        assert_eq!(active("mq-deadline kyber [none]\n"), Some("none"));
        assert_eq!(active("none\n"), None);
        assert_eq!(active(""), None);
    }
}
