//! The PKI directory: `ca.pem`/`ca.key`, `server.pem`/`server.key` and one `<name>.pem`/`<name>.key`
//! pair per client. Keys are written 0600; nothing is overwritten unless asked.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::{Ca, Issued, PkiError, Role, Validity};

/// Validity of the CA, in days.
pub const CA_DAYS: u32 = 3650;
/// Default validity of server and client certificates, in days.
pub const LEAF_DAYS: u32 = 825;

/// The paths of a certificate and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// The private key (PEM, mode 0600).
    pub key: PathBuf,
}

impl Pair {
    /// `dir/<stem>.pem` and `dir/<stem>.key`.
    pub fn in_dir(dir: &Path, stem: &str) -> Pair {
        Pair {
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}.key")),
        }
    }

    fn exists(&self) -> bool {
        self.cert.exists() || self.key.exists()
    }
}

/// Reads a whole file, naming it on error.
pub fn read_to_string(path: &Path) -> Result<String, PkiError> {
    fs::read_to_string(path).map_err(|source| PkiError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Checks a client name: it becomes a file name and a certificate subject.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !ok {
        return Err(format!(
            "invalid name {name:?}: use 1-64 of [A-Za-z0-9._-], not starting with '.'"
        ));
    }
    if ["ca", "server"].contains(&name) {
        return Err(format!(
            "name {name:?} is reserved for the CA and server files"
        ));
    }
    Ok(())
}

/// `pki init`: a new CA and a server certificate for `sans` in `dir`.
pub fn init(dir: &Path, sans: &[String], force: bool) -> Result<(Pair, Pair), PkiError> {
    let ca_pair = Pair::in_dir(dir, "ca");
    let server_pair = Pair::in_dir(dir, "server");
    if !force {
        for pair in [&ca_pair, &server_pair] {
            refuse_existing(pair)?;
        }
    }
    create_dir(dir)?;
    let (ca, ca_issued) = Ca::generate("edgevol CA", Validity::days(CA_DAYS))?;
    let server = ca.issue_server(sans, Validity::days(LEAF_DAYS))?;
    write_pair(&ca_pair, &ca_issued)?;
    write_pair(&server_pair, &server)?;
    Ok((ca_pair, server_pair))
}

/// `pki issue`: a client certificate for `name` with `role`, signed by the CA in `dir`.
pub fn issue(
    dir: &Path,
    role: Role,
    name: &str,
    validity: Validity,
    force: bool,
) -> Result<Pair, PkiError> {
    issue_with(dir, name, force, |ca| ca.issue_client(role, name, validity))
}

/// `pki server`: another appliance's server certificate `name` for `sans`, signed by the CA in
/// `dir` (a site of several appliances shares one CA, which the proxy and the nodes trust).
pub fn issue_server(
    dir: &Path,
    name: &str,
    sans: &[String],
    validity: Validity,
    force: bool,
) -> Result<Pair, PkiError> {
    issue_with(dir, name, force, |ca| ca.issue_server(sans, validity))
}

/// The pair `name` in `dir`, issued by `dir`'s CA with `issue`.
fn issue_with(
    dir: &Path,
    name: &str,
    force: bool,
    issue: impl FnOnce(&Ca) -> Result<Issued, PkiError>,
) -> Result<Pair, PkiError> {
    let pair = Pair::in_dir(dir, name);
    if !force {
        refuse_existing(&pair)?;
    }
    let ca_pair = Pair::in_dir(dir, "ca");
    let ca = Ca::load(&ca_pair.cert, &ca_pair.key)?;
    write_pair(&pair, &issue(&ca)?)?;
    Ok(pair)
}

/// The development PKI: CA, a server certificate for localhost, 127.0.0.1 and ::1, and one
/// client pair per role named after the role (`admin`, `controller`, `observer`, `node`).
/// Existing files are kept, so a second start reuses the first one's certificates.
pub fn ensure_dev(dir: &Path) -> Result<(), PkiError> {
    let sans = ["localhost", "127.0.0.1", "::1"].map(String::from);
    if !Pair::in_dir(dir, "ca").exists() {
        init(dir, &sans, false)?;
    }
    for role in Role::ALL {
        if !Pair::in_dir(dir, role.as_str()).exists() {
            issue(dir, role, role.as_str(), Validity::days(LEAF_DAYS), false)?;
        }
    }
    Ok(())
}

fn refuse_existing(pair: &Pair) -> Result<(), PkiError> {
    for path in [&pair.cert, &pair.key] {
        if path.exists() {
            return Err(PkiError::Exists(path.clone()));
        }
    }
    Ok(())
}

fn create_dir(dir: &Path) -> Result<(), PkiError> {
    fs::create_dir_all(dir).map_err(|source| PkiError::Io {
        path: dir.to_path_buf(),
        source,
    })
}

/// Writes the pair: certificate 0644, key 0600, each through a temporary file and a rename so a
/// crash never leaves a half-written key behind.
pub fn write_pair(pair: &Pair, issued: &Issued) -> Result<(), PkiError> {
    write_atomic(&pair.key, issued.key_pem.as_bytes(), 0o600)?;
    write_atomic(&pair.cert, issued.cert_pem.as_bytes(), 0o644)
}

/// Writes `data` to `path` with `mode` through a synced temporary file and a rename: a crash
/// leaves the old file or the new one, never half of one.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), PkiError> {
    let io = |source| PkiError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io)?;
    // The umask may have narrowed or the file may be reused: set the mode explicitly.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(io)?;
    file.write_all(data).map_err(io)?;
    file.sync_all().map_err(io)?;
    fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_writes_keys_0600_and_refuses_overwrite_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, server) = init(dir.path(), &["localhost".into()], false).unwrap();
        for key in [&ca.key, &server.key] {
            let mode = fs::metadata(key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }
        let before = fs::read(&ca.cert).unwrap();
        match init(dir.path(), &["localhost".into()], false) {
            Err(PkiError::Exists(p)) => assert_eq!(p, ca.cert),
            other => panic!("expected Exists, got {other:?}"),
        }
        assert_eq!(
            fs::read(&ca.cert).unwrap(),
            before,
            "refused init left files alone"
        );
        init(dir.path(), &["localhost".into()], true).unwrap();
        assert_ne!(
            fs::read(&ca.cert).unwrap(),
            before,
            "--force replaced the CA"
        );
    }

    #[test]
    fn issue_needs_a_ca_and_refuses_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let err = issue(dir.path(), Role::Observer, "o", Validity::days(1), false).unwrap_err();
        assert!(err.to_string().contains("ca.pem"), "{err}");
        init(dir.path(), &["localhost".into()], false).unwrap();
        let pair = issue(dir.path(), Role::Observer, "o", Validity::days(1), false).unwrap();
        let mode = fs::metadata(&pair.key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(
            issue(dir.path(), Role::Admin, "o", Validity::days(1), false),
            Err(PkiError::Exists(_))
        ));
    }

    #[test]
    fn the_dev_pki_has_a_pair_per_role_node_included() {
        use crate::PeerIdentity;
        use rustls_pki_types::{pem::PemObject, CertificateDer};
        let dir = tempfile::tempdir().unwrap();
        ensure_dev(dir.path()).unwrap();
        for role in Role::ALL {
            let pair = Pair::in_dir(dir.path(), role.as_str());
            let pem = fs::read(&pair.cert).unwrap();
            let der = CertificateDer::from_pem_slice(&pem).unwrap();
            let id = PeerIdentity::from_der(&der).unwrap();
            assert_eq!((id.name.as_str(), id.role), (role.as_str(), role));
        }
        assert!(Pair::in_dir(dir.path(), "node").cert.exists());
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("kube-controller.1").is_ok());
        for bad in ["", ".hidden", "a/b", "ca", "server", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
