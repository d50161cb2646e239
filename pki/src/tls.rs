//! rustls configurations for both ends of the appliance's mutual TLS.
//!
//! The server demands a client certificate chaining to the CA (no anonymous clients); the
//! client verifies the server against the same CA. Both speak HTTP/2 only (ALPN `h2`), which is
//! what gRPC needs.

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::{files, PkiError};

/// Where the PEM files of one end are.
#[derive(Debug, Clone, Copy)]
pub struct TlsFiles<'a> {
    /// The CA certificate that the peer's certificate must chain to.
    pub ca: &'a Path,
    /// Our certificate (chain).
    pub cert: &'a Path,
    /// Our private key.
    pub key: &'a Path,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The appliance's server configuration: a client certificate is mandatory.
pub fn server_config(files: TlsFiles<'_>) -> Result<Arc<ServerConfig>, PkiError> {
    let roots = Arc::new(load_roots(files.ca)?);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| PkiError::Tls(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| PkiError::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(load_certs(files.cert)?, load_key(files.key)?)
        .map_err(|e| PkiError::Tls(format!("{}: {e}", files.cert.display())))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A client configuration presenting `cert`/`key` and trusting only `ca`.
pub fn client_config(files: TlsFiles<'_>) -> Result<Arc<ClientConfig>, PkiError> {
    let roots = Arc::new(load_roots(files.ca)?);
    let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| PkiError::Tls(e.to_string()))?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| PkiError::Tls(e.to_string()))?
        .with_webpki_verifier(verifier)
        .with_client_auth_cert(load_certs(files.cert)?, load_key(files.key)?)
        .map_err(|e| PkiError::Tls(format!("{}: {e}", files.cert.display())))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

fn load_roots(path: &Path) -> Result<RootCertStore, PkiError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| PkiError::BadPem {
            path: path.to_path_buf(),
            reason: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}

/// Every certificate of a PEM file; at least one.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    let pem = files::read_to_string(path)?;
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PkiError::BadPem {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(PkiError::BadPem {
            path: path.to_path_buf(),
            reason: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, PkiError> {
    let pem = files::read_to_string(path)?;
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| PkiError::BadPem {
        path: path.to_path_buf(),
        reason: format!("no usable private key: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::{init, Pair};

    #[test]
    fn configs_load_from_an_initialised_directory_and_name_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), &["localhost".into()], false).unwrap();
        let ca = Pair::in_dir(dir.path(), "ca");
        let server = Pair::in_dir(dir.path(), "server");
        let files = TlsFiles {
            ca: &ca.cert,
            cert: &server.cert,
            key: &server.key,
        };
        let config = server_config(files).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec()]);

        let missing = dir.path().join("missing.pem");
        let err = server_config(TlsFiles {
            cert: &missing,
            ..files
        })
        .unwrap_err();
        assert!(err.to_string().contains("missing.pem"), "{err}");

        let err = server_config(TlsFiles {
            cert: &server.key,
            ..files
        })
        .unwrap_err();
        assert!(err.to_string().contains("no CERTIFICATE block"), "{err}");
    }
}
