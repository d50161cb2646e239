//! Stage/publish/unpublish/unstage/stats/expand flows against the fake host, including a retry
//! after a failure at each step: the CSI spec's error-table rows and idempotency of the Node
//! service. Each flow runs for a plain and for an encrypted volume ([`Flavour`]); what only an
//! encrypted volume answers (a missing or wrong key, no dm-crypt) is in `crypt_tests`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use edgevol_proto::csi::v1::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume,
};
use edgevol_proto::csi::v1::{NodeStageVolumeRequest, VolumeCapability};

use crate::crypt::{Passphrase, ENCRYPTED_PARAM, PASSPHRASE_KEY};
use crate::csi::request;
use crate::error::Error;
use crate::fabrics::{FabricsConfig, HostIdentity};
use crate::host::Host;
use crate::state::StateStore;
use crate::testing::{FakeHost, LUKS_HEADER_SECTORS};
use crate::volume::{
    Access, ExpandRequest, PublishRequest, StageRequest, Usage, VolumeConfig, Volumes,
};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const KEY: &str = "correct-horse-battery-staple";

/// The volume a flow stages: plain, or encrypted (volume_context `encrypted: "true"`, the
/// passphrase in NodeStageVolume's and NodeExpandVolume's secrets, LUKS2 on the namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavour {
    Plain,
    Encrypted,
}

/// Runs each named flow once per [`Flavour`], as the tests `NAME::plain` and `NAME::encrypted`.
macro_rules! for_each_flavour {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::Flavour;

            #[test]
            fn plain() {
                super::$name(Flavour::Plain)
            }

            #[test]
            fn encrypted() {
                super::$name(Flavour::Encrypted)
            }
        }
    )*};
}

for_each_flavour!(
    mount_volume_full_cycle,
    block_volume_full_cycle,
    reuses_a_live_controller_after_a_restart,
    stage_retry_after_a_failure_at_each_step,
    waits_for_udev_but_not_forever,
    restage_with_other_capability_or_path_is_refused,
    unstage_retry_after_a_failure_at_each_step,
    publish_retry_after_failed_read_only_remount,
    disconnect_only_when_no_other_staged_volume_uses_the_controller,
    single_node_single_writer_refuses_a_second_writer,
    error_rows_of_publish_stats_expand_unstage,
    expand_rescans_and_grows,
    stage_of_a_volume_the_target_refuses_is_not_found_and_leaves_nothing,
    stage_without_the_tcp_transport_is_a_failed_precondition_unless_the_kernel_loads_it,
    stage_loads_a_missing_nvme_fabrics_before_it_connects,
    unpublish_touches_only_the_volumes_own_publication,
    publish_again_at_the_same_target_with_other_arguments_is_already_exists,
    expand_error_rows,
);

/// The host operations a flow injects a failure at, and for an encrypted volume cryptsetup
/// too (its first run: luksFormat at a first stage, close at an unstage).
fn with_crypt(flavour: Flavour, steps: &[&'static str]) -> Vec<&'static str> {
    let mut steps = steps.to_vec();
    if flavour == Flavour::Encrypted {
        steps.push("cryptsetup");
    }
    steps
}

struct Env {
    host: Arc<FakeHost>,
    volumes: Volumes,
    store: StateStore,
    flavour: Flavour,
}

fn env(flavour: Flavour) -> Env {
    let host = Arc::new(FakeHost::new());
    let store = StateStore::open(host.work.join("state")).unwrap();
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
    Env {
        volumes: Volumes::new(dyn_host, store.clone(), cfg),
        store,
        host,
        flavour,
    }
}

fn nqn(n: u32) -> String {
    format!("nqn.2024-01.io.edgevol:box1:vol{n}")
}

fn nguid(n: u32) -> String {
    format!("{n:032x}")
}

fn cap(block: bool, mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume {
                fs_type: String::new(),
                mount_flags: vec!["noatime".into()],
                volume_mount_group: String::new(),
            })
        }),
    }
}

