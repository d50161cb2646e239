//! The project's CSI Controller conformance suite (the MUSTs and error rows of each served RPC),
//! written once against a [`Driver`]: appliance/tests/daemon/controller.rs runs it over direct mTLS to
//! one edgevold, cli/tests/cli/proxy_controller_suite.rs through `edgevol proxy` with one appliance
//! and with two. [`controller_suite!`] makes one test per body.
//!
//! Through a proxy of several appliances a volume lands on the box its name places it on, and
//! listings visit the boxes in the proxy's order, each in id order: the bodies ask the driver
//! which boxes there are and state their expectations in those terms (with one box, exactly the
//! direct answers). An id "of this driver's form that names nothing" is one of its first box.
#![allow(dead_code)]

use std::collections::HashMap;

use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::controller_service_capability::rpc::Type as Rpc;
use edgevol_proto::csi::v1::controller_service_capability::Type as CapType;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use edgevol_proto::csi::v1::volume_content_source::{
    SnapshotSource, Type as SourceType, VolumeSource,
};
use edgevol_proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::Code;

pub const MIB: i64 = 1 << 20;
pub const GIB: i64 = 1 << 30;
/// The topology key an appliance reports itself under.
pub const APPLIANCE_KEY: &str = "edgevol.io/appliance";

/// What the suite runs against: one appliance, or `edgevol proxy` over one or more.
#[allow(async_fn_in_trait)]
pub trait Driver {
    /// The appliance ids, in the order listings visit them.
    fn appliances(&self) -> Vec<String>;
    /// A channel to the Controller (and volume group) services, as a CO opens one.
    async fn channel(&self) -> Channel;
    /// Stops every appliance and starts it again on its data (channels from
    /// [`Driver::channel`] taken before may no longer work).
    async fn restart(&mut self);
    /// The NVMe/TCP port of appliance `id`.
    fn nvme_port(&self, id: &str) -> u16;
    /// The mutable parameters the pool of the volume's appliance stores for it.
    fn stored_mutable_parameters(&self, volume_id: &str) -> Vec<(String, String)>;
    /// The appliance CreateVolumeGroup of `name` lands on.
    fn group_home(&self, name: &str) -> String;
}

/// Makes one `#[tokio::test]` per suite body, each on a fresh driver from `$start().await`.
macro_rules! controller_suite {
    ($start:path) => {
        $crate::controller_suite::controller_suite!(@tests $start;
            capabilities_are_exactly_what_is_served,
            create_volume_validates_and_is_idempotent,
            space_topology_and_sources,
            delete_volume_is_idempotent_and_keeps_snapshots,
            validate_volume_capabilities_confirms_only_what_works,
            list_volumes_paginates_while_volumes_come_and_go,
            get_capacity_tracks_thick_reservations_and_topology,
            snapshots_are_idempotent_listed_and_deleted,
            expand_grows_and_reports_node_expansion,
            volumes_and_snapshots_survive_a_restart,
            a_volume_looks_the_same_from_the_volume_group_service,
            modify_volume_stores_qos_and_refuses_unknown_keys,
            get_volume_reports_published_nodes_and_condition,
            publish_and_unpublish_follow_the_spec_and_survive_a_restart,
            get_snapshot_answers_exactly_what_list_snapshots_shows,
        );
    };
    (@tests $start:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                let mut driver = $start().await;
                $crate::controller_suite::$name(&mut driver).await;
            }
        )*
    };
}
pub(crate) use controller_suite;

pub fn mount(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
    }
}

pub fn block(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

pub fn create(name: &str, required: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount(Mode::SingleNodeWriter)],
        ..Default::default()
    }
}

/// A topology naming appliance `id`.
pub fn on(id: &str) -> Topology {
    Topology {
        segments: HashMap::from([(APPLIANCE_KEY.into(), id.into())]),
    }
}

/// `req` allowed on appliance `id` only.
pub fn pinned(mut req: CreateVolumeRequest, id: &str) -> CreateVolumeRequest {
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![on(id)],
        preferred: vec![],
    });
    req
}

async fn client(d: &impl Driver) -> ControllerClient<Channel> {
    ControllerClient::new(d.channel().await)
}

