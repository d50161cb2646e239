//! NodeUnstageVolume when the appliance is gone (project issue 13), against the fake host:
//! which host operations run, in which order, and how long the plugin waits (the fake's clock
//! is its count of sleeps of `poll` each). The kernel side (queued I/O failing after
//! `fast_io_fail_tmo`) is what tests/e2e/tests/node_faults.rs checks in QEMU.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::fabrics::{FabricsConfig, HostIdentity};
use crate::host::Host;
use crate::state::StateStore;
use crate::sysfs::{self, FailFast};
use crate::testing::FakeHost;
use crate::volume::{StageRequest, VolumeConfig, Volumes};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const POLL: Duration = Duration::from_millis(100);

struct Env {
    host: Arc<FakeHost>,
    volumes: Volumes,
    store: StateStore,
}

fn env_with(fabrics: FabricsConfig) -> Env {
    let host = Arc::new(FakeHost::new());
    let store = StateStore::open(host.work.join("state")).unwrap();
    let cfg = VolumeConfig {
        host: HostIdentity {
            nqn: HOSTNQN.into(),
            id: None,
        },
        fabrics,
        device_wait: Duration::from_secs(1),
        poll: POLL,
    };
    let dyn_host: Arc<dyn Host> = host.clone();
    Env {
        volumes: Volumes::new(dyn_host, store.clone(), cfg),
        store,
        host,
    }
}

fn env() -> Env {
    env_with(FabricsConfig::default())
}

impl Env {
    /// Stages volume `n` (its own subsystem), mount (ext4) or block access.
    fn stage(&self, n: u32, block: bool) -> StageRequest {
        let req = self.req(n, block);
        self.volumes.stage(&req).unwrap();
        req
    }

    /// The NodeStageVolume of volume `n`, behind its own subsystem.
    fn req(&self, n: u32, block: bool) -> StageRequest {
        use crate::volume::{Access, AccessMode, Capability};
        let nqn = format!("nqn.2024-01.io.edgevol:box1:vol{n}");
        let nguid = format!("{n:032x}");
        self.host.add_subsystem(&nqn, &nguid, "", 2048);
        StageRequest {
            volume_id: format!("vol{n}"),
            staging_path: self.host.work.join(format!("staging/vol{n}")),
            capability: Capability {
                access: if block {
                    Access::Block
                } else {
                    Access::Mount {
                        fs_type: "ext4".into(),
                        mount_flags: Vec::new(),
                    }
                },
                mode: AccessMode::SingleNodeWriter,
            },
            target: crate::fabrics::Target::parse("tcp", "10.0.0.2", "4420", &nqn).unwrap(),
            namespace: sysfs::NamespaceId {
                nguid: Some(nguid),
                uuid: None,
            },
            encrypted: None,
        }
    }

    /// The controller as an earlier plugin would have connected it: fast_io_fail_tmo off.
    fn as_connected_by_an_earlier_plugin(&self, controller: &str) {
        self.host
            .write_attr(
                &sysfs::controller_dir(&*self.host, controller).join("fast_io_fail_tmo"),
                "-1",
            )
            .unwrap();
        assert_eq!(
            sysfs::controller_fail_fast(&*self.host, controller).unwrap(),
            FailFast::Off
        );
    }

    fn mounted(&self, s: &StageRequest) -> bool {
        self.host.mounts().iter().any(|(m, _)| *m == s.staging_path)
    }

    /// Host operations since `from` (indices into ops()), as `verb target` pairs.
    fn ops_since(&self, from: usize) -> Vec<String> {
        self.host.ops()[from..].to_vec()
    }

    /// Asserts the node holds nothing of volume `n`: no mount, no controller, no record.
    fn nothing_left(&self, s: &StageRequest) {
        assert!(!self.mounted(s), "still mounted");
        assert!(self.host.controller_names().is_empty(), "controller left");
        assert_eq!(self.store.get(&s.volume_id).unwrap(), None, "record left");
    }
}

