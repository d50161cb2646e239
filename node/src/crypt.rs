//! Encrypted volumes: LUKS2 on the node, with cryptsetup(8) and the kernel's dm-crypt.
//!
//! A volume created with the StorageClass parameter `encrypted: "true"` carries it in its
//! volume_context; NodeStageVolume then needs its passphrase in `secrets` under
//! [`PASSPHRASE_KEY`] (the CO's node-stage secret). The first stage formats LUKS2 on the
//! volume's device (the NVMe/TCP namespace, or the md array of a replicated volume), every
//! stage opens it as a dm-crypt mapping named after the volume, and the filesystem or block
//! access goes on the mapping. The appliance only ever stores and serves ciphertext.
//!
//! Secrets go to cryptsetup on its stdin ([`Host::run_with_input`]): never in an argument
//! (readable in /proc by every process), a file, the state directory, a log line or an error.
//! [`Passphrase`] prints as `<redacted>`, and nothing here formats one.
//!
//! Key rotation: the secret holds the new passphrase under [`PASSPHRASE_KEY`] and the one the
//! volume was formatted (or last re-keyed) with under [`OLD_PASSPHRASE_KEY`]. The next stage
//! that finds the new one refused and the old one accepted re-keys that slot (luksChangeKey:
//! the new passphrase goes into a free slot, then the old slot is purged), so the old
//! passphrase stops working.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::command::path_arg;
use crate::error::{Error, Result};
use crate::fs::{self as filesystem, Probe};
use crate::host::{CmdOutput, Host};
use crate::sysfs::{self, Namespace};

/// NodeStageVolume `secrets` key holding the passphrase (the name Ceph-CSI users know).
pub const PASSPHRASE_KEY: &str = "encryptionPassphrase";
/// NodeStageVolume `secrets` key holding the previous passphrase, during a rotation.
pub const OLD_PASSPHRASE_KEY: &str = "oldEncryptionPassphrase";
/// volume_context (StorageClass parameter) that makes a volume encrypted.
pub const ENCRYPTED_PARAM: &str = "encrypted";
/// volume_context (StorageClass parameter) that lets discards through the encryption.
pub const DISCARD_PARAM: &str = "encryptedDiscard";
/// Longest passphrase accepted, in bytes (cryptsetup's own limit for typed passphrases).
pub const MAX_PASSPHRASE: usize = 512;
/// The kernel module of dm-crypt.
pub const DM_CRYPT_MODULE: &str = "dm-crypt";

/// cryptsetup's exit status for "No key available with this passphrase".
const EXIT_WRONG_KEY: i32 = 2;
/// cryptsetup's exit status for a device that does not exist (close of a gone mapping).
const EXIT_NO_DEVICE: i32 = 4;

/// A passphrase. Its bytes are wiped when it is dropped, and it never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Passphrase(Zeroizing<Vec<u8>>);

impl std::fmt::Debug for Passphrase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Passphrase(<redacted>)")
    }
}

impl Passphrase {
    /// Checks a secret's value: one trailing newline is dropped (a Secret made from a file
    /// written by `echo` has one), and what is left must be 1 to [`MAX_PASSPHRASE`] bytes
    /// without a line break or NUL. Errors name `key`, never the value.
    pub fn parse(key: &str, value: &str) -> Result<Self> {
        let value = value
            .strip_suffix("\r\n")
            .or_else(|| value.strip_suffix('\n'))
            .unwrap_or(value);
        let why = if value.is_empty() {
            Some("is empty".to_owned())
        } else if value.len() > MAX_PASSPHRASE {
            Some(format!("is longer than {MAX_PASSPHRASE} bytes"))
        } else if value.contains(['\n', '\r', '\0']) {
            Some("holds a line break or NUL (only one trailing newline is allowed)".to_owned())
        } else {
            None
        };
        match why {
            Some(why) => Err(Error::InvalidArgument(format!("secret {key:?} {why}"))),
            None => Ok(Passphrase(Zeroizing::new(value.as_bytes().to_vec()))),
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The passphrases a stage was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// The one to use.
    pub current: Passphrase,
    /// The one to replace, during a rotation.
    pub old: Option<Passphrase>,
}

impl Keys {
    /// The passphrases in NodeStageVolume `secrets`: [`PASSPHRASE_KEY`] is required
    /// (INVALID_ARGUMENT naming it when missing), [`OLD_PASSPHRASE_KEY`] optional.
    pub fn from_secrets(volume_id: &str, secrets: &HashMap<String, String>) -> Result<Self> {
        let current = secrets.get(PASSPHRASE_KEY).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "volume {volume_id} is encrypted: NodeStageVolume secrets must hold its \
                 passphrase under {PASSPHRASE_KEY:?} (the StorageClass's node-stage secret)"
            ))
        })?;
        let current = Passphrase::parse(PASSPHRASE_KEY, current)?;
        let old = secrets
            .get(OLD_PASSPHRASE_KEY)
            .map(|v| Passphrase::parse(OLD_PASSPHRASE_KEY, v))
            .transpose()?
            .filter(|old| *old != current);
        Ok(Keys { current, old })
    }
}

