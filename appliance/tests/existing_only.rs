//! `edgevol.io/existing-only`, the question `edgevol proxy` asks before it places a volume:
//! answered like an idempotent CreateVolume when the name exists (ALREADY_EXISTS when it does
//! not match), NOT_FOUND when it does not, and nothing is ever created or stored by it.

mod common;

use std::collections::HashMap;

use common::DevAppliance;
use edgevol_appliance::csi::params::EXISTING_ONLY_PARAM;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use edgevol_proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::Code;

const MIB: i64 = 1 << 20;

fn create(name: &str, bytes: i64, params: &[(&str, &str)]) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }],
        parameters: params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

async fn volume_ids(c: &mut ControllerClient<Channel>) -> Vec<String> {
    c.list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.volume.unwrap().volume_id)
        .collect()
}

async fn free(c: &mut ControllerClient<Channel>) -> i64 {
    c.get_capacity(GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner()
        .available_capacity
}

#[tokio::test]
async fn existing_only_finds_the_named_volume_and_never_creates_one() {
    let app = DevAppliance::start().await;
    app.ready().await;
    let mut c = ControllerClient::new(app.channel("controller").await);
    let ask = [(EXISTING_ONLY_PARAM, "true")];
    let free_before = free(&mut c).await;

    // No volume of the name: NOT_FOUND, and still none (thick would have taken space).
    let s = c
        .create_volume(create(
            "data",
            8 * MIB,
            &[ask[0], ("provisioning", "thick")],
        ))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound, "{s:?}");
    assert!(volume_ids(&mut c).await.is_empty());
    assert_eq!(free(&mut c).await, free_before, "no space taken");

    // Made: the question answers that very volume, as an idempotent CreateVolume does.
    let thick = [("provisioning", "thick")];
    let made = c
        .create_volume(create("data", 8 * MIB, &thick))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let found = c
        .create_volume(create("data", 8 * MIB, &[ask[0], thick[0]]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(found, made, "same id, size, context");
    assert!(
        !found.volume_context.contains_key(EXISTING_ONLY_PARAM),
        "never stored: {:?}",
        found.volume_context
    );

    // Not what was made (size, parameters): ALREADY_EXISTS, as a CreateVolume answers.
    for other in [
        create("data", 16 * MIB, &[ask[0], thick[0]]),
        create("data", 8 * MIB, &ask),
    ] {
        let s = c.create_volume(other).await.unwrap_err();
        assert_eq!(s.code(), Code::AlreadyExists, "{s:?}");
    }
    assert_eq!(volume_ids(&mut c).await, vec![made.volume_id.clone()]);

    // Only "true" is a question; GetCapacity does not take it.
    let s = c
        .create_volume(create("other", MIB, &[(EXISTING_ONLY_PARAM, "yes")]))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    let s = c
        .get_capacity(GetCapacityRequest {
            parameters: HashMap::from([(EXISTING_ONLY_PARAM.to_owned(), "true".to_owned())]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert_eq!(volume_ids(&mut c).await, vec![made.volume_id]);
}
