//! The host-key file, `DATA_DIR/host-keys`: its encoding and its atomic replacement.
//!
//! Layout (integers little-endian):
//!
//! | bytes | what |
//! |---|---|
//! | 8 | magic `EVHKEYS\n` |
//! | 4 | format version, 1 |
//! | 4 | payload length `n` |
//! | n | the [`Table`], postcard |
//! | 32 | SHA-256 of everything before it |
//!
//! The file is replaced, never edited: the new contents go to `host-keys.tmp` (mode 0600),
//! which is fsynced, renamed over `host-keys`, and the directory fsynced, so a crash at any
//! point leaves either the old or the new file whole. A file that does not read back exactly
//! (short, long, another magic, version 0, a checksum or payload that does not match, a table
//! that breaks its invariants) is damaged and refuses the start: an appliance must never forget
//! its nodes' keys quietly. A missing file is an appliance without enrolled nodes.
//!
//! The frame (magic, version, length, SHA-256 of all before it) is the same in every format
//! version; only the payload's encoding changes with the version. So a whole frame of a newer
//! version is a file newer firmware wrote, not damage: it refuses the start too, in those
//! words ([`StoreError::TooNew`], exit status [`TOO_NEW_EXIT`]), and is left as found. A
//! format that needs another frame must change the magic. `tests/golden/host-keys-v1` holds a
//! version-1 file that every later build must read (`file/golden.rs`).

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use super::table::Table;

/// The file's name in the data directory.
pub const FILE_NAME: &str = "host-keys";
const TMP_NAME: &str = "host-keys.tmp";
const MAGIC: &[u8; 8] = b"EVHKEYS\n";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 16;
const CHECKSUM_LEN: usize = 32;
/// Largest payload accepted: far above any real table (a node takes about 250 bytes).
const MAX_PAYLOAD: usize = 64 << 20;

/// edgevold's exit status when the host-key store was written by newer firmware
/// ([`StoreError::TooNew`]): next to the pool's 78 ([`crate::pool::UNSUPPORTED_EXIT`]), for the
/// same situation. Nothing was written, and restarting the same firmware cannot help.
pub const TOO_NEW_EXIT: u8 = 79;

/// Why the key store could not be read or written. Names the file, never a secret.
#[derive(Debug)]
pub enum StoreError {
    /// The OS refused an operation on the file or its directory.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// What the OS said.
        source: io::Error,
    },
    /// The file exists but does not hold a valid table.
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The file is whole but of a format version newer than this firmware reads: newer
    /// firmware wrote it. Left as found.
    TooNew {
        /// The file.
        path: PathBuf,
        /// Its format version.
        found: u32,
        /// The newest this firmware reads.
        supported: u32,
    },
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Io { path, op, source } => {
                write!(f, "host key store {}: {op}: {source}", path.display())
            }
            StoreError::Corrupt { path, reason } => write!(
                f,
                "host key store {} is damaged ({reason}); refusing to start without the nodes' keys: restore it from a backup, or move it away to start with no enrolled node",
                path.display()
            ),
            StoreError::TooNew {
                path,
                found,
                supported,
            } => write!(
                f,
                "host key store {} has format version {found}, newer than this firmware reads \
                 ({supported}): boot the slot that wrote it, or update",
                path.display()
            ),
        }
    }
}

impl std::error::Error for StoreError {}

/// Why a file's bytes hold no table this build can use. Never quotes the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// A whole frame of a newer format version.
    TooNew {
        /// Its format version.
        found: u32,
    },
    /// Anything else: what is wrong.
    Damaged(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::TooNew { found } => write!(
                f,
                "format version {found}, newer than this firmware reads ({VERSION})"
            ),
            DecodeError::Damaged(reason) => f.write_str(reason),
        }
    }
}

/// Where the file and its temporary twin live.
#[derive(Debug, Clone)]
pub struct StoreFile {
    dir: PathBuf,
    path: PathBuf,
    tmp: PathBuf,
}