impl Env {
    /// The disk a staged volume's filesystem or block device is (the first volume staged).
    fn disk(&self) -> &'static str {
        match self.flavour {
            Flavour::Plain => "nvme0n1",
            Flavour::Encrypted => "dm-0",
        }
    }

    /// What unstage flushes, in order: the mapping (if any), then the namespace.
    fn synced_on_unstage(&self) -> Vec<PathBuf> {
        let dev = self.host.dev_root();
        match self.flavour {
            Flavour::Plain => vec![dev.join("nvme0n1")],
            Flavour::Encrypted => vec![dev.join("dm-0"), dev.join("nvme0n1")],
        }
    }

    /// The bytes the workload gets of a namespace of `sectors` (LUKS2 keeps its header).
    fn usable(&self, sectors: u64) -> u64 {
        match self.flavour {
            Flavour::Plain => sectors * 512,
            Flavour::Encrypted => (sectors - LUKS_HEADER_SECTORS) * 512,
        }
    }

    /// NodeExpandVolume of `volume_id` at `path`, with the node-expand secret when encrypted.
    fn grow(&self, volume_id: &str, path: &Path, required_bytes: u64) -> ExpandRequest {
        ExpandRequest {
            volume_id: volume_id.into(),
            volume_path: path.to_owned(),
            required_bytes,
            limit_bytes: 0,
            access: None,
            key: (self.flavour == Flavour::Encrypted)
                .then(|| Passphrase::parse(PASSPHRASE_KEY, KEY).unwrap()),
        }
    }

    fn staging(&self, n: u32) -> PathBuf {
        self.host.work.join(format!("staging/vol{n}"))
    }

    fn target(&self, n: u32, pod: &str) -> PathBuf {
        self.host.work.join(format!("pods/{pod}/vol{n}"))
    }

    /// Volume `n` behind its own subsystem, as the controller would publish it.
    fn stage_req(&self, n: u32, block: bool) -> StageRequest {
        self.host.add_subsystem(
            &nqn(n),
            &nguid(n),
            "00000000-0000-0000-0000-000000000000",
            2048,
        );
        self.stage_req_with(n, cap(block, Mode::SingleNodeWriter))
    }

    fn stage_req_with(&self, n: u32, capability: VolumeCapability) -> StageRequest {
        let mut req = NodeStageVolumeRequest {
            volume_id: format!("vol{n}"),
            publish_context: HashMap::from([
                ("transport".into(), "tcp".into()),
                ("targetAddress".into(), "10.0.0.2".into()),
                ("targetPort".into(), "4420".into()),
                ("subsystemNqn".into(), nqn(n)),
                ("nguid".into(), nguid(n)),
            ]),
            staging_target_path: self.staging(n).to_string_lossy().into_owned(),
            volume_capability: Some(capability),
            secrets: HashMap::from([("password".into(), "hunter2".into())]),
            volume_context: HashMap::new(),
        };
        if self.flavour == Flavour::Encrypted {
            req.volume_context
                .insert(ENCRYPTED_PARAM.into(), "true".into());
            req.secrets.insert(PASSPHRASE_KEY.into(), KEY.into());
        }
        request::stage(&req).unwrap()
    }

    fn publish_req(&self, s: &StageRequest, pod: &str, read_only: bool) -> PublishRequest {
        PublishRequest {
            volume_id: s.volume_id.clone(),
            staging_path: s.staging_path.clone(),
            target_path: self.target(s.volume_id[3..].parse().unwrap(), pod),
            capability: s.capability.clone(),
            read_only,
        }
    }

    fn mounted(&self, p: &Path) -> Option<bool> {
        self.host
            .mounts()
            .into_iter()
            .rev()
            .find(|(m, _)| m == p)
            .map(|(_, ro)| ro)
    }
}