#[test]
fn staging_connects_with_bounded_fast_fail() {
    let e = env();
    e.stage(1, false);
    let opts = &e.host.fabrics_writes()[0];
    for want in [
        "fast_io_fail_tmo=90",
        "ctrl_loss_tmo=600",
        "reconnect_delay=2",
        "keep_alive_tmo=5",
    ] {
        assert!(opts.split(',').any(|o| o == want), "{want} in {opts}");
    }
    assert_eq!(e.host.attr("nvme0", "fast_io_fail_tmo"), "90");
    assert_eq!(e.host.attr("nvme0", "kato"), "5");
}

#[test]
fn appliance_gone_with_fast_fail_the_kernel_bounds_the_wait() {
    // The controller reconnects; its queued I/O fails fast_io_fail_tmo after the loss, which
    // the unmount waits out (in the kernel). The flush then fails: skipped, since the kernel
    // has failed the writes. Then the controller goes, and the record.
    let e = env();
    let s = e.stage(1, false);
    e.host.set_controller_state("nvme0", "connecting");
    e.host.fail_next("sync");
    let from = e.host.ops().len();
    e.volumes.unstage("vol1", &s.staging_path).unwrap();
    assert_eq!(e.host.sleeps(), 0, "no wait of the plugin's own");
    let ops = e.ops_since(from);
    let umount = ops
        .iter()
        .position(|o| o.starts_with("run umount"))
        .unwrap();
    let sync = ops.iter().position(|o| o.starts_with("sync ")).unwrap();
    let delete = ops
        .iter()
        .position(|o| o == "write delete_controller of nvme0")
        .unwrap();
    assert!(umount < sync && sync < delete, "{ops:?}");
    assert!(
        !ops.iter().any(|o| o.starts_with("write fast_io_fail_tmo")),
        "{ops:?}"
    );
    e.nothing_left(&s);
}

#[test]
fn appliance_gone_without_fast_fail_is_given_fast_io_fail_tmo_then_let_go() {
    // A controller connected by an earlier plugin (fast_io_fail_tmo off) would hold the
    // unmount's writes for ctrl_loss_tmo. The plugin waits fast_io_fail_tmo for the appliance,
    // then deletes the controller first (the queued I/O fails at once), then unmounts; there
    // is no device left to flush.
    let e = env();
    let s = e.stage(1, false);
    e.as_connected_by_an_earlier_plugin("nvme0");
    e.host.set_controller_state("nvme0", "connecting");
    let from = e.host.ops().len();
    e.volumes.unstage("vol1", &s.staging_path).unwrap();
    let waited = POLL * e.host.sleeps();
    assert_eq!(waited, Duration::from_secs(90), "fast_io_fail_tmo, no more");
    let ops = e.ops_since(from);
    let delete = ops
        .iter()
        .position(|o| o == "write delete_controller of nvme0")
        .unwrap();
    let umount = ops
        .iter()
        .position(|o| o.starts_with("run umount"))
        .unwrap();
    assert!(delete < umount, "{ops:?}");
    assert!(!ops.iter().any(|o| o.starts_with("sync ")), "{ops:?}");
    e.nothing_left(&s);
}

#[test]
fn an_appliance_back_within_the_wait_gets_the_data() {
    // The same controller, but the appliance finishes its reboot 20 s into the wait: the
    // controller is live again, gets the bounded fast_io_fail_tmo, and the unstage is the
    // ordinary one: unmount, flush to the appliance, disconnect.
    let e = env();
    let s = e.stage(1, false);
    e.as_connected_by_an_earlier_plugin("nvme0");
    e.host.set_controller_state("nvme0", "connecting");
    e.host.set_controller_state_after("nvme0", "live", 200);
    let from = e.host.ops().len();
    e.volumes.unstage("vol1", &s.staging_path).unwrap();
    assert_eq!(POLL * e.host.sleeps(), Duration::from_secs(20));
    let ops = e.ops_since(from);
    let bound = ops
        .iter()
        .position(|o| o == "write fast_io_fail_tmo of nvme0")
        .unwrap();
    let umount = ops
        .iter()
        .position(|o| o.starts_with("run umount"))
        .unwrap();
    let sync = ops.iter().position(|o| o.starts_with("sync ")).unwrap();
    let delete = ops
        .iter()
        .position(|o| o == "write delete_controller of nvme0")
        .unwrap();
    assert!(bound < umount && umount < sync && sync < delete, "{ops:?}");
    assert_eq!(e.host.synced().len(), 1, "flushed to the appliance");
    e.nothing_left(&s);
}