/// How an encrypted volume is opened: what the record keeps (no secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Encryption {
    /// The dm-crypt mapping's name ([`mapping_name`]).
    pub mapping: String,
    /// Discards pass through to the appliance (`encryptedDiscard: "true"`).
    pub discard: bool,
}

fn flag(ctx: &HashMap<String, String>, key: &str) -> Result<bool> {
    match ctx.get(key).map(String::as_str) {
        None | Some("" | "false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(Error::InvalidArgument(format!(
            "volume_context {key}={other:?}: expected \"true\" or \"false\""
        ))),
    }
}

/// The encryption volume `volume_id`'s volume_context asks for (`None`: a plain volume).
pub fn from_context(volume_id: &str, ctx: &HashMap<String, String>) -> Result<Option<Encryption>> {
    let encrypted = flag(ctx, ENCRYPTED_PARAM)?;
    let discard = flag(ctx, DISCARD_PARAM)?;
    if discard && !encrypted {
        return Err(Error::InvalidArgument(format!(
            "volume_context {DISCARD_PARAM}=\"true\" needs {ENCRYPTED_PARAM}=\"true\""
        )));
    }
    Ok(encrypted.then(|| Encryption {
        mapping: mapping_name(volume_id),
        discard,
    }))
}

/// The dm-crypt mapping name of a volume: `edgevol-` and 16 hex digits of a hash of its id
/// (ids may hold any byte and be 128 long; device-mapper names may not), the same after every
/// restart.
pub fn mapping_name(volume_id: &str) -> String {
    format!("edgevol-{:016x}", crate::raid::fnv1a_64(volume_id))
}

/// How LUKS2 key slots are made: argon2id (memory-hard), bounded so a small node can open
/// a volume (the memory is taken only while a slot is unlocked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdfConfig {
    /// `--pbkdf-memory`: at most this many KiB per unlock (cryptsetup lowers it when even
    /// the fewest iterations would outlast `iter_time_ms`).
    pub memory_kib: u32,
    /// `--iter-time`: how long an unlock takes, in milliseconds, on this node.
    pub iter_time_ms: u32,
    /// `--pbkdf-parallel`: threads of one unlock.
    pub parallel: u32,
}

/// 64 MiB, one second, two threads.
pub const DEFAULT_KDF: KdfConfig = KdfConfig {
    memory_kib: 65_536,
    iter_time_ms: 1_000,
    parallel: 2,
};

impl KdfConfig {
    /// Checks the bounds cryptsetup accepts (argon2: at least 32 KiB, at most 4 GiB).
    pub fn validate(&self) -> std::result::Result<(), String> {
        if !(32..=4 * 1024 * 1024).contains(&self.memory_kib) {
            return Err("--luks-pbkdf-memory-kib must be 32 to 4194304".to_owned());
        }
        if self.iter_time_ms == 0 || !(1..=4).contains(&self.parallel) {
            return Err(
                "--luks-iter-time-ms must be at least 1 and --luks-pbkdf-parallel 1 to 4"
                    .to_owned(),
            );
        }
        Ok(())
    }

    fn args(&self) -> Vec<String> {
        vec![
            "--pbkdf".into(),
            "argon2id".into(),
            "--pbkdf-memory".into(),
            self.memory_kib.to_string(),
            "--pbkdf-parallel".into(),
            self.parallel.to_string(),
            "--iter-time".into(),
            self.iter_time_ms.to_string(),
        ]
    }
}

/// True when dm-crypt is loaded or built into the running kernel.
fn dm_crypt_present<H: Host + ?Sized>(host: &H) -> bool {
    crate::initiator::module_present(host, "dm_crypt", "dm-crypt.ko")
}

