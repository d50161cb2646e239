//! Identity over mutual TLS, and the matrix of refused clients, each with its exact failure.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::DevAppliance;
use edgevol_pki::{Ca, Role, Validity};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::plugin_capability::service::Type as Service;
use edgevol_proto::csi::v1::{
    plugin_capability, CreateVolumeRequest, GetPluginCapabilitiesRequest, GetPluginInfoRequest,
    ListVolumesRequest, ProbeRequest,
};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{AlertDescription, ClientConfig, Error as TlsError, RootCertStore};
use tokio_rustls::TlsConnector;
use tonic::Code;

#[tokio::test]
async fn controller_gets_plugin_info_and_probe_turns_ready() {
    let app = DevAppliance::start().await;
    let mut identity = IdentityClient::new(app.channel("controller").await);
    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "csi.edgevol.io");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(info.manifest["appliance-id"], "test-box");

    let caps = identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let services: Vec<Service> = caps
        .capabilities
        .iter()
        .filter_map(|c| match c.r#type {
            Some(plugin_capability::Type::Service(s)) => Some(s.r#type()),
            _ => None,
        })
        .collect();
    assert!(
        services.contains(&Service::ControllerService),
        "{services:?}"
    );
    assert!(
        services.contains(&Service::GroupControllerService),
        "{services:?}"
    );
    assert!(
        services.contains(&Service::VolumeAccessibilityConstraints),
        "{services:?}"
    );

    let deadline = tokio::time::Instant::now() + common::scaled(Duration::from_secs(30));
    loop {
        let ready = identity
            .probe(ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready;
        if ready == Some(true) {
            break;
        }
        assert_eq!(ready, Some(false), "Probe always says whether it is ready");
        assert!(
            tokio::time::Instant::now() < deadline,
            "pool never became ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.running.stop().await.unwrap();
}

/// Connects with `config`, then reads: with TLS 1.3 a refused client certificate shows up as the
/// server's alert on the first read after the client's side of the handshake.
async fn refused_with(app: &DevAppliance, config: ClientConfig) -> TlsError {
    let tcp = TcpStream::connect(app.addr()).await.unwrap();
    let connector = TlsConnector::from(Arc::new(config));
    let mut tls = match connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
    {
        Ok(tls) => tls,
        Err(e) => return tls_error(e),
    };
    let mut buf = [0u8; 64];
    let err = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match tls.read(&mut buf).await {
                Ok(0) => panic!("server closed without an alert"),
                Ok(_) => continue,
                Err(e) => return e,
            }
        }
    })
    .await
    .expect("server neither answered nor refused");
    tls_error(err)
}

fn tls_error(e: std::io::Error) -> TlsError {
    e.into_inner()
        .and_then(|inner| inner.downcast::<TlsError>().ok())
        .map(|b| *b)
        .expect("a rustls error")
}

fn config_with(app: &DevAppliance, client: Option<(String, String)>) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(app.pki().join("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

#[tokio::test]
async fn mtls_matrix_refuses_each_bad_client_with_its_exact_failure() {
    let app = DevAppliance::start().await;

    // A valid client proves the server is up and serving.
    let mut identity = IdentityClient::new(app.channel("observer").await);
    identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap();

    // No client certificate at all.
    let err = refused_with(&app, config_with(&app, None)).await;
    assert_eq!(
        err,
        TlsError::AlertReceived(AlertDescription::CertificateRequired)
    );

    // A role certificate from another CA.
    let (stranger_ca, _) = Ca::generate("stranger CA", Validity::days(1)).unwrap();
    let stranger = stranger_ca
        .issue_client(Role::Admin, "mallory", Validity::days(1))
        .unwrap();
    let err = refused_with(
        &app,
        config_with(&app, Some((stranger.cert_pem, stranger.key_pem))),
    )
    .await;
    assert_eq!(err, TlsError::AlertReceived(AlertDescription::UnknownCA));

    // An expired certificate from the right CA.
    let ca = Ca::load(&app.pki().join("ca.pem"), &app.pki().join("ca.key")).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let expired = ca
        .issue_client(
            Role::Admin,
            "old-admin",
            Validity {
                not_before: now - time::Duration::days(10),
                not_after: now - time::Duration::days(1),
            },
        )
        .unwrap();
    let err = refused_with(
        &app,
        config_with(&app, Some((expired.cert_pem, expired.key_pem))),
    )
    .await;
    assert_eq!(
        err,
        TlsError::AlertReceived(AlertDescription::CertificateExpired)
    );

    // A server certificate of the right CA presented as a client certificate: wrong purpose.
    let server_like = ca
        .issue_server(&["not-a-client".into()], Validity::days(1))
        .unwrap();
    let err = refused_with(
        &app,
        config_with(&app, Some((server_like.cert_pem, server_like.key_pem))),
    )
    .await;
    assert_eq!(
        err,
        TlsError::AlertReceived(AlertDescription::UnsupportedCertificate)
    );

    // An observer calling a Controller RPC that mutates.
    let mut controller = ControllerClient::new(app.channel("observer").await);
    let status = controller
        .create_volume(CreateVolumeRequest {
            name: "v".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(
        status.message(),
        "role observer of client \"observer\" may not call csi.v1.Controller/CreateVolume"
    );
    // ...while a read-only Controller RPC passes the role check.
    controller
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap();

    // The same valid client still works after all the refusals.
    identity.probe(ProbeRequest {}).await.unwrap();
    app.running.stop().await.unwrap();
}