#[test]
fn a_live_controller_of_an_earlier_plugin_is_bounded_before_the_unmount() {
    // Live now, but a loss during the unmount must not queue its writes for ctrl_loss_tmo.
    let e = env();
    let s = e.stage(1, false);
    e.as_connected_by_an_earlier_plugin("nvme0");
    let from = e.host.ops().len();
    e.volumes.unstage("vol1", &s.staging_path).unwrap();
    let ops = e.ops_since(from);
    assert_eq!(ops[0], "write fast_io_fail_tmo of nvme0", "{ops:?}");
    assert!(ops[1].starts_with("run umount"), "{ops:?}");
    assert_eq!(e.host.sleeps(), 0);
    e.nothing_left(&s);
}

#[test]
fn a_flush_error_from_a_live_appliance_keeps_the_volume() {
    // The appliance is there and refuses the flush: that is a real error, retried by the CO;
    // nothing is torn down past the unmount.
    let e = env();
    let s = e.stage(1, false);
    e.host.fail_next("sync");
    let err = e.volumes.unstage("vol1", &s.staging_path).unwrap_err();
    assert!(
        matches!(&err, Error::Internal(m) if m.contains("flushing")),
        "{err}"
    );
    assert_eq!(e.host.controller_names(), ["nvme0"]);
    assert!(e.store.get("vol1").unwrap().is_some());
    e.volumes.unstage("vol1", &s.staging_path).unwrap();
    e.nothing_left(&s);
}

#[test]
fn block_volume_whose_appliance_is_gone() {
    let e = env();
    let s = e.stage(2, true);
    e.as_connected_by_an_earlier_plugin("nvme0");
    e.host.set_controller_state("nvme0", "resetting");
    e.volumes.unstage("vol2", &s.staging_path).unwrap();
    assert_eq!(POLL * e.host.sleeps(), Duration::from_secs(90));
    assert!(e.host.synced().is_empty());
    assert!(
        e.host.commands_of("umount").is_empty(),
        "block: nothing to unmount"
    );
    e.nothing_left(&s);

    // With fast fail on: the flush (which the kernel fails once the timer ran out) is tried,
    // then the controller goes.
    let e = env();
    let s = e.stage(2, true);
    e.host.set_controller_state("nvme0", "connecting");
    e.host.fail_next("sync");
    e.volumes.unstage("vol2", &s.staging_path).unwrap();
    assert_eq!(e.host.sleeps(), 0);
    e.nothing_left(&s);
}

#[test]
fn a_controller_the_kernel_already_deleted() {
    // ctrl_loss_tmo ran out long ago: the kernel deleted the controller and the namespace; the
    // filesystem is still mounted on the dead device. Unmount, nothing to flush or delete.
    let e = env();
    let s = e.stage(1, false);
    e.host.remove_controller_named("nvme0");
    let from = e.host.ops().len();
    e.volumes.unstage("vol1", &s.staging_path).unwrap();
    let ops = e.ops_since(from);
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert!(ops[0].starts_with("run umount"), "{ops:?}");
    e.nothing_left(&s);
}

