//! The node's DH-HMAC-CHAP keys, fetched from the appliance by enrolment.
//!
//! `edgevol.v1.Enrolment/Enrol(host_nqn)` over mTLS with this node's `node` role certificate
//! answers the host secret, the controller secret (both `DHHC-1:` strings, handed as they are to
//! the kernel as `dhchap_secret` / `dhchap_ctrl_secret`) and their generation. The first
//! enrolment binds the host NQN to the certificate's node; asking again gets the same answer
//! until an operator rotates the node's keys. So the plugin keeps no key anywhere but in memory:
//! it enrols whenever it needs them (every NodeStageVolume, and periodically to notice a
//! rotation), and a restarted plugin simply enrols again.
//!
//! Secrets never leave through a `Debug`, `Display`, log line, error message or state record:
//! [`Secret`] prints as `<redacted>` and is wiped when dropped.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use edgevol_pki::client::{MtlsTarget, TargetError};
use edgevol_proto::edgevol::v1::enrolment_client::EnrolmentClient;
use edgevol_proto::edgevol::v1::EnrolRequest;
use tonic::Code;
use zeroize::Zeroize;

use crate::error::{Error, Result};

/// A `DHHC-1:` secret string. Its `Debug` never shows it; it is wiped from memory on drop.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret in its `DHHC-1:hh:<base64>:` representation.
    pub fn new(text: String) -> Self {
        Secret(text)
    }

    /// The secret text, for the kernel only (the connect option string, a sysfs attribute).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// A node's key pair for one appliance.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DhchapKeys {
    /// The host secret (`dhchap_secret`).
    pub host: Secret,
    /// The controller secret for bidirectional authentication (`dhchap_ctrl_secret`).
    pub ctrl: Secret,
    /// The pair's generation: a new one means new secrets.
    pub generation: u64,
}

impl DhchapKeys {
    /// Checks the answer is usable as kernel options: both secrets `DHHC-1:` strings that cannot
    /// break the comma-separated option string (base64's `=` is fine: the kernel splits at
    /// commas, then takes everything after `dhchap_secret=`).
    pub fn validated(host: String, ctrl: String, generation: u64) -> Result<Self> {
        let keys = DhchapKeys {
            host: Secret::new(host),
            ctrl: Secret::new(ctrl),
            generation,
        };
        for (what, s) in [("host", &keys.host), ("controller", &keys.ctrl)] {
            let t = s.expose();
            if !t.starts_with("DHHC-1:")
                || t.contains([',', '\n'])
                || t.chars().any(char::is_whitespace)
            {
                // Never quote the text: it is (or is meant to be) a secret.
                return Err(Error::Internal(format!(
                    "the appliance answered Enrol with a {what} secret that is not in the \
                     kernel's DH-HMAC-CHAP secret format (generation {generation})"
                )));
            }
        }
        Ok(keys)
    }
}

/// Where the node gets its keys from. Blocking: call it off the async reactor.
pub trait KeySource: Send + Sync + fmt::Debug {
    /// Enrols `host_nqn` and returns the node's current keys. Errors are CSI outcomes: a refusal
    /// by the appliance is `FailedPrecondition` (an operator must act), an unreachable appliance
    /// `Unavailable`.
    fn enrol(&self, host_nqn: &str) -> Result<DhchapKeys>;
}

/// How to reach the appliance's control endpoint (flags of `edgevol-node`).
#[derive(Debug, Clone)]
pub struct EnrolConfig {
    /// `HOST:PORT` of edgevold's mTLS listener.
    pub address: String,
    /// Name the appliance's certificate must carry (default: HOST).
    pub server_name: Option<String>,
    /// The appliance's CA certificate.
    pub ca: PathBuf,
    /// This node's `node` role certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// Time allowed for the connection, the TLS handshake and the call.
    pub timeout: Duration,
}

/// Enrols over gRPC + mTLS. Each call runs on a single-threaded runtime of its own, opened and
/// dropped with the call (which closes its connection at once), so it can be called from any
/// blocking thread (never from async code: it blocks).
pub struct GrpcEnroller {
    target: MtlsTarget,
    timeout: Duration,
}

