//! Replicated volumes on the fake host (its md model in testing/md.rs): the RAID1 created over
//! every leg and staged, a degraded stage, a lost leg reported and re-added when its appliance
//! is back, a restarted node re-assembling from the legs, expansion, unstage, and refusals.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use edgevol_driver::fleet::{leg_key, LEG_VOLUME_ID, REPLICAS};
use edgevol_proto::csi::v1::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume,
};
use edgevol_proto::csi::v1::{NodeStageVolumeRequest, VolumeCapability};

use crate::error::Error;
use crate::fabrics::{FabricsConfig, HostIdentity};
use crate::host::Host;
use crate::legs::{self, ReplicatedStageRequest};
use crate::state::StateStore;
use crate::testing::FakeHost;
use crate::volume::{ExpandRequest, PublishRequest, Usage, VolumeConfig, Volumes};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const ID: &str = "box-0-v7+box-1-v7";
/// Each leg: 64 MiB of 512-byte sectors; the md device 1 MiB less.
const LEG_SECTORS: u64 = 131_072;
const MD_BYTES: u64 = (LEG_SECTORS - 2048) * 512;

struct Env {
    host: Arc<FakeHost>,
    store: StateStore,
    volumes: Arc<Volumes>,
}

fn volumes_on(host: &Arc<FakeHost>, store: &StateStore) -> Volumes {
    let cfg = VolumeConfig {
        host: HostIdentity {
            nqn: HOSTNQN.into(),
            id: None,
        },
        fabrics: FabricsConfig::default(),
        device_wait: Duration::from_secs(1),
        poll: Duration::from_millis(100),
    };
    let dyn_host: Arc<dyn Host> = host.clone();
    Volumes::new(dyn_host, store.clone(), cfg)
}

fn env() -> Env {
    let host = Arc::new(FakeHost::new());
    for i in 0..2 {
        host.add_subsystem(
            &leg_nqn(i),
            &format!("{:032x}", i + 1),
            "00000000-0000-0000-0000-000000000000",
            LEG_SECTORS,
        );
    }
    let store = StateStore::open(host.work.join("state")).unwrap();
    Env {
        volumes: Arc::new(volumes_on(&host, &store)),
        store,
        host,
    }
}

fn leg_nqn(i: usize) -> String {
    format!("nqn.2024-11.io.edgevol:box-{i}:v7")
}

impl Env {
    fn staging(&self) -> PathBuf {
        self.host.work.join("staging/rep")
    }

    fn stage_req(&self, block: bool, mode: Mode) -> ReplicatedStageRequest {
        legs::stage_request(&self.stage_request(block, mode))
            .unwrap()
            .unwrap()
    }

    /// NodeStageVolume of the volume as the CO sends it.
    fn stage_request(&self, block: bool, mode: Mode) -> NodeStageVolumeRequest {
        let mut ctx = HashMap::from([(REPLICAS.to_owned(), "2".to_owned())]);
        for i in 0..2 {
            for (k, v) in [
                ("transport", "tcp".to_owned()),
                ("targetAddress", format!("10.0.{i}.2")),
                ("targetPort", "4420".to_owned()),
                ("subsystemNqn", leg_nqn(i)),
                ("nguid", format!("{:032x}", i + 1)),
                (LEG_VOLUME_ID, format!("box-{i}-v7")),
            ] {
                ctx.insert(leg_key(i, k), v);
            }
        }
        NodeStageVolumeRequest {
            volume_id: ID.into(),
            publish_context: ctx,
            staging_target_path: self.staging().to_string_lossy().into_owned(),
            volume_capability: Some(VolumeCapability {
                access_mode: Some(AccessMode { mode: mode as i32 }),
                access_type: Some(if block {
                    AccessType::Block(BlockVolume {})
                } else {
                    AccessType::Mount(MountVolume::default())
                }),
            }),
            secrets: HashMap::new(),
            volume_context: HashMap::new(),
        }
    }

