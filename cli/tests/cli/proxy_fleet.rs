//! `edgevol proxy` over several appliances: placement by topology, then free space,
//! idempotency by name (also after free space moved), GetCapacity per segment, listings paged across appliances, routing by id, and one appliance
//! down while the others keep working.

use std::collections::BTreeSet;

use crate::common;
use crate::fleet;

use common::{create_ok, snapshot_ids, snapshot_of, snapshot_ok, unix_channel};
use edgevol_cli::fleet_placement::{self, EXISTING_ONLY_PARAM};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::*;
use fleet::{all_pages, create, fleet_proxy, home, list_all, start_fleet, stop_all, topology};
use tonic::transport::Channel;
use tonic::Code;

const APPLIANCE: &str = "edgevol.io/appliance";

fn requisite(segments: Vec<Topology>, preferred: Vec<Topology>) -> Option<TopologyRequirement> {
    Some(TopologyRequirement {
        requisite: segments,
        preferred,
    })
}

#[tokio::test]
async fn create_volume_places_by_topology_and_finds_a_retried_name_on_its_appliance() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;

    // Named by the appliance key, by a presence key, or preferred among several.
    let mut on_b = create("pinned-b", 1 << 20);
    on_b.accessibility_requirements = requisite(vec![topology(&[(APPLIANCE, "box-b")])], vec![]);
    let v = create_ok(&mut c, on_b).await;
    assert_eq!(home(&v.volume_id), "box-b");
    assert!(v
        .accessible_topology
        .contains(&topology(&[(APPLIANCE, "box-b")])));
    assert!(
        v.accessible_topology
            .contains(&topology(&[("appliance.edgevol.io/box-b", "true")])),
        "nodes reaching several appliances match: {:?}",
        v.accessible_topology
    );

    let mut on_a = create("pinned-a", 1 << 20);
    on_a.accessibility_requirements = requisite(
        vec![topology(&[("appliance.edgevol.io/box-a", "true")])],
        vec![],
    );
    let v = create_ok(&mut c, on_a).await;
    assert_eq!(home(&v.volume_id), "box-a");

    let both = topology(&[
        ("appliance.edgevol.io/box-a", "true"),
        ("appliance.edgevol.io/box-b", "true"),
    ]);
    for (name, preferred) in [("pref-a", "box-a"), ("pref-b", "box-b")] {
        let mut r = create(name, 1 << 20);
        r.accessibility_requirements = requisite(
            vec![both.clone()],
            vec![topology(&[(APPLIANCE, preferred)])],
        );
        let v = create_ok(&mut c, r).await;
        assert_eq!(home(&v.volume_id), preferred, "{name}");
    }

    // No box of this driver in the requisite topology.
    let mut nowhere = create("nowhere", 1 << 20);
    nowhere.accessibility_requirements = requisite(vec![topology(&[(APPLIANCE, "box-z")])], vec![]);
    let status = c.create_volume(nowhere).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("box-a, box-b"),
        "{}",
        status.message()
    );

    // Unconstrained names spread over both appliances, and every retry finds its volume.
    let mut homes = BTreeSet::new();
    for i in 0..12 {
        let name = format!("pvc-{i}");
        let first = c
            .create_volume(create(&name, 1 << 20))
            .await
            .unwrap()
            .into_inner();
        let again = c
            .create_volume(create(&name, 1 << 20))
            .await
            .unwrap()
            .into_inner();
        let (first, again) = (first.volume.unwrap(), again.volume.unwrap());
        assert_eq!(first.volume_id, again.volume_id, "{name} retried");
        homes.insert(home(&first.volume_id).to_owned());
    }
    assert_eq!(homes.len(), 2, "names land on both appliances");
    assert_eq!(
        list_all(&mut c, 0).await.len(),
        4 + 12,
        "no duplicate from a retry"
    );

    // A clone lives where its source does.
    let src = c
        .create_volume(create("src", 1 << 20))
        .await
        .unwrap()
        .into_inner();
    let src = src.volume.unwrap().volume_id;
    for name in ["clone-1", "clone-2", "clone-3"] {
        let mut clone = create(name, 1 << 20);
        clone.volume_content_source = Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Volume(
                volume_content_source::VolumeSource {
                    volume_id: src.clone(),
                },
            )),
        });
        let v = create_ok(&mut c, clone).await;
        assert_eq!(home(&v.volume_id), home(&src), "{name}");
    }

    stop_all(&mut boxes).await;
}

