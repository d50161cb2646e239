//! The VolumeGroup service (seed 002) over mutual TLS: a test per MUST and per error-table row of
//! CreateVolumeGroup, ModifyVolumeGroupMembership, DeleteVolumeGroup, ListVolumeGroups and
//! ControllerGetVolumeGroup, idempotency, pagination under churn, persistence, and roles.
//!
//! Volumes are made through core directly (`Running::state`), independent of the Controller.

use crate::common;

use std::collections::{BTreeSet, HashMap};

use common::{dev_config, DevAppliance};
use edgevol_appliance::csi::ids::Ids;
use edgevol_core::VolumeSpec;
use edgevol_proto::volumegroup::controller_client::ControllerClient;
use edgevol_proto::volumegroup::{
    ControllerGetVolumeGroupRequest, CreateVolumeGroupRequest, DeleteVolumeGroupRequest,
    ListVolumeGroupsRequest, ModifyVolumeGroupMembershipRequest, VolumeGroup,
};
use tonic::transport::Channel;
use tonic::{Code, Status};

type Client = ControllerClient<Channel>;

async fn start() -> (DevAppliance, Client) {
    let app = DevAppliance::start().await;
    app.ready().await;
    let client = ControllerClient::new(app.channel("controller").await);
    (app, client)
}