    fn stage(&self, block: bool) {
        self.volumes
            .stage_replicated(&self.stage_req(block, Mode::SingleNodeWriter))
            .unwrap();
    }

    fn mdadm(&self) -> Vec<String> {
        self.host
            .commands_of("mdadm")
            .into_iter()
            .map(|a| a.join(" "))
            .collect()
    }

    fn condition(&self) -> Option<String> {
        self.volumes.stats(ID, &self.staging()).unwrap().abnormal
    }
}

#[test]
fn stage_connects_every_leg_failing_fast_and_mounts_a_clean_raid1_of_the_requested_size() {
    let e = env();
    e.stage(false);
    let writes = e.host.fabrics_writes();
    assert_eq!(writes.len(), 2);
    for (i, w) in writes.iter().enumerate() {
        assert!(w.contains(&format!("nqn={}", leg_nqn(i))), "{w}");
        assert!(
            w.split(',').any(|o| o == "fast_io_fail_tmo=5"),
            "legs fail fast: {w}"
        );
    }
    let array = crate::raid::array_name(ID);
    assert_eq!(
        e.mdadm(),
        [
            "--examine /DEV/nvme0n1".to_owned(),
            "--examine /DEV/nvme1n1".to_owned(),
            format!(
                "--create /dev/md/{array} --run --level=1 --raid-devices=2 --metadata=1.2 \
                 --bitmap=internal --assume-clean --data-offset=1M --uuid={} /DEV/nvme0n1 \
                 /DEV/nvme1n1",
                crate::raid::array_uuid(&array)
            ),
        ]
        .map(|c| c.replace("/DEV", &e.host.dev_root().display().to_string()))
    );
    assert_eq!(e.host.md_arrays(), ["md127"]);
    assert_eq!(e.host.md_members("md127"), ["nvme0n1", "nvme1n1"]);
    assert_eq!(e.host.mounts(), [(e.staging(), false)]);
    let mkfs = e.host.commands_of("mkfs.ext4");
    assert!(mkfs[0].last().unwrap().ends_with("/md127"), "{mkfs:?}");
    let rec = e.store.get(ID).unwrap().unwrap();
    let rep = rec.replicated.unwrap();
    assert_eq!(rep.array, array);
    assert_eq!(rep.legs[1].volume_id, "box-1-v7");
    assert_eq!(rep.legs[1].appliance, "box-1");

    // A retry changes nothing; the volume publishes and reads as a healthy volume.
    e.stage(false);
    assert_eq!(e.host.fabrics_writes().len(), 2);
    assert_eq!(e.mdadm().len(), 3);
    let target = e.host.work.join("pods/p/vol");
    let cap = e.stage_req(false, Mode::SingleNodeWriter).capability;
    e.volumes
        .publish(&PublishRequest {
            volume_id: ID.into(),
            staging_path: e.staging(),
            target_path: target.clone(),
            capability: cap,
            read_only: false,
        })
        .unwrap();
    assert_eq!(e.condition(), None);
    let block = env();
    block.stage(true);
    let stats = block.volumes.stats(ID, &block.staging()).unwrap();
    assert_eq!(
        stats.usage,
        Usage::Block(MD_BYTES),
        "exactly the requested capacity"
    );
    assert_eq!(stats.abnormal, None);
    assert!(block.host.mounts().is_empty());
}