/// Before an encrypted volume is opened: dm-crypt must be in the kernel. When it is not, one
/// `modprobe dm-crypt` (an operator may have installed it since); still missing is
/// FAILED_PRECONDITION naming the module and the fix, as for the NVMe/TCP initiator.
pub fn require_dm_crypt<H: Host + ?Sized>(host: &H, volume_id: &str) -> Result<()> {
    if dm_crypt_present(host) {
        return Ok(());
    }
    let tried = match host.modprobe(DM_CRYPT_MODULE) {
        Ok(out) if out.success() && dm_crypt_present(host) => {
            tracing::info!(
                module = DM_CRYPT_MODULE,
                "loaded the kernel module with modprobe"
            );
            return Ok(());
        }
        Ok(out) if out.success() => format!(
            "modprobe {DM_CRYPT_MODULE} succeeded but no dm_crypt shows in {}",
            host.sys_root().join("module").display()
        ),
        Ok(out) => format!(
            "modprobe {DM_CRYPT_MODULE} failed: {}",
            first_line(&out).unwrap_or("no output")
        ),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            format!("modprobe {DM_CRYPT_MODULE}: no modprobe in the plugin's image")
        }
        Err(e) => format!("modprobe {DM_CRYPT_MODULE}: {e}"),
    };
    let kernel = host.kernel_release().map_or_else(
        |_| "the host's kernel".to_owned(),
        |r| format!("the host's kernel {}", r.trim()),
    );
    Err(Error::FailedPrecondition(format!(
        "volume {volume_id} is encrypted and this node cannot open it: {kernel} has no \
         dm-crypt (module dm-crypt not loaded); {tried}. Fix: run `modprobe dm-crypt` on the \
         host (list it in /etc/modules-load.d/ to keep it across reboots), or boot a kernel \
         built with CONFIG_DM_CRYPT"
    )))
}

fn first_line(out: &CmdOutput) -> Option<&str> {
    out.stderr
        .lines()
        .chain(out.stdout.lines())
        .map(str::trim)
        .find(|l| !l.is_empty())
}

/// The open mapping `name`, as a [`Namespace`] (disk `dm-3`, its `major:minor` and size).
pub fn find_mapping<H: Host + ?Sized>(host: &H, name: &str) -> io::Result<Option<Namespace>> {
    let block = host.sys_root().join("block");
    let entries = match fs::read_dir(&block) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let disk = entry.file_name().to_string_lossy().into_owned();
        if !disk.starts_with("dm-") {
            continue;
        }
        let dir = entry.path();
        match fs::read_to_string(dir.join("dm/name")) {
            Ok(n) if n.trim() == name => {}
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
        let dev = fs::read_to_string(dir.join("dev"))?.trim().to_owned();
        return Ok(Some(Namespace {
            size_bytes: sysfs::disk_size(host, &disk)?,
            disk,
            dev,
        }));
    }
    Ok(None)
}

/// True when mapping `mapped` (`dm-3`) sits on `disk` (`nvme1n1`, `md127`).
fn maps_disk<H: Host + ?Sized>(host: &H, mapped: &str, disk: &str) -> bool {
    host.sys_root()
        .join("block")
        .join(mapped)
        .join("slaves")
        .join(disk)
        .exists()
}

/// Runs cryptsetup with `input` on its stdin. A host without cryptsetup is FAILED_PRECONDITION
/// (the plugin's image lacks it).
fn cryptsetup<H: Host + ?Sized>(host: &H, args: Vec<String>, input: &[u8]) -> Result<CmdOutput> {
    host.run_with_input("cryptsetup", &args, input)
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => Error::FailedPrecondition(
                "cryptsetup is not installed in the node plugin's image: encrypted volumes \
                 need it (and its libraries)"
                    .to_owned(),
            ),
            _ => Error::io("running cryptsetup", &e),
        })
}

/// The error of a cryptsetup run that did not succeed: its arguments (never a secret) and
/// what it wrote to stderr (cryptsetup never prints a passphrase).
fn failed(what: &str, args: &[String], out: &CmdOutput) -> Error {
    let ended = out
        .code
        .map_or_else(|| "killed by a signal".to_owned(), |c| format!("exit {c}"));
    Error::Internal(format!(
        "{what}: cryptsetup {} failed ({ended}): {}",
        args.join(" "),
        out.stderr.trim()
    ))
}

fn wrong_key(volume_id: &str) -> Error {
    Error::FailedPrecondition(format!(
        "volume {volume_id}: the passphrase in secret {PASSPHRASE_KEY:?} does not open its \
         LUKS2 header (and no accepted {OLD_PASSPHRASE_KEY:?} was given to re-key it); fix \
         the node-stage secret"
    ))
}

