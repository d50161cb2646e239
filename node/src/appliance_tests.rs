//! A node reaching several appliances on the fake host: each volume connects with the keys of
//! the appliance its subsystem NQN names, a rotation on one appliance touches only its
//! controllers, an appliance without an endpoint is refused before the kernel is touched, and
//! one unreachable appliance does not hold up the others' key refresh.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgevol_proto::csi::v1::volume_capability::BlockVolume;
use edgevol_proto::csi::v1::volume_capability::{access_mode::Mode, AccessMode, AccessType};
use edgevol_proto::csi::v1::{NodeStageVolumeRequest, VolumeCapability};

use crate::appliances::ApplianceKeys;
use crate::csi::request;
use crate::error::{Error, Result};
use crate::fabrics::{FabricsConfig, HostIdentity};
use crate::host::Host;
use crate::keys::{DhchapKeys, KeySource};
use crate::state::StateStore;
use crate::testing::FakeHost;
use crate::volume::{StageRequest, VolumeConfig, Volumes};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";

/// A `DHHC-1` secret of appliance `tag` (one letter) at `generation`.
fn secret(tag: char, generation: u64) -> String {
    format!(
        "DHHC-1:01:{}{generation:02}AAAA==:",
        tag.to_string().repeat(42)
    )
}

/// One appliance's Enrolment: its own key pair, or a refusal.
#[derive(Debug)]
struct Box_ {
    tag: char,
    answer: Mutex<Result<u64>>,
    calls: Mutex<usize>,
}

impl Box_ {
    fn new(tag: char) -> Arc<Self> {
        Arc::new(Box_ {
            tag,
            answer: Mutex::new(Ok(1)),
            calls: Mutex::new(0),
        })
    }

    fn rotate_to(&self, generation: u64) {
        *self.answer.lock().unwrap() = Ok(generation);
    }

    fn go_down(&self) {
        *self.answer.lock().unwrap() = Err(Error::Unavailable(format!(
            "enrolment with appliance {}: connection refused",
            self.tag
        )));
    }

    fn calls(&self) -> usize {
        *self.calls.lock().unwrap()
    }
}

impl KeySource for Box_ {
    fn enrol(&self, _host_nqn: &str) -> Result<DhchapKeys> {
        *self.calls.lock().unwrap() += 1;
        let generation = self.answer.lock().unwrap().clone()?;
        DhchapKeys::validated(
            secret(self.tag, generation),
            secret(self.tag.to_ascii_uppercase(), generation),
            generation,
        )
    }
}

struct Env {
    host: Arc<FakeHost>,
    volumes: Volumes,
    box1: Arc<Box_>,
    box2: Arc<Box_>,
}

fn env() -> Env {
    let host = FakeHost::new();
    host.set_kernel_auth(true);
    host.set_modules(
        "6.12.9-cloud-amd64",
        "kernel/drivers/nvme/host/nvme-core.ko.xz: kernel/drivers/nvme/common/nvme-auth.ko.xz\n",
        "",
    );
    let host = Arc::new(host);
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
    let (box1, box2) = (Box_::new('a'), Box_::new('b'));
    let keys = ApplianceKeys::default()
        .with(Some("box-1".into()), box1.clone())
        .with(Some("box-2".into()), box2.clone());
    let dyn_host: Arc<dyn Host> = host.clone();
    let volumes = Volumes::new(dyn_host, store, cfg).with_appliance_keys(keys);
    Env {
        host,
        volumes,
        box1,
        box2,
    }
}

impl Env {
    /// A block volume `v<n>` of `appliance` (served at 10.0.<n>.2).
    fn stage_req(&self, appliance: &str, n: u32) -> StageRequest {
        let nqn = format!("nqn.2024-11.io.edgevol:{appliance}:v{n}");
        self.host.add_subsystem(
            &nqn,
            &format!("{n:032x}"),
            "00000000-0000-0000-0000-000000000000",
            2048,
        );
        let req = NodeStageVolumeRequest {
            volume_id: format!("{appliance}-v{n}"),
            publish_context: HashMap::from([
                ("transport".into(), "tcp".into()),
                ("targetAddress".into(), format!("10.0.{n}.2")),
                ("targetPort".into(), "4420".into()),
                ("subsystemNqn".into(), nqn),
                ("nguid".into(), format!("{n:032x}")),
            ]),
            staging_target_path: self
                .host
                .work
                .join(format!("staging/{appliance}-v{n}"))
                .to_string_lossy()
                .into_owned(),
            volume_capability: Some(VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(AccessType::Block(BlockVolume {})),
            }),
            secrets: HashMap::new(),
            volume_context: HashMap::new(),
        };
        request::stage(&req).unwrap()
    }
}

#[test]
fn each_volume_connects_with_the_keys_of_the_appliance_its_nqn_names() {
    let e = env();
    e.volumes.stage(&e.stage_req("box-1", 1)).unwrap();
    e.volumes.stage(&e.stage_req("box-2", 2)).unwrap();
    assert_eq!((e.box1.calls(), e.box2.calls()), (1, 1));
    let writes = e.host.fabrics_writes();
    assert!(writes[0].contains(&format!("dhchap_secret={}", secret('a', 1))));
    assert!(writes[1].contains(&format!("dhchap_secret={}", secret('b', 1))));
    assert!(writes[1].contains(&format!("dhchap_ctrl_secret={}", secret('B', 1))));
}