async fn restart(app: DevAppliance) -> (DevAppliance, Client) {
    let DevAppliance { dir, running } = app;
    running.stop().await.unwrap();
    let running = edgevol_appliance::start(dev_config(dir.path(), "127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let app = DevAppliance { dir, running };
    app.ready().await;
    let client = ControllerClient::new(app.channel("controller").await);
    (app, client)
}

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

async fn volume_exists(app: &DevAppliance, id: &str) -> bool {
    let v = Ids::new(&app.running.state.appliance_id)
        .parse_volume(id)
        .unwrap();
    app.running
        .state
        .on_pool(move |_, pool| pool.volume(v).is_ok())
        .await
        .unwrap()
}

async fn create(
    c: &mut Client,
    name: &str,
    params: &[(&str, &str)],
) -> Result<VolumeGroup, Status> {
    c.create_volume_group(CreateVolumeGroupRequest {
        name: name.into(),
        parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().volume_group.unwrap())
}

async fn modify(c: &mut Client, group: &str, vols: &[String]) -> Result<VolumeGroup, Status> {
    c.modify_volume_group_membership(ModifyVolumeGroupMembershipRequest {
        volume_group_id: group.into(),
        volume_ids: vols.to_vec(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().volume_group.unwrap())
}

async fn get(c: &mut Client, group: &str) -> Result<VolumeGroup, Status> {
    c.controller_get_volume_group(ControllerGetVolumeGroupRequest {
        volume_group_id: group.into(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().volume_group.unwrap())
}

async fn delete(c: &mut Client, group: &str) -> Result<(), Status> {
    c.delete_volume_group(DeleteVolumeGroupRequest {
        volume_group_id: group.into(),
        ..Default::default()
    })
    .await
    .map(drop)
}

async fn list(c: &mut Client, max: i32, token: &str) -> Result<(Vec<String>, String), Status> {
    let r = c
        .list_volume_groups(ListVolumeGroupsRequest {
            max_entries: max,
            starting_token: token.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let ids = r
        .entries
        .into_iter()
        .map(|e| e.volume_group.unwrap().volume_group_id)
        .collect();
    Ok((ids, r.next_token))
}

fn members(g: &VolumeGroup) -> BTreeSet<String> {
    g.volumes.iter().map(|v| v.volume_id.clone()).collect()
}

fn set(ids: &[String]) -> BTreeSet<String> {
    ids.iter().cloned().collect()
}

#[tokio::test]
async fn create_is_idempotent_and_refuses_incompatible_or_unsupported() {
    let (app, mut c) = start().await;
    let g = create(&mut c, "pg", &[("consistency", "crash")])
        .await
        .unwrap();
    assert!(Ids::new(&app.running.state.appliance_id)
        .parse_group(&g.volume_group_id)
        .is_some());
    assert!(g.volumes.is_empty(), "a new group is empty");
    assert_eq!(
        g.volume_group_context,
        HashMap::from([("consistency".into(), "crash".into())])
    );
    // Same name and parameters: the same group, even after members joined.
    let v = volume(&app, "v").await;
    modify(&mut c, &g.volume_group_id, std::slice::from_ref(&v))
        .await
        .unwrap();
    let again = create(&mut c, "pg", &[("consistency", "crash")])
        .await
        .unwrap();
    assert_eq!(again.volume_group_id, g.volume_group_id);
    assert_eq!(members(&again), set(&[v]));
    // Same name, other parameters: ALREADY_EXISTS.
    let err = create(&mut c, "pg", &[]).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{}", err.message());
    assert!(
        err.message().contains(&g.volume_group_id),
        "{}",
        err.message()
    );
    // Not supported: INVALID_ARGUMENT, and nothing created.
    for params in [
        &[("consistency", "application")][..],
        &[("replicas", "3")][..],
    ] {
        let err = create(&mut c, "other", params).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{params:?}");
        assert!(err.message().contains("parameters"), "{}", err.message());
    }
    // Required name and size limits.
    assert_eq!(
        create(&mut c, "", &[]).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        create(&mut c, &"n".repeat(129), &[])
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    assert!(create(&mut c, &"n".repeat(128), &[]).await.is_ok());
    let (all, _) = list(&mut c, 0, "").await.unwrap();
    assert_eq!(all.len(), 2, "{all:?}");
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn secrets_are_accepted_and_never_echoed() {
    let (app, mut c) = start().await;
    let ok = c
        .create_volume_group(CreateVolumeGroupRequest {
            name: "g".into(),
            secrets: HashMap::from([("token".into(), "hunter2".into())]),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap();
    assert!(!format!("{ok:?}").contains("hunter2"));
    let err = c
        .list_volume_groups(ListVolumeGroupsRequest {
            secrets: HashMap::from([("token".into(), "hunter2".repeat(600))]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(!err.message().contains("hunter2") && !err.message().contains("token"));
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn modify_sets_membership_exactly_and_idempotently() {
    let (app, mut c) = start().await;
    let g = create(&mut c, "g", &[]).await.unwrap().volume_group_id;
    let vols = [
        volume(&app, "a").await,
        volume(&app, "b").await,
        volume(&app, "c").await,
    ];
    let all = modify(&mut c, &g, &vols).await.unwrap();
    assert_eq!(members(&all), set(&vols));
    assert!(all.volumes.iter().all(|v| v.capacity_bytes == 1 << 20));
    // Idempotent: the same list (in any order, duplicates folded) changes nothing.
    let shuffled = vec![
        vols[2].clone(),
        vols[0].clone(),
        vols[1].clone(),
        vols[0].clone(),
    ];
    assert_eq!(
        members(&modify(&mut c, &g, &shuffled).await.unwrap()),
        set(&vols)
    );
    // Missing ones leave, new ones join.
    let d = volume(&app, "d").await;
    let next = modify(&mut c, &g, &[vols[1].clone(), d.clone()])
        .await
        .unwrap();
    assert_eq!(members(&next), set(&[vols[1].clone(), d.clone()]));
    assert_eq!(members(&get(&mut c, &g).await.unwrap()), members(&next));
    // Removed volumes still exist, outside any group.
    assert!(volume_exists(&app, &vols[0]).await);
    // Empty: everyone leaves.
    assert!(modify(&mut c, &g, &[]).await.unwrap().volumes.is_empty());
    assert!(get(&mut c, &g).await.unwrap().volumes.is_empty());
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn modify_error_rows() {
    let (app, mut c) = start().await;
    let g = create(&mut c, "g", &[]).await.unwrap().volume_group_id;
    let h = create(&mut c, "h", &[]).await.unwrap().volume_group_id;
    let a = volume(&app, "a").await;
    let b = volume(&app, "b").await;
    modify(&mut c, &h, std::slice::from_ref(&b)).await.unwrap();
    modify(&mut c, &g, std::slice::from_ref(&a)).await.unwrap();

    // Volume id or group does not exist: NOT_FOUND, membership unchanged.
    for (group, vol) in [
        ("test-box-g999", a.clone()),
        ("other-box-g1", a.clone()),
        (g.as_str(), "test-box-v999".to_owned()),
        (g.as_str(), "other-box-v1".to_owned()),
    ] {
        let err = modify(&mut c, group, &[a.clone(), vol.clone()])
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            Code::NotFound,
            "{group} {vol}: {}",
            err.message()
        );
    }
    // A volume of another group is incompatible: INVALID_ARGUMENT naming that group.
    let err = modify(&mut c, &g, &[a.clone(), b.clone()])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(err.message().contains(&h), "{}", err.message());
    assert_eq!(
        members(&get(&mut c, &g).await.unwrap()),
        set(std::slice::from_ref(&a))
    );
    assert_eq!(
        members(&get(&mut c, &h).await.unwrap()),
        set(std::slice::from_ref(&b))
    );
    // Required and size-limited fields.
    assert_eq!(
        modify(&mut c, "", &[]).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        modify(&mut c, &g, &[String::new()])
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    assert_eq!(
        modify(&mut c, &g, &["v".repeat(129)])
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );

    // The maximum is reached: RESOURCE_EXHAUSTED.
    let max = edgevol_core::limits::MAX_GROUP_MEMBERS;
    let many: Vec<String> = app
        .running
        .state
        .on_pool(move |state, pool| {
            (0..=max)
                .map(|i| {
                    let v = pool
                        .create_volume(VolumeSpec::new(format!("m{i}"), 1 << 20))
                        .unwrap();
                    Ids::new(&state.appliance_id).volume(v)
                })
                .collect()
        })
        .await
        .unwrap();
    let err = modify(&mut c, &g, &many).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    assert_eq!(
        modify(&mut c, &g, &many[..max])
            .await
            .unwrap()
            .volumes
            .len(),
        max
    );
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn delete_removes_group_and_members_idempotently() {
    let (app, mut c) = start().await;
    let g = create(&mut c, "g", &[]).await.unwrap().volume_group_id;
    let a = volume(&app, "a").await;
    let outsider = volume(&app, "outsider").await;
    modify(&mut c, &g, std::slice::from_ref(&a)).await.unwrap();

    // In use (a member is published): FAILED_PRECONDITION, nothing deleted.
    let v = Ids::new(&app.running.state.appliance_id)
        .parse_volume(&a)
        .unwrap();
    let host = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
    app.running
        .state
        .on_pool(move |_, pool| pool.publish(v, host, false))
        .await
        .unwrap()
        .unwrap();
    let err = delete(&mut c, &g).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains(&a), "{}", err.message());
    assert!(get(&mut c, &g).await.is_ok() && volume_exists(&app, &a).await);
    app.running
        .state
        .on_pool(move |_, pool| pool.unpublish(v, host))
        .await
        .unwrap()
        .unwrap();

    delete(&mut c, &g).await.unwrap();
    assert_eq!(get(&mut c, &g).await.unwrap_err().code(), Code::NotFound);
    assert!(
        !volume_exists(&app, &a).await,
        "deleting a group deletes its volumes"
    );
    assert!(volume_exists(&app, &outsider).await, "and only those");
    // Does not exist (any more, or never, or not ours): OK.
    delete(&mut c, &g).await.unwrap();
    delete(&mut c, "test-box-g999").await.unwrap();
    delete(&mut c, "other-box-g1").await.unwrap();
    assert_eq!(
        delete(&mut c, "").await.unwrap_err().code(),
        Code::InvalidArgument
    );
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn get_returns_the_group_or_not_found() {
    let (app, mut c) = start().await;
    let g = create(&mut c, "g", &[("consistency", "crash")])
        .await
        .unwrap();
    let a = volume(&app, "a").await;
    let after = modify(&mut c, &g.volume_group_id, std::slice::from_ref(&a))
        .await
        .unwrap();
    assert_eq!(get(&mut c, &g.volume_group_id).await.unwrap(), after);
    for missing in ["test-box-g999", "other-box-g1", "test-box-v1", "junk"] {
        let err = get(&mut c, missing).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{missing}");
        assert!(err.message().contains(missing), "{}", err.message());
    }
    assert_eq!(
        get(&mut c, "").await.unwrap_err().code(),
        Code::InvalidArgument
    );
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn list_pages_and_refuses_bad_tokens() {
    let (app, mut c) = start().await;
    let mut made = Vec::new();
    for i in 0..5 {
        made.push(
            create(&mut c, &format!("g{i}"), &[])
                .await
                .unwrap()
                .volume_group_id,
        );
    }
    let (all, token) = list(&mut c, 0, "").await.unwrap();
    assert_eq!(all, made);
    assert_eq!(token, "", "no next page");
    let (p1, t1) = list(&mut c, 2, "").await.unwrap();
    assert_eq!(p1, made[..2]);
    assert!(!t1.is_empty());
    let (p2, t2) = list(&mut c, 2, &t1).await.unwrap();
    assert_eq!(p2, made[2..4]);
    let (p3, t3) = list(&mut c, 2, &t2).await.unwrap();
    assert_eq!(p3, made[4..]);
    assert_eq!(t3, "", "last page");
    // Exactly max_entries left: no token pointing at an empty page.
    let (p, t) = list(&mut c, 5, "").await.unwrap();
    assert_eq!((p.len(), t.as_str()), (5, ""));
    // Invalid starting_token: ABORTED.
    for bad in ["junk", "other-box-g1", "test-box-v1", "test-box-g01"] {
        let err = list(&mut c, 2, bad).await.unwrap_err();
        assert_eq!(err.code(), Code::Aborted, "{bad}: {}", err.message());
    }
    // max_entries MUST NOT be negative.
    assert_eq!(
        list(&mut c, -1, "").await.unwrap_err().code(),
        Code::InvalidArgument
    );
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn list_pages_while_groups_come_and_go() {
    let (app, mut c) = start().await;
    let mut made = Vec::new();
    for i in 0..9 {
        made.push(
            create(&mut c, &format!("g{i}"), &[])
                .await
                .unwrap()
                .volume_group_id,
        );
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut added = Vec::new();
    let mut deleted = BTreeSet::new();
    let mut round = 0;
    loop {
        let (page, next) = list(&mut c, 3, &token).await.unwrap();
        assert!(page.len() <= 3);
        seen.extend(page);
        if next.is_empty() {
            break;
        }
        token = next;
        // Churn between pages: delete one group behind the cursor, one ahead, add one.
        round += 1;
        if round <= 2 {
            let behind = seen[0].clone();
            let ahead = made[made.len() - round].clone();
            for g in [behind, ahead] {
                if deleted.insert(g.clone()) {
                    delete(&mut c, &g).await.unwrap();
                }
            }
            added.push(
                create(&mut c, &format!("new{round}"), &[])
                    .await
                    .unwrap()
                    .volume_group_id,
            );
        }
    }
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no group twice: {seen:?}");
    // Every group that existed throughout was seen; new ones (higher ids) too.
    for g in made.iter().chain(&added).filter(|g| !deleted.contains(*g)) {
        assert!(seen.contains(g), "{g} missing from {seen:?}");
    }
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn groups_and_memberships_survive_a_restart() {
    let (app, mut c) = start().await;
    let g = create(&mut c, "g", &[("consistency", "crash")])
        .await
        .unwrap()
        .volume_group_id;
    let empty = create(&mut c, "empty", &[]).await.unwrap().volume_group_id;
    let gone = create(&mut c, "gone", &[]).await.unwrap().volume_group_id;
    let vols = [volume(&app, "a").await, volume(&app, "b").await];
    let before = modify(&mut c, &g, &vols).await.unwrap();
    delete(&mut c, &gone).await.unwrap();
    drop(c);

    let (app, mut c) = restart(app).await;
    assert_eq!(get(&mut c, &g).await.unwrap(), before);
    assert!(get(&mut c, &empty).await.unwrap().volumes.is_empty());
    assert_eq!(get(&mut c, &gone).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(list(&mut c, 0, "").await.unwrap().0, vec![g.clone(), empty]);
    // Idempotency by name holds after the restart; the parameters were kept.
    assert_eq!(
        create(&mut c, "g", &[("consistency", "crash")])
            .await
            .unwrap()
            .volume_group_id,
        g
    );
    assert_eq!(
        create(&mut c, "g", &[]).await.unwrap_err().code(),
        Code::AlreadyExists
    );
    app.running.stop().await.unwrap();
}

#[tokio::test]
async fn observers_may_list_and_get_but_not_change() {
    let (app, mut c) = start().await;
    let g = create(&mut c, "g", &[]).await.unwrap().volume_group_id;
    let a = volume(&app, "a").await;
    let mut o = ControllerClient::new(app.channel("observer").await);
    assert_eq!(list(&mut o, 0, "").await.unwrap().0, vec![g.clone()]);
    get(&mut o, &g).await.unwrap();
    let denied = [
        create(&mut o, "h", &[]).await.map(drop),
        modify(&mut o, &g, std::slice::from_ref(&a)).await.map(drop),
        delete(&mut o, &g).await,
    ];
    for r in denied {
        assert_eq!(r.unwrap_err().code(), Code::PermissionDenied);
    }
    assert!(
        get(&mut c, &g).await.unwrap().volumes.is_empty(),
        "nothing changed"
    );
    app.running.stop().await.unwrap();
}