/// True when `key` unlocks a key slot of `device` (`open --test-passphrase`: no mapping made).
fn key_opens<H: Host + ?Sized>(host: &H, device: &Path, key: &Passphrase) -> Result<bool> {
    let args = vec![
        "open".into(),
        "--test-passphrase".into(),
        "--key-file=-".into(),
        path_arg(device),
    ];
    let out = cryptsetup(host, args.clone(), key.bytes())?;
    match out.code {
        Some(0) => Ok(true),
        Some(EXIT_WRONG_KEY) => Ok(false),
        _ => Err(failed("testing the passphrase", &args, &out)),
    }
}

/// What a stage opens: the device and how.
#[derive(Debug)]
pub struct OpenRequest<'a> {
    /// The volume (for messages).
    pub volume_id: &'a str,
    /// The device holding the LUKS2 header: `/dev/nvme1n1` or `/dev/md127`.
    pub device: &'a Path,
    /// Its disk name (`nvme1n1`), to tell a mapping on it from a stale one.
    pub disk: &'a str,
    /// Mapping name and discards.
    pub encryption: &'a Encryption,
    /// The passphrases.
    pub keys: &'a Keys,
    /// Open read-only (reader-only access modes), and never format.
    pub read_only: bool,
}

/// Opens the volume's LUKS2 mapping, formatting the device first when it is blank; re-keys
/// the slot on a rotation. Returns the mapping. An open mapping on the device already is
/// success (a retried stage); one on another device (the namespace came back under another
/// name) is closed and opened again.
pub fn open<H: Host + ?Sized>(
    host: &H,
    kdf: &KdfConfig,
    req: &OpenRequest<'_>,
) -> Result<Namespace> {
    let id = req.volume_id;
    let name = req.encryption.mapping.as_str();
    if let Some(m) = lookup(host, name)? {
        if maps_disk(host, &m.disk, req.disk) {
            rotate(host, kdf, req)?;
            return Ok(m);
        }
        tracing::warn!(volume_id = id, mapping = name, device = %req.device.display(),
            "a mapping of this volume is open on another device (its old namespace): closing it");
        close(host, name)?;
    }
    match filesystem::probe(host, req.device)? {
        Probe::Filesystem(t) if t == "crypto_LUKS" => {}
        Probe::Blank if !req.read_only => format(host, kdf, req)?,
        Probe::Blank => {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is encrypted but {} is blank and the access mode is read-only: \
                 nothing to open",
                req.device.display()
            )))
        }
        Probe::Filesystem(t) => {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is encrypted but {} holds an unencrypted {t} filesystem, not a \
                 LUKS2 header (a copy of an unencrypted volume?); refusing to format over it",
                req.device.display()
            )))
        }
        Probe::Other(what) => {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is encrypted but {} holds {what}, not a LUKS2 header; refusing \
                 to format over it",
                req.device.display()
            )))
        }
    }
    rotate(host, kdf, req)?;
    let mut args = vec!["open".into(), "--type".into(), "luks2".into()];
    if req.encryption.discard {
        args.push("--allow-discards".into());
    }
    if req.read_only {
        args.push("--readonly".into());
    }
    args.extend(["--key-file=-".into(), path_arg(req.device), name.to_owned()]);
    let out = cryptsetup(host, args.clone(), req.keys.current.bytes())?;
    match out.code {
        Some(0) => {}
        Some(EXIT_WRONG_KEY) => return Err(wrong_key(id)),
        _ => return Err(failed(&format!("volume {id}: opening"), &args, &out)),
    }
    tracing::info!(
        volume_id = id,
        mapping = name,
        discard = req.encryption.discard,
        "LUKS2 mapping opened"
    );
    lookup(host, name)?.ok_or_else(|| {
        Error::Unavailable(format!(
            "volume {id}: cryptsetup opened mapping {name} but it does not show in /sys/block"
        ))
    })
}

fn lookup<H: Host + ?Sized>(host: &H, name: &str) -> Result<Option<Namespace>> {
    find_mapping(host, name).map_err(|e| Error::io(format!("looking up mapping {name}"), &e))
}