#[test]
fn a_volume_restored_from_another_ones_snapshot_gets_its_own_array_beside_the_source() {
    // The restored legs carry the source's md superblock (its UUID): mdadm refuses them while
    // the source's array runs here, unless the assembly gives them this volume's own UUID.
    let e = env();
    e.stage(false);
    let restored_id = "box-0-v8+box-1-v8";
    let mut req = e.stage_request(false, Mode::SingleNodeWriter);
    req.volume_id = restored_id.into();
    req.staging_target_path = e
        .host
        .work
        .join("staging/restored")
        .to_string_lossy()
        .into();
    for i in 0..2 {
        let (nqn, nguid) = (
            format!("nqn.2024-11.io.edgevol:box-{i}:v8"),
            format!("{:032x}", i + 3),
        );
        e.host.add_subsystem(
            &nqn,
            &nguid,
            "00000000-0000-0000-0000-000000000000",
            LEG_SECTORS,
        );
        e.host
            .md_copy_superblock(&format!("{:032x}", i + 1), &nguid);
        req.publish_context.insert(leg_key(i, "subsystemNqn"), nqn);
        req.publish_context.insert(leg_key(i, "nguid"), nguid);
        req.publish_context
            .insert(leg_key(i, LEG_VOLUME_ID), format!("box-{i}-v8"));
    }
    e.volumes
        .stage_replicated(&legs::stage_request(&req).unwrap().unwrap())
        .unwrap();
    let array = crate::raid::array_name(restored_id);
    let assemble = e
        .mdadm()
        .into_iter()
        .find(|c| c.starts_with("--assemble"))
        .unwrap();
    assert!(
        assemble.contains(&format!(
            "--update=uuid --uuid={}",
            crate::raid::array_uuid(&array)
        )),
        "{assemble}"
    );
    assert_eq!(e.host.md_arrays(), ["md126", "md127"]);
    assert_eq!(e.host.md_members("md126"), ["nvme2n1", "nvme3n1"]);
    // Its next assembly (a restarted node) needs no new UUID.
    assert_eq!(e.condition(), None);
}

#[test]
fn unstage_stops_the_array_and_disconnects_every_leg() {
    let e = env();
    e.stage(false);
    e.volumes.unstage(ID, &e.staging()).unwrap();
    assert!(e.host.mounts().is_empty());
    assert!(e.host.md_arrays().is_empty());
    assert!(e.host.controller_names().is_empty());
    assert!(e.store.get(ID).unwrap().is_none());
    let stop = e.mdadm().pop().unwrap();
    assert!(
        stop.starts_with("--stop ") && stop.ends_with("/md127"),
        "{stop}"
    );
    // Again: nothing staged, OK.
    e.volumes.unstage(ID, &e.staging()).unwrap();

    // A box gone at unstage: its leg's controller is deleted all the same.
    let e = env();
    e.stage(true);
    e.host.set_controller_state("nvme1", "connecting");
    e.host.md_fail_member("md127", "nvme1n1");
    e.volumes.unstage(ID, &e.staging()).unwrap();
    assert!(e.host.controller_names().is_empty());
    assert!(e.host.md_arrays().is_empty());
}

#[test]
fn a_lost_leg_is_reported_and_re_added_when_its_appliance_is_back() {
    let e = env();
    e.stage(false);
    // box-1 goes away: its controller reconnects, md fails the member after fast_io_fail_tmo.
    e.host.set_controller_state("nvme1", "connecting");
    e.host.md_fail_member("md127", "nvme1n1");
    assert_eq!(
        e.condition().as_deref(),
        Some("degraded: leg box-1-v7 (box-1) missing")
    );
    assert_eq!(e.volumes.heal_replicated(), 0, "not while it is away");

    // It is back: the next NodeGetVolumeStats re-adds the leg; md resyncs what the bitmap marks.
    e.host.set_controller_state("nvme1", "live");
    e.host.md_sync_progress("md127", 0);
    let cond = e.condition().unwrap();
    assert!(
        cond.starts_with("degraded: leg box-1-v7 (box-1) resyncing"),
        "{cond}"
    );
    let dev = e.host.dev_root().display().to_string();
    let tail: Vec<String> = e.mdadm().split_off(3);
    assert_eq!(
        tail,
        [
            format!("{dev}/md127 --remove failed"),
            format!("--examine {dev}/nvme1n1"),
            format!("{dev}/md127 --re-add {dev}/nvme1n1"),
        ]
    );
    e.host.md_sync_progress("md127", (LEG_SECTORS - 2048) / 2);
    let cond = e.condition().unwrap();
    assert!(cond.ends_with("resyncing, 50% done"), "{cond}");
    e.host.md_finish_resync("md127");
    assert_eq!(e.condition(), None);
    assert_eq!(e.mdadm().len(), 6, "nothing more to do");
}

