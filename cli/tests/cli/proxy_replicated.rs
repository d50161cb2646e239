//! Replicated volumes through `edgevol proxy`: one leg per appliance, sized for md's metadata,
//! every call acting on every leg, snapshots per leg, a half-created volume completed by the
//! retry, and a leg's appliance down.

use std::collections::{BTreeSet, HashMap};

use crate::common;
use crate::fleet;

use common::{create_ok, snapshot_ids, snapshot_of, snapshot_ok};

use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::AccessMode;
use edgevol_proto::csi::v1::*;
use fleet::{
    create, fleet_proxy, home, list_all, mount, start_fleet, stop_all, topology, volume_pages,
};
use tonic::transport::Channel;
use tonic::Code;

const MIB: i64 = 1 << 20;
const NODE: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-000000000001";

fn replicated(name: &str, bytes: i64, replicas: &str) -> CreateVolumeRequest {
    let mut r = create(name, bytes);
    r.parameters.insert("replicas".into(), replicas.into());
    r
}

fn legs(id: &str) -> Vec<&str> {
    id.split('+').collect()
}

async fn leg_volume(c: &mut ControllerClient<Channel>, leg: &str) -> Result<Volume, tonic::Status> {
    Ok(c.controller_get_volume(ControllerGetVolumeRequest {
        volume_id: leg.into(),
    })
    .await?
    .into_inner()
    .volume
    .unwrap())
}