/// luksFormat of a blank device, the passphrase on stdin.
fn format<H: Host + ?Sized>(host: &H, kdf: &KdfConfig, req: &OpenRequest<'_>) -> Result<()> {
    let mut args: Vec<String> = vec![
        "luksFormat".into(),
        "--batch-mode".into(),
        "--type".into(),
        "luks2".into(),
    ];
    args.extend(kdf.args());
    args.extend(["--key-file=-".into(), path_arg(req.device)]);
    let out = cryptsetup(host, args.clone(), req.keys.current.bytes())?;
    if !out.success() {
        return Err(failed(
            &format!("volume {}: formatting LUKS2", req.volume_id),
            &args,
            &out,
        ));
    }
    tracing::info!(volume_id = req.volume_id, device = %req.device.display(),
        "LUKS2 header written (first stage of an encrypted volume)");
    Ok(())
}

/// A rotation, when the secret carries an old passphrase: the current one opens the header
/// already (nothing to do but make sure the old one does not: its slot is removed), or the
/// old one does and its slot is re-keyed to the current one. Neither: wrong key.
fn rotate<H: Host + ?Sized>(host: &H, kdf: &KdfConfig, req: &OpenRequest<'_>) -> Result<()> {
    let Some(old) = &req.keys.old else {
        return Ok(());
    };
    let id = req.volume_id;
    let device = req.device;
    if key_opens(host, device, &req.keys.current)? {
        if key_opens(host, device, old)? {
            let args = vec![
                "luksRemoveKey".into(),
                "--batch-mode".into(),
                "--key-file=-".into(),
                path_arg(device),
            ];
            let out = cryptsetup(host, args.clone(), old.bytes())?;
            if !out.success() {
                return Err(failed(
                    &format!("volume {id}: removing the old passphrase's slot"),
                    &args,
                    &out,
                ));
            }
            tracing::info!(volume_id = id, "old passphrase's key slot removed");
        }
        return Ok(());
    }
    if req.read_only {
        // A reader must not write the header; the writer's next stage re-keys it.
        return Err(wrong_key(id));
    }
    if !key_opens(host, device, old)? {
        return Err(wrong_key(id));
    }
    // Both passphrases on stdin, one line each: without --key-file cryptsetup reads the
    // existing one, then the new one, each up to a newline (which no passphrase holds).
    let mut input = Zeroizing::new(Vec::with_capacity(old.bytes().len() + 2 * MAX_PASSPHRASE));
    input.extend_from_slice(old.bytes());
    input.push(b'\n');
    input.extend_from_slice(req.keys.current.bytes());
    input.push(b'\n');
    let mut args: Vec<String> = vec!["luksChangeKey".into(), "--batch-mode".into()];
    args.extend(kdf.args());
    args.push(path_arg(device));
    let out = cryptsetup(host, args.clone(), &input)?;
    match out.code {
        Some(0) => {
            tracing::info!(
                volume_id = id,
                "LUKS2 key slot re-keyed to the new passphrase; \
                the old one no longer opens the volume"
            );
            Ok(())
        }
        Some(EXIT_WRONG_KEY) => Err(wrong_key(id)),
        _ => Err(failed(&format!("volume {id}: re-keying"), &args, &out)),
    }
}

/// Closes mapping `name`; a mapping that is not open is success.
pub fn close<H: Host + ?Sized>(host: &H, name: &str) -> Result<()> {
    if lookup(host, name)?.is_none() {
        return Ok(());
    }
    let args = vec!["close".into(), name.to_owned()];
    let out = cryptsetup(host, args.clone(), &[])?;
    match out.code {
        Some(0) => Ok(()),
        Some(EXIT_NO_DEVICE) if lookup(host, name)?.is_none() => Ok(()),
        _ => Err(failed(&format!("closing mapping {name}"), &args, &out)),
    }
}

