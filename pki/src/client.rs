//! The client end of the appliance's mutual TLS: where the appliance is, the name its
//! certificate must carry, and a connection (or a gRPC channel) to it.
//!
//! The CLI, the node plugin's enrolment and the tests all reach the appliance this way, so the
//! address rules (HOST:PORT, the server name defaulting to HOST), `TCP_NODELAY` and the
//! handshake live here once. tonic's own TLS is not compiled in: one TLS stack, rustls with ring.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tonic::codegen::http::uri::Authority;
use tonic::transport::{Channel, Endpoint};

/// An appliance endpoint reached over mutual TLS.
#[derive(Clone)]
pub struct MtlsTarget {
    address: String,
    server_name: ServerName<'static>,
    tls: Arc<ClientConfig>,
}

impl fmt::Debug for MtlsTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MtlsTarget")
            .field("address", &self.address)
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// An address or server name that cannot name an appliance endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetError {
    /// Not `HOST:PORT` at all.
    Address {
        /// What was given.
        address: String,
        /// What the parser said.
        reason: String,
    },
    /// `HOST` without a port.
    NoPort(String),
    /// The name to verify is no DNS name or IP address.
    ServerName {
        /// What was given (or HOST, when no name was).
        name: String,
        /// What rustls said.
        reason: String,
    },
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetError::Address { address, reason } => {
                write!(f, "appliance address {address:?}: {reason}")
            }
            TargetError::NoPort(address) => {
                write!(f, "appliance address {address:?}: expected HOST:PORT")
            }
            TargetError::ServerName { name, reason } => {
                write!(f, "appliance server name {name:?}: {reason}")
            }
        }
    }
}

impl StdError for TargetError {}

/// Why a connection to the appliance failed.
#[derive(Debug)]
pub enum ConnectError {
    /// The TCP connection failed: nothing listens there, or the host cannot be reached.
    Unreachable(io::Error),
    /// The TLS handshake failed: one side refused the other's certificate.
    Handshake(io::Error),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Unreachable(e) => write!(f, "unreachable: {e}"),
            ConnectError::Handshake(e) => write!(f, "refused the TLS handshake: {e}"),
        }
    }
}

// No `source()`: the OS or rustls error is already in the message, and error chains
// ([`ChannelError`]) would print it twice.
impl StdError for ConnectError {}

/// A gRPC channel could not be opened. Its text is the whole chain of causes (tonic's own
/// "transport error" says nothing by itself).
#[derive(Debug)]
pub struct ChannelError(tonic::transport::Error);

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

impl StdError for ChannelError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}