/// New contents written and fsynced beside the file, not yet in its place: [`Staged::commit`]
/// puts them there. Dropped without a commit (a crash), the file is unchanged.
#[derive(Debug)]
#[must_use = "a staged write changes nothing until committed"]
pub struct Staged<'a> {
    file: &'a StoreFile,
}

impl StoreFile {
    /// The file of data directory `dir`.
    pub fn in_dir(dir: &Path) -> StoreFile {
        StoreFile {
            dir: dir.to_path_buf(),
            path: dir.join(FILE_NAME),
            tmp: dir.join(TMP_NAME),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io<'a>(&'a self, path: &'a Path, op: &'static str) -> impl Fn(io::Error) -> StoreError + 'a {
        move |source| StoreError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    }

    /// Reads the table: empty if there is no file. A leftover temporary file (a write that
    /// crashed before its rename, so never acknowledged) is removed. A file others may read is
    /// narrowed to 0600 with a warning.
    pub fn load(&self) -> Result<Table, StoreError> {
        match fs::remove_file(&self.tmp) {
            Ok(()) => {
                tracing::warn!(path = %self.tmp.display(), "removed an unfinished host key store write")
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(self.io(&self.tmp, "remove")(e)),
        }
        let bytes = match fs::read(&self.path) {
            Ok(bytes) => Zeroizing::new(bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Table::default()),
            Err(e) => return Err(self.io(&self.path, "read")(e)),
        };
        let mode = fs::metadata(&self.path)
            .map_err(self.io(&self.path, "stat"))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            tracing::warn!(path = %self.path.display(), mode = format!("{:o}", mode & 0o777),
                "host key store was readable by others: narrowed to 0600");
            fs::set_permissions(&self.path, fs::Permissions::from_mode(0o600))
                .map_err(self.io(&self.path, "chmod"))?;
        }
        decode(&bytes).map_err(|e| match e {
            DecodeError::TooNew { found } => StoreError::TooNew {
                path: self.path.clone(),
                found,
                supported: VERSION,
            },
            DecodeError::Damaged(reason) => StoreError::Corrupt {
                path: self.path.clone(),
                reason,
            },
        })
    }

    /// Writes `table` to the temporary file and fsyncs it.
    pub fn stage(&self, table: &Table) -> Result<Staged<'_>, StoreError> {
        let bytes = encode(table);
        let io = self.io(&self.tmp, "write");
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&self.tmp)
            .map_err(&io)?;
        // An old temporary file keeps its mode through `open`: set it.
        file.set_permissions(fs::Permissions::from_mode(0o600))
            .map_err(&io)?;
        file.write_all(&bytes).map_err(&io)?;
        file.sync_all().map_err(&io)?;
        Ok(Staged { file: self })
    }

    /// Replaces the file with `table`, durably: [`StoreFile::stage`] then [`Staged::commit`].
    pub fn save(&self, table: &Table) -> Result<(), StoreError> {
        self.stage(table)?.commit()
    }
}

impl Staged<'_> {
    /// Renames the staged contents over the file and fsyncs the directory: durable on return.
    pub fn commit(self) -> Result<(), StoreError> {
        let f = self.file;
        fs::rename(&f.tmp, &f.path).map_err(f.io(&f.path, "rename"))?;
        fs::File::open(&f.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(f.io(&f.dir, "fsync directory"))
    }
}

/// The file's bytes for `table`.
pub fn encode(table: &Table) -> Zeroizing<Vec<u8>> {
    let payload = Zeroizing::new(postcard::to_allocvec(table).expect("a table always serializes"));
    let len = u32::try_from(payload.len()).expect("a table is far below 4 GiB");
    let mut out = Zeroizing::new(Vec::with_capacity(
        HEADER_LEN + payload.len() + CHECKSUM_LEN,
    ));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&payload);
    let sum = ring::digest::digest(&ring::digest::SHA256, &out);
    out.extend_from_slice(sum.as_ref());
    out
}