fn mount_volume_full_cycle(f: Flavour) {
    let e = env(f);
    let s = e.stage_req(1, false);
    e.volumes.stage(&s).unwrap();
    assert_eq!(e.host.fabrics_writes().len(), 1);
    assert_eq!(e.host.commands_of("mkfs.ext4").len(), 1);
    assert_eq!(e.mounted(&s.staging_path), Some(false));
    let mount_args = &e.host.commands_of("mount")[0];
    assert_eq!(
        mount_args[..4],
        ["-t", "ext4", "-o", "noatime"].map(String::from)
    );

    // Stage again: nothing new happens.
    e.volumes.stage(&s).unwrap();
    assert_eq!(e.host.fabrics_writes().len(), 1);
    assert_eq!(e.host.commands_of("mkfs.ext4").len(), 1);
    assert_eq!(e.host.commands_of("mount").len(), 1);

    let p = e.publish_req(&s, "a", true);
    e.volumes.publish(&p).unwrap();
    e.volumes.publish(&p).unwrap();
    assert_eq!(e.mounted(&p.target_path), Some(true), "read-only honoured");
    assert_eq!(
        e.host.commands_of("mount").len(),
        3,
        "bind + remount ro, once"
    );

    let stats = e.volumes.stats("vol1", &p.target_path).unwrap();
    assert!(matches!(stats.usage, Usage::Filesystem(u) if u.total_inodes == 65536));
    assert_eq!(stats.abnormal, None);

    // Unstage while published is refused, nothing torn down.
    let err = e.volumes.unstage("vol1", &s.staging_path).unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err}");
    assert_eq!(e.host.controller_names(), ["nvme0"]);

    e.volumes.unpublish("vol1", &p.target_path).unwrap();
    e.volumes.unpublish("vol1", &p.target_path).unwrap();
    assert!(
        !p.target_path.exists(),
        "unpublish removes the target it created"
    );
    e.volumes.unstage("vol1", &s.staging_path).unwrap();
    assert_eq!(e.mounted(&s.staging_path), None);
    assert_eq!(e.host.synced(), e.synced_on_unstage());
    assert!(e.host.controller_names().is_empty(), "disconnected");
    assert_eq!(e.store.get("vol1").unwrap(), None);
    // Unstage again: OK.
    e.volumes.unstage("vol1", &s.staging_path).unwrap();
}

fn block_volume_full_cycle(f: Flavour) {
    let e = env(f);
    let s = e.stage_req(2, true);
    e.volumes.stage(&s).unwrap();
    assert!(e.host.commands_of("mkfs.ext4").is_empty());
    // A raw block volume's data is never probed (an encrypted one's namespace is, for its
    // LUKS2 header).
    let probed = e.host.commands_of("blkid");
    match e.flavour {
        Flavour::Plain => assert!(probed.is_empty(), "{probed:?}"),
        Flavour::Encrypted => assert!(
            probed
                .iter()
                .all(|a| a.last().unwrap().ends_with("/nvme0n1")),
            "{probed:?}"
        ),
    }
    let rec = e.store.get("vol2").unwrap().unwrap();
    assert_eq!(rec.disk.as_deref(), Some(e.disk()));
    assert_eq!(rec.controller.as_deref(), Some("nvme0"));
    let p = e.publish_req(&s, "b", false);
    e.volumes.publish(&p).unwrap();
    // Publish again: the bind is found (nothing new happens), stage again likewise.
    e.volumes.publish(&p).unwrap();
    e.volumes.stage(&s).unwrap();
    assert_eq!(e.host.commands_of("mount").len(), 1, "one bind");
    assert!(p.target_path.is_file(), "target file created");
    let bind = &e.host.commands_of("mount")[0];
    assert_eq!(bind[1], e.host.dev_root().join(e.disk()).to_string_lossy());
    assert_eq!(e.mounted(&p.target_path), Some(false));
    let stats = e.volumes.stats("vol2", &p.target_path).unwrap();
    assert_eq!(stats.usage, Usage::Block(e.usable(2048)));
    e.volumes.unpublish("vol2", &p.target_path).unwrap();
    e.volumes.unpublish("vol2", &p.target_path).unwrap();
    assert!(!p.target_path.exists());
    e.volumes.unstage("vol2", &s.staging_path).unwrap();
    e.volumes.unstage("vol2", &s.staging_path).unwrap();
    assert!(e.host.controller_names().is_empty());
}

fn reuses_a_live_controller_after_a_restart(f: Flavour) {
    let e = env(f);
    let s = e.stage_req(1, false);
    e.volumes.stage(&s).unwrap();
    // The plugin restarts and the CO retries: the state file and the kernel agree.
    e.store.remove("vol1").unwrap();
    e.volumes.stage(&s).unwrap();
    assert_eq!(e.host.fabrics_writes().len(), 1, "no second connect");
    assert_eq!(e.host.commands_of("mount").len(), 1, "no second mount");
}