#[test]
fn a_leg_whose_controller_the_kernel_gave_up_is_connected_again_by_the_periodic_check() {
    let e = env();
    e.stage(true);
    e.host.md_fail_member("md127", "nvme0n1");
    e.host.remove_controller_named("nvme0");
    assert_eq!(
        e.condition().as_deref(),
        Some("degraded: leg box-0-v7 (box-0) missing")
    );
    assert_eq!(e.volumes.heal_replicated(), 1);
    // Connected again (as nvme0 anew), the stale member dropped, the leg re-added.
    let dev = e.host.dev_root().display().to_string();
    let tail: Vec<String> = e.mdadm().split_off(3);
    assert_eq!(
        tail,
        [
            format!("{dev}/md127 --remove failed"),
            format!("--examine {dev}/nvme0n1"),
            format!("{dev}/md127 --re-add {dev}/nvme0n1"),
        ]
    );
    assert!(e.host.fabrics_writes()[2]
        .split(',')
        .any(|o| o == "fast_io_fail_tmo=5"));
    e.host.md_finish_resync("md127");
    assert_eq!(e.condition(), None);
}

#[test]
fn reconnecting_a_leg_holds_no_lock_and_is_undone_for_a_volume_unstaged_meanwhile() {
    let e = env();
    e.stage(true);
    e.host.md_fail_member("md127", "nvme1n1");
    e.host.remove_controller_named("nvme1");
    // While the periodic check's connect waits for the kernel, the CO unstages the volume: it
    // goes through (it would wait forever for a lock held across the connect).
    let (volumes, staging) = (e.volumes.clone(), e.staging());
    e.host
        .during_next_connect(move || volumes.unstage(ID, &staging).unwrap());
    assert_eq!(e.volumes.heal_replicated(), 0);
    assert!(e.store.get(ID).unwrap().is_none());
    assert!(e.host.md_arrays().is_empty());
    assert!(
        e.host.controller_names().is_empty(),
        "the leg connected meanwhile is disconnected again"
    );
}

#[test]
fn a_leg_that_cannot_connect_stages_degraded_and_joins_with_a_full_sync_later() {
    let e = env();
    e.host.fail_next("connect"); // box-0 refuses
    e.stage(false);
    let dev = e.host.dev_root().display().to_string();
    let create = e.mdadm().pop().unwrap();
    assert!(
        create.ends_with(&format!(
            "--data-offset=1M --uuid={} missing {dev}/nvme0n1",
            crate::raid::array_uuid(&crate::raid::array_name(ID))
        )),
        "{create}"
    );
    assert_eq!(e.host.mounts().len(), 1, "staged, degraded");
    assert_eq!(
        e.condition().as_deref(),
        Some("degraded: leg box-0-v7 (box-0) missing")
    );
    // The leg never held the array: it is added whole once its box answers.
    assert_eq!(e.volumes.heal_replicated(), 1);
    assert!(e
        .mdadm()
        .last()
        .unwrap()
        .ends_with(&format!("--add {dev}/nvme1n1")));
    e.host.md_finish_resync("md127");
    assert_eq!(e.condition(), None);
}

#[test]
fn no_leg_at_all_is_an_error_naming_each_leg_and_leaves_nothing() {
    let e = env();
    e.host.fail_next("connect");
    e.host.fail_next("connect");
    let err = e
        .volumes
        .stage_replicated(&e.stage_req(false, Mode::SingleNodeWriter))
        .unwrap_err();
    assert!(
        matches!(&err, Error::Unavailable(m)
            if m.contains("no leg could be connected") && m.contains("leg box-0-v7 (box-0)")
                && m.contains("leg box-1-v7 (box-1)")),
        "{err}"
    );
    assert!(e.store.get(ID).unwrap().is_none());
    assert!(e.mdadm().is_empty());
}