/// The table of a file's bytes, or why there is none: the frame is checked first, so only a
/// whole file of a newer version is [`DecodeError::TooNew`].
pub fn decode(bytes: &[u8]) -> Result<Table, DecodeError> {
    let (version, payload) = frame(bytes).map_err(DecodeError::Damaged)?;
    if version > VERSION {
        return Err(DecodeError::TooNew { found: version });
    }
    if version != VERSION {
        return Err(DecodeError::Damaged(format!(
            "format version {version} was never written"
        )));
    }
    decode_table(payload).map_err(DecodeError::Damaged)
}

/// The version and payload of a whole frame, or what is wrong with it.
fn frame(bytes: &[u8]) -> Result<(u32, &[u8]), String> {
    if bytes.len() < HEADER_LEN + CHECKSUM_LEN {
        return Err(format!(
            "{} bytes: shorter than any valid file",
            bytes.len()
        ));
    }
    if &bytes[..8] != MAGIC {
        return Err("not a host key store (bad magic)".into());
    }
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let len = usize::try_from(word(12)).unwrap_or(usize::MAX);
    if len > MAX_PAYLOAD || HEADER_LEN + len + CHECKSUM_LEN != bytes.len() {
        return Err(format!(
            "{} bytes for a payload of {len}: torn or extended",
            bytes.len()
        ));
    }
    let (body, sum) = bytes.split_at(HEADER_LEN + len);
    if ring::digest::digest(&ring::digest::SHA256, body).as_ref() != sum {
        return Err("checksum mismatch".into());
    }
    Ok((word(8), &body[HEADER_LEN..]))
}

/// The version-1 payload: a postcard [`Table`] that keeps its invariants.
fn decode_table(payload: &[u8]) -> Result<Table, String> {
    let (table, rest): (Table, &[u8]) =
        postcard::take_from_bytes(payload).map_err(|e| format!("payload does not decode: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the table", rest.len()));
    }
    table.check()?;
    Ok(table)
}

