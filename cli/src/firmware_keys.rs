//! `edgevol pki firmware-key` and `edgevol pki sign-firmware`: the firmware signing key (kept
//! by the operator, never on the appliance) and the signed update bundles it makes.

use std::path::{Path, PathBuf};

use edgevol_firmware::bundle::{self, Manifest};
use edgevol_firmware::key::{KeyId, SigningKey, VerifyingKey};
use edgevol_firmware::pool_format::PoolFormat;
use edgevol_pki::files::write_atomic;

/// File name of the signing key in the PKI directory (PEM, mode 0600).
pub const SIGNING_KEY: &str = "firmware-signing.key";
/// File name of the verification key (hex; what `image/build.sh` bakes into the image).
pub const VERIFYING_KEY: &str = "firmware-signing.pub";

/// Where [`create_key`] wrote the key pair.
#[derive(Debug)]
pub struct KeyFiles {
    /// The signing key.
    pub private: PathBuf,
    /// The verification key.
    pub public: PathBuf,
    /// Its id, as bundles and errors name it.
    pub id: KeyId,
}

/// A new signing key in `dir`; refuses to replace one unless `force` (a lost key means every
/// deployed appliance needs a re-image to trust a new one).
pub fn create_key(dir: &Path, force: bool) -> Result<KeyFiles, String> {
    let private = dir.join(SIGNING_KEY);
    let public = dir.join(VERIFYING_KEY);
    if !force {
        if let Some(existing) = [&private, &public].into_iter().find(|p| p.exists()) {
            return Err(format!(
                "{} already exists (pass --force to overwrite)",
                existing.display()
            ));
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (key, pem) = SigningKey::generate().map_err(|e| e.to_string())?;
    let verifying = key.verifying_key();
    write_atomic(&private, pem.as_bytes(), 0o600).map_err(|e| e.to_string())?;
    write_atomic(&public, verifying.to_hex().as_bytes(), 0o644).map_err(|e| e.to_string())?;
    Ok(KeyFiles {
        private,
        public,
        id: verifying.id(),
    })
}

/// What to put in a bundle.
#[derive(Debug)]
pub struct SignRequest<'a> {
    /// The signing key file.
    pub key: &'a Path,
    /// The kernel image.
    pub kernel: &'a Path,
    /// The initramfs.
    pub initramfs: &'a Path,
    /// The firmware version.
    pub version: &'a str,
    /// The target architecture.
    pub arch: &'a str,
    /// Where the bundle goes.
    pub out: &'a Path,
    /// The pools the firmware reads (a `pool-format` line, as edgevold records it in its slot:
    /// `edgevol-pool-format 1 versions 3-4 compatible 0x0 read-only-compatible 0x0
    /// incompatible 0x0`), declared in a format-2 manifest. `None`: a format-1 manifest, read
    /// as firmware that reads exactly pool format version 3, which every firmware accepts.
    pub pool_format: Option<&'a str>,
}

/// Builds, signs and writes a bundle; returns its manifest.
pub fn sign(req: &SignRequest<'_>) -> Result<Manifest, String> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let pem =
        std::fs::read_to_string(req.key).map_err(|e| format!("{}: {e}", req.key.display()))?;
    let key = SigningKey::from_pem(&pem).map_err(|e| format!("{}: {e}", req.key.display()))?;
    let kernel = read(req.kernel)?;
    let initramfs = read(req.initramfs)?;
    let signed = match req.pool_format {
        Some(line) => {
            let reads = PoolFormat::from_line(&format!("{}\n", line.trim_end())).ok_or_else(|| {
                format!(
                    "--pool-format {line:?}: expected \"edgevol-pool-format 1 versions OLDEST-NEWEST \
                     compatible 0xHEX read-only-compatible 0xHEX incompatible 0xHEX\""
                )
            })?;
            bundle::build_declaring(&key, req.arch, req.version, reads, &kernel, &initramfs)
        }
        None => bundle::build(&key, req.arch, req.version, &kernel, &initramfs),
    }
    .map_err(|e| e.to_string())?;
    write_atomic(req.out, &signed, 0o644).map_err(|e| e.to_string())?;
    bundle::inspect(&signed).map_err(|e| e.to_string())
}

/// Checks a bundle file against a verification key file, as the appliance will.
pub fn verify(bundle_path: &Path, public: &Path, arch: &str) -> Result<Manifest, String> {
    let text = std::fs::read_to_string(public).map_err(|e| format!("{}: {e}", public.display()))?;
    let key = VerifyingKey::from_hex(&text).map_err(|e| format!("{}: {e}", public.display()))?;
    let bytes =
        std::fs::read(bundle_path).map_err(|e| format!("{}: {e}", bundle_path.display()))?;
    bundle::verify(&bytes, &key, arch)
        .map(|v| v.manifest)
        .map_err(|e| format!("{}: {e}", bundle_path.display()))
}

/// One line per manifest field, digests in hex.
pub fn render_manifest(m: &Manifest) -> String {
    let hex = |d: &[u8]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!(
        "version    {}\narch       {}\nsigned by  key {}\nkernel     {} bytes sha256 {}\ninitramfs  {} bytes sha256 {}\nreads      {}{}\n",
        m.version,
        m.arch,
        m.key_id,
        m.kernel.len,
        hex(&m.kernel.sha256),
        m.initramfs.len,
        hex(&m.initramfs.sha256),
        m.pool_format(),
        if m.declared_pool_format.is_some() {
            ""
        } else {
            " (not declared: a format-1 manifest)"
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn key_files_then_a_bundle_that_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let files = create_key(dir.path(), false).unwrap();
        let mode = std::fs::metadata(&files.private)
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        assert!(create_key(dir.path(), false)
            .unwrap_err()
            .contains("already exists"));
        let kernel = dir.path().join("vmlinuz");
        let initramfs = dir.path().join("initramfs.gz");
        std::fs::write(&kernel, b"kernel").unwrap();
        std::fs::write(&initramfs, b"initramfs").unwrap();
        let out = dir.path().join("fw.bundle");
        let manifest = sign(&SignRequest {
            key: &files.private,
            kernel: &kernel,
            initramfs: &initramfs,
            version: "0.2.0",
            arch: "x86_64",
            out: &out,
            pool_format: None,
        })
        .unwrap();
        assert_eq!(manifest.key_id, files.id);
        assert_eq!(manifest.pool_format(), PoolFormat::V3_ONLY);
        assert!(
            render_manifest(&manifest).contains("reads      pool format version 3 (not declared")
        );
        // Declared: signed into the manifest, shown back.
        let line = "edgevol-pool-format 1 versions 3-4 compatible 0x0 read-only-compatible 0x0 incompatible 0x8000000000000000";
        let declared = sign(&SignRequest {
            key: &files.private,
            kernel: &kernel,
            initramfs: &initramfs,
            version: "0.3.0",
            arch: "x86_64",
            out: &dir.path().join("declared.bundle"),
            pool_format: Some(line),
        })
        .unwrap();
        assert_eq!(
            verify(&dir.path().join("declared.bundle"), &files.public, "x86_64").unwrap(),
            declared
        );
        assert_eq!(
            declared.pool_format().to_line().trim_end(),
            line,
            "what the appliance compares with its pool"
        );
        let bad = sign(&SignRequest {
            key: &files.private,
            kernel: &kernel,
            initramfs: &initramfs,
            version: "0.4.0",
            arch: "x86_64",
            out: &dir.path().join("bad.bundle"),
            pool_format: Some("versions 3-4"),
        })
        .unwrap_err();
        assert!(bad.contains("--pool-format"), "{bad}");
        assert_eq!(verify(&out, &files.public, "x86_64").unwrap(), manifest);
        let wrong_arch = verify(&out, &files.public, "aarch64").unwrap_err();
        assert!(wrong_arch.contains("architecture"), "{wrong_arch}");
        let shown = render_manifest(&manifest);
        assert!(shown.contains("version    0.2.0"), "{shown}");
        // A new key (forced) no longer verifies the old bundle.
        create_key(dir.path(), true).unwrap();
        let err = verify(&out, &files.public, "x86_64").unwrap_err();
        assert!(err.contains("trusts key"), "{err}");
    }

    #[test]
    fn signing_with_a_non_key_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.key");
        std::fs::write(&junk, "not a key").unwrap();
        let err = sign(&SignRequest {
            key: &junk,
            kernel: &junk,
            initramfs: &junk,
            version: "1",
            arch: "x86_64",
            out: &dir.path().join("out"),
            pool_format: None,
        })
        .unwrap_err();
        assert!(err.contains("PEM"), "{err}");
        assert!(!dir.path().join("out").exists());
    }
}
