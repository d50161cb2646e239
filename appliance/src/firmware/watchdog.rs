//! `/dev/watchdog` (QEMU's i6300esb, a board's TCO timer, or softdog when the box has none):
//! opened once, petted by a write after every healthy probe. Never disarmed (no magic close): if
//! the daemon hangs or exits, the timer runs out and the box resets, which on a trial boot means
//! the previous slot. [`Watchdog::info`] names the driver behind the device (logged when armed).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// An armed hardware watchdog.
#[derive(Debug)]
pub struct Watchdog {
    file: File,
    path: PathBuf,
}

impl Watchdog {
    /// Opens (and so arms) the device.
    pub fn open(path: &Path) -> std::io::Result<Watchdog> {
        let file = OpenOptions::new().write(true).open(path)?;
        Ok(Watchdog {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Restarts the timer.
    pub fn pet(&mut self) -> std::io::Result<()> {
        // Any byte but 'V' (the magic close that would disarm it).
        self.file.write_all(b"\0")?;
        self.file.flush()
    }

    /// The device.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `path` and logs what was armed (the driver and timeout the kernel names in
    /// `/sys/class/watchdog`), or why nothing was.
    pub fn arm(path: &Path) -> Option<Watchdog> {
        match Watchdog::open(path) {
            Ok(dog) => {
                match dog.info(Path::new("/sys/class/watchdog")) {
                    Some(info) => tracing::info!(
                        device = %path.display(),
                        driver = %info.identity,
                        timeout = %info
                            .timeout_s
                            .map_or_else(|| "unknown".to_owned(), |t| format!("{t}s")),
                        "watchdog armed"
                    ),
                    None => {
                        tracing::info!(device = %path.display(), "watchdog armed (driver unknown)")
                    }
                }
                Some(dog)
            }
            Err(e) => {
                tracing::error!(device = %path.display(), error = %e, "watchdog not armed");
                None
            }
        }
    }

    /// The driver behind the device and its timeout, from the kernel's watchdog class
    /// (`class_dir`, `/sys/class/watchdog` on a box); `None` if the kernel does not say.
    pub fn info(&self, class_dir: &Path) -> Option<Info> {
        let dir = class_dir.join(sysfs_name(&self.path)?);
        let identity = std::fs::read_to_string(dir.join("identity")).ok()?;
        let timeout_s = std::fs::read_to_string(dir.join("timeout"))
            .ok()
            .and_then(|t| t.trim().parse().ok());
        Some(Info {
            identity: identity.trim().to_owned(),
            timeout_s,
        })
    }
}

/// What the kernel says about a watchdog device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    /// The driver's name for its timer (`i6300ESB timer`, `Software Watchdog`).
    pub identity: String,
    /// Seconds without a pet before the box resets, if the kernel says.
    pub timeout_s: Option<u32>,
}

/// The watchdog class entry of a device node: the legacy `/dev/watchdog` is the first
/// registered timer, `watchdog0`; `/dev/watchdogN` is `watchdogN`.
fn sysfs_name(device: &Path) -> Option<String> {
    let name = device.file_name()?.to_str()?;
    let n = name.strip_prefix("watchdog")?;
    if n.is_empty() {
        Some("watchdog0".to_owned())
    } else if n.bytes().all(|b| b.is_ascii_digit()) {
        Some(name.to_owned())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pets_write_a_byte_that_is_not_the_magic_close() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("watchdog");
        std::fs::write(&path, b"").unwrap();
        let mut dog = Watchdog::open(&path).unwrap();
        dog.pet().unwrap();
        dog.pet().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"\0\0");
        assert!(Watchdog::open(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn info_names_the_driver_from_the_watchdog_class() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("watchdog");
        std::fs::write(&dev, b"").unwrap();
        let class = dir.path().join("class");
        std::fs::create_dir_all(class.join("watchdog0")).unwrap();
        std::fs::create_dir_all(class.join("watchdog1")).unwrap();
        std::fs::write(class.join("watchdog0/identity"), "i6300ESB timer\n").unwrap();
        std::fs::write(class.join("watchdog0/timeout"), "30\n").unwrap();
        std::fs::write(class.join("watchdog1/identity"), "Software Watchdog\n").unwrap();
        let dog = Watchdog::open(&dev).unwrap();
        assert_eq!(
            dog.info(&class),
            Some(Info {
                identity: "i6300ESB timer".into(),
                timeout_s: Some(30)
            })
        );
        let dev1 = dir.path().join("watchdog1");
        std::fs::write(&dev1, b"").unwrap();
        assert_eq!(
            Watchdog::open(&dev1).unwrap().info(&class),
            Some(Info {
                identity: "Software Watchdog".into(),
                timeout_s: None
            })
        );
        // Not a watchdog node, or no class entry: the kernel says nothing.
        assert_eq!(sysfs_name(Path::new("/dev/null")), None);
        assert_eq!(sysfs_name(Path::new("/dev/watchdogx")), None);
        assert_eq!(
            Watchdog::open(&dev).unwrap().info(&dir.path().join("none")),
            None
        );
    }
}