#[test]
fn a_rotation_on_one_appliance_reaches_only_its_controllers() {
    let e = env();
    e.volumes.stage(&e.stage_req("box-1", 1)).unwrap();
    e.volumes.stage(&e.stage_req("box-2", 2)).unwrap();
    assert_eq!(e.volumes.refresh_keys().unwrap(), 0, "nothing new");
    e.box2.rotate_to(4);
    assert_eq!(e.volumes.refresh_keys().unwrap(), 1);
    assert_eq!(e.host.attr("nvme0", "dhchap_secret"), secret('a', 1));
    assert_eq!(e.host.attr("nvme1", "dhchap_secret"), secret('b', 4));
    assert_eq!(e.host.attr("nvme1", "dhchap_ctrl_secret"), secret('B', 4));
}

#[test]
fn one_unreachable_appliance_does_not_hold_up_the_others_refresh() {
    let e = env();
    e.volumes.stage(&e.stage_req("box-1", 1)).unwrap();
    e.volumes.stage(&e.stage_req("box-2", 2)).unwrap();
    e.box1.go_down();
    e.box2.rotate_to(3);
    let err = e.volumes.refresh_keys().unwrap_err();
    assert!(
        matches!(&err, Error::Unavailable(m) if m.contains("appliance a")),
        "{err}"
    );
    assert_eq!(e.host.attr("nvme1", "dhchap_secret"), secret('b', 3));
    assert_eq!(e.host.attr("nvme0", "dhchap_secret"), secret('a', 1));
}

#[test]
fn an_appliance_without_an_endpoint_is_refused_before_the_kernel_is_touched() {
    let e = env();
    let err = e.volumes.stage(&e.stage_req("box-3", 1)).unwrap_err();
    assert!(
        matches!(&err, Error::FailedPrecondition(m)
            if m.contains("appliance box-3") && m.contains("box-1, box-2")
                && m.contains("--appliance ID=HOST:PORT")),
        "{err}"
    );
    assert!(e.host.fabrics_writes().is_empty());
    assert_eq!((e.box1.calls(), e.box2.calls()), (0, 0));

    // A plain --appliance HOST:PORT enrols for every appliance without one of its own.
    let every = Box_::new('z');
    let e = env();
    let dyn_host: Arc<dyn Host> = e.host.clone();
    let store = StateStore::open(e.host.work.join("state")).unwrap();
    let volumes = Volumes::new(dyn_host, store, e.volumes.config().clone()).with_appliance_keys(
        ApplianceKeys::single(every.clone()).with(Some("box-1".into()), e.box1.clone()),
    );
    volumes.stage(&e.stage_req("box-3", 1)).unwrap();
    volumes.stage(&e.stage_req("box-1", 2)).unwrap();
    let writes = e.host.fabrics_writes();
    assert!(writes[0].contains(&secret('z', 1)));
    assert!(writes[1].contains(&secret('a', 1)));
    assert_eq!((every.calls(), e.box1.calls()), (1, 1));
}

#[test]
fn each_leg_of_a_replicated_volume_uses_and_rotates_its_own_appliance_s_keys() {
    let e = env();
    let mut ctx = HashMap::from([("replicas".to_owned(), "2".to_owned())]);
    for (i, (appliance, n)) in [("box-1", 1u32), ("box-2", 2)].into_iter().enumerate() {
        let nqn = format!("nqn.2024-11.io.edgevol:{appliance}:v{n}");
        e.host.add_subsystem(
            &nqn,
            &format!("{n:032x}"),
            "00000000-0000-0000-0000-000000000000",
            131_072,
        );
        for (k, v) in [
            ("transport", "tcp".to_owned()),
            ("targetAddress", format!("10.0.{n}.2")),
            ("targetPort", "4420".to_owned()),
            ("subsystemNqn", nqn),
            ("nguid", format!("{n:032x}")),
            ("volumeId", format!("{appliance}-v{n}")),
        ] {
            ctx.insert(format!("leg{i}.{k}"), v);
        }
    }
    let req = NodeStageVolumeRequest {
        volume_id: "box-1-v1+box-2-v2".into(),
        publish_context: ctx,
        staging_target_path: e.host.work.join("staging/r").to_string_lossy().into_owned(),
        volume_capability: Some(VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Block(BlockVolume {})),
        }),
        secrets: HashMap::new(),
        volume_context: HashMap::new(),
    };
    let req = crate::legs::stage_request(&req).unwrap().unwrap();
    e.volumes.stage_replicated(&req).unwrap();
    let writes = e.host.fabrics_writes();
    assert!(writes[0].contains(&format!("dhchap_secret={}", secret('a', 1))));
    assert!(writes[1].contains(&format!("dhchap_secret={}", secret('b', 1))));
    e.box2.rotate_to(2);
    assert_eq!(
        e.volumes.refresh_keys().unwrap(),
        1,
        "leg 1's controller only"
    );
    assert_eq!(e.host.attr("nvme0", "dhchap_secret"), secret('a', 1));
    assert_eq!(e.host.attr("nvme1", "dhchap_secret"), secret('b', 2));
}