#[test]
fn no_initiator_is_failed_precondition_naming_the_module_before_anything_is_touched() {
    let e = env();
    // No /dev/nvme-fabrics, and modprobe cannot load nvme-tcp: refused before a record, a
    // connect or an mdadm, as a single volume's stage is.
    e.host.remove_initiator();
    let err = e
        .volumes
        .stage_replicated(&e.stage_req(false, Mode::SingleNodeWriter))
        .unwrap_err();
    assert!(
        matches!(&err, Error::FailedPrecondition(m) if m.contains(ID)
            && m.contains("no /dev/nvme-fabrics (module nvme-fabrics not loaded)")
            && m.contains("modprobe nvme-tcp")
            && m.contains("CONFIG_NVME_TCP")),
        "{err}"
    );
    assert!(e.store.get(ID).unwrap().is_none(), "no record");
    assert!(e.host.fabrics_writes().is_empty(), "no connect");
    assert!(e.mdadm().is_empty());
    assert_eq!(
        e.host.commands_of("modprobe"),
        vec![vec!["nvme-tcp".to_owned()]],
        "one more try to load it"
    );
    // Once the module can be loaded, the retry loads it and stages.
    e.host.set_loadable(&["nvme-fabrics", "nvme-tcp"]);
    e.stage(false);
    assert_eq!(e.host.fabrics_writes().len(), 2);
    assert_eq!(e.host.commands_of("modprobe").len(), 2);
}

#[test]
fn a_restarted_node_assembles_the_array_from_its_legs_degraded_if_one_is_missing() {
    let e = env();
    e.stage(true);
    // The node reboots while box-1 is down: md is gone, so is box-1's controller.
    let dev = e.host.dev_root().display().to_string();
    e.host
        .run("mdadm", &["--stop".into(), format!("{dev}/md127")])
        .unwrap();
    e.host.remove_controller_named("nvme1");
    e.host.fail_next("connect"); // box-1 still refuses... (box-0's controller survived)
    let restarted = volumes_on(&e.host, &e.store);
    assert_eq!(restarted.adopt(), 0);
    restarted
        .stage_replicated(&e.stage_req(true, Mode::SingleNodeWriter))
        .unwrap();
    let assemble = e.mdadm().pop().unwrap();
    assert_eq!(
        assemble,
        format!(
            "--assemble /dev/md/{} --run {dev}/nvme0n1",
            crate::raid::array_name(ID)
        )
    );
    assert_eq!(e.host.md_members("md127"), ["nvme0n1"]);
    assert_eq!(
        restarted
            .stats(ID, &e.staging())
            .unwrap()
            .abnormal
            .as_deref(),
        Some("degraded: leg box-1-v7 (box-1) missing")
    );
    // box-1 back: the periodic check connects it and re-adds it.
    assert_eq!(restarted.heal_replicated(), 1);
    assert!(e.mdadm().last().unwrap().contains("--re-add"));
}

#[test]
fn an_array_udev_assembled_in_part_is_started_not_assembled_again() {
    let e = env();
    e.stage(true);
    let dev = e.host.dev_root().display().to_string();
    e.host
        .run("mdadm", &["--stop".into(), format!("{dev}/md127")])
        .unwrap();
    // The node restarts; box-1 is down; udev's incremental assembly holds box-0's leg.
    e.host.remove_controller_named("nvme1");
    e.host.md_incremental("nvme0n1");
    e.host.fail_next("connect");
    e.stage(true);
    assert_eq!(
        e.mdadm().pop().unwrap(),
        format!("--run {dev}/md127"),
        "started, not assembled a second time"
    );
    assert_eq!(
        e.volumes.stats(ID, &e.staging()).unwrap().usage,
        Usage::Block(MD_BYTES)
    );
    assert_eq!(
        e.condition().as_deref(),
        Some("degraded: leg box-1-v7 (box-1) missing")
    );
}