impl fmt::Debug for GrpcEnroller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcEnroller")
            .field("target", &self.target)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl GrpcEnroller {
    /// Loads the certificates and checks the address; connects only when asked to enrol.
    pub fn new(cfg: &EnrolConfig) -> std::result::Result<Self, String> {
        let tls = edgevol_pki::tls::client_config(edgevol_pki::tls::TlsFiles {
            ca: &cfg.ca,
            cert: &cfg.cert,
            key: &cfg.key,
        });
        let target = tls
            .map_err(|e| format!("node certificate: {e}"))
            .and_then(|tls| {
                MtlsTarget::new(&cfg.address, cfg.server_name.as_deref(), tls)
                    .map_err(|e| appliance_flag_error(&e))
            })?;
        Ok(GrpcEnroller {
            target,
            timeout: cfg.timeout,
        })
    }

    async fn call(&self, host_nqn: &str) -> std::result::Result<DhchapKeysText, CallError> {
        let channel = self
            .target
            .channel(self.timeout, Some(self.timeout))
            .await
            .map_err(|e| CallError::Connect(e.to_string()))?;
        let answer = EnrolmentClient::new(channel)
            .enrol(EnrolRequest {
                host_nqn: host_nqn.to_owned(),
            })
            .await
            .map_err(CallError::Status)?
            .into_inner();
        Ok(DhchapKeysText {
            host: answer.host_secret,
            ctrl: answer.ctrl_secret,
            generation: answer.generation,
        })
    }
}

/// A bad `--appliance` (or `--appliance-server-name`), named as the flag the operator wrote.
fn appliance_flag_error(e: &TargetError) -> String {
    match e {
        TargetError::NoPort(address) => format!(
            "--appliance {address:?}: expected HOST:PORT of the appliance's control endpoint"
        ),
        other => format!("--appliance: {other}"),
    }
}

/// The answer before validation (moved into [`DhchapKeys`] at once).
struct DhchapKeysText {
    host: String,
    ctrl: String,
    generation: u64,
}

enum CallError {
    Connect(String),
    Status(tonic::Status),
}

impl KeySource for GrpcEnroller {
    fn enrol(&self, host_nqn: &str) -> Result<DhchapKeys> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("enrolment runtime: {e}")))?;
        let outcome = runtime.block_on(async {
            tokio::time::timeout(self.timeout * 2, self.call(host_nqn))
                .await
                .unwrap_or_else(|_| {
                    Err(CallError::Connect(format!(
                        "no answer within {:?}",
                        self.timeout * 2
                    )))
                })
        });
        // Dropping the runtime drops the connection's task: the appliance sees it closed now,
        // not at the next enrolment.
        drop(runtime);
        match outcome {
            Ok(text) => DhchapKeys::validated(text.host, text.ctrl, text.generation),
            Err(e) => Err(enrol_error(self.target.address(), host_nqn, e)),
        }
    }
}