/// A thick volume of `mib` MiB on appliance `id`: takes that much of its free space.
async fn fill(c: &mut ControllerClient<Channel>, name: &str, id: &str, mib: i64) {
    let mut r = create(name, mib << 20);
    r.parameters.insert("provisioning".into(), "thick".into());
    r.accessibility_requirements = requisite(vec![topology(&[(APPLIANCE, id)])], vec![]);
    let v = create_ok(c, r).await;
    assert_eq!(home(&v.volume_id), id);
}

/// Appliance `id`'s free bytes, through the proxy.
async fn free(c: &mut ControllerClient<Channel>, id: &str) -> i64 {
    c.get_capacity(GetCapacityRequest {
        accessible_topology: Some(topology(&[(APPLIANCE, id)])),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .available_capacity
}

/// Names the name's order alone would put on `ids[first]` first.
fn names_first_on(first: usize, n: usize) -> Vec<String> {
    let ids = ["box-a", "box-b"];
    (0..)
        .map(|i| format!("pvc-free-{i}"))
        .filter(|name| fleet_placement::order(None, &ids, name)[0] == first)
        .take(n)
        .collect()
}

#[tokio::test]
async fn equally_preferred_appliances_take_volumes_by_free_space_after_topology() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    fill(&mut c, "filler-a", "box-a", 64).await;
    assert!(free(&mut c, "box-a").await < free(&mut c, "box-b").await);

    // Names the hash alone puts on box-a go to box-b, which has more free.
    for name in names_first_on(0, 4) {
        let v = create_ok(&mut c, create(&name, 1 << 20)).await;
        assert_eq!(home(&v.volume_id), "box-b", "{name}");
    }

    // Topology beats space: preferred box-a, or only box-a allowed.
    let both = topology(&[
        ("appliance.edgevol.io/box-a", "true"),
        ("appliance.edgevol.io/box-b", "true"),
    ]);
    let mut preferred = create("pref-a", 1 << 20);
    preferred.accessibility_requirements =
        requisite(vec![both.clone()], vec![topology(&[(APPLIANCE, "box-a")])]);
    assert_eq!(home(&create_ok(&mut c, preferred).await.volume_id), "box-a");
    let mut only = create("only-a", 1 << 20);
    only.accessibility_requirements = requisite(vec![topology(&[(APPLIANCE, "box-a")])], vec![]);
    assert_eq!(home(&create_ok(&mut c, only).await.volume_id), "box-a");

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn a_retry_whose_answer_was_lost_finds_its_volume_after_free_space_moved() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let name = names_first_on(0, 1).remove(0);

    // box-b has more free: the volume goes there, not where the name alone would put it.
    fill(&mut c, "filler-a", "box-a", 64).await;
    let first = create_ok(&mut c, create(&name, 1 << 20)).await;
    assert_eq!(home(&first.volume_id), "box-b");

    // Now box-a has more free (a new name goes there), and the first answer was lost.
    fill(&mut c, "filler-b", "box-b", 128).await;
    assert!(free(&mut c, "box-a").await > free(&mut c, "box-b").await);
    let fresh = create_ok(&mut c, create(&names_first_on(1, 1)[0], 1 << 20)).await;
    assert_eq!(home(&fresh.volume_id), "box-a", "free space moved");
    let again = create_ok(&mut c, create(&name, 1 << 20)).await;
    assert_eq!(again, first, "the retry gets the same volume");

    // A retry that does not match what was made is refused by the box that has it.
    let status = c.create_volume(create(&name, 2 << 20)).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    let listed = list_all(&mut c, 0).await;
    assert_eq!(
        listed.len(),
        4,
        "two fillers, the new name, the volume once: {listed:?}"
    );

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn with_an_allowed_appliance_silent_placement_follows_the_name_alone() {
    let dir = tempfile::tempdir().unwrap();
    let ids = ["box-a", "box-b", "box-c"];
    let mut boxes = start_fleet(dir.path(), &ids).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    fill(&mut c, "filler-c", "box-c", 64).await;
    assert!(free(&mut c, "box-b").await > free(&mut c, "box-c").await);

    // box-a may hold any name (a lost answer): free space would be a guess a retry cannot
    // repeat, so names the hash ranks box-c before box-b go to box-c though box-b has more.
    boxes[0].stop().await;
    let names: Vec<String> = (0..)
        .map(|i| format!("pvc-silent-{i}"))
        .filter(|name| {
            let order = fleet_placement::order(None, &ids, name);
            order.iter().position(|&i| i == 2) < order.iter().position(|&i| i == 1)
        })
        .take(3)
        .collect();
    for name in &names {
        let v = create_ok(&mut c, create(name, 1 << 20)).await;
        assert_eq!(home(&v.volume_id), "box-c", "{name}");
    }

    stop_all(&mut boxes).await;
}

/// A name is the driver's, so the appliances outside the requisite topology are asked too; one
/// of them that does not answer is passed over (the documented limit: were it the holder, the
/// name would be made twice), so a box that is down blocks no volume or snapshot elsewhere.
#[tokio::test]
async fn an_appliance_outside_the_topology_that_is_down_blocks_no_create() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    boxes[0].stop().await;
    let mut r = create("pinned-b", 1 << 20);
    r.accessibility_requirements = requisite(vec![topology(&[(APPLIANCE, "box-b")])], vec![]);
    let v = create_ok(&mut c, r).await;
    assert_eq!(home(&v.volume_id), "box-b");
    let s = snapshot_ok(&mut c, snapshot_of(&v.volume_id, "snap-b")).await;
    assert_eq!(home(&s.snapshot_id), "box-b");

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn the_existing_only_question_is_the_proxys_own_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    assert_eq!(
        EXISTING_ONLY_PARAM,
        edgevol_appliance::csi::params::EXISTING_ONLY_PARAM,
        "the proxy and edgevold spell it alike"
    );
    create_ok(&mut c, create("made", 1 << 20)).await;
    for name in ["made", "absent"] {
        let mut r = create(name, 1 << 20);
        r.parameters
            .insert(EXISTING_ONLY_PARAM.into(), "true".into());
        let status = c.create_volume(r).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains(EXISTING_ONLY_PARAM),
            "{}",
            status.message()
        );
    }
    assert_eq!(list_all(&mut c, 0).await.len(), 1, "nothing created");

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn get_capacity_answers_per_segment_and_sums_the_appliances_of_a_wider_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let capacity = |t: Option<Topology>| GetCapacityRequest {
        accessible_topology: t,
        ..Default::default()
    };
    let mut per_box = Vec::new();
    for id in ["box-a", "box-b"] {
        let got = c
            .get_capacity(capacity(Some(topology(&[(APPLIANCE, id)]))))
            .await
            .unwrap()
            .into_inner();
        let by_presence = c
            .get_capacity(capacity(Some(topology(&[(
                &format!("appliance.edgevol.io/{id}"),
                "true",
            )]))))
            .await
            .unwrap()
            .into_inner();
        assert!(got.available_capacity > 0);
        assert_eq!(
            got.available_capacity, by_presence.available_capacity,
            "{id}"
        );
        per_box.push(got);
    }
    // Make the two differ: a thick volume on box-b takes its space.
    let mut thick = create("thick", 64 << 20);
    thick
        .parameters
        .insert("provisioning".into(), "thick".into());
    thick.accessibility_requirements = requisite(vec![topology(&[(APPLIANCE, "box-b")])], vec![]);
    c.create_volume(thick).await.unwrap();
    let b_now = c
        .get_capacity(capacity(Some(topology(&[(APPLIANCE, "box-b")]))))
        .await
        .unwrap()
        .into_inner()
        .available_capacity;
    assert_eq!(b_now, per_box[1].available_capacity - (64 << 20));

    let all = c.get_capacity(capacity(None)).await.unwrap().into_inner();
    assert_eq!(
        all.available_capacity,
        per_box[0].available_capacity + b_now
    );
    let node_of_both = c
        .get_capacity(capacity(Some(topology(&[
            ("appliance.edgevol.io/box-a", "true"),
            ("appliance.edgevol.io/box-b", "true"),
        ]))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node_of_both.available_capacity, all.available_capacity);
    let elsewhere = c
        .get_capacity(capacity(Some(topology(&[(APPLIANCE, "box-z")]))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(elsewhere.available_capacity, 0);
    assert_eq!(elsewhere.maximum_volume_size, Some(0));

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn listings_page_across_appliances_with_tokens_that_outlive_changes() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b", "box-c"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let mut created = Vec::new();
    for (i, id) in ["box-a", "box-b", "box-c", "box-a", "box-c", "box-a"]
        .iter()
        .enumerate()
    {
        let mut r = create(&format!("v{i}"), 1 << 20);
        r.accessibility_requirements = requisite(vec![topology(&[(APPLIANCE, id)])], vec![]);
        created.push(create_ok(&mut c, r).await.volume_id);
    }
    let whole: BTreeSet<_> = created.iter().cloned().collect();
    for page in [0, 1, 2, 3, 4, 7] {
        let listed = list_all(&mut c, page).await;
        assert_eq!(listed.len(), created.len(), "page {page}: each once");
        assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), whole);
    }

    // Stop after two entries (both of box-a), then change every appliance under the token:
    // the entry the token stands after is deleted, others are created.
    let first = c
        .list_volumes(ListVolumesRequest {
            max_entries: 2,
            starting_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let seen: Vec<String> = first
        .entries
        .iter()
        .map(|e| e.volume.clone().unwrap().volume_id)
        .collect();
    assert!(!first.next_token.is_empty());
    c.delete_volume(DeleteVolumeRequest {
        volume_id: seen[1].clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut late = Vec::new();
    for (i, id) in ["box-a", "box-b"].iter().enumerate() {
        let mut r = create(&format!("late{i}"), 1 << 20);
        r.accessibility_requirements = requisite(vec![topology(&[(APPLIANCE, id)])], vec![]);
        late.push(create_ok(&mut c, r).await.volume_id);
    }
    let mut rest = Vec::new();
    let mut token = first.next_token;
    while !token.is_empty() {
        let resp = c
            .list_volumes(ListVolumesRequest {
                max_entries: 2,
                starting_token: token,
            })
            .await
            .expect("a token stays valid while volumes come and go")
            .into_inner();
        rest.extend(
            resp.entries
                .into_iter()
                .map(|e| e.volume.unwrap().volume_id),
        );
        token = resp.next_token;
    }
    for id in &seen {
        assert!(!rest.contains(id), "{id} listed twice");
    }
    for id in created.iter().filter(|id| !seen.contains(id)) {
        assert!(rest.contains(id), "{id} missing after the changes");
    }
    for id in &late {
        assert!(
            rest.contains(id),
            "{id}, created after the token, is listed"
        );
    }

    // Tokens the proxy never issued.
    for bad in ["bogus", "box-z:3", "box-a:zz"] {
        let status = c
            .list_volumes(ListVolumesRequest {
                max_entries: 1,
                starting_token: bad.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Aborted, "{bad}: {status:?}");
    }

    // Snapshots page the same way; filtered listings go to the one appliance concerned.
    let mut snaps = Vec::new();
    for (i, v) in created.iter().filter(|id| !seen.contains(id)).enumerate() {
        let s = snapshot_ok(&mut c, snapshot_of(v, &format!("s{i}"))).await;
        snaps.push(s);
    }
    let listed = all_pages(async |starting_token| {
        let resp = c
            .list_snapshots(ListSnapshotsRequest {
                max_entries: 1,
                starting_token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let ids = resp.entries.into_iter();
        (
            ids.map(|e| e.snapshot.unwrap().snapshot_id).collect(),
            resp.next_token,
        )
    })
    .await;
    assert_eq!(
        listed.iter().collect::<BTreeSet<_>>(),
        snaps
            .iter()
            .map(|s| &s.snapshot_id)
            .collect::<BTreeSet<_>>()
    );
    assert_eq!(listed.len(), snaps.len());
    let last = snaps.last().unwrap();
    let by_source = snapshot_ids(
        &mut c,
        ListSnapshotsRequest {
            source_volume_id: last.source_volume_id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(by_source.len(), 1);
    assert_eq!(by_source[0], last.snapshot_id);

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn an_appliance_down_fails_only_its_own_calls() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let on = |name: &str, id: &str| {
        let mut r = create(name, 1 << 20);
        r.accessibility_requirements = requisite(vec![topology(&[(APPLIANCE, id)])], vec![]);
        r
    };
    let va = create_ok(&mut c, on("va", "box-a")).await;
    let vb = create_ok(&mut c, on("vb", "box-b")).await;
    let get = |id: &str| ControllerGetVolumeRequest {
        volume_id: id.into(),
    };

    // box-a (the first listed, which Identity calls go to) is killed.
    boxes[0].stop().await;
    let status = c
        .controller_get_volume(get(&va.volume_id))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains(&boxes[0].addr.to_string()),
        "names the appliance: {}",
        status.message()
    );
    let status = c.create_volume(on("va2", "box-a")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");

    // box-b's volumes, new unconstrained volumes, listings, capacity and Identity still work.
    c.controller_get_volume(get(&vb.volume_id)).await.unwrap();
    c.create_snapshot(snapshot_of(&vb.volume_id, "while-a-is-down"))
        .await
        .unwrap();
    for i in 0..6 {
        let v = create_ok(&mut c, create(&format!("free-{i}"), 1 << 20)).await;
        assert_eq!(home(&v.volume_id), "box-b");
    }
    let listed = list_all(&mut c, 1).await;
    assert_eq!(
        listed.len(),
        7,
        "box-b's volumes, box-a left out: {listed:?}"
    );
    assert!(listed.iter().all(|id| home(id) == "box-b"));
    let cap = c
        .get_capacity(GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(cap.available_capacity > 0);
    let info = IdentityClient::new(unix_channel(dir.path().join("csi.sock")).await)
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "csi.edgevol.io");

    // Back: its calls work again through the same proxy.
    boxes[0].restart().await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match c.controller_get_volume(get(&va.volume_id)).await {
            Ok(_) => break,
            Err(s) => {
                assert_eq!(s.code(), Code::Unavailable, "{s:?}");
                assert!(tokio::time::Instant::now() < deadline, "never came back");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
    assert_eq!(list_all(&mut c, 2).await.len(), 8);

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn ids_of_no_appliance_get_the_spec_answer_and_a_swapped_address_serves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let status = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: "box-z-v1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    c.delete_volume(DeleteVolumeRequest {
        volume_id: "box-z-v1".into(),
        ..Default::default()
    })
    .await
    .expect("deleting a volume that does not exist succeeds");
    let status = c
        .delete_snapshot(DeleteSnapshotRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // The same appliances, with their ids swapped in the proxy's list.
    let swapped_dir = dir.path().join("swapped");
    std::fs::create_dir_all(&swapped_dir).unwrap();
    std::os::unix::fs::symlink(dir.path().join("pki"), swapped_dir.join("pki")).unwrap();
    let (a, b) = boxes.split_at_mut(1);
    std::mem::swap(&mut a[0].id, &mut b[0].id);
    let mut wrong = fleet_proxy(&swapped_dir, &boxes).await;
    let status = wrong
        .create_volume(create("lost", 1 << 20))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .contains("is box-a, not box-b as configured"),
        "{}",
        status.message()
    );

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn an_unreachable_appliance_is_left_out_of_listings_without_being_dialled_again() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-b"]).await;
    // box-x: something on its address that drops every connection, counting them.
    let dialled = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let x_addr = listener.local_addr().unwrap();
    let counter = dialled.clone();
    tokio::spawn(async move {
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    boxes.insert(
        0,
        fleet::Box_ {
            id: "box-x".into(),
            data: dir.path().join("box-x"),
            addr: x_addr,
            running: None,
        },
    );
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    c.create_volume(create("v", 1 << 20)).await.unwrap();
    let after_create = dialled.load(Ordering::SeqCst);

    assert_eq!(list_all(&mut c, 0).await.len(), 1);
    let tried = dialled.load(Ordering::SeqCst);
    assert!(tried >= 1, "the listing tried box-x");
    assert!(tried >= after_create);
    assert_eq!(list_all(&mut c, 1).await.len(), 1);
    c.get_capacity(GetCapacityRequest::default()).await.unwrap();
    let info = IdentityClient::new(unix_channel(dir.path().join("csi.sock")).await)
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "csi.edgevol.io");
    assert_eq!(
        dialled.load(Ordering::SeqCst),
        tried,
        "listings, capacity and Identity left box-x out without dialling it"
    );

    // Its own volumes' calls always try it.
    let status = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: "box-x-v1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(dialled.load(Ordering::SeqCst), tried + 1);

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn volume_groups_and_group_snapshots_are_served_by_their_appliance() {
    use edgevol_proto::csi::v1::group_controller_client::GroupControllerClient;
    use edgevol_proto::volumegroup::controller_client::ControllerClient as GroupsClient;
    use edgevol_proto::volumegroup::{
        ControllerGetVolumeGroupRequest, CreateVolumeGroupRequest, DeleteVolumeGroupRequest,
        ListVolumeGroupsRequest, ModifyVolumeGroupMembershipRequest,
    };

    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let channel = unix_channel(dir.path().join("csi.sock")).await;
    let mut groups = GroupsClient::new(channel.clone());
    let mut gc = GroupControllerClient::new(channel);

    // Groups spread by name; each retry finds its group.
    let mut made = Vec::new();
    for i in 0..8 {
        let req = CreateVolumeGroupRequest {
            name: format!("group-{i}"),
            ..Default::default()
        };
        let g = groups
            .create_volume_group(req.clone())
            .await
            .unwrap()
            .into_inner()
            .volume_group
            .unwrap();
        let again = groups
            .create_volume_group(req)
            .await
            .unwrap()
            .into_inner()
            .volume_group
            .unwrap();
        assert_eq!(g.volume_group_id, again.volume_group_id);
        made.push(g.volume_group_id);
    }
    let homes: BTreeSet<&str> = made.iter().map(|g| home(g)).collect();
    assert_eq!(homes.len(), 2, "{made:?}");
    let listed = all_pages(async |starting_token| {
        let page = groups
            .list_volume_groups(ListVolumeGroupsRequest {
                max_entries: 3,
                starting_token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let ids = page.entries.into_iter();
        (
            ids.map(|e| e.volume_group.unwrap().volume_group_id)
                .collect(),
            page.next_token,
        )
    })
    .await;
    assert_eq!(
        listed.iter().collect::<BTreeSet<_>>(),
        made.iter().collect::<BTreeSet<_>>()
    );
    assert_eq!(listed.len(), made.len());

    // A group on box-b with two of box-b's volumes, then its group snapshot.
    let group = made.iter().find(|g| home(g) == "box-b").unwrap().clone();
    let mut vols = Vec::new();
    for name in ["m1", "m2"] {
        let mut r = create(name, 1 << 20);
        r.accessibility_requirements = requisite(vec![topology(&[(APPLIANCE, "box-b")])], vec![]);
        vols.push(create_ok(&mut c, r).await.volume_id);
    }
    let modified = groups
        .modify_volume_group_membership(ModifyVolumeGroupMembershipRequest {
            volume_group_id: group.clone(),
            volume_ids: vols.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap();
    assert_eq!(modified.volumes.len(), 2);
    let got = groups
        .controller_get_volume_group(ControllerGetVolumeGroupRequest {
            volume_group_id: group.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap();
    assert_eq!(got.volumes.len(), 2);
    let gs = gc
        .create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest {
            name: "gs".into(),
            source_volume_ids: vols.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(home(&gs.group_snapshot_id), "box-b");
    // Volumes of two appliances: a group snapshot is one appliance's, so INVALID_ARGUMENT
    // naming both, not the NOT_FOUND box-b (the first volume's) would answer for box-a's.
    let mut r = create("m3", 1 << 20);
    r.accessibility_requirements = requisite(vec![topology(&[(APPLIANCE, "box-a")])], vec![]);
    let far = create_ok(&mut c, r).await.volume_id;
    let status = gc
        .create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest {
            name: "gs-spread".into(),
            source_volume_ids: vec![vols[0].clone(), far.clone()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let msg = status.message();
    for named in [
        far.as_str(),
        vols[0].as_str(),
        "box-a",
        "box-b",
        "must share one appliance",
    ] {
        assert!(msg.contains(named), "{named} in {msg}");
    }
    let snaps: Vec<String> = gs.snapshots.iter().map(|s| s.snapshot_id.clone()).collect();
    let again = gc
        .get_volume_group_snapshot(GetVolumeGroupSnapshotRequest {
            group_snapshot_id: gs.group_snapshot_id.clone(),
            snapshot_ids: snaps.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(again.group_snapshot_id, gs.group_snapshot_id);
    gc.delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: gs.group_snapshot_id.clone(),
        snapshot_ids: snaps,
        ..Default::default()
    })
    .await
    .unwrap();
    groups
        .modify_volume_group_membership(ModifyVolumeGroupMembershipRequest {
            volume_group_id: group.clone(),
            volume_ids: vec![],
            ..Default::default()
        })
        .await
        .unwrap();
    groups
        .delete_volume_group(DeleteVolumeGroupRequest {
            volume_group_id: group.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let status = groups
        .controller_get_volume_group(ControllerGetVolumeGroupRequest {
            volume_group_id: group,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn a_fleet_offers_the_capabilities_of_its_appliances() {
    use controller_service_capability::rpc::Type as Rpc;
    use controller_service_capability::Type as CapType;
    use edgevol_proto::csi::v1::controller_client::ControllerClient;

    let rpcs = |caps: Vec<ControllerServiceCapability>| -> Vec<Rpc> {
        caps.into_iter()
            .filter_map(|c| match c.r#type {
                Some(CapType::Rpc(r)) => Some(r.r#type()),
                _ => None,
            })
            .collect()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let fleet = rpcs(
        c.controller_get_capabilities(ControllerGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .capabilities,
    );
    let single_socket = dir.path().join("single.sock");
    common::start_proxy(
        &single_socket,
        boxes[0].addr,
        common::dev_tls(&dir.path().join("pki"), "controller"),
    )
    .await;
    let one = rpcs(
        ControllerClient::new(unix_channel(single_socket).await)
            .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .capabilities,
    );
    assert!(one.contains(&Rpc::ListVolumesPublishedNodes));
    assert_eq!(
        fleet, one,
        "LIST_VOLUMES_PUBLISHED_NODES included: ListVolumes lists replicated volumes whole"
    );

    stop_all(&mut boxes).await;
}