pub async fn snapshot(c: &mut ControllerClient<Channel>, source: &str, name: &str) -> Snapshot {
    c.create_snapshot(CreateSnapshotRequest {
        source_volume_id: source.into(),
        name: name.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .snapshot
    .unwrap()
}

pub async fn vol(c: &mut ControllerClient<Channel>, req: CreateVolumeRequest) -> Volume {
    c.create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

pub fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> (Code, String) {
    let s = r.unwrap_err();
    (s.code(), s.message().to_owned())
}

/// The appliance an object id names (`box-a-v3` -> `box-a`).
pub fn home(id: &str) -> &str {
    id.rsplit_once('-').map_or("", |(h, _)| h)
}

/// An id of this driver's form that names nothing: `local` (`v4242`) on its first appliance.
fn unknown(d: &impl Driver, local: &str) -> String {
    format!("{}-{local}", d.appliances()[0])
}

/// Where a listing shows object `id`: its appliance's place in the driver, then its number.
fn listing_key(appliances: &[String], id: &str) -> (usize, u64) {
    let (h, local) = id.rsplit_once('-').unwrap();
    let n = local.trim_start_matches(|c: char| c.is_ascii_lowercase());
    (
        appliances.iter().position(|a| a == h).unwrap(),
        n.parse().unwrap(),
    )
}

/// `ids` in listing order.
fn in_listing_order(appliances: &[String], mut ids: Vec<String>) -> Vec<String> {
    ids.sort_by_key(|id| listing_key(appliances, id));
    ids
}

pub async fn capabilities_are_exactly_what_is_served(d: &mut impl Driver) {
    let caps = client(d)
        .await
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut got: Vec<Rpc> = caps
        .capabilities
        .iter()
        .map(|c| match c.r#type {
            Some(CapType::Rpc(r)) => r.r#type(),
            None => panic!("capability without type"),
        })
        .collect();
    got.sort_by_key(|r| *r as i32);
    // The daemon always runs its NVMe/TCP target: publishing is offered.
    let mut want = edgevol_appliance::csi::controller::capabilities(true);
    want.sort_by_key(|r| *r as i32);
    assert_eq!(got, want);
    assert!(got.contains(&Rpc::ModifyVolume) && got.contains(&Rpc::GetVolume));
    assert!(got.contains(&Rpc::GetSnapshot));
    assert!(
        got.contains(&Rpc::PublishUnpublishVolume),
        "publishing is offered while the NVMe/TCP target runs"
    );
}

pub async fn create_volume_validates_and_is_idempotent(d: &mut impl Driver) {
    let mut c = client(d).await;

    let v = vol(&mut c, create("pvc-1", 1)).await;
    assert_eq!(v.capacity_bytes, MIB, "rounded up to the 1 MiB cluster");
    let here = &v.accessible_topology[0].segments[APPLIANCE_KEY];
    assert!(d.appliances().contains(here), "{here}");
    assert!(v.volume_id.starts_with(&format!("{here}-v")), "{v:?}");
    assert_eq!(v.volume_context["edgevol.io/cluster-size"], "1048576");

    // Same name, same arguments: the same volume.
    let again = vol(&mut c, create("pvc-1", 1)).await;
    assert_eq!(again.volume_id, v.volume_id);
    // Same name, a range the existing volume does not satisfy: ALREADY_EXISTS.
    let (code_, msg) = code(c.create_volume(create("pvc-1", 10 * MIB)).await);
    assert_eq!(code_, Code::AlreadyExists, "{msg}");
    // Same name, other parameters: ALREADY_EXISTS.
    let mut thick = create("pvc-1", 1);
    thick
        .parameters
        .insert("provisioning".into(), "thick".into());
    assert_eq!(code(c.create_volume(thick).await).0, Code::AlreadyExists);

    // Without a capacity range: the 1 GiB default.
    let mut no_range = create("pvc-default", 0);
    no_range.capacity_range = None;
    assert_eq!(vol(&mut c, no_range).await.capacity_bytes, GIB);
    // The limit is honoured, rounding down inside the range.
    let mut ranged = create("pvc-ranged", MIB + 1);
    ranged.capacity_range.as_mut().unwrap().limit_bytes = 3 * MIB + 7;
    assert_eq!(vol(&mut c, ranged).await.capacity_bytes, 2 * MIB);

    let bad = [
        (create("", MIB), "name is required"),
        (create(&"n".repeat(129), MIB), "name is 129 bytes"),
        (create("bad\u{7}name", MIB), "control character"),
        (
            CreateVolumeRequest {
                volume_capabilities: vec![],
                ..create("no-caps", MIB)
            },
            "volume_capabilities is required",
        ),
        (
            CreateVolumeRequest {
                volume_capabilities: vec![mount(Mode::MultiNodeMultiWriter)],
                ..create("rwx-mount", MIB)
            },
            "MULTI_NODE_MULTI_WRITER",
        ),
        (
            CreateVolumeRequest {
                parameters: HashMap::from([("colour".into(), "blue".into())]),
                ..create("odd-param", MIB)
            },
            "unknown parameter \"colour\"",
        ),
        (
            CreateVolumeRequest {
                capacity_range: Some(CapacityRange {
                    required_bytes: 5 * MIB,
                    limit_bytes: MIB,
                }),
                ..create("inverted", 0)
            },
            "below required_bytes",
        ),
        (create("negative", -1), "must not be negative"),
    ];
    for (req, text) in bad {
        let (code_, msg) = code(c.create_volume(req).await);
        assert_eq!(code_, Code::InvalidArgument, "{msg}");
        assert!(msg.contains(text), "{msg:?} lacks {text:?}");
    }
    // Block volumes may be shared by several writers.
    let rwx = CreateVolumeRequest {
        volume_capabilities: vec![block(Mode::MultiNodeMultiWriter)],
        ..create("rwx-block", MIB)
    };
    vol(&mut c, rwx).await;
}

pub async fn space_topology_and_sources(d: &mut impl Driver) {
    let mut c = client(d).await;

    // Thick beyond the pool: RESOURCE_EXHAUSTED. Thin of the same size: fine.
    let mut huge = create("huge", 64 * GIB);
    huge.parameters
        .insert("provisioning".into(), "thick".into());
    assert_eq!(code(c.create_volume(huge).await).0, Code::ResourceExhausted);
    vol(&mut c, create("huge-thin", 64 * GIB)).await;

    // Topology: a requisite that excludes this driver's appliances cannot be satisfied.
    let elsewhere = on("other-box");
    let first = d.appliances()[0].clone();
    let here = on(&first);
    let mut req = create("placed", MIB);
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![elsewhere.clone()],
        preferred: vec![],
    });
    assert_eq!(
        code(c.create_volume(req.clone()).await).0,
        Code::ResourceExhausted
    );
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![elsewhere, here.clone()],
        preferred: vec![here],
    });
    assert_eq!(home(&vol(&mut c, req).await.volume_id), first);

    // Sources: a snapshot and a volume, echoed back; size rules.
    let src = vol(&mut c, create("src", 8 * MIB)).await;
    let snap = snapshot(&mut c, &src.volume_id, "snap-1").await;
    let from_snap = |name: &str, required: i64, id: &str| CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(SourceType::Snapshot(SnapshotSource {
                snapshot_id: id.into(),
            })),
        }),
        ..create(name, required)
    };
    let restored = vol(&mut c, from_snap("restored", 0, &snap.snapshot_id)).await;
    assert_eq!(
        restored.capacity_bytes,
        8 * MIB,
        "defaults to the source's size"
    );
    assert_eq!(
        home(&restored.volume_id),
        home(&src.volume_id),
        "restored where its snapshot is"
    );
    assert_eq!(
        restored.content_source.unwrap().r#type,
        Some(SourceType::Snapshot(SnapshotSource {
            snapshot_id: snap.snapshot_id.clone()
        }))
    );
    let (code_, msg) = code(
        c.create_volume(from_snap("small", 4 * MIB, &snap.snapshot_id))
            .await,
    );
    assert_eq!(code_, Code::OutOfRange, "{msg}");
    let (code_, _) = code(
        c.create_volume(from_snap("ghost", 0, &unknown(d, "s999")))
            .await,
    );
    assert_eq!(code_, Code::NotFound);
    let (code_, _) = code(c.create_volume(from_snap("alien", 0, "elsewhere-s1")).await);
    assert_eq!(code_, Code::NotFound);

    let clone = CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(SourceType::Volume(VolumeSource {
                volume_id: src.volume_id.clone(),
            })),
        }),
        ..create("clone", 16 * MIB)
    };
    let clone = vol(&mut c, clone).await;
    assert_eq!(clone.capacity_bytes, 16 * MIB);
    assert_eq!(home(&clone.volume_id), home(&src.volume_id));
}