fn stage_retry_after_a_failure_at_each_step(f: Flavour) {
    for step in with_crypt(f, &["connect", "blkid", "mkfs.ext4", "mount"]) {
        let e = env(f);
        let s = e.stage_req(1, false);
        e.host.fail_next(step);
        let err = e.volumes.stage(&s).unwrap_err();
        assert!(!err.to_string().is_empty(), "{step}");
        assert!(
            e.store.get("vol1").unwrap().is_some(),
            "{step}: intent recorded"
        );
        e.volumes.stage(&s).unwrap();
        assert_eq!(e.mounted(&s.staging_path), Some(false), "{step}");
        assert_eq!(e.host.controller_names(), ["nvme0"], "{step}");
        assert_eq!(
            e.host.commands_of("mkfs.ext4").len(),
            1 + usize::from(step == "mkfs.ext4"),
            "{step}: one mkfs that succeeded"
        );
    }
}

fn waits_for_udev_but_not_forever(f: Flavour) {
    let e = env(f);
    let s = e.stage_req(1, true);
    e.host.set_udev_delay(3);
    e.volumes.stage(&s).unwrap();
    assert!(e.host.dev_root().join("nvme0n1").exists());

    let e = env(f);
    let s = e.stage_req(1, true);
    e.host.set_udev_delay(50); // beyond the 1 s / 100 ms budget
    let err = e.volumes.stage(&s).unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    // Once udev catches up, the retry succeeds without a second connect.
    e.host.set_udev_delay(0);
    for _ in 0..50 {
        e.host.sleep(Duration::ZERO);
    }
    e.volumes.stage(&s).unwrap();
    assert_eq!(e.host.fabrics_writes().len(), 1);
}

fn restage_with_other_capability_or_path_is_refused(f: Flavour) {
    let e = env(f);
    let s = e.stage_req(1, false);
    e.volumes.stage(&s).unwrap();
    let other = e.stage_req_with(1, cap(true, Mode::SingleNodeWriter));
    assert!(matches!(
        e.volumes.stage(&other),
        Err(Error::AlreadyExists(_))
    ));
    let mut elsewhere = s.clone();
    elsewhere.staging_path = e.host.work.join("staging/other");
    assert!(matches!(
        e.volumes.stage(&elsewhere),
        Err(Error::FailedPrecondition(_))
    ));
    // Multi-node writers on a filesystem are refused.
    let multi = e.stage_req_with(3, cap(false, Mode::MultiNodeMultiWriter));
    assert!(matches!(
        e.volumes.stage(&multi),
        Err(Error::FailedPrecondition(_))
    ));
}

fn unstage_retry_after_a_failure_at_each_step(f: Flavour) {
    for step in with_crypt(f, &["umount", "sync", "delete_controller"]) {
        let e = env(f);
        let s = e.stage_req(1, false);
        e.volumes.stage(&s).unwrap();
        e.host.fail_next(step);
        let err = e.volumes.unstage("vol1", &s.staging_path).unwrap_err();
        assert!(matches!(err, Error::Internal(_)), "{step}: {err}");
        assert!(
            e.store.get("vol1").unwrap().is_some(),
            "{step}: record kept for the retry"
        );
        e.volumes.unstage("vol1", &s.staging_path).unwrap();
        assert!(e.host.controller_names().is_empty(), "{step}");
        assert_eq!(e.mounted(&s.staging_path), None, "{step}");
        assert_eq!(e.store.get("vol1").unwrap(), None, "{step}");
    }
}

fn publish_retry_after_failed_read_only_remount(f: Flavour) {
    let e = env(f);
    let s = e.stage_req(1, false);
    e.volumes.stage(&s).unwrap();
    let p = e.publish_req(&s, "a", true);
    // The bind succeeds, the remount fails: the retry completes it.
    let mounts_before = e.host.commands_of("mount").len();
    e.host.fail_next("mount");
    assert!(e.volumes.publish(&p).is_err());
    assert_eq!(e.host.commands_of("mount").len(), mounts_before + 1);
    e.volumes.publish(&p).unwrap();
    assert_eq!(e.mounted(&p.target_path), Some(true));
    // Now ask read-write at the same target: incompatible.
    let rw = PublishRequest {
        read_only: false,
        ..p.clone()
    };
    assert!(matches!(
        e.volumes.publish(&rw),
        Err(Error::AlreadyExists(_))
    ));
}

