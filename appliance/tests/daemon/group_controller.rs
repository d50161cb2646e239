//! CSI GroupController over mutual TLS: a test per MUST and per error-table row of
//! GroupControllerGetCapabilities, CreateVolumeGroupSnapshot, DeleteVolumeGroupSnapshot and
//! GetVolumeGroupSnapshot, idempotency, persistence across a restart, and roles.
//!
//! Volumes and groups are set up through core directly (`Running::state`), so these tests do not
//! depend on the Controller service; groups are set up through the VolumeGroup service.

use crate::common;

use std::collections::{BTreeSet, HashMap};

use common::{dev_config, DevAppliance};
use edgevol_appliance::csi::ids::Ids;
use edgevol_core::VolumeSpec;
use edgevol_proto::csi::v1::group_controller_client::GroupControllerClient;
use edgevol_proto::csi::v1::group_controller_service_capability::{rpc, Type as CapType};
use edgevol_proto::csi::v1::{
    CreateVolumeGroupSnapshotRequest, DeleteVolumeGroupSnapshotRequest,
    GetVolumeGroupSnapshotRequest, GroupControllerGetCapabilitiesRequest, VolumeGroupSnapshot,
};
use edgevol_proto::volumegroup::controller_client::ControllerClient as VgClient;
use edgevol_proto::volumegroup::{
    CreateVolumeGroupRequest, DeleteVolumeGroupRequest, ModifyVolumeGroupMembershipRequest,
};
use tonic::transport::Channel;
use tonic::{Code, Status};

async fn start() -> DevAppliance {
    let app = DevAppliance::start().await;
    app.ready().await;
    app
}