#[test]
fn a_shared_controller_is_neither_waited_for_nor_deleted() {
    // Two volumes behind one subsystem: the controller is the other volume's too. Its queued
    // I/O is the kernel's business (fast_io_fail_tmo); the plugin does not delete it.
    let e = env();
    let nqn = "nqn.2024-01.io.edgevol:box1:shared";
    let mut a = e.req(7, false);
    e.host.add_subsystem(nqn, &format!("{:032x}", 71), "", 64);
    e.host.add_subsystem(nqn, &format!("{:032x}", 72), "", 64);
    a.target = crate::fabrics::Target::parse("tcp", "10.0.0.2", "4420", nqn).unwrap();
    a.namespace.nguid = Some(format!("{:032x}", 71));
    let mut b = a.clone();
    b.volume_id = "vol8".into();
    b.staging_path = e.host.work.join("staging/vol8");
    b.namespace.nguid = Some(format!("{:032x}", 72));
    e.volumes.stage(&a).unwrap();
    e.volumes.stage(&b).unwrap();
    let ctrl = e.host.controller_names()[0].clone();
    e.as_connected_by_an_earlier_plugin(&ctrl);
    e.host.set_controller_state(&ctrl, "connecting");
    e.host.fail_next("sync");
    e.volumes.unstage("vol7", &a.staging_path).unwrap();
    assert_eq!(e.host.sleeps(), 0);
    assert_eq!(
        e.host.controller_names(),
        std::slice::from_ref(&ctrl),
        "still vol8's"
    );
    assert!(e.store.get("vol8").unwrap().is_some());
    assert_eq!(e.store.get("vol7").unwrap(), None);
}

#[test]
fn fast_fail_turned_off_by_the_operator_is_left_to_the_kernel() {
    // --fast-io-fail-tmo -1: the operator wants I/O queued until ctrl_loss_tmo; the plugin
    // neither waits on its own nor deletes a controller before the unmount.
    let e = env_with(FabricsConfig {
        fast_io_fail_tmo: -1,
        ..FabricsConfig::default()
    });
    let s = e.stage(1, false);
    assert_eq!(e.host.attr("nvme0", "fast_io_fail_tmo"), "off");
    e.host.set_controller_state("nvme0", "connecting");
    e.host.fail_next("sync");
    let from = e.host.ops().len();
    e.volumes.unstage("vol1", &s.staging_path).unwrap();
    assert_eq!(e.host.sleeps(), 0);
    let ops = e.ops_since(from);
    assert!(ops[0].starts_with("run umount"), "{ops:?}");
    e.nothing_left(&s);
}

#[test]
fn adopt_bounds_the_controllers_of_staged_volumes() {
    // After an upgrade from a plugin that connected without fast_io_fail_tmo, the restarted
    // plugin brings its volumes' controllers (live or reconnecting) to the configured value;
    // controllers of no staged volume are not its business.
    let e = env();
    e.stage(1, false);
    e.stage(2, true);
    e.as_connected_by_an_earlier_plugin("nvme0");
    e.as_connected_by_an_earlier_plugin("nvme1");
    e.host.set_controller_state("nvme1", "connecting");
    e.host.add_controller(
        "nvme5",
        "tcp",
        "traddr=10.0.0.9,trsvcid=4420",
        "nqn.2024-01.io.other:x",
        HOSTNQN,
        "live",
    );
    assert_eq!(e.volumes.adopt(), 2);
    assert_eq!(e.host.attr("nvme0", "fast_io_fail_tmo"), "90");
    assert_eq!(e.host.attr("nvme1", "fast_io_fail_tmo"), "90");
    assert_eq!(e.host.attr("nvme5", "fast_io_fail_tmo"), "off");
    assert_eq!(e.volumes.adopt(), 0, "nothing left to change");
    // A kernel refusing the write does not stop the plugin.
    e.as_connected_by_an_earlier_plugin("nvme0");
    e.host.fail_next("fast_io_fail_tmo");
    assert_eq!(e.volumes.adopt(), 0);
    assert_eq!(e.host.attr("nvme0", "fast_io_fail_tmo"), "off");
}