fn disconnect_only_when_no_other_staged_volume_uses_the_controller(f: Flavour) {
    let e = env(f);
    // Two namespaces in one subsystem (a shared controller).
    e.host.add_subsystem(
        &nqn(7),
        &nguid(71),
        "00000000-0000-0000-0000-000000000000",
        64,
    );
    e.host.add_subsystem(
        &nqn(7),
        &nguid(72),
        "00000000-0000-0000-0000-000000000000",
        64,
    );
    let mut a = e.stage_req_with(7, cap(true, Mode::SingleNodeWriter));
    a.namespace.nguid = Some(nguid(71));
    a.volume_id = "va".into();
    let mut b = a.clone();
    b.namespace.nguid = Some(nguid(72));
    b.volume_id = "vb".into();
    b.staging_path = e.host.work.join("staging/vb");
    e.volumes.stage(&a).unwrap();
    e.volumes.stage(&b).unwrap();
    assert_eq!(
        e.host.fabrics_writes().len(),
        1,
        "second volume reuses the controller"
    );
    e.volumes.unstage("va", &a.staging_path).unwrap();
    assert_eq!(e.host.controller_names(), ["nvme0"], "still used by vb");
    e.volumes.unstage("vb", &b.staging_path).unwrap();
    assert!(e.host.controller_names().is_empty());
}

fn single_node_single_writer_refuses_a_second_writer(f: Flavour) {
    let e = env(f);
    e.host.add_subsystem(
        &nqn(4),
        &nguid(4),
        "00000000-0000-0000-0000-000000000000",
        64,
    );
    let s = e.stage_req_with(4, cap(false, Mode::SingleNodeSingleWriter));
    e.volumes.stage(&s).unwrap();
    e.volumes.publish(&e.publish_req(&s, "a", false)).unwrap();
    let second = e.publish_req(&s, "b", false);
    assert!(matches!(
        e.volumes.publish(&second),
        Err(Error::FailedPrecondition(_))
    ));
    // A reader is fine.
    e.volumes.publish(&e.publish_req(&s, "c", true)).unwrap();
}

fn error_rows_of_publish_stats_expand_unstage(f: Flavour) {
    let e = env(f);
    let s = e.stage_req(1, false);
    let p = e.publish_req(&s, "a", false);
    // Unknown volume.
    assert!(matches!(e.volumes.publish(&p), Err(Error::NotFound(_))));
    assert!(matches!(
        e.volumes.stats("vol1", &p.target_path),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        e.volumes.expand(&e.grow("vol1", &p.target_path, 0)),
        Err(Error::NotFound(_))
    ));
    // Unknown volume, nothing mounted: unstage/unpublish are idempotent successes.
    e.volumes.unstage("vol1", &s.staging_path).unwrap();
    e.volumes.unpublish("vol1", &p.target_path).unwrap();
    // Unknown volume but something mounted at the staging path: not ours, refused.
    std::fs::create_dir_all(&s.staging_path).unwrap();
    e.host.add_mount("8:5", &s.staging_path, "ext4", "/dev/sdz");
    assert!(matches!(
        e.volumes.unstage("vol1", &s.staging_path),
        Err(Error::NotFound(_))
    ));

    let e = env(f);
    let s = e.stage_req(1, false);
    e.volumes.stage(&s).unwrap();
    // Wrong staging path at publish; block publish of a mount volume; a path not of the volume.
    let mut wrong = e.publish_req(&s, "a", false);
    wrong.staging_path = e.host.work.join("elsewhere");
    assert!(matches!(
        e.volumes.publish(&wrong),
        Err(Error::FailedPrecondition(_))
    ));
    let mut as_block = e.publish_req(&s, "a", false);
    as_block.capability = e
        .stage_req_with(1, cap(true, Mode::SingleNodeWriter))
        .capability;
    assert!(matches!(
        e.volumes.publish(&as_block),
        Err(Error::FailedPrecondition(_))
    ));
    assert!(matches!(
        e.volumes.stats("vol1", &e.host.work.join("nowhere")),
        Err(Error::NotFound(_))
    ));
    // Condition: abnormal when the controller is not live.
    e.host.set_controller_state("nvme0", "connecting");
    let stats = e.volumes.stats("vol1", &s.staging_path).unwrap();
    assert!(stats.abnormal.unwrap().contains("connecting"));
    assert!(matches!(
        e.volumes.expand(&e.grow("vol1", &s.staging_path, 0)),
        Err(Error::Unavailable(_))
    ));
}

