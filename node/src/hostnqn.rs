//! The host NQN (the CSI node id): `/etc/nvme/hostnqn`, generated and persisted when missing,
//! in the form nvme-cli uses (`nqn.2014-08.org.nvmexpress:uuid:<uuid>`) so both agree.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use crate::fabrics::HostIdentity;

const UUID_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn check_nqn(nqn: &str, path: &Path) -> io::Result<()> {
    if nqn.starts_with("nqn.")
        && nqn.len() <= 223
        && !nqn.contains([',', '='])
        && !nqn.chars().any(char::is_whitespace)
    {
        Ok(())
    } else {
        Err(invalid(format!(
            "{}: {nqn:?} is not a valid host NQN",
            path.display()
        )))
    }
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

/// Reads the host NQN at `path`, or generates one from a fresh UUID read from `uuid_source`
/// (the kernel's `/proc/sys/kernel/random/uuid`) and persists it atomically.
pub fn load_or_create(path: &Path, uuid_source: &Path) -> io::Result<String> {
    match fs::read_to_string(path) {
        Ok(text) => {
            let nqn = text.trim().to_owned();
            check_nqn(&nqn, path)?;
            return Ok(nqn);
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let uuid = fs::read_to_string(uuid_source)?.trim().to_ascii_lowercase();
    if !is_uuid(&uuid) {
        return Err(invalid(format!(
            "{}: not a UUID: {uuid:?}",
            uuid_source.display()
        )));
    }
    let nqn = format!("{UUID_PREFIX}{uuid}");
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = fs::File::create(&tmp)?;
    f.write_all(format!("{nqn}\n").as_bytes())?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    tracing::info!(hostnqn = %nqn, path = %path.display(), "generated host NQN");
    Ok(nqn)
}

/// The host identity for `nqn`: the host id is read from `hostid_path` when it exists (so
/// connects agree with nvme-cli's), else taken from a UUID-form NQN, else left to the kernel.
pub fn identity(nqn: String, hostid_path: &Path) -> io::Result<HostIdentity> {
    let id = match fs::read_to_string(hostid_path) {
        Ok(text) => {
            let id = text.trim().to_ascii_lowercase();
            if !is_uuid(&id) {
                return Err(invalid(format!(
                    "{}: not a UUID: {id:?}",
                    hostid_path.display()
                )));
            }
            Some(id)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => nqn
            .strip_prefix(UUID_PREFIX)
            .filter(|u| is_uuid(u))
            .map(str::to_ascii_lowercase),
        Err(e) => return Err(e),
    };
    Ok(HostIdentity { nqn, id })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_once_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("uuid");
        fs::write(&src, "6F1C2D3E-4B5A-6978-8A9B-0C1D2E3F4A5B\n").unwrap();
        let path = dir.path().join("etc/nvme/hostnqn");
        let nqn = load_or_create(&path, &src).unwrap();
        assert_eq!(
            nqn,
            "nqn.2014-08.org.nvmexpress:uuid:6f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b"
        );
        fs::write(&src, "00000000-0000-0000-0000-000000000001\n").unwrap();
        assert_eq!(
            load_or_create(&path, &src).unwrap(),
            nqn,
            "persisted, not regenerated"
        );
        let ident = identity(nqn, &dir.path().join("hostid")).unwrap();
        assert_eq!(
            ident.id.as_deref(),
            Some("6f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b")
        );
    }

    #[test]
    fn rejects_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hostnqn");
        fs::write(&path, "not an nqn\n").unwrap();
        assert!(load_or_create(&path, &dir.path().join("uuid")).is_err());
        let src = dir.path().join("uuid");
        fs::write(&src, "nope").unwrap();
        assert!(load_or_create(&dir.path().join("other"), &src).is_err());
        let hostid = dir.path().join("hostid");
        fs::write(&hostid, "xyz").unwrap();
        assert!(identity("nqn.a".into(), &hostid).is_err());
        let plain = identity(
            "nqn.2024-01.io.example:host1".into(),
            &dir.path().join("none"),
        )
        .unwrap();
        assert_eq!(plain.id, None);
    }
}
