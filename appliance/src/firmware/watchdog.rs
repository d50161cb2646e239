//! `/dev/watchdog` (QEMU's i6300esb, a board's TCO timer, or softdog): opened once, petted by a
//! write after every healthy probe. Never disarmed (no magic close): if the daemon hangs or
//! exits, the timer runs out and the box resets, which on a trial boot means the previous slot.

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
}