#[test]
fn a_controller_connected_by_an_older_plugin_gets_the_legs_timeout_at_start() {
    let e = env();
    e.stage(true);
    for c in ["nvme0", "nvme1"] {
        e.host
            .write_attr(
                &e.host
                    .sys_root()
                    .join(format!("class/nvme/{c}/fast_io_fail_tmo")),
                "90",
            )
            .unwrap();
    }
    assert_eq!(volumes_on(&e.host, &e.store).adopt(), 2);
    assert_eq!(e.host.attr("nvme0", "fast_io_fail_tmo"), "5");
    assert_eq!(e.host.attr("nvme1", "fast_io_fail_tmo"), "5");
}

#[test]
fn expansion_grows_every_leg_then_the_array_then_the_filesystem() {
    let e = env();
    e.stage(false);
    let grown = 2 * LEG_SECTORS;
    for i in 0..2 {
        e.host.grow_subsystem(&leg_nqn(i), grown);
    }
    let want = (grown - 2048) * 512;
    let size = e
        .volumes
        .expand(&ExpandRequest {
            volume_id: ID.into(),
            volume_path: e.staging(),
            required_bytes: want,
            limit_bytes: 0,
            access: None,
            key: None,
        })
        .unwrap();
    assert_eq!(size, want);
    let dev = e.host.dev_root().display().to_string();
    assert_eq!(
        e.mdadm().last().unwrap(),
        &format!("--grow {dev}/md127 --size=max")
    );
    let resize = e.host.commands_of("resize2fs");
    assert_eq!(resize, [vec![format!("{dev}/md127")]]);

    // Degraded: refused until every leg is back.
    e.host.md_fail_member("md127", "nvme1n1");
    e.host.set_controller_state("nvme1", "connecting");
    let err = e
        .volumes
        .expand(&ExpandRequest {
            volume_id: ID.into(),
            volume_path: e.staging(),
            required_bytes: want + (1 << 20),
            limit_bytes: 0,
            access: None,
            key: None,
        })
        .unwrap_err();
    assert!(
        matches!(&err, Error::Unavailable(m) if m.contains("every leg in sync")),
        "{err}"
    );
    if let Usage::Filesystem(_) = e.volumes.stats(ID, &e.staging()).unwrap().usage {
    } else {
        panic!("a mounted volume reports filesystem usage");
    }
}

#[test]
fn the_legs_flags_are_checked_at_start() {
    use clap::Parser;
    for bad in [
        "--leg-fast-io-fail-tmo=0",
        "--leg-fast-io-fail-tmo=-1",
        "--replica-check-secs=0",
    ] {
        let args = crate::Args::parse_from(["edgevol-node", bad]);
        let host: Arc<dyn Host> = Arc::new(FakeHost::new());
        let e = crate::build_with_keys(&args, host, None).unwrap_err();
        assert!(
            e.contains("--leg-fast-io-fail-tmo must be 1 to 60"),
            "{bad}: {e}"
        );
    }
}

#[tokio::test]
async fn node_stage_volume_with_replicas_in_its_publish_context_stages_the_legs() {
    use crate::csi::node::{NodeInfo, NodeService};
    use edgevol_proto::csi::v1::node_server::Node;
    let e = env();
    let node = NodeService::new(e.volumes.clone(), NodeInfo::default());
    let mut req = e.stage_request(true, Mode::SingleNodeWriter);
    req.publish_context.remove("leg1.subsystemNqn");
    let status = node
        .node_stage_volume(tonic::Request::new(req))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("leg1.subsystemNqn"), "{status:?}");
    node.node_stage_volume(tonic::Request::new(
        e.stage_request(true, Mode::SingleNodeWriter),
    ))
    .await
    .unwrap();
    assert_eq!(e.host.md_members("md127"), ["nvme0n1", "nvme1n1"]);
}

