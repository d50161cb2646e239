//! Who a verified client is: its name and role, read from its certificate.

use std::fmt;

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::{Role, ROLE_URI_PREFIX};

/// The identity of a client whose certificate chain was already verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The certificate subject's common name.
    pub name: String,
    /// The role of the `urn:edgevol:role:*` URI SAN.
    pub role: Role,
}

/// Why a verified certificate carries no usable identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityError {
    /// The DER could not be parsed.
    Unparsable,
    /// No `urn:edgevol:role:*` URI SAN.
    NoRole,
    /// More than one role SAN: ambiguous, refused.
    SeveralRoles,
    /// A role SAN naming no known role.
    UnknownRole(String),
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentityError::Unparsable => f.write_str("client certificate could not be parsed"),
            IdentityError::NoRole => write!(
                f,
                "client certificate carries no role (expected one URI SAN {ROLE_URI_PREFIX}<role>)"
            ),
            IdentityError::SeveralRoles => {
                f.write_str("client certificate carries more than one role SAN")
            }
            IdentityError::UnknownRole(r) => {
                write!(f, "client certificate carries unknown role {r:?}")
            }
        }
    }
}

impl std::error::Error for IdentityError {}

impl PeerIdentity {
    /// Reads the identity out of a DER certificate.
    pub fn from_der(der: &[u8]) -> Result<PeerIdentity, IdentityError> {
        let (_, cert) = X509Certificate::from_der(der).map_err(|_| IdentityError::Unparsable)?;
        let name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or("")
            .to_owned();
        let mut role = None;
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for general_name in &san.value.general_names {
                let GeneralName::URI(uri) = general_name else {
                    continue;
                };
                let Some(role_name) = uri.strip_prefix(ROLE_URI_PREFIX) else {
                    continue;
                };
                if role.is_some() {
                    return Err(IdentityError::SeveralRoles);
                }
                let parsed = role_name
                    .parse::<Role>()
                    .map_err(|_| IdentityError::UnknownRole(role_name.to_owned()))?;
                role = Some(parsed);
            }
        }
        let role = role.ok_or(IdentityError::NoRole)?;
        Ok(PeerIdentity { name, role })
    }
}

impl fmt::Display for PeerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.role, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Ca, Validity};
    use rustls_pki_types::{pem::PemObject, CertificateDer};

    #[test]
    fn client_certificates_carry_name_and_role() {
        let (ca, _) = Ca::generate("test CA", Validity::days(1)).unwrap();
        for role in Role::ALL {
            let issued = ca.issue_client(role, "kube-1", Validity::days(1)).unwrap();
            let der = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap();
            let id = PeerIdentity::from_der(&der).unwrap();
            assert_eq!(id.name, "kube-1");
            assert_eq!(id.role, role);
        }
        let server = ca
            .issue_server(&["localhost".into()], Validity::days(1))
            .unwrap();
        let der = CertificateDer::from_pem_slice(server.cert_pem.as_bytes()).unwrap();
        assert_eq!(PeerIdentity::from_der(&der), Err(IdentityError::NoRole));
        assert_eq!(
            PeerIdentity::from_der(b"junk"),
            Err(IdentityError::Unparsable)
        );
    }
}