#[tokio::test]
async fn a_replicated_volume_has_a_leg_per_appliance_and_every_call_acts_on_every_leg() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b", "box-c"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;

    let v = create_ok(&mut c, replicated("mirror", 64 * MIB, "2")).await;
    let ids = legs(&v.volume_id);
    assert_eq!(ids.len(), 2, "{}", v.volume_id);
    let homes: BTreeSet<&str> = ids.iter().map(|l| home(l)).collect();
    assert_eq!(
        homes.len(),
        2,
        "legs on distinct appliances: {}",
        v.volume_id
    );
    assert_eq!(v.capacity_bytes, 64 * MIB, "exactly what was asked");
    assert_eq!(v.volume_context["replicas"], "2");
    let segment = &v.accessible_topology[0].segments;
    for h in &homes {
        assert_eq!(segment[&format!("appliance.edgevol.io/{h}")], "true");
    }
    for leg in &ids {
        let lv = leg_volume(&mut c, leg).await.unwrap();
        assert_eq!(
            lv.capacity_bytes,
            65 * MIB,
            "{leg}: the md data offset more"
        );
    }
    let again = create_ok(&mut c, replicated("mirror", 64 * MIB, "2")).await;
    assert_eq!(again.volume_id, v.volume_id, "idempotent by name");

    // Publish: every leg, each one's context under its leg<i>. keys.
    let publish = ControllerPublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: NODE.into(),
        volume_capability: Some(mount()),
        volume_context: v.volume_context.clone(),
        ..Default::default()
    };
    let ctx = c
        .controller_publish_volume(publish.clone())
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    assert_eq!(ctx["replicas"], "2");
    // The node plugin reads it as the same legs, on their appliances.
    let read = edgevol_node::legs::parse_legs(&v.volume_id, &ctx)
        .unwrap()
        .expect("a replicated publish_context");
    assert_eq!(
        read.iter()
            .map(|l| l.volume_id.as_str())
            .collect::<Vec<_>>(),
        ids
    );
    for l in &read {
        assert_eq!(l.appliance, home(&l.volume_id));
    }
    for (i, leg) in ids.iter().enumerate() {
        assert_eq!(ctx[&format!("leg{i}.volumeId")], *leg);
        assert_eq!(ctx[&format!("leg{i}.transport")], "tcp");
        assert!(ctx.contains_key(&format!("leg{i}.subsystemNqn")));
        assert!(ctx.contains_key(&format!("leg{i}.targetAddress")));
    }
    let got = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: v.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let status = got.status.unwrap();
    assert_eq!(status.published_node_ids, vec![NODE.to_owned()]);
    assert!(!status.volume_condition.unwrap().abnormal);
    assert_eq!(got.volume.unwrap().capacity_bytes, 64 * MIB);
    c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: NODE.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let status = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: v.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert!(status.published_node_ids.is_empty());

    // Validate: confirmed with the parameters it was created with (replicas included).
    let validate = |mutable: &[(&str, &str)], id: &str, params: HashMap<String, String>| {
        ValidateVolumeCapabilitiesRequest {
            volume_id: id.into(),
            volume_capabilities: vec![mount()],
            parameters: params,
            mutable_parameters: mutable
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        }
    };
    let params = HashMap::from([("replicas".to_owned(), "2".to_owned())]);
    let ok = c
        .validate_volume_capabilities(validate(&[], &v.volume_id, params.clone()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.confirmed.unwrap().parameters, params);

    // Modify: QoS on every leg.
    for leg in &ids {
        let before = c
            .validate_volume_capabilities(validate(&[("maxIops", "100")], leg, HashMap::new()))
            .await
            .unwrap()
            .into_inner();
        assert!(before.confirmed.is_none(), "{leg} has no limit yet");
    }
    c.controller_modify_volume(ControllerModifyVolumeRequest {
        volume_id: v.volume_id.clone(),
        mutable_parameters: HashMap::from([("maxIops".into(), "100".into())]),
        ..Default::default()
    })
    .await
    .unwrap();
    for leg in &ids {
        let after = c
            .validate_volume_capabilities(validate(&[("maxIops", "100")], leg, HashMap::new()))
            .await
            .unwrap()
            .into_inner();
        assert!(after.confirmed.is_some(), "{leg}: {}", after.message);
    }

    // Expand: every leg to the new size plus the offset; the node grows md and the filesystem.
    let grown = c
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: v.volume_id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 128 * MIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 128 * MIB);
    assert!(grown.node_expansion_required);
    for leg in &ids {
        assert_eq!(
            leg_volume(&mut c, leg).await.unwrap().capacity_bytes,
            129 * MIB
        );
    }

    // Delete: every leg, and again (idempotent).
    for _ in 0..2 {
        c.delete_volume(DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    for leg in &ids {
        let status = leg_volume(&mut c, leg).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{leg} deleted");
    }
    let status = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: v.volume_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn replicas_are_refused_without_enough_appliances_and_with_multi_node_writers() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;

    let status = c
        .create_volume(replicated("three", 8 * MIB, "3"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("replicas=3 needs 3 appliances"),
        "{}",
        status.message()
    );

    // Requisite allows one box only: never two legs on it.
    let mut one_box = replicated("one-box", 8 * MIB, "2");
    one_box.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![topology(&[("edgevol.io/appliance", "box-a")])],
        preferred: vec![],
    });
    let status = c.create_volume(one_box).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    // A node reaching both allows both.
    let mut both = replicated("both", 8 * MIB, "2");
    both.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![topology(&[
            ("appliance.edgevol.io/box-a", "true"),
            ("appliance.edgevol.io/box-b", "true"),
        ])],
        preferred: vec![],
    });
    let v = create_ok(&mut c, both).await;
    assert_eq!(legs(&v.volume_id).len(), 2);

    let mut shared = replicated("shared", 8 * MIB, "2");
    shared.volume_capabilities[0].access_mode = Some(AccessMode {
        mode: Mode::MultiNodeMultiWriter as i32,
    });
    let status = c.create_volume(shared).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("multi-node writer"),
        "{}",
        status.message()
    );

    let status = c
        .create_volume(replicated("four", 8 * MIB, "4"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // The leg marking is the proxy's to set: a class that sets it is refused.
    for key in ["edgevol.io/leg", "edgevol.io/legs-before"] {
        let mut marked = replicated("marked", 8 * MIB, "1");
        marked.parameters.insert(key.into(), "0/2".into());
        let status = c.create_volume(marked).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(key), "{}", status.message());
    }

    // replicas=1 is a plain volume (the parameter never reaches the appliance).
    let plain = create_ok(&mut c, replicated("plain", 8 * MIB, "1")).await;
    assert_eq!(legs(&plain.volume_id).len(), 1);
    assert_eq!(plain.capacity_bytes, 8 * MIB);
    let confirmed = c
        .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: plain.volume_id.clone(),
            volume_capabilities: vec![mount()],
            parameters: HashMap::from([("replicas".into(), "1".into())]),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(confirmed.confirmed.is_some(), "{}", confirmed.message);

    // Capacity for replicated volumes: bounded by the second box, less the md offset.
    let capacity = |replicas: &str| GetCapacityRequest {
        parameters: HashMap::from([("replicas".into(), replicas.into())]),
        ..Default::default()
    };
    let mut free = Vec::new();
    for id in ["box-a", "box-b"] {
        free.push(
            c.get_capacity(GetCapacityRequest {
                accessible_topology: Some(topology(&[("edgevol.io/appliance", id)])),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .available_capacity,
        );
    }
    let two = c.get_capacity(capacity("2")).await.unwrap().into_inner();
    assert_eq!(two.available_capacity, free.iter().min().unwrap() - MIB);
    let three = c.get_capacity(capacity("3")).await.unwrap().into_inner();
    assert_eq!(
        three.available_capacity, 0,
        "two appliances cannot hold three legs"
    );

    // A leg size no appliance can give.
    let status = c
        .create_volume(replicated("huge", i64::MAX - 1, "2"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn no_leg_is_made_while_too_few_appliances_answer_and_a_lost_leg_shows() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;

    boxes[1].stop().await;
    let status = c
        .create_volume(replicated("half", 16 * MIB, "2"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("box-b"), "{}", status.message());
    assert!(
        status.message().contains("0 took a leg"),
        "{}",
        status.message()
    );
    assert!(
        list_all(&mut c, 0).await.is_empty(),
        "no leg on box-a: it would hold a position box-b may need at the retry"
    );

    boxes[1].restart().await;
    let v = create_ok(&mut c, replicated("half", 16 * MIB, "2")).await;
    assert_eq!(legs(&v.volume_id).len(), 2);
    assert_eq!(list_all(&mut c, 0).await, [v.volume_id.as_str()]);

    // box-b down again: the volume is reported degraded, naming the leg; its deletion waits.
    boxes[1].stop().await;
    let got = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: v.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let cond = got.status.unwrap().volume_condition.unwrap();
    assert!(cond.abnormal);
    let lost = legs(&v.volume_id)
        .into_iter()
        .find(|l| home(l) == "box-b")
        .unwrap();
    assert!(cond.message.contains(lost), "{}", cond.message);
    assert!(cond.message.contains("unreachable"), "{}", cond.message);
    let status = c
        .delete_volume(DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    boxes[1].restart().await;
    c.delete_volume(DeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    for leg in legs(&v.volume_id) {
        assert_eq!(
            leg_volume(&mut c, leg).await.unwrap_err().code(),
            Code::NotFound
        );
    }

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn a_snapshot_has_a_leg_per_leg_and_restores_into_a_replicated_volume() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b", "box-c"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let v = create_ok(&mut c, replicated("orig", 32 * MIB, "2")).await;
    let snap = snapshot_ok(&mut c, snapshot_of(&v.volume_id, "snap")).await;
    let snap_legs = legs(&snap.snapshot_id);
    assert_eq!(snap_legs.len(), 2);
    for (s, vol) in snap_legs.iter().zip(legs(&v.volume_id)) {
        assert_eq!(home(s), home(vol), "each leg snapshotted on its appliance");
    }
    assert_eq!(snap.source_volume_id, v.volume_id);
    assert_eq!(snap.size_bytes, 32 * MIB);
    assert!(snap.ready_to_use);
    let listed = snapshot_ids(
        &mut c,
        ListSnapshotsRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0], snap.snapshot_id);
    let got = c
        .get_snapshot(GetSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(
        got, snap,
        "GetSnapshot gives the snapshot as CreateSnapshot did"
    );

    let from_snapshot = |name: &str, replicas: Option<&str>| {
        let mut r = create(name, 0);
        r.capacity_range = None;
        if let Some(n) = replicas {
            r.parameters.insert("replicas".into(), n.into());
        }
        r.volume_content_source = Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: snap.snapshot_id.clone(),
                },
            )),
        });
        r
    };
    for (name, replicas) in [("restored", Some("2")), ("restored-default", None)] {
        let r = create_ok(&mut c, from_snapshot(name, replicas)).await;
        assert_eq!(r.capacity_bytes, 32 * MIB, "{name}");
        for (leg, s) in legs(&r.volume_id).iter().zip(&snap_legs) {
            assert_eq!(
                home(leg),
                home(s),
                "{name}: restored where the snapshot leg is"
            );
        }
        assert_eq!(
            r.content_source,
            from_snapshot(name, None).volume_content_source
        );
    }
    let status = c
        .create_volume(from_snapshot("three", Some("3")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // A clone of the replicated volume, likewise.
    let mut clone = create("clone", 32 * MIB);
    clone.parameters.insert("replicas".into(), "2".into());
    clone.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource {
                volume_id: v.volume_id.clone(),
            },
        )),
    });
    let cl = create_ok(&mut c, clone).await;
    for (leg, src) in legs(&cl.volume_id).iter().zip(legs(&v.volume_id)) {
        assert_eq!(home(leg), home(src));
    }
    // Restored and cloned legs carry their marking too: each volume is listed once, whole.
    let mut listed = list_all(&mut c, 1).await;
    listed.sort();
    let restored: Vec<String> = listed
        .iter()
        .filter(|id| legs(id).len() == 2)
        .cloned()
        .collect();
    assert_eq!(
        restored.len(),
        4,
        "orig, restored, restored-default, clone: {listed:?}"
    );
    assert!(listed.contains(&cl.volume_id) && listed.contains(&v.volume_id));
    assert_eq!(listed.len(), 4, "no leg listed on its own: {listed:?}");

    for _ in 0..2 {
        c.delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let listed = snapshot_ids(
        &mut c,
        ListSnapshotsRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert!(listed.is_empty(), "every leg deleted");

    stop_all(&mut boxes).await;
}

/// Every entry the proxy lists, `page` at a time.
async fn entries(
    c: &mut ControllerClient<Channel>,
    page: i32,
) -> Vec<list_volumes_response::Entry> {
    volume_pages(c, page).await.concat()
}

#[tokio::test]
async fn list_volumes_shows_each_replicated_volume_once_and_where_it_is_published() {
    use controller_service_capability::rpc::Type as Rpc;
    use controller_service_capability::Type as CapType;

    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b", "box-c"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;

    let mut created = Vec::new();
    for (name, replicas) in [
        ("r1", "2"),
        ("p1", "1"),
        ("r2", "3"),
        ("r3", "2"),
        ("p2", "1"),
    ] {
        let mut r = replicated(name, 8 * MIB, replicas);
        r.parameters.insert("provisioning".into(), "thin".into());
        created.push(create_ok(&mut c, r).await);
    }
    let mut want: Vec<String> = created.iter().map(|v| v.volume_id.clone()).collect();
    want.sort();
    for page in [0, 1, 2, 3, 4, 7] {
        let mut got = list_all(&mut c, page).await;
        got.sort();
        assert_eq!(
            got, want,
            "page size {page}: every volume once, legs hidden"
        );
    }
    let listed = entries(&mut c, 2).await;
    for v in &created {
        let e = listed
            .iter()
            .find(|e| e.volume.as_ref().unwrap().volume_id == v.volume_id)
            .unwrap();
        let lv = e.volume.as_ref().unwrap();
        assert_eq!(lv.capacity_bytes, v.capacity_bytes, "{}", v.volume_id);
        assert_eq!(lv.volume_context, v.volume_context, "{}", v.volume_id);
        assert!(!lv.volume_context.contains_key("edgevol.io/leg"));
        if legs(&v.volume_id).len() > 1 {
            assert_eq!(lv.accessible_topology, v.accessible_topology);
            assert_eq!(lv.capacity_bytes, 8 * MIB);
        }
    }

    // `edgevol volumes` on each appliance (through a one-box proxy, as an operator would) shows
    // which leg of which replicated volume each leg is.
    let r2 = created[2].volume_id.clone();
    for (i, leg) in legs(&r2).into_iter().enumerate() {
        let b = boxes.iter().find(|b| b.id == home(leg)).unwrap();
        let socket = dir.path().join(format!("one-{}.sock", b.id));
        common::start_proxy(
            &socket,
            b.addr,
            common::dev_tls(&dir.path().join("pki"), "controller"),
        )
        .await;
        let channel = common::unix_channel(socket).await;
        let rows = edgevol_cli::status::volumes(&channel).await.unwrap();
        let row = rows.iter().find(|r| r.id == leg).unwrap();
        let shown = legs(&r2)[..=i].join("+");
        let more = if i == 2 { "" } else { "+…" };
        assert_eq!(
            row.leg.as_deref(),
            Some(format!("{i}/3 of {shown}{more}").as_str())
        );
        let table = edgevol_cli::status::render_volumes(&rows, None);
        assert!(table.lines().next().unwrap().contains(" LEG "), "{table}");
    }

    // Validate with the class's parameters: each leg is asked with its own marking besides.
    let r3 = created[3].volume_id.clone();
    let confirmed = c
        .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: r3.clone(),
            volume_capabilities: vec![mount()],
            parameters: HashMap::from([
                ("replicas".into(), "2".into()),
                ("provisioning".into(), "thin".into()),
            ]),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(confirmed.confirmed.is_some(), "{}", confirmed.message);

    // The proxy offers published nodes in listings again; an attacher-style reconcile (every
    // page of ListVolumes, volume -> nodes) sees the replicated volume attached to its node.
    let caps = c
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert!(caps.iter().any(|cap| matches!(&cap.r#type,
        Some(CapType::Rpc(r)) if r.r#type() == Rpc::ListVolumesPublishedNodes)));
    let r1 = created[0].volume_id.clone();
    c.controller_publish_volume(ControllerPublishVolumeRequest {
        volume_id: r1.clone(),
        node_id: NODE.into(),
        volume_capability: Some(mount()),
        volume_context: created[0].volume_context.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let attached = |listed: &[list_volumes_response::Entry]| -> HashMap<String, Vec<String>> {
        listed
            .iter()
            .map(|e| {
                (
                    e.volume.as_ref().unwrap().volume_id.clone(),
                    e.status.as_ref().unwrap().published_node_ids.clone(),
                )
            })
            .collect()
    };
    for page in [0, 1, 3] {
        let seen = attached(&entries(&mut c, page).await);
        assert_eq!(seen[&r1], [NODE], "page size {page}");
        assert!(seen[&r3].is_empty());
    }
    c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
        volume_id: r1.clone(),
        node_id: NODE.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(attached(&entries(&mut c, 0).await)[&r1].is_empty());

    stop_all(&mut boxes).await;
}

#[tokio::test]
async fn a_half_created_volume_is_completed_by_the_retry_when_a_full_box_has_room_again() {
    let dir = tempfile::tempdir().unwrap();
    let ids = ["box-a", "box-b", "box-c"];
    let mut boxes = start_fleet(dir.path(), &ids).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;

    // Fill the box the name places second: the first attempt's legs skip it.
    let order = edgevol_cli::fleet_placement::order(None, &ids, "half");
    let (first, middle, last) = (ids[order[0]], ids[order[1]], ids[order[2]]);
    let thick = || HashMap::from([("provisioning".to_owned(), "thick".to_owned())]);
    let free = c
        .get_capacity(GetCapacityRequest {
            parameters: thick(),
            accessible_topology: Some(topology(&[("edgevol.io/appliance", middle)])),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .available_capacity;
    let mut filler = create("filler", free - 8 * MIB);
    filler.parameters = thick();
    filler.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![topology(&[("edgevol.io/appliance", middle)])],
        preferred: vec![],
    });
    let filler = create_ok(&mut c, filler).await;

    let mut half = replicated("half", 32 * MIB, "3");
    half.parameters.extend(thick());
    let status = c.create_volume(half.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let kept: Vec<String> = status
        .message()
        .split("completes the volume: ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .expect("the kept legs are named")
        .split(", ")
        .map(str::to_owned)
        .collect();
    assert_eq!(
        kept.iter().map(|l| home(l)).collect::<Vec<_>>(),
        [first, last],
        "{}",
        status.message()
    );

    // With room again, the middle box would come second: its new leg makes way for the kept
    // one, which already holds that position, and becomes the last leg.
    c.delete_volume(DeleteVolumeRequest {
        volume_id: filler.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let v = create_ok(&mut c, half.clone()).await;
    let got = legs(&v.volume_id);
    assert_eq!(
        &got[..2],
        [kept[0].as_str(), kept[1].as_str()],
        "{}",
        v.volume_id
    );
    assert_eq!(home(got[2]), middle);
    assert_eq!(v.capacity_bytes, 32 * MIB);
    let again = create_ok(&mut c, half).await;
    assert_eq!(again.volume_id, v.volume_id, "idempotent by name");
    assert_eq!(list_all(&mut c, 1).await, [v.volume_id.as_str()]);
    // Nothing else is left on the middle box: the filler and the displaced leg are gone.
    let n: u32 = got[2].rsplit('v').next().unwrap().parse().unwrap();
    for k in 1..n {
        let stray = format!("{middle}-v{k}");
        assert_eq!(
            leg_volume(&mut c, &stray).await.unwrap_err().code(),
            Code::NotFound,
            "{stray}"
        );
    }

    stop_all(&mut boxes).await;
}

/// The names of the volumes appliance `id`'s pool holds (legs included, which ListVolumes
/// through the proxy hides but the last of).
fn names_on(boxes: &[fleet::Box_], id: &str) -> Vec<String> {
    let b = boxes.iter().find(|b| b.id == id).unwrap();
    let pool = b.running.as_ref().unwrap().state.lock_pool().unwrap();
    pool.volumes(None).map(|v| v.name().to_owned()).collect()
}

/// CreateVolume of `name` (2 replicas, `bytes`) restored from `snapshot`.
fn restore_of(name: &str, bytes: i64, snapshot: &str) -> CreateVolumeRequest {
    let mut r = replicated(name, bytes, "2");
    r.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: snapshot.into(),
            },
        )),
    });
    r
}

/// A replicated volume of 32 MiB whose second leg was grown to 48 MiB on its own, and a
/// snapshot of it: its snapshot legs differ in size, so a restore into 40 MiB legs suits the
/// first leg's appliance and not the second's. The volume and the snapshot.
async fn uneven_snapshot(c: &mut ControllerClient<Channel>) -> (Volume, Snapshot) {
    let v = create_ok(c, replicated("orig", 32 * MIB, "2")).await;
    let r = c
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: legs(&v.volume_id)[1].to_owned(),
            capacity_range: Some(CapacityRange {
                required_bytes: 48 * MIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 48 * MIB);
    let snap = snapshot_ok(c, snapshot_of(&v.volume_id, "snap")).await;
    (v, snap)
}

#[tokio::test]
async fn an_appliance_refusing_a_leg_size_is_named_with_the_leg_and_its_appliance() {
    let dir = tempfile::tempdir().unwrap();
    let ids = ["box-a", "box-b"];
    let mut boxes = start_fleet(dir.path(), &ids).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;

    // OUT_OF_RANGE from one box only: the second leg would be smaller than its snapshot leg.
    let (v, snap) = uneven_snapshot(&mut c).await;
    let status = c
        .create_volume(restore_of("restored", 40 * MIB, &snap.snapshot_id))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    let refusing = home(legs(&v.volume_id)[1]);
    let named = format!("leg restored+leg on appliance {refusing}: ");
    assert!(status.message().starts_with(&named), "{}", status.message());
    assert!(
        status
            .message()
            .contains("the source holds 50331648 bytes, more than required_bytes"),
        "the appliance's own reason: {}",
        status.message()
    );

    // RESOURCE_EXHAUSTED from one box: the box the name places second is full for a thick leg.
    let order = edgevol_cli::fleet_placement::order(None, &ids, "thick");
    let (first, full) = (ids[order[0]], ids[order[1]]);
    let thick = || HashMap::from([("provisioning".to_owned(), "thick".to_owned())]);
    let free = c
        .get_capacity(GetCapacityRequest {
            parameters: thick(),
            accessible_topology: Some(topology(&[("edgevol.io/appliance", full)])),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .available_capacity;
    let mut filler = create("filler", free - 8 * MIB);
    filler.parameters = thick();
    filler.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![topology(&[("edgevol.io/appliance", full)])],
        preferred: vec![],
    });
    let filler = create_ok(&mut c, filler).await;
    let mut req = replicated("thick", 32 * MIB, "2");
    req.parameters.extend(thick());
    let status = c.create_volume(req.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let msg = status.message();
    assert!(
        msg.contains(&format!("passed over: {full}: not enough free space")),
        "the full appliance and its reason: {msg}"
    );
    // The leg the first box took stays, named, for the retry (its position is fixed); the
    // full box holds none.
    let kept = msg
        .split("completes the volume: ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .expect("the kept leg is named");
    assert_eq!(home(kept), first, "{msg}");
    assert!(names_on(&boxes, first).contains(&"thick+leg".to_owned()));
    assert!(!names_on(&boxes, full).contains(&"thick+leg".to_owned()));
    // With room again the retry completes the volume from the kept leg: nothing is left over.
    c.delete_volume(DeleteVolumeRequest {
        volume_id: filler.volume_id,
        ..Default::default()
    })
    .await
    .unwrap();
    let done = create_ok(&mut c, req).await;
    assert_eq!(legs(&done.volume_id)[0], kept, "{}", done.volume_id);
    for id in ids {
        let legs_of_thick = names_on(&boxes, id)
            .into_iter()
            .filter(|n| n == "thick+leg")
            .count();
        assert_eq!(legs_of_thick, 1, "{id}");
    }

    stop_all(&mut boxes).await;
}

/// A restore (or clone) whose later leg an appliance refuses for good (OUT_OF_RANGE here)
/// deletes the legs made before it: the CO has no id to delete them by, ListVolumes would hide
/// them (legs but the last are), and a retry with a size every leg can take would meet
/// ALREADY_EXISTS on a kept leg. The refusal says which legs went.
#[tokio::test]
async fn a_refused_restore_leaves_no_leg_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let (v, snap) = uneven_snapshot(&mut c).await;
    let status = c
        .create_volume(restore_of("restored", 40 * MIB, &snap.snapshot_id))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(
        status
            .message()
            .contains("the legs made before it were deleted"),
        "{status:?}"
    );
    let first = home(legs(&v.volume_id)[0]);
    assert!(
        !names_on(&boxes, first).contains(&"restored+leg".to_owned()),
        "{first} keeps a leg of the refused restore"
    );
    let r = create_ok(&mut c, restore_of("restored", 48 * MIB, &snap.snapshot_id)).await;
    assert_eq!(r.capacity_bytes, 48 * MIB);

    // Legs are deleted only when the refusing box holds no leg of the name: one that does may
    // belong to a volume the CO was answered. Here the second box holds a plain volume named
    // like the leg: the refusal (ALREADY_EXISTS) is passed on and the first leg is kept.
    let second = home(legs(&v.volume_id)[1]);
    let mut squatter = create("held+leg", MIB);
    squatter.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![topology(&[("edgevol.io/appliance", second)])],
        preferred: vec![],
    });
    create_ok(&mut c, squatter).await;
    let status = c
        .create_volume(restore_of("held", 48 * MIB, &snap.snapshot_id))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    assert!(!status.message().contains("deleted"), "{status:?}");
    assert!(names_on(&boxes, first).contains(&"held+leg".to_owned()));
    stop_all(&mut boxes).await;
}

/// A volume group is one appliance's: a replicated volume, whose legs lie on several, is a
/// volume no group can take (INVALID_ARGUMENT naming its appliances), not one that does not
/// exist (the NOT_FOUND the group's box alone would answer).
#[tokio::test]
async fn a_replicated_volume_joins_no_volume_group() {
    use edgevol_proto::volumegroup::controller_client::ControllerClient as GroupsClient;
    use edgevol_proto::volumegroup::{
        CreateVolumeGroupRequest, ModifyVolumeGroupMembershipRequest,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let v = create_ok(&mut c, replicated("mirrored", 8 * MIB, "2")).await;
    let mut groups = GroupsClient::new(common::unix_channel(dir.path().join("csi.sock")).await);
    let group = groups
        .create_volume_group(CreateVolumeGroupRequest {
            name: "g".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap();
    let status = groups
        .modify_volume_group_membership(ModifyVolumeGroupMembershipRequest {
            volume_group_id: group.volume_group_id.clone(),
            volume_ids: vec![v.volume_id.clone()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let msg = status.message();
    assert!(msg.contains("replicated over appliances"), "{msg}");
    assert!(msg.contains("box-a") && msg.contains("box-b"), "{msg}");
    // Nor a group snapshot: its volumes share one appliance, a replicated volume's legs do not.
    let plain = create_ok(&mut c, create("plain", 8 * MIB)).await;
    let mut gc = edgevol_proto::csi::v1::group_controller_client::GroupControllerClient::new(
        common::unix_channel(dir.path().join("csi.sock")).await,
    );
    let status = gc
        .create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest {
            name: "gs".into(),
            source_volume_ids: vec![plain.volume_id.clone(), v.volume_id.clone()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let msg = status.message();
    assert!(msg.contains("must share one appliance"), "{msg}");
    assert!(msg.contains("box-a") && msg.contains("box-b"), "{msg}");
    stop_all(&mut boxes).await;
}

/// The other side of a refused restore: a box too full for its thick leg (RESOURCE_EXHAUSTED,
/// which room made later cures) keeps the first leg, and the retry completes the volume from it.
#[tokio::test]
async fn a_restore_refused_for_room_keeps_its_first_leg_for_the_retry() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let v = create_ok(&mut c, replicated("orig", 8 * MIB, "2")).await;
    let snap = snapshot_ok(&mut c, snapshot_of(&v.volume_id, "snap")).await;
    let (first, second) = (home(legs(&v.volume_id)[0]), home(legs(&v.volume_id)[1]));
    let thick = || HashMap::from([("provisioning".to_owned(), "thick".to_owned())]);
    let on_second = || {
        Some(TopologyRequirement {
            requisite: vec![topology(&[("edgevol.io/appliance", second)])],
            preferred: vec![],
        })
    };
    let free = c
        .get_capacity(GetCapacityRequest {
            parameters: thick(),
            accessible_topology: on_second().map(|t| t.requisite[0].clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .available_capacity;
    let mut filler = create("filler", free - 8 * MIB);
    filler.parameters = thick();
    filler.accessibility_requirements = on_second();
    let filler = create_ok(&mut c, filler).await;

    let mut req = restore_of("restored", 32 * MIB, &snap.snapshot_id);
    req.parameters.extend(thick());
    let status = c.create_volume(req.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(!status.message().contains("deleted"), "{status:?}");
    assert!(names_on(&boxes, first).contains(&"restored+leg".to_owned()));

    c.delete_volume(DeleteVolumeRequest {
        volume_id: filler.volume_id,
        ..Default::default()
    })
    .await
    .unwrap();
    let done = create_ok(&mut c, req).await;
    assert_eq!(done.capacity_bytes, 32 * MIB);
    for id in [first, second] {
        let restored_legs = names_on(&boxes, id)
            .into_iter()
            .filter(|n| n == "restored+leg")
            .count();
        assert_eq!(restored_legs, 1, "{id}");
    }
    stop_all(&mut boxes).await;
}

/// The names of the snapshots appliance `id`'s pool holds (leg snapshots included).
fn snapshot_names_on(boxes: &[fleet::Box_], id: &str) -> Vec<String> {
    let b = boxes.iter().find(|b| b.id == id).unwrap();
    let pool = b.running.as_ref().unwrap().state.lock_pool().unwrap();
    pool.snapshots(None).map(|s| s.name().to_owned()).collect()
}

/// `req` placed on appliance `id` only.
fn pinned_to(mut req: CreateVolumeRequest, id: &str) -> CreateVolumeRequest {
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![topology(&[("edgevol.io/appliance", id)])],
        preferred: vec![],
    });
    req
}

/// A name is one volume's (one snapshot's), plain or replicated: a plain CreateVolume of a
/// replicated volume's name, and a replicated one of a plain volume's, are ALREADY_EXISTS naming
/// where the other one is, and make nothing; snapshots likewise. A compatible repeat of the
/// same kind still answers the existing one.
#[tokio::test]
async fn plain_and_replicated_share_one_name_space() {
    let dir = tempfile::tempdir().unwrap();
    let ids = ["box-a", "box-b"];
    let mut boxes = start_fleet(dir.path(), &ids).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let mirrored = create_ok(&mut c, replicated("mirrored", 8 * MIB, "2")).await;
    let solo = create_ok(&mut c, pinned_to(create("solo", 8 * MIB), "box-a")).await;

    let status = c
        .create_volume(create("mirrored", 8 * MIB))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    let msg = status.message();
    assert!(msg.contains("replicated volume"), "{msg}");
    assert!(msg.contains("mirrored+leg"), "{msg}");
    let status = c
        .create_volume(replicated("solo", 8 * MIB, "2"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    let msg = status.message();
    assert!(
        msg.contains("box-a") && msg.contains(&solo.volume_id),
        "{msg}"
    );
    assert!(msg.contains("plain volume"), "{msg}");
    for id in ids {
        let names = names_on(&boxes, id);
        assert!(!names.contains(&"mirrored".to_owned()), "{id}: {names:?}");
        assert!(!names.contains(&"solo+leg".to_owned()), "{id}: {names:?}");
    }
    // Compatible repeats of the same kind: the same volumes.
    let again = create_ok(&mut c, replicated("mirrored", 8 * MIB, "2")).await;
    assert_eq!(again.volume_id, mirrored.volume_id);
    let again = create_ok(&mut c, pinned_to(create("solo", 8 * MIB), "box-a")).await;
    assert_eq!(again.volume_id, solo.volume_id);

    // Snapshots: "plain" of the plain volume, "mirror" of the replicated one.
    let plain = snapshot_ok(&mut c, snapshot_of(&solo.volume_id, "plain")).await;
    let mirror = snapshot_ok(&mut c, snapshot_of(&mirrored.volume_id, "mirror")).await;
    let status = c
        .create_snapshot(snapshot_of(&mirrored.volume_id, "plain"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    let msg = status.message();
    assert!(
        msg.contains("box-a") && msg.contains("plain volume"),
        "{msg}"
    );
    let status = c
        .create_snapshot(snapshot_of(&solo.volume_id, "mirror"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    let msg = status.message();
    assert!(
        msg.contains("mirror+leg") && msg.contains("replicated"),
        "{msg}"
    );
    for id in ids {
        let names = snapshot_names_on(&boxes, id);
        assert!(!names.contains(&"plain+leg".to_owned()), "{id}: {names:?}");
        assert!(!names.contains(&"mirror".to_owned()), "{id}: {names:?}");
    }
    let again = snapshot_ok(&mut c, snapshot_of(&solo.volume_id, "plain")).await;
    assert_eq!(again.snapshot_id, plain.snapshot_id);
    let again = snapshot_ok(&mut c, snapshot_of(&mirrored.volume_id, "mirror")).await;
    assert_eq!(again.snapshot_id, mirror.snapshot_id);
    stop_all(&mut boxes).await;
}

/// A replicated CreateSnapshot whose later leg an appliance refuses for good (ALREADY_EXISTS
/// here: the second box holds a plain snapshot named like the leg) deletes the leg snapshots it
/// made before answering, and says so: nothing hidden is left, and once the name is free the
/// retry makes the snapshot, one leg per box.
#[tokio::test]
async fn a_refused_replicated_snapshot_leaves_no_leg_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut boxes = start_fleet(dir.path(), &["box-a", "box-b"]).await;
    let mut c = fleet_proxy(dir.path(), &boxes).await;
    let v = create_ok(&mut c, replicated("orig", 8 * MIB, "2")).await;
    let (first, second) = (home(legs(&v.volume_id)[0]), home(legs(&v.volume_id)[1]));
    let other = create_ok(&mut c, pinned_to(create("other", MIB), second)).await;
    let squatter = snapshot_ok(&mut c, snapshot_of(&other.volume_id, "snap+leg")).await;

    let status = c
        .create_snapshot(snapshot_of(&v.volume_id, "snap"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    let msg = status.message();
    assert!(msg.contains(second), "the refusing box: {msg}");
    assert!(
        msg.contains("the leg snapshots made before it were deleted"),
        "{msg}"
    );
    assert!(
        !snapshot_names_on(&boxes, first).contains(&"snap+leg".to_owned()),
        "{first} keeps a leg snapshot of the refused snapshot"
    );

    c.delete_snapshot(DeleteSnapshotRequest {
        snapshot_id: squatter.snapshot_id,
        ..Default::default()
    })
    .await
    .unwrap();
    let snap = snapshot_ok(&mut c, snapshot_of(&v.volume_id, "snap")).await;
    assert_eq!(legs(&snap.snapshot_id).len(), 2);
    for id in [first, second] {
        let n = snapshot_names_on(&boxes, id)
            .into_iter()
            .filter(|n| n == "snap+leg")
            .count();
        assert_eq!(n, 1, "{id}");
    }
    stop_all(&mut boxes).await;
}