/// Grows mapping `name` to its device (`cryptsetup resize`), then returns it. cryptsetup needs
/// the passphrase unless the kernel keyring holds the volume key (not the case on every host):
/// `key` comes from NodeExpandVolume's secrets (the CO's node-expand secret). Without one, a
/// resize that asks for it is FAILED_PRECONDITION naming what to configure.
pub fn resize<H: Host + ?Sized>(
    host: &H,
    volume_id: &str,
    name: &str,
    key: Option<&Passphrase>,
) -> Result<Namespace> {
    let mut args: Vec<String> = vec!["resize".into()];
    if key.is_some() {
        args.push("--key-file=-".into());
    }
    args.push(name.to_owned());
    let out = cryptsetup(host, args.clone(), key.map_or(&[][..], Passphrase::bytes))?;
    match out.code {
        Some(0) => {}
        Some(EXIT_WRONG_KEY) => return Err(wrong_key(volume_id)),
        Some(_) if key.is_none() => {
            return Err(Error::FailedPrecondition(format!(
                "volume {volume_id} is encrypted: growing its LUKS2 mapping needs the \
                 passphrase, and NodeExpandVolume carried no {PASSPHRASE_KEY:?} in its secrets; \
                 give the StorageClass csi.storage.k8s.io/node-expand-secret-name and \
                 -namespace naming the same Secret as its node-stage secret ({})",
                out.stderr.trim()
            )))
        }
        _ => {
            return Err(failed(
                &format!("volume {volume_id}: growing the LUKS2 mapping"),
                &args,
                &out,
            ))
        }
    }
    lookup(host, name)?.ok_or_else(|| {
        Error::Unavailable(format!(
            "volume {volume_id}: mapping {name} is not open (stage the volume again)"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_passphrase_is_required_and_checked_without_being_echoed() {
        let e = Keys::from_secrets("v1", &HashMap::new()).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("\"encryptionPassphrase\"")),
            "{e}"
        );
        let k = Keys::from_secrets("v1", &secrets(&[(PASSPHRASE_KEY, "s3cret-pass\n")])).unwrap();
        assert_eq!(k.current.bytes(), b"s3cret-pass");
        assert_eq!(k.old, None);
        assert_eq!(format!("{k:?}").matches("s3cret").count(), 0, "{k:?}");
        let long = "x".repeat(MAX_PASSPHRASE + 1);
        for (key, bad) in [
            (PASSPHRASE_KEY, ""),
            (PASSPHRASE_KEY, "\n"),
            (PASSPHRASE_KEY, "two\nlines-s3cret"),
            (PASSPHRASE_KEY, long.as_str()),
            (OLD_PASSPHRASE_KEY, "nul\0s3cret"),
        ] {
            let mut s = secrets(&[(PASSPHRASE_KEY, "fine"), (key, bad)]);
            s.insert(key.to_owned(), bad.to_owned());
            let e = Keys::from_secrets("v1", &s).unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, Error::InvalidArgument(_)), "{text}");
            assert!(text.contains(key), "{text}");
            assert!(!text.contains("s3cret") && !text.contains("xxxx"), "{text}");
        }
        // The same passphrase as old and new is no rotation.
        let k = Keys::from_secrets(
            "v1",
            &secrets(&[(PASSPHRASE_KEY, "same"), (OLD_PASSPHRASE_KEY, "same")]),
        )
        .unwrap();
        assert_eq!(k.old, None);
    }

    #[test]
    fn volume_context_flags_name_the_mapping_and_discards() {
        let ctx = |pairs: &[(&str, &str)]| secrets(pairs);
        assert_eq!(from_context("v1", &ctx(&[])).unwrap(), None);
        assert_eq!(
            from_context("v1", &ctx(&[(ENCRYPTED_PARAM, "false")])).unwrap(),
            None
        );
        let e = from_context("v1", &ctx(&[(ENCRYPTED_PARAM, "true")]))
            .unwrap()
            .unwrap();
        assert_eq!(e.mapping, mapping_name("v1"));
        assert!(!e.discard);
        let e = from_context(
            "v1",
            &ctx(&[(ENCRYPTED_PARAM, "true"), (DISCARD_PARAM, "true")]),
        )
        .unwrap()
        .unwrap();
        assert!(e.discard);
        for bad in [
            ctx(&[(ENCRYPTED_PARAM, "yes")]),
            ctx(&[(DISCARD_PARAM, "true")]),
        ] {
            assert!(matches!(
                from_context("v1", &bad),
                Err(Error::InvalidArgument(_))
            ));
        }
        // Names are stable, short enough for device-mapper, and differ per volume.
        assert_eq!(mapping_name("v1"), mapping_name("v1"));
        assert_ne!(mapping_name("v1"), mapping_name("v2"));
        assert_eq!(mapping_name(&"x".repeat(128)).len(), 24);
    }

    #[test]
    fn kdf_bounds() {
        DEFAULT_KDF.validate().unwrap();
        for bad in [
            KdfConfig {
                memory_kib: 16,
                ..DEFAULT_KDF
            },
            KdfConfig {
                iter_time_ms: 0,
                ..DEFAULT_KDF
            },
            KdfConfig {
                parallel: 0,
                ..DEFAULT_KDF
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let args = DEFAULT_KDF.args().join(" ");
        assert_eq!(
            args,
            "--pbkdf argon2id --pbkdf-memory 65536 --pbkdf-parallel 2 --iter-time 1000"
        );
    }
}