pub async fn delete_volume_is_idempotent_and_keeps_snapshots(d: &mut impl Driver) {
    let mut c = client(d).await;
    let v = vol(&mut c, create("doomed", MIB)).await;
    let snap = snapshot(&mut c, &v.volume_id, "keep-me").await;
    for _ in 0..2 {
        c.delete_volume(DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    c.delete_volume(DeleteVolumeRequest {
        volume_id: "not-ours-v1".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let (code_, _) = code(c.delete_volume(DeleteVolumeRequest::default()).await);
    assert_eq!(code_, Code::InvalidArgument);
    let listed = c
        .list_snapshots(ListSnapshotsRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1, "the snapshot outlives its source");
    assert_eq!(
        listed.entries[0]
            .snapshot
            .as_ref()
            .unwrap()
            .source_volume_id,
        v.volume_id
    );
}

pub async fn validate_volume_capabilities_confirms_only_what_works(d: &mut impl Driver) {
    let mut c = client(d).await;
    let v = vol(&mut c, create("checked", MIB)).await;
    let ask = |caps: Vec<VolumeCapability>| ValidateVolumeCapabilitiesRequest {
        volume_id: v.volume_id.clone(),
        volume_capabilities: caps,
        ..Default::default()
    };
    let ok = c
        .validate_volume_capabilities(ask(vec![mount(Mode::SingleNodeWriter)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ok.confirmed.unwrap().volume_capabilities,
        vec![mount(Mode::SingleNodeWriter)]
    );
    let no = c
        .validate_volume_capabilities(ask(vec![mount(Mode::MultiNodeMultiWriter)]))
        .await
        .unwrap()
        .into_inner();
    assert!(no.confirmed.is_none());
    assert!(
        no.message.contains("MULTI_NODE_MULTI_WRITER"),
        "{}",
        no.message
    );
    // A mode the volume was not created for is not confirmed.
    let other_mode = c
        .validate_volume_capabilities(ask(vec![mount(Mode::MultiNodeReaderOnly)]))
        .await
        .unwrap()
        .into_inner();
    assert!(other_mode.confirmed.is_none(), "{}", other_mode.message);
    let mut qos = ask(vec![mount(Mode::SingleNodeWriter)]);
    qos.mutable_parameters.insert("maxIops".into(), "7".into());
    let no = c
        .validate_volume_capabilities(qos)
        .await
        .unwrap()
        .into_inner();
    assert!(no.confirmed.is_none(), "the volume has no such QoS");
    let mut wrong_params = ask(vec![mount(Mode::SingleNodeWriter)]);
    wrong_params
        .parameters
        .insert("provisioning".into(), "thick".into());
    let no = c
        .validate_volume_capabilities(wrong_params)
        .await
        .unwrap()
        .into_inner();
    assert!(no.confirmed.is_none());

    assert_eq!(
        code(c.validate_volume_capabilities(ask(vec![])).await).0,
        Code::InvalidArgument
    );
    let mut missing = ask(vec![mount(Mode::SingleNodeWriter)]);
    missing.volume_id = unknown(d, "v4242");
    assert_eq!(
        code(c.validate_volume_capabilities(missing).await).0,
        Code::NotFound
    );
}

pub async fn list_volumes_paginates_while_volumes_come_and_go(d: &mut impl Driver) {
    let mut c = client(d).await;
    let boxes = d.appliances();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            vol(&mut c, create(&format!("list-{i}"), MIB))
                .await
                .volume_id,
        );
    }
    let homes: std::collections::BTreeSet<&str> = ids.iter().map(|id| home(id)).collect();
    assert_eq!(
        homes.len(),
        boxes.len(),
        "the pages cross every appliance: {ids:?}"
    );
    let page = |token: String| ListVolumesRequest {
        max_entries: 2,
        starting_token: token,
    };
    let first = c
        .list_volumes(page(String::new()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.entries.len(), 2);
    assert!(!first.next_token.is_empty());
    let mut seen: Vec<String> = first
        .entries
        .iter()
        .map(|e| e.volume.as_ref().unwrap().volume_id.clone())
        .collect();
    let ordered = in_listing_order(&boxes, ids.clone());
    assert_eq!(seen, ordered[..2], "the first page starts the listing");
    // Between pages: delete one already listed and one not yet listed; create a new one.
    let gone = [seen[0].clone(), ordered[3].clone()];
    for id in &gone {
        c.delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let late = vol(&mut c, create("list-late", MIB)).await.volume_id;
    let mut token = first.next_token;
    while !token.is_empty() {
        let next = c.list_volumes(page(token)).await.unwrap().into_inner();
        assert!(next.entries.len() <= 2);
        seen.extend(
            next.entries
                .iter()
                .map(|e| e.volume.as_ref().unwrap().volume_id.clone()),
        );
        token = next.next_token;
    }
    // The listing goes on after the last entry it gave: every survivor not yet listed, and the
    // new volume when it lies beyond that point (with one appliance it always does).
    let after = listing_key(&boxes, &ordered[1]);
    let rest = in_listing_order(
        &boxes,
        ids.iter()
            .chain([&late])
            .filter(|id| !gone.contains(id) && listing_key(&boxes, id) > after)
            .cloned()
            .collect(),
    );
    let expect: Vec<String> = ordered[..2].iter().cloned().chain(rest).collect();
    if boxes.len() == 1 {
        assert_eq!(
            expect,
            [&ids[0], &ids[1], &ids[2], &ids[4], &late].map(String::clone)
        );
    }
    assert_eq!(seen, expect, "no duplicates, no skips of survivors");

    let (code_, _) = code(
        c.list_volumes(ListVolumesRequest {
            max_entries: 0,
            starting_token: "garbage".into(),
        })
        .await,
    );
    assert_eq!(code_, Code::Aborted);
    let (code_, _) = code(
        c.list_volumes(ListVolumesRequest {
            max_entries: -1,
            starting_token: String::new(),
        })
        .await,
    );
    assert_eq!(code_, Code::InvalidArgument);
}

pub async fn get_capacity_tracks_thick_reservations_and_topology(d: &mut impl Driver) {
    let mut c = client(d).await;
    let free = |c: &mut ControllerClient<Channel>, req: GetCapacityRequest| {
        let mut c = c.clone();
        async move { c.get_capacity(req).await.unwrap().into_inner() }
    };
    let before = free(&mut c, GetCapacityRequest::default()).await;
    assert!(before.available_capacity > 15 * GIB, "{before:?}");
    assert_eq!(before.minimum_volume_size, Some(MIB));
    let mut thick = create("reserved", GIB);
    thick
        .parameters
        .insert("provisioning".into(), "thick".into());
    vol(&mut c, thick).await;
    vol(&mut c, create("thin", GIB)).await;
    let after = free(&mut c, GetCapacityRequest::default()).await;
    assert_eq!(
        before.available_capacity - after.available_capacity,
        GIB,
        "only thick reserves"
    );

    let elsewhere = GetCapacityRequest {
        accessible_topology: Some(on("other")),
        ..Default::default()
    };
    assert_eq!(free(&mut c, elsewhere).await.available_capacity, 0);
    let rwx_mount = GetCapacityRequest {
        volume_capabilities: vec![mount(Mode::MultiNodeMultiWriter)],
        ..Default::default()
    };
    assert_eq!(free(&mut c, rwx_mount).await.available_capacity, 0);
    let (code_, _) = code(
        c.get_capacity(GetCapacityRequest {
            parameters: HashMap::from([("speed".into(), "ludicrous".into())]),
            ..Default::default()
        })
        .await,
    );
    assert_eq!(code_, Code::InvalidArgument);
}

pub async fn snapshots_are_idempotent_listed_and_deleted(d: &mut impl Driver) {
    let mut c = client(d).await;
    let a = vol(&mut c, create("a", 2 * MIB)).await.volume_id;
    // b on another appliance than a's where the driver has one: the ALREADY_EXISTS row below
    // then asks a box that does not hold the name (a name is the driver's).
    let apps = d.appliances();
    let b_home = apps
        .iter()
        .find(|id| id.as_str() != home(&a))
        .map_or(home(&a), String::as_str);
    let b = vol(&mut c, pinned(create("b", MIB), b_home))
        .await
        .volume_id;
    let snap = |source: &str, name: &str| CreateSnapshotRequest {
        source_volume_id: source.into(),
        name: name.into(),
        ..Default::default()
    };
    let s1 = c
        .create_snapshot(snap(&a, "s1"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(s1.ready_to_use);
    assert_eq!(s1.size_bytes, 2 * MIB);
    assert!(s1.creation_time.unwrap().seconds > 1_700_000_000);
    let again = c
        .create_snapshot(snap(&a, "s1"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(again.snapshot_id, s1.snapshot_id);
    assert_eq!(
        code(c.create_snapshot(snap(&b, "s1")).await).0,
        Code::AlreadyExists
    );
    assert_eq!(
        code(c.create_snapshot(snap(&unknown(d, "v999"), "s9")).await).0,
        Code::NotFound
    );
    assert_eq!(
        code(c.create_snapshot(snap(&a, "")).await).0,
        Code::InvalidArgument
    );
    assert_eq!(
        code(c.create_snapshot(snap("", "s9")).await).0,
        Code::InvalidArgument
    );
    let s2 = c
        .create_snapshot(snap(&a, "s2"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let s3 = c
        .create_snapshot(snap(&b, "s3"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();

    let lister = c.clone();
    let list = |req: ListSnapshotsRequest| {
        let mut c = lister.clone();
        async move {
            c.list_snapshots(req)
                .await
                .unwrap()
                .into_inner()
                .entries
                .into_iter()
                .map(|e| e.snapshot.unwrap().snapshot_id)
                .collect::<Vec<_>>()
        }
    };
    let by_source = ListSnapshotsRequest {
        source_volume_id: a.clone(),
        ..Default::default()
    };
    assert_eq!(
        list(by_source).await,
        vec![s1.snapshot_id.clone(), s2.snapshot_id.clone()]
    );
    let by_id = ListSnapshotsRequest {
        snapshot_id: s3.snapshot_id.clone(),
        ..Default::default()
    };
    assert_eq!(list(by_id).await, vec![s3.snapshot_id.clone()]);
    let unknown_id = ListSnapshotsRequest {
        snapshot_id: unknown(d, "s4242"),
        ..Default::default()
    };
    assert!(list(unknown_id).await.is_empty());
    let paged = c
        .list_snapshots(ListSnapshotsRequest {
            max_entries: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(paged.entries.len(), 2);
    let rest = list(ListSnapshotsRequest {
        starting_token: paged.next_token,
        ..Default::default()
    })
    .await;
    let every = [&s1, &s2, &s3].map(|s| s.snapshot_id.clone()).to_vec();
    assert_eq!(rest, in_listing_order(&apps, every)[2..].to_vec());
    assert_eq!(
        code(
            c.list_snapshots(ListSnapshotsRequest {
                starting_token: "x".into(),
                ..Default::default()
            })
            .await
        )
        .0,
        Code::Aborted
    );

    for _ in 0..2 {
        c.delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: s1.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert_eq!(
        code(c.delete_snapshot(DeleteSnapshotRequest::default()).await).0,
        Code::InvalidArgument
    );
    let all = list(ListSnapshotsRequest::default()).await;
    assert_eq!(
        all,
        in_listing_order(&apps, vec![s2.snapshot_id, s3.snapshot_id])
    );
}

pub async fn expand_grows_and_reports_node_expansion(d: &mut impl Driver) {
    let mut c = client(d).await;
    let v = vol(&mut c, create("grow", MIB)).await.volume_id;
    let expand = |required: i64, cap: Option<VolumeCapability>| ControllerExpandVolumeRequest {
        volume_id: v.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        volume_capability: cap,
        ..Default::default()
    };
    let r = c
        .controller_expand_volume(expand(4 * MIB, Some(mount(Mode::SingleNodeWriter))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.capacity_bytes, r.node_expansion_required),
        (4 * MIB, true)
    );
    let r = c
        .controller_expand_volume(expand(6 * MIB, Some(block(Mode::SingleNodeWriter))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.capacity_bytes, r.node_expansion_required),
        (6 * MIB, false)
    );
    // Asking for less than the current size is already satisfied.
    let r = c
        .controller_expand_volume(expand(MIB, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 6 * MIB);

    let mut missing = expand(8 * MIB, None);
    missing.volume_id = unknown(d, "v777");
    assert_eq!(
        code(c.controller_expand_volume(missing).await).0,
        Code::NotFound
    );
    let mut no_range = expand(8 * MIB, None);
    no_range.capacity_range = None;
    assert_eq!(
        code(c.controller_expand_volume(no_range).await).0,
        Code::InvalidArgument
    );
}

pub async fn volumes_and_snapshots_survive_a_restart(d: &mut impl Driver) {
    let mut c = client(d).await;
    let v = vol(&mut c, create("durable", 3 * MIB)).await;
    let s = snapshot(&mut c, &v.volume_id, "durable-snap").await;
    d.restart().await;
    let mut c = client(d).await;
    let listed = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let back = listed.entries[0].volume.as_ref().unwrap();
    assert_eq!(
        (back.volume_id.as_str(), back.capacity_bytes),
        (v.volume_id.as_str(), 3 * MIB)
    );
    let again = vol(&mut c, create("durable", 3 * MIB)).await;
    assert_eq!(
        again.volume_id, v.volume_id,
        "idempotency survives the restart"
    );
    let snaps = c
        .list_snapshots(ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        snaps.entries[0].snapshot.as_ref().unwrap().snapshot_id,
        s.snapshot_id
    );
}

pub async fn a_volume_looks_the_same_from_the_volume_group_service(d: &mut impl Driver) {
    use edgevol_proto::volumegroup::controller_client::ControllerClient as VgClient;
    use edgevol_proto::volumegroup::{
        ControllerGetVolumeGroupRequest, CreateVolumeGroupRequest,
        ModifyVolumeGroupMembershipRequest,
    };
    let mut c = client(d).await;
    // A group holds volumes of its own appliance: the volume is made where the group lands.
    let mut req = pinned(create("grouped", 2 * MIB), &d.group_home("g"));
    req.parameters.insert("fsType".into(), "xfs".into());
    let v = vol(&mut c, req).await;
    let mut vg = VgClient::new(d.channel().await);
    let group = vg
        .create_volume_group(CreateVolumeGroupRequest {
            name: "g".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap();
    vg.modify_volume_group_membership(ModifyVolumeGroupMembershipRequest {
        volume_group_id: group.volume_group_id.clone(),
        volume_ids: vec![v.volume_id.clone()],
        ..Default::default()
    })
    .await
    .unwrap();
    let got = vg
        .controller_get_volume_group(ControllerGetVolumeGroupRequest {
            volume_group_id: group.volume_group_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap();
    let member = &got.volumes[0];
    assert_eq!(member.volume_id, v.volume_id);
    assert_eq!(member.volume_context, v.volume_context);
    assert_eq!(
        member.accessible_topology[0].segments,
        v.accessible_topology[0].segments
    );

    // Through several appliances: a volume of another box than the group's is a volume the
    // group cannot take (INVALID_ARGUMENT, naming both boxes), not one that does not exist;
    // the group is left as it was.
    let group_home = d.group_home("g");
    let apps = d.appliances();
    if let Some(other) = apps.iter().find(|a| **a != group_home) {
        let far = vol(&mut c, pinned(create("far", MIB), other)).await;
        let (code_, msg) = code(
            vg.modify_volume_group_membership(ModifyVolumeGroupMembershipRequest {
                volume_group_id: group.volume_group_id.clone(),
                volume_ids: vec![v.volume_id.clone(), far.volume_id.clone()],
                ..Default::default()
            })
            .await,
        );
        assert_eq!(code_, Code::InvalidArgument, "{msg}");
        for named in [&far.volume_id, other, &group_home] {
            assert!(msg.contains(named.as_str()), "{named} in {msg}");
        }
        let still = vg
            .controller_get_volume_group(ControllerGetVolumeGroupRequest {
                volume_group_id: group.volume_group_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .volume_group
            .unwrap();
        let kept: Vec<&str> = still.volumes.iter().map(|m| m.volume_id.as_str()).collect();
        assert_eq!(kept, vec![v.volume_id.as_str()]);
    }
}

pub async fn modify_volume_stores_qos_and_refuses_unknown_keys(d: &mut impl Driver) {
    let mut c = client(d).await;
    let mut req = create("qos", MIB);
    req.mutable_parameters
        .insert("maxIops".into(), "500".into());
    let v = vol(&mut c, req.clone()).await;
    // A retry of the same create is the same volume.
    assert_eq!(vol(&mut c, req).await.volume_id, v.volume_id);
    let modify = |params: &[(&str, &str)]| ControllerModifyVolumeRequest {
        volume_id: v.volume_id.clone(),
        mutable_parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    c.controller_modify_volume(modify(&[("maxBandwidthBytes", "1048576")]))
        .await
        .unwrap();
    assert_eq!(
        d.stored_mutable_parameters(&v.volume_id),
        vec![
            ("maxBandwidthBytes".to_owned(), "1048576".to_owned()),
            ("maxIops".to_owned(), "500".to_owned())
        ]
    );
    for (params, text) in [
        (vec![("maxIops", "many")], "positive integer"),
        (vec![("colour", "red")], "unknown mutable parameter"),
        (vec![], "mutable_parameters is required"),
    ] {
        let (code_, msg) = code(c.controller_modify_volume(modify(&params)).await);
        assert_eq!(code_, Code::InvalidArgument, "{msg}");
        assert!(msg.contains(text), "{msg}");
    }
    let mut ghost = modify(&[("maxIops", "1")]);
    ghost.volume_id = unknown(d, "v31337");
    assert_eq!(
        code(c.controller_modify_volume(ghost).await).0,
        Code::NotFound
    );
    let mut bad = create("bad-qos", MIB);
    bad.mutable_parameters.insert("burst".into(), "9".into());
    assert_eq!(code(c.create_volume(bad).await).0, Code::InvalidArgument);

    // The stored QoS survives a restart.
    d.restart().await;
    assert_eq!(d.stored_mutable_parameters(&v.volume_id).len(), 2);
}

pub async fn get_volume_reports_published_nodes_and_condition(d: &mut impl Driver) {
    let mut c = client(d).await;
    let v = vol(&mut c, create("inspected", MIB)).await;
    let got = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: v.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.volume.unwrap().volume_id, v.volume_id);
    let status = got.status.unwrap();
    assert!(status.published_node_ids.is_empty());
    let condition = status.volume_condition.unwrap();
    assert!(!condition.abnormal, "{}", condition.message);
    let listed = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        !listed.entries[0]
            .status
            .as_ref()
            .unwrap()
            .volume_condition
            .as_ref()
            .unwrap()
            .abnormal
    );
    let (code_, _) = code(
        c.controller_get_volume(ControllerGetVolumeRequest {
            volume_id: unknown(d, "v404"),
        })
        .await,
    );
    assert_eq!(code_, Code::NotFound);
    let (code_, _) = code(
        c.controller_get_volume(ControllerGetVolumeRequest::default())
            .await,
    );
    assert_eq!(code_, Code::InvalidArgument);
}

fn publish_req(
    volume: &str,
    node: &str,
    cap: VolumeCapability,
    readonly: bool,
) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        volume_capability: Some(cap),
        readonly,
        ..Default::default()
    }
}

pub async fn publish_and_unpublish_follow_the_spec_and_survive_a_restart(d: &mut impl Driver) {
    let mut c = client(d).await;
    let v = vol(&mut c, create("published", 4 * MIB)).await.volume_id;
    let node_a = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-000000000001";
    let node_b = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-4000-8000-000000000002";

    let ctx = c
        .controller_publish_volume(publish_req(
            &v,
            node_a,
            mount(Mode::SingleNodeWriter),
            false,
        ))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    assert_eq!(ctx["transport"], "tcp");
    assert_eq!(ctx["targetAddress"], "127.0.0.1");
    assert_eq!(ctx["targetPort"], d.nvme_port(home(&v)).to_string());
    let n = v.rsplit_once("-v").unwrap().1;
    assert_eq!(
        ctx["subsystemNqn"],
        format!("nqn.2024-11.io.edgevol:{}:v{n}", home(&v))
    );
    assert_eq!(ctx["nguid"].len(), 32);
    assert_eq!(ctx["uuid"].len(), 36);
    assert_eq!(ctx["readonly"], "false");
    // Idempotent: the same call, the same context.
    let again = c
        .controller_publish_volume(publish_req(
            &v,
            node_a,
            mount(Mode::SingleNodeWriter),
            false,
        ))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    assert_eq!(again, ctx);

    let nowhere = unknown(d, "v9999");
    let rows = [
        (
            publish_req(&v, node_a, mount(Mode::SingleNodeWriter), true),
            Code::AlreadyExists,
            "readonly",
        ),
        (
            publish_req(&v, node_b, mount(Mode::SingleNodeWriter), false),
            Code::FailedPrecondition,
            node_a,
        ),
        (
            publish_req(&v, "kube-node-1", mount(Mode::SingleNodeWriter), false),
            Code::NotFound,
            "not an NVMe host NQN",
        ),
        (
            publish_req(&nowhere, node_a, mount(Mode::SingleNodeWriter), false),
            Code::NotFound,
            "does not exist",
        ),
        (
            publish_req(&v, node_a, mount(Mode::MultiNodeReaderOnly), true),
            Code::InvalidArgument,
            "access mode",
        ),
        (
            ControllerPublishVolumeRequest {
                volume_capability: None,
                ..publish_req(&v, node_a, mount(Mode::SingleNodeWriter), false)
            },
            Code::InvalidArgument,
            "volume_capability is required",
        ),
        (
            publish_req("", node_a, mount(Mode::SingleNodeWriter), false),
            Code::InvalidArgument,
            "volume_id",
        ),
        (
            publish_req(&v, "", mount(Mode::SingleNodeWriter), false),
            Code::InvalidArgument,
            "node_id",
        ),
    ];
    for (req, want, text) in rows {
        let (got, msg) = code(c.controller_publish_volume(req).await);
        assert_eq!(got, want, "{msg}");
        assert!(msg.contains(text), "{msg:?} lacks {text:?}");
    }
    // A published volume cannot be deleted.
    let (got, _) = code(
        c.delete_volume(DeleteVolumeRequest {
            volume_id: v.clone(),
            ..Default::default()
        })
        .await,
    );
    assert_eq!(got, Code::FailedPrecondition);

    // Many readers: a reader-only volume is published read-only to several nodes.
    let mut ro = create("readers", MIB);
    ro.volume_capabilities = vec![mount(Mode::MultiNodeReaderOnly)];
    let ro = vol(&mut c, ro).await.volume_id;
    for node in [node_a, node_b] {
        let ctx = c
            .controller_publish_volume(publish_req(
                &ro,
                node,
                mount(Mode::MultiNodeReaderOnly),
                false,
            ))
            .await
            .unwrap()
            .into_inner()
            .publish_context;
        assert_eq!(
            ctx["readonly"], "true",
            "reader-only modes publish read-only"
        );
    }

    // Publish state survives a restart.
    d.restart().await;
    let mut c = client(d).await;
    let status = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: v.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(status.published_node_ids, vec![node_a.to_owned()]);
    let listed = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let readers = listed
        .entries
        .iter()
        .find(|e| e.volume.as_ref().unwrap().volume_id == ro)
        .unwrap();
    assert_eq!(readers.status.as_ref().unwrap().published_node_ids.len(), 2);

    // Unpublish: idempotent, unknown volume or node OK, then the volume can go.
    for _ in 0..2 {
        c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: v.clone(),
            node_id: node_a.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
        volume_id: unknown(d, "v4040"),
        node_id: node_a.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let (got, _) = code(
        c.controller_unpublish_volume(ControllerUnpublishVolumeRequest::default())
            .await,
    );
    assert_eq!(got, Code::InvalidArgument);
    // An empty node_id unpublishes from every node.
    c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
        volume_id: ro.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    for id in [v, ro] {
        c.delete_volume(DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
        .unwrap();
    }
}

pub async fn get_snapshot_answers_exactly_what_list_snapshots_shows(d: &mut impl Driver) {
    let mut c = client(d).await;
    let a = vol(&mut c, create("a", 2 * MIB)).await.volume_id;
    let s1 = snapshot(&mut c, &a, "s1").await;
    let get = |id: &str| GetSnapshotRequest {
        snapshot_id: id.into(),
        ..Default::default()
    };
    let got = c
        .get_snapshot(get(&s1.snapshot_id))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let listed = c
        .list_snapshots(ListSnapshotsRequest {
            snapshot_id: s1.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(listed.len(), 1);
    assert_eq!(Some(&got), listed[0].snapshot.as_ref());
    assert_eq!(got, s1, "the fields CreateSnapshot gave, unchanged");

    // Unknown, another appliance's, and deleted ids: NOT_FOUND; no id: INVALID_ARGUMENT.
    for id in [unknown(d, "s999").as_str(), "other-box-s1", "garbage"] {
        assert_eq!(
            code(c.get_snapshot(get(id)).await).0,
            Code::NotFound,
            "{id}"
        );
    }
    assert_eq!(code(c.get_snapshot(get("")).await).0, Code::InvalidArgument);
    c.delete_snapshot(DeleteSnapshotRequest {
        snapshot_id: s1.snapshot_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(
        code(c.get_snapshot(get(&s1.snapshot_id)).await).0,
        Code::NotFound
    );
}
