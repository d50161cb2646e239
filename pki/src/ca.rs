//! The certificate authority: issues server and role-bearing client certificates.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::{files, PkiError, Role};

/// When a certificate is valid.
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    /// First instant of validity.
    pub not_before: OffsetDateTime,
    /// Last instant of validity.
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// From an hour ago (tolerates clock skew between hosts) until `days` from now.
    pub fn days(days: u32) -> Self {
        let now = OffsetDateTime::now_utc();
        Validity {
            not_before: now - Duration::hours(1),
            not_after: now + Duration::days(i64::from(days)),
        }
    }
}

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// The private key (PKCS#8).
    pub key_pem: String,
}

/// A CA that can issue certificates.
#[derive(Debug)]
pub struct Ca {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    /// Creates a new self-signed CA valid for `validity`.
    pub fn generate(common_name: &str, validity: Validity) -> Result<(Ca, Issued), PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, validity);
        let cert = params.self_signed(&key)?;
        let issued = Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        let ca = Ca {
            cert_pem: issued.cert_pem.clone(),
            issuer: Issuer::new(params, key),
        };
        Ok((ca, issued))
    }

    /// Loads a CA from its certificate and key files.
    pub fn load(cert: &Path, key: &Path) -> Result<Ca, PkiError> {
        let cert_pem = files::read_to_string(cert)?;
        let key_pem = files::read_to_string(key)?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| PkiError::BadPem {
            path: key.to_path_buf(),
            reason: format!("not a usable private key: {e}"),
        })?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).map_err(|e| PkiError::BadPem {
            path: cert.to_path_buf(),
            reason: format!("not a usable CA certificate: {e}"),
        })?;
        Ok(Ca { cert_pem, issuer })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Issues a server certificate for the given DNS names and IP addresses.
    pub fn issue_server(&self, sans: &[String], validity: Validity) -> Result<Issued, PkiError> {
        let mut params = CertificateParams::new(sans.to_vec())?;
        params.distinguished_name = name(sans.first().map_or("edgevol appliance", |s| s));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, validity)
    }

    /// Issues a client certificate named `name` carrying `role`.
    pub fn issue_client(
        &self,
        role: Role,
        common_name: &str,
        validity: Validity,
    ) -> Result<Issued, PkiError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name);
        params.subject_alt_names = vec![SanType::URI(role.uri().try_into()?)];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, validity)
    }

    fn sign(&self, mut params: CertificateParams, validity: Validity) -> Result<Issued, PkiError> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, validity);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "edgevol");
    dn.push(DnType::CommonName, common_name);
    dn
}

fn set_validity(params: &mut CertificateParams, validity: Validity) {
    params.not_before = validity.not_before;
    params.not_after = validity.not_after;
}