#[test]
fn what_cannot_work_is_refused_clearly() {
    let e = env();
    let err = e
        .volumes
        .stage_replicated(&e.stage_req(true, Mode::MultiNodeMultiWriter))
        .unwrap_err();
    assert!(
        matches!(&err, Error::FailedPrecondition(m) if m.contains("multi-node writer")),
        "{err}"
    );
    assert!(e.host.fabrics_writes().is_empty());
    e.stage(true);
    let other = e.stage_req(false, Mode::SingleNodeWriter);
    let err = e.volumes.stage_replicated(&other).unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err}");

    // A node without mdadm: said so, with what to install.
    let e = env();
    e.host.remove_mdadm();
    let err = e
        .volumes
        .stage_replicated(&e.stage_req(true, Mode::SingleNodeWriter))
        .unwrap_err();
    assert!(
        matches!(&err, Error::FailedPrecondition(m)
            if m.contains("mdadm is not installed") && m.contains("raid1")),
        "{err}"
    );

    // A leg mdadm cannot read is never taken for a new one.
    let e = env();
    e.host.fail_next_with(
        "mdadm",
        2,
        "mdadm: cannot open /dev/nvme0n1: Input/output error",
    );
    let err = e
        .volumes
        .stage_replicated(&e.stage_req(true, Mode::SingleNodeWriter))
        .unwrap_err();
    assert!(
        matches!(&err, Error::Internal(m) if m.contains("Input/output error")),
        "{err}"
    );
    assert!(!e.mdadm().iter().any(|c| c.starts_with("--create")));
}

#[test]
fn an_encrypted_replicated_volume_puts_luks2_on_the_md_array() {
    // md mirrors ciphertext: the LUKS2 header is on the array, the mapping on top is staged,
    // and unstage closes the mapping before it stops the array. The passphrase reaches
    // cryptsetup's stdin only.
    let key = "rep-passphrase-9";
    let e = env();
    let mut req = e.stage_request(false, Mode::SingleNodeWriter);
    req.volume_context
        .insert(crate::crypt::ENCRYPTED_PARAM.into(), "true".into());
    let op = legs::stage_request(&req).unwrap_err();
    assert!(
        matches!(&op, Error::InvalidArgument(m) if m.contains(crate::crypt::PASSPHRASE_KEY)),
        "{op}"
    );
    req.secrets
        .insert(crate::crypt::PASSPHRASE_KEY.into(), key.into());
    let op = legs::stage_request(&req).unwrap().unwrap();
    e.volumes.stage_replicated(&op).unwrap();
    e.volumes.stage_replicated(&op).unwrap();
    let runs = e.host.cryptsetup_runs();
    let verbs: Vec<&str> = runs.iter().map(|(a, _)| a[0].as_str()).collect();
    assert_eq!(verbs, ["luksFormat", "open"]);
    let md = e.host.md_arrays()[0].clone();
    assert!(
        runs[0].0.last().unwrap().ends_with(&format!("/{md}")),
        "{runs:?}"
    );
    let mapping = crate::crypt::mapping_name(ID);
    assert_eq!(e.host.luks_mapping(&mapping), Some(("dm-0".into(), md)));
    let mkfs = e.host.commands_of("mkfs.ext4");
    assert!(mkfs[0].last().unwrap().ends_with("/dm-0"), "{mkfs:?}");
    assert_eq!(e.condition(), None);

    let from = e.host.ops().len();
    e.volumes.unstage(ID, &e.staging()).unwrap();
    let ops = e.host.ops()[from..].to_vec();
    let at = |p: &str| ops.iter().position(|o| o.starts_with(p)).unwrap();
    assert!(
        at("run cryptsetup close") < at("run mdadm --stop"),
        "{ops:?}"
    );
    assert_eq!(e.host.luks_mapping(&mapping), None);
    for (program, args) in e.host.all_commands() {
        assert!(!args.iter().any(|a| a.contains(key)), "{program} {args:?}");
    }
}