/// Stops the daemon and starts it again on the same data dir.
async fn restart(app: DevAppliance) -> DevAppliance {
    let DevAppliance { dir, running } = app;
    running.stop().await.unwrap();
    let running = edgevol_appliance::start(dev_config(dir.path(), "127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let app = DevAppliance { dir, running };
    app.ready().await;
    app
}

/// A 1 MiB volume made through core; its CSI id.
async fn volume(app: &DevAppliance, name: &str) -> String {
    let name = name.to_owned();
    app.running
        .state
        .on_pool(move |state, pool| {
            let id = pool.create_volume(VolumeSpec::new(name, 1 << 20)).unwrap();
            Ids::new(&state.appliance_id).volume(id)
        })
        .await
        .unwrap()
}

struct Clients {
    gc: GroupControllerClient<Channel>,
    vg: VgClient<Channel>,
}

async fn clients(app: &DevAppliance, who: &str) -> Clients {
    let channel = app.channel(who).await;
    Clients {
        gc: GroupControllerClient::new(channel.clone()),
        vg: VgClient::new(channel),
    }
}

/// A group named `name` holding new volumes `<name>-0..n`; (group id, volume ids).
async fn group_of(
    app: &DevAppliance,
    c: &mut Clients,
    name: &str,
    n: usize,
) -> (String, Vec<String>) {
    let group =
        c.vg.create_volume_group(CreateVolumeGroupRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap()
        .volume_group_id;
    let mut vols = Vec::new();
    for i in 0..n {
        vols.push(volume(app, &format!("{name}-{i}")).await);
    }
    set_members(c, &group, &vols).await;
    (group, vols)
}

async fn set_members(c: &mut Clients, group: &str, vols: &[String]) {
    c.vg.modify_volume_group_membership(ModifyVolumeGroupMembershipRequest {
        volume_group_id: group.into(),
        volume_ids: vols.to_vec(),
        ..Default::default()
    })
    .await
    .unwrap();
}

fn create_req(name: &str, vols: &[String]) -> CreateVolumeGroupSnapshotRequest {
    CreateVolumeGroupSnapshotRequest {
        name: name.into(),
        source_volume_ids: vols.to_vec(),
        ..Default::default()
    }
}

async fn create(
    c: &mut Clients,
    name: &str,
    vols: &[String],
) -> Result<VolumeGroupSnapshot, Status> {
    c.gc.create_volume_group_snapshot(create_req(name, vols))
        .await
        .map(|r| r.into_inner().group_snapshot.unwrap())
}

fn member_ids(gs: &VolumeGroupSnapshot) -> Vec<String> {
    gs.snapshots.iter().map(|s| s.snapshot_id.clone()).collect()
}

async fn get(c: &mut Clients, id: &str, snaps: Vec<String>) -> Result<VolumeGroupSnapshot, Status> {
    c.gc.get_volume_group_snapshot(GetVolumeGroupSnapshotRequest {
        group_snapshot_id: id.into(),
        snapshot_ids: snaps,
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().group_snapshot.unwrap())
}

async fn delete(c: &mut Clients, id: &str, snaps: Vec<String>) -> Result<(), Status> {
    c.gc.delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: id.into(),
        snapshot_ids: snaps,
        ..Default::default()
    })
    .await
    .map(drop)
}

fn code<T: std::fmt::Debug>(r: Result<T, Status>) -> Code {
    r.expect_err("the call must fail").code()
}

#[tokio::test]
async fn capabilities_are_exactly_create_delete_get() {
    let app = start().await;
    for who in ["controller", "observer"] {
        let mut c = clients(&app, who).await;
        let caps =
            c.gc.group_controller_get_capabilities(GroupControllerGetCapabilitiesRequest {})
                .await
                .unwrap()
                .into_inner()
                .capabilities;
        let types: Vec<i32> = caps
            .iter()
            .map(|c| match &c.r#type {
                Some(CapType::Rpc(r)) => r.r#type,
                None => panic!("capability without a type"),
            })
            .collect();
        assert_eq!(
            types,
            vec![rpc::Type::CreateDeleteGetVolumeGroupSnapshot as i32],
            "{who}"
        );
    }
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn create_snapshots_every_member_at_one_point_and_reports_each() {
    let app = start().await;
    let mut c = clients(&app, "controller").await;
    let (group, vols) = group_of(&app, &mut c, "db", 3).await;
    let gs = create(&mut c, "gs-1", &vols).await.unwrap();
    let ids = Ids::new(&app.running.state.appliance_id);
    let gs_id = ids
        .parse_group_snapshot(&gs.group_snapshot_id)
        .expect("our id");
    assert!(gs.ready_to_use);
    let t = gs.creation_time.expect("creation_time is REQUIRED");
    assert!(t.seconds > 1_600_000_000, "{t:?}");
    assert_eq!(gs.snapshots.len(), 3);
    let sources: BTreeSet<&str> = gs
        .snapshots
        .iter()
        .map(|s| s.source_volume_id.as_str())
        .collect();
    assert_eq!(sources, vols.iter().map(String::as_str).collect());
    for s in &gs.snapshots {
        assert!(
            ids.parse_snapshot(&s.snapshot_id).is_some(),
            "{}",
            s.snapshot_id
        );
        assert_eq!(s.group_snapshot_id, gs.group_snapshot_id);
        assert!(s.ready_to_use);
        assert_eq!(s.size_bytes, 1 << 20);
        // One commit: every member has the group snapshot's time.
        assert_eq!(s.creation_time, Some(t));
    }
    // Core holds one group snapshot of that group, its members cut in one record.
    let (group_of_gs, n) = app
        .running
        .state
        .on_pool(move |_, pool| {
            let g = pool.group_snapshot(gs_id).unwrap();
            (g.group(), g.snapshots().len())
        })
        .await
        .unwrap();
    assert_eq!(ids.group(group_of_gs), group);
    assert_eq!(n, 3);
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn create_is_idempotent_by_name_and_sources() {
    let app = start().await;
    let mut c = clients(&app, "controller").await;
    let (group, vols) = group_of(&app, &mut c, "app", 2).await;
    let first = create(&mut c, "gs", &vols).await.unwrap();
    // Same name, same sources in another order: the same group snapshot, not a second one.
    let reversed: Vec<String> = vols.iter().rev().cloned().collect();
    let again = create(&mut c, "gs", &reversed).await.unwrap();
    assert_eq!(again, first);
    let count = app
        .running
        .state
        .on_pool(|_, pool| pool.group_snapshots(None).count())
        .await
        .unwrap();
    assert_eq!(count, 1, "created once");

    // Same name, other sources: ALREADY_EXISTS.
    let extra = volume(&app, "extra").await;
    let mut more = vols.clone();
    more.push(extra.clone());
    set_members(&mut c, &group, &more).await;
    let err = create(&mut c, "gs", &more).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{}", err.message());
    assert!(
        err.message().contains(&first.group_snapshot_id),
        "{}",
        err.message()
    );
    // The original sources still get the original snapshot, though the group changed since.
    assert_eq!(create(&mut c, "gs", &vols).await.unwrap(), first);
    // Parameters take part in idempotency: unknown ones are refused, even for a known name.
    let mut req = create_req("gs", &vols);
    req.parameters.insert("quiesce".into(), "true".into());
    assert_eq!(
        code(c.gc.create_volume_group_snapshot(req).await),
        Code::InvalidArgument
    );
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn volumes_that_are_not_exactly_one_group_are_failed_precondition() {
    let app = start().await;
    let mut c = clients(&app, "controller").await;
    let (_, a) = group_of(&app, &mut c, "a", 2).await;
    let (_, b) = group_of(&app, &mut c, "b", 1).await;
    let loose = volume(&app, "loose").await;

    // A volume in no group.
    let err = create(&mut c, "x1", std::slice::from_ref(&loose))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains("no volume group"),
        "{}",
        err.message()
    );
    // Part of a group only.
    let err = create(&mut c, "x2", &a[..1]).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains(&a[1]),
        "names the member left out: {}",
        err.message()
    );
    // Two groups.
    let mixed = vec![a[0].clone(), a[1].clone(), b[0].clone()];
    let err = create(&mut c, "x3", &mixed).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    // A group plus a loose volume.
    let err = create(&mut c, "x4", &[a[0].clone(), a[1].clone(), loose])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    // Nothing was created by the refused calls.
    let count = app
        .running
        .state
        .on_pool(|_, pool| {
            (
                pool.group_snapshots(None).count(),
                pool.snapshots(None).count(),
            )
        })
        .await
        .unwrap();
    assert_eq!(count, (0, 0));
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn create_refuses_invalid_arguments_and_unknown_volumes() {
    let app = start().await;
    let mut c = clients(&app, "controller").await;
    let (_, vols) = group_of(&app, &mut c, "g", 2).await;
    let cases: Vec<(CreateVolumeGroupSnapshotRequest, Code, &str)> = vec![
        (
            create_req("", &vols),
            Code::InvalidArgument,
            "name is required",
        ),
        (
            create_req(&"n".repeat(129), &vols),
            Code::InvalidArgument,
            "at most 128",
        ),
        (
            create_req("a\u{1}b", &vols),
            Code::InvalidArgument,
            "control character",
        ),
        (
            create_req("gs", &[]),
            Code::InvalidArgument,
            "source_volume_ids is required",
        ),
        (
            create_req("gs", &[vols[0].clone(), vols[0].clone(), vols[1].clone()]),
            Code::InvalidArgument,
            "twice",
        ),
        (
            create_req("gs", &[vols[0].clone(), String::new()]),
            Code::InvalidArgument,
            "required",
        ),
        (
            create_req("gs", &[vols[0].clone(), "test-box-v999".into()]),
            Code::NotFound,
            "test-box-v999",
        ),
        (
            create_req("gs", &[vols[0].clone(), "other-box-v1".into()]),
            Code::NotFound,
            "other-box-v1",
        ),
        (
            CreateVolumeGroupSnapshotRequest {
                parameters: HashMap::from([("k".into(), "v".repeat(4096))]),
                ..create_req("gs", &vols)
            },
            Code::InvalidArgument,
            "4097 bytes",
        ),
    ];
    for (req, want, text) in cases {
        let err =
            c.gc.create_volume_group_snapshot(req.clone())
                .await
                .unwrap_err();
        assert_eq!(err.code(), want, "{req:?}: {}", err.message());
        assert!(
            err.message().contains(text),
            "{:?} lacks {text:?}",
            err.message()
        );
    }
    let created = app
        .running
        .state
        .on_pool(|_, pool| pool.group_snapshots(None).count())
        .await
        .unwrap();
    assert_eq!(created, 0);
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn secrets_are_accepted_and_never_echoed() {
    let app = start().await;
    let mut c = clients(&app, "controller").await;
    let (_, vols) = group_of(&app, &mut c, "g", 1).await;
    let secret = HashMap::from([("password".to_owned(), "hunter2".to_owned())]);
    let gs =
        c.gc.create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest {
            secrets: secret.clone(),
            ..create_req("gs", &vols)
        })
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    c.gc.get_volume_group_snapshot(GetVolumeGroupSnapshotRequest {
        group_snapshot_id: gs.group_snapshot_id.clone(),
        snapshot_ids: member_ids(&gs),
        secrets: secret,
    })
    .await
    .unwrap();
    let big = HashMap::from([("password".to_owned(), "hunter2".repeat(600))]);
    let err =
        c.gc.delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: gs.group_snapshot_id.clone(),
            snapshot_ids: member_ids(&gs),
            secrets: big,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(!err.message().contains("hunter2") && !err.message().contains("password"));
    // The refused delete deleted nothing.
    get(&mut c, &gs.group_snapshot_id, member_ids(&gs))
        .await
        .unwrap();
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn delete_removes_members_and_is_idempotent() {
    let app = start().await;
    let mut c = clients(&app, "controller").await;
    let (_, vols) = group_of(&app, &mut c, "g", 2).await;
    let gs = create(&mut c, "gs", &vols).await.unwrap();
    let snaps = member_ids(&gs);

    // Required fields.
    assert_eq!(
        code(delete(&mut c, "", snaps.clone()).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(delete(&mut c, &gs.group_snapshot_id, vec![]).await),
        Code::InvalidArgument
    );
    // Snapshot list mismatch: a member missing, a stranger added, a duplicate. Nothing deleted.
    let mut stranger = snaps.clone();
    stranger.push("test-box-s999".into());
    let mut dup = snaps.clone();
    dup.push(snaps[0].clone());
    for wrong in [snaps[..1].to_vec(), stranger, dup] {
        let err = delete(&mut c, &gs.group_snapshot_id, wrong)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
        assert!(err.message().contains("do not match"), "{}", err.message());
    }
    get(&mut c, &gs.group_snapshot_id, snaps.clone())
        .await
        .unwrap();

    // A volume made from a member snapshot does not keep the group snapshot "in use".
    let ids = Ids::new(&app.running.state.appliance_id);
    let member = ids.parse_snapshot(&snaps[0]).unwrap();
    app.running
        .state
        .on_pool(move |_, pool| {
            let mut spec = VolumeSpec::new("restored", 1 << 20);
            spec.source = Some(edgevol_core::ContentSource::Snapshot(member));
            pool.create_volume(spec)
        })
        .await
        .unwrap()
        .unwrap();

    let reversed: Vec<String> = snaps.iter().rev().cloned().collect();
    delete(&mut c, &gs.group_snapshot_id, reversed)
        .await
        .unwrap();
    assert_eq!(
        code(get(&mut c, &gs.group_snapshot_id, snaps.clone()).await),
        Code::NotFound
    );
    let left = app
        .running
        .state
        .on_pool(|_, pool| {
            (
                pool.snapshots(None).count(),
                pool.volume_by_name("restored").is_some(),
            )
        })
        .await
        .unwrap();
    assert_eq!(
        left,
        (0, true),
        "member snapshots go with it; the restored volume stays"
    );

    // Idempotent: again, and ids that never existed or are not ours, all OK.
    delete(&mut c, &gs.group_snapshot_id, snaps.clone())
        .await
        .unwrap();
    delete(&mut c, "test-box-gs12345", snaps.clone())
        .await
        .unwrap();
    delete(&mut c, "other-box-gs1", snaps.clone())
        .await
        .unwrap();
    delete(&mut c, "garbage", snaps).await.unwrap();
    // csi-sanity's shape: an unknown id without snapshot_ids is still OK (looked up first).
    delete(&mut c, "test-box-gs12345", vec![]).await.unwrap();
    delete(&mut c, &gs.group_snapshot_id, vec![]).await.unwrap();
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn get_returns_the_group_snapshot_and_its_error_rows() {
    let app = start().await;
    let mut c = clients(&app, "controller").await;
    let (_, vols) = group_of(&app, &mut c, "g", 2).await;
    let gs = create(&mut c, "gs", &vols).await.unwrap();
    let snaps = member_ids(&gs);
    assert_eq!(
        get(&mut c, &gs.group_snapshot_id, snaps.clone())
            .await
            .unwrap(),
        gs
    );
    let reversed: Vec<String> = snaps.iter().rev().cloned().collect();
    assert_eq!(
        get(&mut c, &gs.group_snapshot_id, reversed).await.unwrap(),
        gs
    );
    // Snapshot list mismatch.
    let err = get(&mut c, &gs.group_snapshot_id, snaps[1..].to_vec())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains(&snaps[0]),
        "lists ours: {}",
        err.message()
    );
    // Does not exist.
    for missing in ["test-box-gs999", "other-box-gs1", "test-box-g1"] {
        let err = get(&mut c, missing, snaps.clone()).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{missing}");
        assert!(err.message().contains(missing), "{}", err.message());
    }
    // csi-sanity's shape: an unknown id without snapshot_ids is NOT_FOUND (looked up first).
    for missing in ["test-box-gs999", "garbage"] {
        assert_eq!(code(get(&mut c, missing, vec![]).await), Code::NotFound);
    }
    // Required fields: snapshot_ids of an existing group snapshot.
    assert_eq!(
        code(get(&mut c, "", snaps.clone()).await),
        Code::InvalidArgument
    );
    let err = get(&mut c, &gs.group_snapshot_id, vec![])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("snapshot_ids is required"),
        "{}",
        err.message()
    );
    assert_eq!(
        code(get(&mut c, &"x".repeat(129), snaps).await),
        Code::InvalidArgument
    );
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn group_snapshots_outlive_their_group() {
    let app = start().await;
    let mut c = clients(&app, "controller").await;
    let (group, vols) = group_of(&app, &mut c, "g", 2).await;
    let gs = create(&mut c, "gs", &vols).await.unwrap();
    c.vg.delete_volume_group(DeleteVolumeGroupRequest {
        volume_group_id: group,
        ..Default::default()
    })
    .await
    .unwrap();
    // The group and its volumes are gone; the group snapshot and its members are not.
    assert_eq!(
        get(&mut c, &gs.group_snapshot_id, member_ids(&gs))
            .await
            .unwrap(),
        gs
    );
    // A retry of the create still answers with it.
    assert_eq!(create(&mut c, "gs", &vols).await.unwrap(), gs);
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn group_snapshots_survive_a_restart() {
    let app = start().await;
    let mut c = clients(&app, "controller").await;
    let (_, vols) = group_of(&app, &mut c, "g", 3).await;
    let gs = create(&mut c, "gs", &vols).await.unwrap();
    let gone = create(&mut c, "gs-deleted", &vols).await.unwrap();
    delete(&mut c, &gone.group_snapshot_id, member_ids(&gone))
        .await
        .unwrap();
    drop(c);

    let app = restart(app).await;
    let mut c = clients(&app, "controller").await;
    assert_eq!(
        get(&mut c, &gs.group_snapshot_id, member_ids(&gs))
            .await
            .unwrap(),
        gs
    );
    assert_eq!(
        code(get(&mut c, &gone.group_snapshot_id, member_ids(&gone)).await),
        Code::NotFound
    );
    // Idempotency holds across the restart too.
    assert_eq!(create(&mut c, "gs", &vols).await.unwrap(), gs);
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn observers_may_get_but_not_create_or_delete() {
    let app = start().await;
    let mut c = clients(&app, "controller").await;
    let (_, vols) = group_of(&app, &mut c, "g", 1).await;
    let gs = create(&mut c, "gs", &vols).await.unwrap();
    let mut o = clients(&app, "observer").await;
    assert_eq!(
        get(&mut o, &gs.group_snapshot_id, member_ids(&gs))
            .await
            .unwrap(),
        gs
    );
    let err = create(&mut o, "gs2", &vols).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{}", err.message());
    let err = delete(&mut o, &gs.group_snapshot_id, member_ids(&gs))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{}", err.message());
    get(&mut c, &gs.group_snapshot_id, member_ids(&gs))
        .await
        .unwrap();
    app.running.stop().await.unwrap();
}
