//! Records of staged volumes, one small TOML file per volume in the state directory.
//!
//! A record is written *before* the first host step of NodeStageVolume (it is the intent:
//! target, namespace identity, capability) and updated with the controller and disk once they
//! are known; it is removed as the *last* step of NodeUnstageVolume. So a crash anywhere
//! leaves a record that a retry completes, and a record's target counts as "in use" while its
//! stage is half done, which keeps a concurrent unstage of another volume from deleting a
//! shared controller. The kernel stays the authority on what is connected and mounted: the
//! record only says what we intended and where to look.
//!
//! Writes are atomic: temp file, fsync, rename, fsync of the directory.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::crypt::Encryption;
use crate::error::{Error, Result};
use crate::fabrics::Target;
use crate::legs::Replicated;
use crate::volume::Capability;

/// One staged (or being staged) volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedVolume {
    /// CSI volume id.
    pub volume_id: String,
    /// Where it is staged.
    pub staging_path: PathBuf,
    /// How it was staged.
    pub capability: Capability,
    /// Where its subsystem lives.
    pub target: Target,
    /// Namespace NGUID (32 hex digits).
    pub nguid: Option<String>,
    /// Namespace UUID (32 hex digits).
    pub uuid: Option<String>,
    /// Controller name (`nvme3`) once connected: a hint, the kernel is asked again.
    pub controller: Option<String>,
    /// Disk name (`nvme3n1`) once found: a hint, the kernel is asked again.
    pub disk: Option<String>,
    /// What each NodePublishVolume asked, by target path, recorded before its bind: tells a
    /// second publish at a target with other arguments (ALREADY_EXISTS) from the retry of one
    /// that failed between its bind and its read-only remount. The mount table says what is
    /// published; this says what was asked.
    #[serde(default)]
    pub publications: Vec<Publication>,
    /// A replicated volume: its md array and legs (`target`, `nguid` and `uuid` above are its
    /// first leg's). `None` for a plain volume, and in records written before replication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicated: Option<Replicated>,
    /// An encrypted volume: its dm-crypt mapping and whether discards pass (never a key).
    /// `None` for a plain volume, and in records written before encryption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<Encryption>,
}

/// One NodePublishVolume of a staged volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    /// Target path.
    pub target_path: PathBuf,
    /// The request's capability.
    pub capability: Capability,
    /// Read-only publication.
    pub read_only: bool,
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
}

fn file_name(volume_id: &str) -> String {
    // Volume ids are opaque and may hold any byte; hex keeps file names safe (<= 128 bytes of
    // id -> 256 hex digits, within NAME_MAX).
    let hex: String = volume_id.bytes().map(|b| format!("{b:02x}")).collect();
    format!("vol-{hex}.toml")
}

impl StateStore {
    /// Opens (creating) the state directory.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(StateStore { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, volume_id: &str) -> PathBuf {
        self.dir.join(file_name(volume_id))
    }

    /// The record of `volume_id`, if any.
    pub fn get(&self, volume_id: &str) -> Result<Option<StagedVolume>> {
        let path = self.path(volume_id);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(format!("reading {}", path.display()), &e)),
        };
        let rec: StagedVolume = toml::from_str(&text).map_err(|e| {
            Error::Internal(format!("state file {} is damaged: {e}", path.display()))
        })?;
        Ok(Some(rec))
    }

    /// Every record.
    pub fn all(&self) -> Result<Vec<StagedVolume>> {
        let entries = fs::read_dir(&self.dir)
            .map_err(|e| Error::io(format!("listing {}", self.dir.display()), &e))?;
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("listing the state directory", &e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("vol-") && name.ends_with(".toml")) {
                continue;
            }
            let path = entry.path();
            let text = fs::read_to_string(&path)
                .map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
            let rec: StagedVolume = toml::from_str(&text).map_err(|e| {
                Error::Internal(format!("state file {} is damaged: {e}", path.display()))
            })?;
            out.push(rec);
        }
        out.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
        Ok(out)
    }

    /// Writes `rec` atomically.
    pub fn put(&self, rec: &StagedVolume) -> Result<()> {
        let path = self.path(&rec.volume_id);
        let text = toml::to_string(rec)
            .map_err(|e| Error::Internal(format!("encoding state of {}: {e}", rec.volume_id)))?;
        let tmp = path.with_extension("tmp");
        let write = || -> io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            File::open(&self.dir)?.sync_all()
        };
        write().map_err(|e| Error::io(format!("writing {}", path.display()), &e))
    }

    /// Removes the record of `volume_id` (absent is fine).
    pub fn remove(&self, volume_id: &str) -> Result<()> {
        let path = self.path(volume_id);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(format!("removing {}", path.display()), &e)),
        }
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(format!("syncing {}", self.dir.display()), &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::{Access, AccessMode};

    fn record(id: &str) -> StagedVolume {
        StagedVolume {
            volume_id: id.to_owned(),
            staging_path: "/stage/a".into(),
            capability: Capability {
                access: Access::Mount {
                    fs_type: "ext4".into(),
                    mount_flags: vec!["noatime".into()],
                },
                mode: AccessMode::SingleNodeWriter,
            },
            target: Target::parse("tcp", "10.0.0.2", "4420", "nqn.a:b").unwrap(),
            nguid: Some("0123456789abcdef0123456789abcdef".into()),
            uuid: None,
            controller: Some("nvme1".into()),
            disk: None,
            publications: Vec::new(),
            replicated: None,
            encrypted: None,
        }
    }

    #[test]
    fn round_trips_and_lists() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path().join("state")).unwrap();
        assert_eq!(store.get("x/../y").unwrap(), None);
        let mut a = record("x/../y");
        a.publications.push(Publication {
            target_path: "/pods/p/vol".into(),
            capability: a.capability.clone(),
            read_only: true,
        });
        let b = StagedVolume {
            capability: Capability {
                access: Access::Block,
                mode: AccessMode::MultiNodeMultiWriter,
            },
            ..record("b")
        };
        store.put(&a).unwrap();
        store.put(&b).unwrap();
        assert_eq!(store.get("x/../y").unwrap().as_ref(), Some(&a));
        assert_eq!(store.all().unwrap(), vec![b.clone(), a.clone()]);
        store.remove("b").unwrap();
        store.remove("b").unwrap();
        assert_eq!(store.all().unwrap(), vec![a]);
    }

    #[test]
    fn a_record_written_before_publications_were_kept_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        let rec = record("old");
        let text = toml::to_string(&rec).unwrap();
        let old: String = text
            .lines()
            .filter(|l| !l.starts_with("publications"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_ne!(old, text, "the field was there to drop");
        std::fs::write(store.path("old"), old).unwrap();
        assert_eq!(store.get("old").unwrap(), Some(rec));
    }

    #[test]
    fn damaged_file_is_an_error_not_absence() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        std::fs::write(store.path("v"), "not = [toml").unwrap();
        assert!(store.get("v").is_err());
        assert!(store.all().is_err());
    }
}
