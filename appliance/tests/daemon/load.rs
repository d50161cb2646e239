//! Load: 1,000 concurrent CreateVolume calls with distinct names and 100 with one shared name
//! leave exactly 1,001 volumes and no unexpected error.

use crate::common;

use common::DevAppliance;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::ListVolumesRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_creates_and_a_hundred_racing_on_one_name() {
    let app = DevAppliance::start().await;
    app.ready().await;
    let client = ControllerClient::new(app.channel("controller").await);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1100 {
        let mut c = client.clone();
        let name = if i % 11 == 0 {
            "shared".to_owned()
        } else {
            format!("load-{i}")
        };
        tasks.spawn(async move {
            let v = c
                .create_volume(common::block_volume(name.clone()))
                .await?
                .into_inner();
            Ok::<_, tonic::Status>((name, v.volume.unwrap().volume_id))
        });
    }
    let mut shared_ids = std::collections::HashSet::new();
    let mut created = 0;
    while let Some(joined) = tasks.join_next().await {
        let (name, id) = joined
            .unwrap()
            .unwrap_or_else(|s| panic!("unexpected error: {s:?}"));
        created += 1;
        if name == "shared" {
            shared_ids.insert(id);
        }
    }
    assert_eq!(created, 1100);
    assert_eq!(shared_ids.len(), 1, "the 100 racing calls got one volume");

    let mut c = client.clone();
    let mut total = 0;
    let mut token = String::new();
    loop {
        let page = c
            .list_volumes(ListVolumesRequest {
                max_entries: 300,
                starting_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        total += page.entries.len();
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(total, 1001);
    app.running.stop().await.unwrap();
}
