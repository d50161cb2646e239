//! The fake host's cryptsetup: LUKS2 headers (key slots) per disk, and dm-crypt mappings as
//! the kernel shows them (`/sys/block/dm-N/{dev,size,dm/name,slaves/}` and `/dev/dm-N`).
//! Passphrases arrive on stdin only; each run's arguments and input are kept apart so tests can
//! show a secret never reached an argument.

use std::collections::HashMap;
use std::fs;
use std::io;

use super::{arg_basename, fail, ok, write, FakeHost};
use crate::host::CmdOutput;

/// Sectors the fake's LUKS2 header takes from the device (the real one: 16 MiB).
pub const HEADER_SECTORS: u64 = 64;

/// What the fake keeps of cryptsetup.
#[derive(Debug, Default)]
pub(super) struct Luks {
    /// Key slots per disk that holds a header.
    slots: HashMap<String, Vec<Vec<u8>>>,
    /// Open mappings: name -> (dm disk, backing disk).
    mappings: HashMap<String, (String, String)>,
    /// Every run: its arguments and its stdin.
    pub(super) runs: Vec<(Vec<String>, Vec<u8>)>,
}

fn sectors(host: &FakeHost, disk: &str) -> u64 {
    fs::read_to_string(host.sys.join("block").join(disk).join("size"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

impl FakeHost {
    /// Every cryptsetup run: arguments and the bytes given on stdin.
    pub fn cryptsetup_runs(&self) -> Vec<(Vec<String>, Vec<u8>)> {
        self.st().luks.runs.clone()
    }

    /// The number of key slots in `disk`'s LUKS2 header (`None`: no header).
    pub fn luks_slots(&self, disk: &str) -> Option<usize> {
        self.st().luks.slots.get(disk).map(Vec::len)
    }

    /// The open mapping `name`: its dm disk and the disk below it.
    pub fn luks_mapping(&self, name: &str) -> Option<(String, String)> {
        self.st().luks.mappings.get(name).cloned()
    }

    /// Unloads dm-crypt (and makes modprobe unable to load it unless [`FakeHost::set_loadable`]
    /// lists `dm-crypt`).
    pub fn remove_dm_crypt(&self) {
        fs::remove_dir_all(self.sys.join("module/dm_crypt")).unwrap();
    }

    fn key_opens(&self, disk: &str, key: &[u8]) -> bool {
        self.st()
            .luks
            .slots
            .get(disk)
            .is_some_and(|s| s.iter().any(|k| k == key))
    }

    pub(super) fn cryptsetup(&self, args: &[String], input: &[u8]) -> io::Result<CmdOutput> {
        self.st().luks.runs.push((args.to_vec(), input.to_vec()));
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let last = arg_basename(a.last().copied().unwrap_or_default());
        match a.as_slice() {
            ["open", "--test-passphrase", "--key-file=-", _] => {
                if self.key_opens(&last, input) {
                    ok("")
                } else {
                    fail(2, "No key available with this passphrase.")
                }
            }
            ["luksFormat", .., "--key-file=-", _] => {
                self.st()
                    .luks
                    .slots
                    .insert(last.clone(), vec![input.to_vec()]);
                self.set_signature(&last, "TYPE=crypto_LUKS\n");
                ok("")
            }
            ["open", "--type", "luks2", .., "--key-file=-", dev, name] => {
                let disk = arg_basename(dev);
                if !self.key_opens(&disk, input) {
                    return fail(2, "No key available with this passphrase.");
                }
                if self.st().luks.mappings.contains_key(*name) {
                    return fail(5, &format!("Device {name} already exists."));
                }
                // The kernel hands out the lowest free minor: a reopened mapping gets its
                // old name back, and what mkfs wrote on it shows again.
                let n = {
                    let st = self.st();
                    let used: Vec<&String> = st.luks.mappings.values().map(|(d, _)| d).collect();
                    (0..)
                        .find(|n| !used.contains(&&format!("dm-{n}")))
                        .unwrap_or(0)
                };
                let dm = format!("dm-{n}");
                let dir = self.sys.join("block").join(&dm);
                write(&dir.join("dev"), &format!("253:{n}"));
                write(&dir.join("dm/name"), name);
                write(&dir.join("slaves").join(&disk), "");
                let size = sectors(self, &disk).saturating_sub(HEADER_SECTORS);
                write(&dir.join("size"), &size.to_string());
                fs::write(self.dev.join(&dm), "")?;
                self.st()
                    .luks
                    .mappings
                    .insert((*name).to_owned(), (dm, disk));
                ok("")
            }
            ["close", name] => {
                let Some((dm, _)) = self.st().luks.mappings.remove(*name) else {
                    return fail(4, &format!("Device {name} is not active."));
                };
                fs::remove_dir_all(self.sys.join("block").join(&dm))?;
                fs::remove_file(self.dev.join(&dm))?;
                ok("")
            }
            ["resize", .., name] => {
                let Some((dm, disk)) = self.st().luks.mappings.get(*name).cloned() else {
                    return fail(4, &format!("Device {name} is not active."));
                };
                // A host whose kernel keyring does not hold the volume key (the QEMU node's):
                // cryptsetup asks for the passphrase.
                if !a.contains(&"--key-file=-") {
                    return fail(1, "Nothing to read on input.");
                }
                if !self.key_opens(&disk, input) {
                    return fail(2, "No key available with this passphrase.");
                }
                let size = sectors(self, &disk).saturating_sub(HEADER_SECTORS);
                write(
                    &self.sys.join("block").join(dm).join("size"),
                    &size.to_string(),
                );
                ok("")
            }
            ["luksChangeKey", .., _] => {
                // Existing passphrase, then the new one, a line each.
                let text = input.to_vec();
                let mut lines = text.split(|b| *b == b'\n');
                let (old, new) = (lines.next().unwrap_or_default(), lines.next());
                let Some(new) = new.filter(|n| !n.is_empty()) else {
                    return fail(1, "Nothing to read on input.");
                };
                let mut st = self.st();
                let Some(slots) = st.luks.slots.get_mut(&last) else {
                    return fail(1, "Device is not a valid LUKS device.");
                };
                match slots.iter().position(|k| k == old) {
                    Some(i) => {
                        slots[i] = new.to_vec();
                        ok("")
                    }
                    None => fail(2, "No key available with this passphrase."),
                }
            }
            ["luksRemoveKey", "--batch-mode", "--key-file=-", _] => {
                let mut st = self.st();
                let Some(slots) = st.luks.slots.get_mut(&last) else {
                    return fail(1, "Device is not a valid LUKS device.");
                };
                match slots.iter().position(|k| k == input) {
                    Some(i) => {
                        slots.remove(i);
                        ok("")
                    }
                    None => fail(2, "No key available with this passphrase."),
                }
            }
            _ => fail(1, "fake cryptsetup: arguments not modelled"),
        }
    }

    /// cryptsetup is not installed.
    pub fn remove_cryptsetup(&self) {
        self.st().missing_programs.push("cryptsetup".to_owned());
    }

    /// Adds a second key slot with `key` to `disk`'s header (a rotation half done by hand).
    pub fn luks_add_slot(&self, disk: &str, key: &[u8]) {
        self.st()
            .luks
            .slots
            .get_mut(disk)
            .expect("a LUKS2 header")
            .push(key.to_vec());
    }
}