#[cfg(test)]
mod golden;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostkeys::table::tests::{counter, known};

    const A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001";

    fn table() -> Table {
        let mut t = Table::default();
        let mut secret = counter();
        t.enrol("node-a", [7; 32], A, 1_700_000_000, &mut secret)
            .unwrap();
        t.rotate("node-a", 1_700_000_100, &mut secret).unwrap();
        t
    }

    fn same(a: &Table, b: &Table) -> bool {
        encode(a) == encode(b)
    }

    #[test]
    fn encode_decode_round_trips_and_the_layout_is_as_documented() {
        let t = table();
        let bytes = encode(&t);
        assert_eq!(&bytes[..8], b"EVHKEYS\n");
        assert_eq!(bytes[8..12], 1u32.to_le_bytes());
        let len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        assert_eq!(bytes.len(), 16 + len + 32);
        let back = decode(&bytes).unwrap();
        assert!(same(&t, &back));
        let node = back.node("node-a").unwrap();
        assert!(node.current.host.ct_eq(&known(1)));
        assert!(node.pending.as_ref().unwrap().ctrl.ct_eq(&known(4)));
        assert!(decode(&encode(&Table::default())).is_ok());
    }

    /// A whole frame of format `version` around `payload`: what firmware of that version
    /// writes (or, with a bad payload, damage behind a valid checksum).
    fn sealed(version: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_le_bytes());
        b.extend_from_slice(payload);
        let sum = ring::digest::digest(&ring::digest::SHA256, &b);
        b.extend_from_slice(sum.as_ref());
        b
    }

    /// The reason of a damaged file; fails on any other refusal.
    fn damage(bytes: &[u8]) -> String {
        match decode(bytes) {
            Err(DecodeError::Damaged(reason)) => reason,
            other => panic!("want damage, got {other:?}"),
        }
    }

    #[test]
    fn every_damage_is_refused_with_its_reason() {
        let good = encode(&table());
        let damaged = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.to_vec();
            f(&mut b);
            damage(&b)
        };
        assert!(damaged(&|b| b.clear()).contains("shorter"));
        assert!(damaged(&|b| b.truncate(b.len() - 1)).contains("torn"));
        assert!(damaged(&|b| b.truncate(50)).contains("torn"));
        assert!(damaged(&|b| b.push(0)).contains("torn"));
        assert!(damaged(&|b| b[0] = b'X').contains("magic"));
        assert!(damaged(&|b| b[12] ^= 1).contains("torn"));
        // Every single flipped bit of the version, payload or checksum is caught: a version
        // byte flipped to a newer version is damage, not a newer file.
        for i in (8..12).chain(16..good.len()) {
            let e = damaged(&|b| b[i] ^= 0x10);
            assert!(e.contains("checksum"), "byte {i}: {e}");
        }
        assert!(damaged(&|b| b[8] = 2).contains("checksum"));
        // A checksum that matches a payload that does not decode, or breaks the invariants.
        let e = damage(&sealed(VERSION, &[0xff; 10]));
        assert!(e.contains("does not decode"), "{e}");
        let mut payload = postcard::to_allocvec(&table()).unwrap();
        payload.push(0);
        assert!(damage(&sealed(VERSION, &payload)).contains("after the table"));
        let mut broken = table();
        broken.next_generation = 1;
        let e = damage(&sealed(VERSION, &postcard::to_allocvec(&broken).unwrap()));
        assert!(e.contains("out of range"), "{e}");
        // Version 0 was never written: a whole frame of it is damage too.
        let payload = postcard::to_allocvec(&table()).unwrap();
        let e = damage(&sealed(0, &payload));
        assert_eq!(e, "format version 0 was never written");
    }

    /// What a secret of the test table looks like in any text: its `DHHC-1` representation,
    /// its base64 and its bytes.
    fn secret_texts() -> Vec<String> {
        let t = table();
        let node = t.node("node-a").unwrap();
        let mut out = vec!["DHHC".to_owned()];
        for pair in [&node.current, node.pending.as_ref().unwrap()] {
            for secret in [&pair.host, &pair.ctrl] {
                let text = secret.encode();
                out.push(text["DHHC-1:01:".len()..text.len() - 1].to_owned());
                out.push(text.to_string());
            }
        }
        // The raw key bytes: `known(n)` is 32 times n, as hex and as a Rust array would print.
        for n in 1..=4u8 {
            out.push(format!("{n:02x}").repeat(32));
            out.push(format!("[{n}, {n}, {n}"));
        }
        out
    }

    /// A whole file of a newer version (what newer firmware writes): refused as such, in words
    /// that never say damaged, and left as found.
    #[test]
    fn a_newer_version_is_refused_in_words_and_left_alone() {
        let payload = postcard::to_allocvec(&table()).unwrap();
        for found in [2, u32::MAX] {
            assert_eq!(
                decode(&sealed(found, &payload)).unwrap_err(),
                DecodeError::TooNew { found }
            );
        }
        // Whatever the payload of a newer version holds: its encoding is not this build's.
        assert_eq!(
            decode(&sealed(2, b"a table this build cannot parse")).unwrap_err(),
            DecodeError::TooNew { found: 2 }
        );

        let dir = tempfile::tempdir().unwrap();
        let file = StoreFile::in_dir(dir.path());
        let newer = sealed(2, &payload);
        fs::write(file.path(), &newer).unwrap();
        fs::set_permissions(file.path(), fs::Permissions::from_mode(0o600)).unwrap();
        let e = file.load().unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::TooNew {
                    found: 2,
                    supported: 1,
                    ..
                }
            ),
            "{e:?}"
        );
        let text = e.to_string();
        assert_eq!(
            text,
            format!(
                "host key store {} has format version 2, newer than this firmware reads (1): \
                 boot the slot that wrote it, or update",
                file.path().display()
            )
        );
        assert!(
            !text.contains("damaged") && !text.contains("corrupt"),
            "{text}"
        );
        assert_eq!(fs::read(file.path()).unwrap(), newer, "left as found");
    }

    /// Neither refusal, as the daemon prints it (`Display`) or a log would (`Debug`), holds a
    /// secret of the file: not for a newer file, not for a damaged one (one whose secret text
    /// was altered behind a valid checksum, so the secret decoder reports on it).
    #[test]
    fn no_refusal_prints_a_secret() {
        let dir = tempfile::tempdir().unwrap();
        let file = StoreFile::in_dir(dir.path());
        let payload = postcard::to_allocvec(&table()).unwrap();
        let mut altered = payload.clone();
        let at = altered
            .windows(10)
            .position(|w| w == b"DHHC-1:01:")
            .unwrap()
            + 12;
        altered[at] = if altered[at] == b'A' { b'B' } else { b'A' };
        let texts = secret_texts();
        assert!(
            payload
                .windows(texts[1].len())
                .any(|w| w == texts[1].as_bytes()),
            "the texts looked for are the file's"
        );
        let mut flipped = encode(&table()).to_vec();
        flipped[40] ^= 1;
        for (bytes, why) in [
            (sealed(2, &payload), "newer than this firmware"),
            (sealed(VERSION, &altered), "payload does not decode"),
            (sealed(0, &payload), "format version 0"),
            (flipped, "checksum"),
        ] {
            fs::write(file.path(), &bytes).unwrap();
            let e = file.load().unwrap_err();
            let shown = format!("{e} {e:?}");
            assert!(shown.contains(why), "{shown}");
            for secret in &texts {
                assert!(!shown.contains(secret.as_str()), "{secret:?} in {shown}");
            }
        }
    }

    #[test]
    fn save_writes_0600_and_reopens_the_same_table() {
        let dir = tempfile::tempdir().unwrap();
        let file = StoreFile::in_dir(dir.path());
        assert!(
            same(&file.load().unwrap(), &Table::default()),
            "no file: empty"
        );
        let t = table();
        file.save(&t).unwrap();
        let meta = fs::metadata(file.path()).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(same(&file.load().unwrap(), &t));
        assert!(!dir.path().join(TMP_NAME).exists());
    }

    #[test]
    fn a_crash_before_the_rename_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = StoreFile::in_dir(dir.path());
        let old = table();
        file.save(&old).unwrap();
        let mut new = old.clone();
        new.revoke("node-a", 5).unwrap();
        let staged = file.stage(&new).unwrap();
        // The process dies here: the staged write is never committed.
        drop(staged);
        assert!(dir.path().join(TMP_NAME).exists());
        let reopened = file.load().unwrap();
        assert!(same(&reopened, &old), "the old state, whole");
        assert!(
            !dir.path().join(TMP_NAME).exists(),
            "the leftover is removed"
        );
        // A torn temporary file is no obstacle either.
        fs::write(dir.path().join(TMP_NAME), b"EVHK").unwrap();
        assert!(same(&file.load().unwrap(), &old));
        // Committed, the new state is what opens.
        file.stage(&new).unwrap().commit().unwrap();
        assert!(same(&file.load().unwrap(), &new));
    }

    #[test]
    fn a_damaged_or_empty_file_refuses_to_load_and_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let file = StoreFile::in_dir(dir.path());
        file.save(&table()).unwrap();
        let mut bytes = fs::read(file.path()).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        fs::write(file.path(), &bytes).unwrap();
        let e = file.load().unwrap_err().to_string();
        assert!(e.contains("host-keys") && e.contains("checksum"), "{e}");
        assert_eq!(fs::read(file.path()).unwrap(), bytes, "left as found");
        fs::write(file.path(), b"").unwrap();
        let e = file.load().unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
    }

    #[test]
    fn a_file_others_can_read_is_narrowed() {
        let dir = tempfile::tempdir().unwrap();
        let file = StoreFile::in_dir(dir.path());
        file.save(&table()).unwrap();
        fs::set_permissions(file.path(), fs::Permissions::from_mode(0o644)).unwrap();
        file.load().unwrap();
        let mode = fs::metadata(file.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