fn expand_rescans_and_grows(f: Flavour) {
    let e = env(f);
    let s = e.stage_req(1, false);
    e.volumes.stage(&s).unwrap();
    e.host.grow_subsystem(&nqn(1), 4096);
    let size = e
        .volumes
        .expand(&e.grow("vol1", &s.staging_path, 4096 * 512))
        .unwrap();
    assert_eq!(size, 4096 * 512);
    assert!(e
        .host
        .attr_writes()
        .iter()
        .any(|(p, v)| p.ends_with("nvme0/rescan_controller") && v == "1"));
    assert_eq!(e.host.commands_of("resize2fs").len(), 1);
    // Asking beyond what the controller gave: an error, not a silent success.
    let err = e
        .volumes
        .expand(&e.grow("vol1", &s.staging_path, 8192 * 512))
        .unwrap_err();
    assert!(matches!(err, Error::OutOfRange(_)), "{err}");
    assert_eq!(e.host.commands_of("resize2fs").len(), 1);
}

#[test]
fn stats_and_expand_of_a_relative_path_are_not_found() {
    // csi-sanity's "should fail when volume is not found" sends volume_path "some/path": no
    // volume is ever staged or published at a relative path, so the answer is NOT_FOUND (a
    // missing volume_path stays INVALID_ARGUMENT).
    use edgevol_proto::csi::v1::{NodeExpandVolumeRequest, NodeGetVolumeStatsRequest};
    let stats = |path: &str| {
        request::stats(&NodeGetVolumeStatsRequest {
            volume_id: "vol1".into(),
            volume_path: path.into(),
            staging_target_path: String::new(),
        })
    };
    let expand = |path: &str| {
        request::expand(&NodeExpandVolumeRequest {
            volume_id: "vol1".into(),
            volume_path: path.into(),
            ..Default::default()
        })
    };
    for path in ["some/path", "../etc", "/a/../b", "rel\0nul"] {
        assert!(
            matches!(stats(path), Err(Error::NotFound(m)) if m.contains("vol1")),
            "stats {path:?}"
        );
        assert!(
            matches!(expand(path), Err(Error::NotFound(m)) if m.contains("vol1")),
            "expand {path:?}"
        );
    }
    assert!(matches!(stats(""), Err(Error::InvalidArgument(_))));
    assert!(matches!(expand(""), Err(Error::InvalidArgument(_))));
    assert_eq!(
        stats("/pods/a/vol1").unwrap().1,
        PathBuf::from("/pods/a/vol1")
    );
}

#[test]
fn publish_without_a_staging_path_is_a_failed_precondition() {
    use edgevol_proto::csi::v1::NodePublishVolumeRequest;
    let req = NodePublishVolumeRequest {
        volume_id: "vol1".into(),
        target_path: "/pods/a/vol1".into(),
        volume_capability: Some(cap(false, Mode::SingleNodeWriter)),
        ..Default::default()
    };
    assert!(matches!(
        request::publish(&req),
        Err(Error::FailedPrecondition(m)) if m.contains("NodeStageVolume")
    ));
    let relative = NodePublishVolumeRequest {
        staging_target_path: "staging/vol1".into(),
        ..req
    };
    assert!(matches!(
        request::publish(&relative),
        Err(Error::InvalidArgument(_))
    ));
}

