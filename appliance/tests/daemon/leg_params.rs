//! The leg marking of replicated volumes (`edgevol.io/leg`, `edgevol.io/legs-before`): checked,
//! stored with the volume, shown in every volume_context, part of CreateVolume's idempotency,
//! kept across a restart, and exported as `edgevol_volume_leg`.

use crate::common;

use std::collections::HashMap;

use common::{dev_config, DevAppliance};
use edgevol_appliance::config::MetricsConfig;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use edgevol_proto::csi::v1::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;
use tonic::Code;

const MIB: i64 = 1 << 20;

fn leg(name: &str, marks: &[(&str, &str)]) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 5 * MIB,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }],
        parameters: marks
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

/// The exporter's text (a plain HTTP/1.1 GET).
async fn scrape(app: &DevAppliance) -> String {
    let addr = app.running.metrics_addr.expect("exporter runs");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    tcp.read_to_string(&mut raw).await.unwrap();
    raw.split_once("\r\n\r\n").unwrap().1.to_owned()
}

async fn listed(c: &mut ControllerClient<Channel>) -> HashMap<String, HashMap<String, String>> {
    c.list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| {
            let v = e.volume.unwrap();
            (v.volume_id, v.volume_context)
        })
        .collect()
}

#[tokio::test]
async fn leg_marks_are_checked_stored_shown_and_kept_across_a_restart() {
    let with_metrics = |c: &mut edgevol_appliance::config::Config| {
        c.metrics = MetricsConfig {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            best_effort: false,
        };
    };
    let app = DevAppliance::start_with(with_metrics).await;
    app.ready().await;
    let mut c = ControllerClient::new(app.channel("controller").await);
    const LEG: &str = "edgevol.io/leg";
    const BEFORE: &str = "edgevol.io/legs-before";

    let marks = [(LEG, "1/2"), (BEFORE, "box-a-v4")];
    let v = c
        .create_volume(leg("mirror+leg", &marks))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.volume_context[LEG], "1/2");
    assert_eq!(v.volume_context[BEFORE], "box-a-v4");
    let got = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: v.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(got.volume_context, v.volume_context);
    assert_eq!(listed(&mut c).await[&v.volume_id], v.volume_context);

    // Idempotent by name with the same marks; other marks are another volume's.
    let again = c
        .create_volume(leg("mirror+leg", &marks))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, v.volume_id);
    for other in [
        vec![(LEG, "0/2")],
        vec![(LEG, "1/2"), (BEFORE, "box-c-v4")],
        vec![],
    ] {
        let s = c
            .create_volume(leg("mirror+leg", &other))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::AlreadyExists, "{other:?}: {s:?}");
    }

    // Refused: a position without its earlier legs, the earlier legs alone, too many legs.
    for bad in [
        vec![(LEG, "1/2")],
        vec![(BEFORE, "box-a-v4")],
        vec![(LEG, "0/2"), (BEFORE, "box-a-v4")],
        vec![(LEG, "3/4"), (BEFORE, "a-v1+b-v1+c-v1")],
        vec![(LEG, "2/2"), (BEFORE, "a-v1+b-v1")],
        vec![(LEG, "1/2"), (BEFORE, "a-v1+b-v1")],
        vec![(LEG, "half")],
    ] {
        let s = c.create_volume(leg("bad+leg", &bad)).await.unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{bad:?}: {s:?}");
        assert!(s.message().contains("edgevol.io/leg"), "{}", s.message());
    }

    // The exporter shows the leg, its position and the legs before it; a plain volume is no leg.
    let plain = c
        .create_volume(leg("plain", &[]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let text = scrape(&app).await;
    let sample = format!(
        "edgevol_volume_leg{{volume_id=\"{}\",leg=\"1/2\",legs_before=\"box-a-v4\"}} 1",
        v.volume_id
    );
    assert!(text.lines().any(|l| l == sample), "{sample} in:\n{text}");
    assert!(
        !text.contains(&format!(
            "edgevol_volume_leg{{volume_id=\"{}\"",
            plain.volume_id
        )),
        "{text}"
    );
    c.delete_volume(DeleteVolumeRequest {
        volume_id: plain.volume_id,
        ..Default::default()
    })
    .await
    .unwrap();

    let DevAppliance { dir, running } = app;
    running.stop().await.unwrap();
    let running = edgevol_appliance::start(dev_config(dir.path(), "127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let app = DevAppliance { dir, running };
    app.ready().await;
    let mut c = ControllerClient::new(app.channel("controller").await);
    let after = listed(&mut c).await;
    assert_eq!(after.len(), 1, "the refused legs were never created");
    assert_eq!(after[&v.volume_id], v.volume_context, "the marks survive");
    let again = c
        .create_volume(leg("mirror+leg", &marks))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, v.volume_id, "and so does idempotency");
    app.running.stop().await.unwrap();
}