impl MtlsTarget {
    /// The appliance at `address` (`HOST:PORT`), whose certificate must be valid for
    /// `server_name`, or else for HOST; `tls` is a [`crate::tls::client_config`].
    pub fn new(
        address: &str,
        server_name: Option<&str>,
        tls: Arc<ClientConfig>,
    ) -> Result<MtlsTarget, TargetError> {
        let authority: Authority = address.parse().map_err(|e| TargetError::Address {
            address: address.to_owned(),
            reason: format!("{e}"),
        })?;
        if authority.port_u16().is_none() {
            return Err(TargetError::NoPort(address.to_owned()));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = server_name.unwrap_or(host);
        let server_name =
            ServerName::try_from(name.to_owned()).map_err(|e| TargetError::ServerName {
                name: name.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(MtlsTarget {
            address: address.to_owned(),
            server_name,
            tls,
        })
    }

    /// `HOST:PORT`, as given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The name the appliance's certificate is verified against.
    pub fn server_name(&self) -> &ServerName<'static> {
        &self.server_name
    }

    /// A TCP connection (no Nagle delay: gRPC's small frames would wait for delayed ACKs)
    /// with the TLS handshake done. No timeout: callers bound it.
    pub async fn connect(&self) -> Result<TlsStream<TcpStream>, ConnectError> {
        let tcp = TcpStream::connect(&self.address)
            .await
            .map_err(ConnectError::Unreachable)?;
        tcp.set_nodelay(true).map_err(ConnectError::Unreachable)?;
        TlsConnector::from(self.tls.clone())
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(ConnectError::Handshake)
    }

    /// A gRPC channel over [`MtlsTarget::connect`]: connected before this returns, and
    /// reconnected by tonic when the connection drops. `call_timeout` bounds every call.
    pub async fn channel(
        &self,
        connect_timeout: Duration,
        call_timeout: Option<Duration>,
    ) -> Result<Channel, ChannelError> {
        let mut endpoint = Endpoint::from_shared(format!("http://{}", self.address))
            .map_err(ChannelError)?
            .connect_timeout(connect_timeout);
        if let Some(t) = call_timeout {
            endpoint = endpoint.timeout(t);
        }
        let target = self.clone();
        endpoint
            .connect_with_connector(tower::service_fn(move |_| {
                let target = target.clone();
                async move { target.connect().await.map(TokioIo::new) }
            }))
            .await
            .map_err(ChannelError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::{init, issue, issue_server, Pair};
    use crate::tls::{client_config, server_config, TlsFiles};
    use crate::{Role, Validity};
    use tokio::net::TcpListener;

    fn tls(dir: &std::path::Path, who: &str) -> Arc<ClientConfig> {
        client_config(TlsFiles {
            ca: &Pair::in_dir(dir, "ca").cert,
            cert: &Pair::in_dir(dir, who).cert,
            key: &Pair::in_dir(dir, who).key,
        })
        .unwrap()
    }

    /// A PKI in a temp dir (server valid for `localhost`) with an observer client pair.
    fn pki() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), &["localhost".into()], false).unwrap();
        issue(
            dir.path(),
            Role::Observer,
            "observer",
            Validity::days(1),
            false,
        )
        .unwrap();
        dir
    }

    #[test]
    fn addresses_need_a_port_and_names_default_to_the_host() {
        let dir = pki();
        let t = tls(dir.path(), "observer");
        let target = MtlsTarget::new("10.0.0.1:9500", None, t.clone()).unwrap();
        assert_eq!(target.address(), "10.0.0.1:9500");
        assert_eq!(
            target.server_name(),
            &ServerName::try_from("10.0.0.1").unwrap()
        );
        let target = MtlsTarget::new("[::1]:9500", None, t.clone()).unwrap();
        assert_eq!(target.server_name(), &ServerName::try_from("::1").unwrap());
        let target = MtlsTarget::new("box:9500", Some("box-7.example"), t.clone()).unwrap();
        assert_eq!(
            target.server_name(),
            &ServerName::try_from("box-7.example").unwrap()
        );
        let e = MtlsTarget::new("10.0.0.1", None, t.clone()).unwrap_err();
        assert_eq!(e, TargetError::NoPort("10.0.0.1".into()));
        assert!(e.to_string().contains("expected HOST:PORT"), "{e}");
        let e = MtlsTarget::new("a b:1", None, t.clone()).unwrap_err();
        assert!(matches!(e, TargetError::Address { .. }), "{e}");
        let e = MtlsTarget::new("box:1", Some("not a name"), t).unwrap_err();
        assert!(matches!(e, TargetError::ServerName { .. }), "{e}");
    }

    /// Accepts TLS connections with the appliance's server configuration; each accepted
    /// connection reports its ALPN protocol, or the handshake error.
    async fn tls_server(
        dir: &std::path::Path,
        stem: &str,
    ) -> (
        std::net::SocketAddr,
        tokio::task::JoinHandle<Result<Vec<u8>, String>>,
    ) {
        let server = Pair::in_dir(dir, stem);
        let config = server_config(TlsFiles {
            ca: &Pair::in_dir(dir, "ca").cert,
            cert: &server.cert,
            key: &server.key,
        })
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let tls = tokio_rustls::TlsAcceptor::from(config)
                .accept(tcp)
                .await
                .map_err(|e| e.to_string())?;
            Ok(tls.get_ref().1.alpn_protocol().unwrap_or_default().to_vec())
        });
        (addr, task)
    }

    #[tokio::test]
    async fn connects_with_the_client_certificate_and_checks_the_server_name() {
        let dir = pki();
        let (addr, server) = tls_server(dir.path(), "server").await;
        let target = MtlsTarget::new(
            &addr.to_string(),
            Some("localhost"),
            tls(dir.path(), "observer"),
        )
        .unwrap();
        let stream = target.connect().await.unwrap();
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        assert_eq!(server.await.unwrap().unwrap(), b"h2");

        // The server's certificate is not valid for 127.0.0.1 (HOST, with no name given).
        let (addr, server) = tls_server(dir.path(), "server").await;
        let target = MtlsTarget::new(&addr.to_string(), None, tls(dir.path(), "observer")).unwrap();
        let e = target.connect().await.unwrap_err();
        assert!(matches!(e, ConnectError::Handshake(_)), "{e}");
        assert!(
            e.to_string().starts_with("refused the TLS handshake"),
            "{e}"
        );
        assert!(server.await.unwrap().is_err());
    }

    #[tokio::test]
    async fn another_appliance_of_the_site_gets_a_server_certificate_from_the_same_ca() {
        let dir = pki();
        let sans = ["box-b.lan".to_owned(), "192.0.2.8".to_owned()];
        issue_server(dir.path(), "box-b", &sans, Validity::days(1), false).unwrap();
        let again = issue_server(dir.path(), "box-b", &sans, Validity::days(1), false);
        assert!(
            matches!(again, Err(crate::PkiError::Exists(_))),
            "{again:?}"
        );
        for (name, accepted) in [
            ("box-b.lan", true),
            ("192.0.2.8", true),
            ("localhost", false),
        ] {
            let (addr, server) = tls_server(dir.path(), "box-b").await;
            let target =
                MtlsTarget::new(&addr.to_string(), Some(name), tls(dir.path(), "observer"))
                    .unwrap();
            assert_eq!(target.connect().await.is_ok(), accepted, "{name}");
            assert_eq!(server.await.unwrap().is_ok(), accepted, "{name}");
        }
    }

    #[tokio::test]
    async fn a_channel_error_names_its_cause() {
        let dir = pki();
        // A port with nothing behind it.
        let addr = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let target = MtlsTarget::new(
            &addr.to_string(),
            Some("localhost"),
            tls(dir.path(), "observer"),
        )
        .unwrap();
        let e = target
            .channel(Duration::from_secs(5), None)
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("unreachable: "), "{text}");
        assert!(text.to_lowercase().contains("refused"), "{text}");
    }
}