fn stage_of_a_volume_the_target_refuses_is_not_found_and_leaves_nothing(f: Flavour) {
    let e = env(f);
    let s = e.stage_req(1, false);
    e.host.fail_next_connect(5); // EIO: the target answered the Connect with an error
    let err = e.volumes.stage(&s).unwrap_err();
    assert!(
        matches!(&err, Error::NotFound(m) if m.contains(&nqn(1)) && m.contains(HOSTNQN)),
        "{err}"
    );
    assert_eq!(e.store.get("vol1").unwrap(), None, "no record left");
    assert!(e.host.controller_names().is_empty());
    // Nothing listening is not a verdict on the volume: UNAVAILABLE, the intent is kept.
    e.host.fail_next_connect(111);
    assert!(matches!(e.volumes.stage(&s), Err(Error::Unavailable(_))));
    assert!(e.store.get("vol1").unwrap().is_some());
    e.volumes.stage(&s).unwrap();
}

fn stage_without_the_tcp_transport_is_a_failed_precondition_unless_the_kernel_loads_it(f: Flavour) {
    let e = env(f);
    let s = e.stage_req(1, false);
    // nvme-fabrics is there, nvme-tcp is not and cannot be loaded: the kernel answers the
    // connect EINVAL ("no handler found for transport tcp").
    e.host.remove_initiator();
    e.host.set_loadable(&["nvme-fabrics"]);
    e.host.set_release("6.1.0-minimal");
    std::fs::write(e.host.dev_root().join("nvme-fabrics"), "").unwrap();
    let err = e.volumes.stage(&s).unwrap_err();
    assert!(
        matches!(&err, Error::FailedPrecondition(m) if m.contains("module nvme-tcp")
            && m.contains("CONFIG_NVME_TCP")),
        "{err}"
    );
    assert_eq!(e.store.get("vol1").unwrap(), None, "no record left");
    // The kernel loads the transport itself at the connect (request_module): staged.
    e.host.set_loadable(&["nvme-fabrics", "nvme-tcp"]);
    e.volumes.stage(&s).unwrap();
    assert_eq!(e.host.controller_names(), vec!["nvme0".to_owned()]);
}

fn stage_loads_a_missing_nvme_fabrics_before_it_connects(f: Flavour) {
    let e = env(f);
    let s = e.stage_req(1, true);
    e.host.remove_initiator();
    e.host.set_loadable(&["nvme-fabrics", "nvme-tcp"]);
    e.volumes.stage(&s).unwrap();
    assert_eq!(
        e.host.commands_of("modprobe"),
        vec![vec!["nvme-tcp".to_owned()]]
    );
    assert_eq!(e.host.controller_names(), vec!["nvme0".to_owned()]);
}

fn unpublish_touches_only_the_volumes_own_publication(f: Flavour) {
    let e = env(f);
    let a = e.stage_req(1, false);
    let b = e.stage_req(2, true);
    e.volumes.stage(&a).unwrap();
    e.volumes.stage(&b).unwrap();
    let pa = e.publish_req(&a, "x", false);
    let pb = e.publish_req(&b, "x", false);
    e.volumes.publish(&pa).unwrap();
    e.volumes.publish(&pb).unwrap();
    // vol2's id at vol1's target (and the reverse): NOT_FOUND, both stay mounted.
    assert!(matches!(
        e.volumes.unpublish("vol2", &pa.target_path),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        e.volumes.unpublish("vol1", &pb.target_path),
        Err(Error::NotFound(_))
    ));
    // An unknown volume at a foreign mount: NOT_FOUND, untouched.
    let foreign = e.host.work.join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    e.host.add_mount("0:42", &foreign, "tmpfs", "tmpfs");
    assert!(matches!(
        e.volumes.unpublish("vol9", &foreign),
        Err(Error::NotFound(m)) if m.contains("tmpfs")
    ));
    assert_eq!(e.mounted(&foreign), Some(false));
    assert_eq!(e.mounted(&pa.target_path), Some(false));
    assert_eq!(e.mounted(&pb.target_path), Some(false));
    assert!(e.host.commands_of("umount").is_empty());
    e.volumes.unpublish("vol1", &pa.target_path).unwrap();
    e.volumes.unpublish("vol2", &pb.target_path).unwrap();
    assert_eq!(e.mounted(&pa.target_path), None);
    assert_eq!(e.mounted(&pb.target_path), None);
    assert!(!pa.target_path.exists() && !pb.target_path.exists());
}

