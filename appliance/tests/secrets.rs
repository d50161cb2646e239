//! CSI secrets never reach the log: every call is logged (with the caller's identity), but no
//! request body is, so a secret value sent with calls that succeed and calls that fail is absent
//! from everything the daemon logged at the most verbose level.

mod common;

use common::log_capture::Captured;
use common::DevAppliance;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
use edgevol_proto::csi::v1::*;

const SECRET: &str = "s3cr3t-Pa55word-that-must-not-leak";

#[tokio::test]
async fn secrets_are_never_logged() {
    let log = Captured::install();

    let app = DevAppliance::start().await;
    app.ready().await;
    let mut c = ControllerClient::new(app.channel("controller").await);
    let secrets = std::collections::HashMap::from([("password".to_owned(), SECRET.to_owned())]);
    let cap = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    };
    let v = c
        .create_volume(CreateVolumeRequest {
            name: "with-secrets".into(),
            volume_capabilities: vec![cap.clone()],
            secrets: secrets.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    // A refused call with secrets, and calls of other RPCs carrying secrets.
    c.create_volume(CreateVolumeRequest {
        name: String::new(),
        secrets: secrets.clone(),
        ..Default::default()
    })
    .await
    .unwrap_err();
    c.create_snapshot(CreateSnapshotRequest {
        source_volume_id: v.volume_id.clone(),
        name: "snap".into(),
        secrets: secrets.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    c.delete_volume(DeleteVolumeRequest {
        volume_id: v.volume_id,
        secrets,
    })
    .await
    .unwrap();
    app.running.stop().await.unwrap();

    let text = log.text();
    assert!(text.contains("CreateVolume"), "calls are logged:\n{text}");
    assert!(
        text.contains("controller/controller"),
        "with the caller's identity:\n{text}"
    );
    assert!(!text.contains(SECRET), "a secret leaked into the log");
    assert!(
        !text.contains("password"),
        "a secret's key leaked into the log"
    );
}
