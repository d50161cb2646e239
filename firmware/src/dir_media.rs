//! [`Media`] on a directory of the boot partition: `firmware-state.0` and `firmware-state.1`,
//! each one [`RECORD_LEN`] bytes, overwritten in place and synced. In-place overwrites of a
//! same-size file reuse its clusters on FAT, so a cut tears at most the copy being written.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use crate::record::{Media, RECORD_LEN};

/// The two copies in `dir`.
#[derive(Debug, Clone)]
pub struct DirMedia {
    dir: PathBuf,
}

impl DirMedia {
    /// The copies in `dir` (which must exist).
    pub fn new(dir: &Path) -> DirMedia {
        DirMedia {
            dir: dir.to_path_buf(),
        }
    }

    /// The file of copy 0 or 1.
    pub fn path(&self, copy: usize) -> PathBuf {
        self.dir.join(format!("firmware-state.{copy}"))
    }
}

impl Media for DirMedia {
    type Error = std::io::Error;

    fn read(&mut self, copy: usize) -> std::io::Result<Option<Vec<u8>>> {
        let mut file = match File::open(self.path(copy)) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        // A record is one sector: more than that is not ours, and reading it all would let a
        // stray large file cost memory.
        let mut buf = Vec::with_capacity(RECORD_LEN);
        Read::by_ref(&mut file)
            .take(RECORD_LEN as u64)
            .read_to_end(&mut buf)?;
        Ok(Some(buf))
    }

    fn write(&mut self, copy: usize, data: &[u8]) -> std::io::Result<()> {
        let path = self.path(copy);
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        file.write_all(data)?;
        file.set_len(data.len() as u64)?;
        file.sync_all()?;
        if created {
            // The new directory entry must be durable too.
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Store;
    use crate::slots::{SlotId, Slots};

    #[test]
    fn state_survives_reopen_from_files() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, none) = Store::open(DirMedia::new(dir.path())).unwrap();
        assert_eq!(none, None);
        let mut s = Slots::factory("1.0").unwrap();
        store.save(&s).unwrap();
        s.begin_write(SlotId::A).unwrap();
        store.save(&s).unwrap();
        let (_, back) = Store::open(DirMedia::new(dir.path())).unwrap();
        assert_eq!(back, Some(s));
        for copy in 0..2 {
            let len = std::fs::metadata(DirMedia::new(dir.path()).path(copy))
                .unwrap()
                .len();
            assert_eq!(len, RECORD_LEN as u64);
        }
    }

    #[test]
    fn an_oversized_file_is_read_as_one_record_only() {
        let dir = tempfile::tempdir().unwrap();
        let media = DirMedia::new(dir.path());
        std::fs::write(media.path(0), vec![7u8; 3 * RECORD_LEN]).unwrap();
        let mut media = media;
        assert_eq!(media.read(0).unwrap().unwrap().len(), RECORD_LEN);
        assert_eq!(media.read(1).unwrap(), None);
    }
}