fn publish_again_at_the_same_target_with_other_arguments_is_already_exists(f: Flavour) {
    let e = env(f);
    let s = e.stage_req(1, false);
    e.volumes.stage(&s).unwrap();
    let p = e.publish_req(&s, "a", false);
    e.volumes.publish(&p).unwrap();
    let mut as_block = p.clone();
    as_block.capability = e
        .stage_req_with(1, cap(true, Mode::SingleNodeWriter))
        .capability;
    assert!(matches!(
        e.volumes.publish(&as_block),
        Err(Error::AlreadyExists(_))
    ));
    let mut other_staging = p.clone();
    other_staging.staging_path = e.host.work.join("elsewhere");
    assert!(matches!(
        e.volumes.publish(&other_staging),
        Err(Error::AlreadyExists(_))
    ));
    // Published read-write, asked read-only: the workload's mount is not remounted behind its
    // back (the record tells this from a retry after a failed read-only remount).
    let ro = PublishRequest {
        read_only: true,
        ..p.clone()
    };
    assert!(matches!(
        e.volumes.publish(&ro),
        Err(Error::AlreadyExists(_))
    ));
    // Another access mode at the same target: ALREADY_EXISTS too.
    let mut snsw = p.clone();
    snsw.capability = e
        .stage_req_with(1, cap(false, Mode::SingleNodeSingleWriter))
        .capability;
    assert!(matches!(
        e.volumes.publish(&snsw),
        Err(Error::AlreadyExists(_))
    ));
    assert_eq!(e.mounted(&p.target_path), Some(false));
    assert_eq!(
        e.host.commands_of("mount").len(),
        2,
        "mkfs'd mount + one bind"
    );
    e.volumes.publish(&p).unwrap();
    // Unpublish forgets what was asked: the target may be published read-only afresh.
    e.volumes.unpublish("vol1", &p.target_path).unwrap();
    assert!(e
        .store
        .get("vol1")
        .unwrap()
        .unwrap()
        .publications
        .is_empty());
    e.volumes.publish(&ro).unwrap();
    assert_eq!(e.mounted(&p.target_path), Some(true));
}

fn expand_error_rows(f: Flavour) {
    let e = env(f);
    let s = e.stage_req(1, false);
    e.volumes.stage(&s).unwrap();
    // The capability must be the staged one (INVALID_ARGUMENT "exceeds capabilities").
    let mut req = e.grow("vol1", &s.staging_path, 0);
    req.access = Some(Access::Block);
    assert!(matches!(
        e.volumes.expand(&req),
        Err(Error::InvalidArgument(m)) if m.contains("block")
    ));
    req.access = Some(Access::Mount {
        fs_type: "xfs".into(),
        mount_flags: Vec::new(),
    });
    assert!(matches!(
        e.volumes.expand(&req),
        Err(Error::InvalidArgument(m)) if m.contains("xfs")
    ));
    // A mount capability that names no filesystem, or the right one, is fine.
    for fs_type in ["", "ext4"] {
        req.access = Some(Access::Mount {
            fs_type: fs_type.into(),
            mount_flags: Vec::new(),
        });
        assert_eq!(e.volumes.expand(&req).unwrap(), 2048 * 512);
    }
    // A limit below the current size: OUT_OF_RANGE at once (no rescan).
    let rescans = e.host.attr_writes().len();
    let mut req = e.grow("vol1", &s.staging_path, 0);
    req.limit_bytes = 1024 * 512;
    assert!(matches!(
        e.volumes.expand(&req),
        Err(Error::OutOfRange(m)) if m.contains("limit_bytes")
    ));
    assert_eq!(e.host.attr_writes().len(), rescans);
    // Staged read-only: the filesystem cannot grow (FAILED_PRECONDITION "volume in use").
    e.volumes.unstage("vol1", &s.staging_path).unwrap();
    let ro = e.stage_req_with(1, cap(false, Mode::SingleNodeReaderOnly));
    e.volumes.stage(&ro).unwrap();
    assert_eq!(e.mounted(&ro.staging_path), Some(true));
    let err = e
        .volumes
        .expand(&e.grow("vol1", &ro.staging_path, 0))
        .unwrap_err();
    assert!(
        matches!(&err, Error::FailedPrecondition(m) if m.contains("read-only")),
        "{err}"
    );
    assert_eq!(
        e.host.commands_of("resize2fs").len(),
        2,
        "only the two grows above"
    );
}