/// The CSI outcome of a failed enrolment. The appliance's messages never carry a secret.
fn enrol_error(address: &str, host_nqn: &str, err: CallError) -> Error {
    let status = match err {
        CallError::Connect(why) => {
            return Error::Unavailable(format!(
                "enrolment with the appliance at {address} failed: {why}; the node's \
                 DH-HMAC-CHAP keys come from there (check --appliance and that edgevold runs)"
            ))
        }
        CallError::Status(s) => s,
    };
    let (code, msg) = (status.code(), status.message());
    match code {
        Code::PermissionDenied => Error::FailedPrecondition(format!(
            "the appliance at {address} refused to enrol host NQN {host_nqn} with this node's \
             certificate ({msg}): the NQN is bound to another node, or this certificate was \
             revoked. If this host took over another node's NQN, revoke that node \
             (edgevol keys revoke --node OLD) or give this host its own NQN (--node-id-file); \
             if this certificate was revoked, issue a new one (edgevol pki issue --role node \
             --name NODE) and restart edgevol-node with it"
        )),
        Code::FailedPrecondition => Error::FailedPrecondition(format!(
            "the appliance at {address} refused to enrol host NQN {host_nqn} ({msg}): this \
             node's certificate is bound to another host NQN (one node, one NQN). Use the NQN \
             it enrolled with (--node-id-file), or revoke the node (edgevol keys revoke --node \
             NODE) and enrol with a newly issued certificate"
        )),
        Code::InvalidArgument => Error::FailedPrecondition(format!(
            "the appliance at {address} refused host NQN {host_nqn} as invalid ({msg})"
        )),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
            Error::Unavailable(format!(
                "enrolment with the appliance at {address} failed: {code:?}: {msg}"
            ))
        }
        _ => Error::Internal(format!(
            "enrolment with the appliance at {address} failed: {code:?}: {msg}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "DHHC-1:01:aG9zdGhvc3Rob3N0aG9zdGhvc3Rob3N0aG9zdGhvc3RhYmNkCg==:";
    const CTRL: &str = "DHHC-1:01:Y3RybGN0cmxjdHJsY3RybGN0cmxjdHJsY3RybGN0cmxhYmNkCg==:";

    #[test]
    fn secrets_never_print() {
        let keys = DhchapKeys::validated(HOST.into(), CTRL.into(), 7).unwrap();
        let shown = format!("{keys:?} {:?} {:#?}", keys.host, keys);
        assert!(!shown.contains("DHHC-1"), "{shown}");
        assert!(shown.contains("generation: 7"), "{shown}");
        assert_eq!(keys.host.expose(), HOST);
        assert_eq!(keys.ctrl.expose(), CTRL);
    }

    #[test]
    fn answers_that_are_no_dhchap_secret_are_refused_without_quoting_them() {
        for (h, c) in [
            ("hunter2", CTRL),
            (HOST, ""),
            ("DHHC-1:01:abc,traddr=1.2.3.4:", CTRL),
            (HOST, "DHHC-1:01:a b:"),
        ] {
            let e = DhchapKeys::validated(h.into(), c.into(), 1).unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, Error::Internal(_)), "{text}");
            assert!(!text.contains(h) || h.is_empty(), "{text}");
            assert!(!text.contains("DHHC-1"), "{text}");
        }
    }

    #[test]
    fn refusals_name_what_to_do_and_unreachable_is_unavailable() {
        let nqn = "nqn.2014-08.org.nvmexpress:uuid:1";
        let e = enrol_error(
            "10.0.0.1:9500",
            nqn,
            CallError::Status(tonic::Status::permission_denied("host NQN is bound")),
        );
        assert!(
            matches!(&e, Error::FailedPrecondition(m)
            if m.contains("bound to another node") && m.contains("edgevol keys revoke")
                && m.contains(nqn) && m.contains("10.0.0.1:9500")),
            "{e}"
        );
        let e = enrol_error(
            "10.0.0.1:9500",
            nqn,
            CallError::Status(tonic::Status::failed_precondition("node has another NQN")),
        );
        assert!(
            matches!(&e, Error::FailedPrecondition(m)
            if m.contains("bound to another host NQN")),
            "{e}"
        );
        let e = enrol_error(
            "10.0.0.1:9500",
            nqn,
            CallError::Connect("connection refused".into()),
        );
        assert!(
            matches!(&e, Error::Unavailable(m) if m.contains("connection refused")),
            "{e}"
        );
        let e = enrol_error(
            "10.0.0.1:9500",
            nqn,
            CallError::Status(tonic::Status::unavailable("down")),
        );
        assert!(matches!(e, Error::Unavailable(_)), "{e}");
        let e = enrol_error(
            "10.0.0.1:9500",
            nqn,
            CallError::Status(tonic::Status::internal("store")),
        );
        assert!(matches!(e, Error::Internal(_)), "{e}");
    }

    #[test]
    fn an_address_without_port_or_certificates_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = |address: &str| EnrolConfig {
            address: address.to_owned(),
            server_name: None,
            ca: dir.path().join("ca.pem"),
            cert: dir.path().join("node.pem"),
            key: dir.path().join("node.key"),
            timeout: Duration::from_secs(1),
        };
        let e = GrpcEnroller::new(&cfg("10.0.0.1:9500")).unwrap_err();
        assert!(e.contains("node certificate"), "{e}");
        edgevol_pki::files::ensure_dev(dir.path()).unwrap();
        let e = GrpcEnroller::new(&cfg("10.0.0.1")).unwrap_err();
        assert!(e.contains("--appliance") && e.contains("HOST:PORT"), "{e}");
        GrpcEnroller::new(&cfg("10.0.0.1:9500")).unwrap();
    }
}
