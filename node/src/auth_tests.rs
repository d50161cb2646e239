//! Data-path authentication on the fake host: keys from enrolment at NodeStageVolume, what a
//! refusal or an unreachable appliance gives, a kernel without NVMe authentication, key
//! rotation onto live controllers, and no secret in a state record, a log line, an error or a
//! `Debug`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgevol_proto::csi::v1::volume_capability::{access_mode::Mode, AccessMode, AccessType};
use edgevol_proto::csi::v1::volume_capability::{BlockVolume, MountVolume};
use edgevol_proto::csi::v1::{NodeStageVolumeRequest, VolumeCapability};

use crate::csi::request;
use crate::error::{Error, Result};
use crate::fabrics::{FabricsConfig, HostIdentity};
use crate::host::Host;
use crate::keys::{DhchapKeys, KeySource};
use crate::state::StateStore;
use crate::testing::{capture, FakeHost};
use crate::volume::{StageRequest, VolumeConfig, Volumes};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";

fn secret(tag: char, generation: u64) -> String {
    // The shape of a real one: DHHC-1:01:<base64 of 32 bytes + CRC-32>:
    format!(
        "DHHC-1:01:{}{generation:02}AAAA==:",
        tag.to_string().repeat(42)
    )
}

fn pair(generation: u64) -> DhchapKeys {
    DhchapKeys::validated(secret('h', generation), secret('c', generation), generation).unwrap()
}

/// The appliance's Enrolment as the node sees it: the current pair, or a refusal.
#[derive(Debug)]
struct FakeEnrolment {
    answer: Mutex<Result<DhchapKeys>>,
    calls: Mutex<Vec<String>>,
}

impl FakeEnrolment {
    fn new(generation: u64) -> Arc<Self> {
        Arc::new(FakeEnrolment {
            answer: Mutex::new(Ok(pair(generation))),
            calls: Mutex::new(Vec::new()),
        })
    }

    fn answer(&self, a: Result<DhchapKeys>) {
        *self.answer.lock().unwrap() = a;
    }

    fn calls(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

impl KeySource for FakeEnrolment {
    fn enrol(&self, host_nqn: &str) -> Result<DhchapKeys> {
        self.calls.lock().unwrap().push(host_nqn.to_owned());
        self.answer.lock().unwrap().clone()
    }
}

struct Env {
    host: Arc<FakeHost>,
    store: StateStore,
    enrolment: Arc<FakeEnrolment>,
    volumes: Volumes,
}

fn config() -> VolumeConfig {
    VolumeConfig {
        host: HostIdentity {
            nqn: HOSTNQN.into(),
            id: None,
        },
        fabrics: FabricsConfig::default(),
        device_wait: Duration::from_secs(1),
        poll: Duration::from_millis(100),
    }
}

/// A host whose kernel authenticates (Debian's 6.12), enrolled at generation 1.
fn env() -> Env {
    let host = FakeHost::new();
    host.set_kernel_auth(true);
    host.set_modules(
        "6.12.9-cloud-amd64",
        "kernel/drivers/nvme/host/nvme-core.ko.xz: kernel/drivers/nvme/common/nvme-auth.ko.xz\n",
        "",
    );
    env_on(host, true)
}

/// Volumes on `host`, with keys from a fake enrolment at generation 1 or without keys.
fn env_on(host: FakeHost, keys: bool) -> Env {
    let host = Arc::new(host);
    let store = StateStore::open(host.work.join("state")).unwrap();
    let enrolment = FakeEnrolment::new(1);
    let dyn_host: Arc<dyn Host> = host.clone();
    let mut volumes = Volumes::new(dyn_host, store.clone(), config());
    if keys {
        volumes = volumes.with_keys(enrolment.clone());
    }
    Env {
        host,
        store,
        enrolment,
        volumes,
    }
}

fn nqn(n: u32) -> String {
    format!("nqn.2024-01.io.edgevol:box1:vol{n}")
}

impl Env {
    fn stage_req(&self, n: u32, block: bool) -> StageRequest {
        self.host.add_subsystem(
            &nqn(n),
            &format!("{n:032x}"),
            "00000000-0000-0000-0000-000000000000",
            2048,
        );
        let req = NodeStageVolumeRequest {
            volume_id: format!("vol{n}"),
            publish_context: HashMap::from([
                ("transport".into(), "tcp".into()),
                ("targetAddress".into(), "10.0.0.2".into()),
                ("targetPort".into(), "4420".into()),
                ("subsystemNqn".into(), nqn(n)),
                ("nguid".into(), format!("{n:032x}")),
            ]),
            staging_target_path: self
                .host
                .work
                .join(format!("staging/vol{n}"))
                .to_string_lossy()
                .into_owned(),
            volume_capability: Some(VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(if block {
                    AccessType::Block(BlockVolume {})
                } else {
                    AccessType::Mount(MountVolume::default())
                }),
            }),
            secrets: HashMap::new(),
            volume_context: HashMap::new(),
        };
        request::stage(&req).unwrap()
    }

    /// Every byte of every state record.
    fn records_text(&self) -> String {
        let mut all = String::new();
        for e in std::fs::read_dir(self.host.work.join("state")).unwrap() {
            let path = e.unwrap().path();
            if path.is_file() {
                all.push_str(&std::fs::read_to_string(path).unwrap());
            }
        }
        all
    }

    fn dhchap_writes(&self) -> Vec<(String, String)> {
        self.host
            .attr_writes()
            .into_iter()
            .filter_map(|(path, value)| {
                let attr = path.file_name()?.to_string_lossy().into_owned();
                let ctrl = path.parent()?.file_name()?.to_string_lossy().into_owned();
                attr.starts_with("dhchap")
                    .then(|| (format!("{ctrl}/{attr}"), value))
            })
            .collect()
    }
}

#[test]
fn stage_connects_with_the_enrolled_keys_and_keeps_them_out_of_records_logs_and_errors() {
    let e = env();
    let req = e.stage_req(1, false);
    let (staged, log) = capture(|| e.volumes.stage(&req));
    staged.unwrap();
    assert_eq!(e.enrolment.calls(), 1, "enrolled at NodeStageVolume");
    let writes = e.host.fabrics_writes();
    assert_eq!(writes.len(), 1);
    assert!(
        writes[0].ends_with(&format!(
            ",dhchap_secret={},dhchap_ctrl_secret={}",
            secret('h', 1),
            secret('c', 1)
        )),
        "bidirectional keys in the option string"
    );
    assert_eq!(e.host.attr("nvme0", "dhchap_secret"), secret('h', 1));
    assert!(log.contains("connecting NVMe/TCP controller"), "{log}");
    assert!(
        log.contains("authentication=\"DH-HMAC-CHAP bidirectional\""),
        "{log}"
    );
    assert!(log.contains("key_generation=1"), "{log}");

    // A retry reuses the controller; a block volume of another subsystem connects with keys too.
    let (again, log2) = capture(|| {
        e.volumes.stage(&req).unwrap();
        e.volumes.stage(&e.stage_req(2, true))
    });
    again.unwrap();
    assert_eq!(e.host.fabrics_writes().len(), 2);
    assert_eq!(e.store.all().unwrap().len(), 2);

    // A refused connect with keys: the error names the volume and the possible causes.
    let req3 = e.stage_req(3, true);
    e.host.fail_next_connect(5);
    let (err, log3) = capture(|| e.volumes.stage(&req3).unwrap_err());
    assert!(
        matches!(&err, Error::NotFound(m) if m.contains("authentication failed")),
        "{err}"
    );
    assert!(
        e.store.get("vol3").unwrap().is_none(),
        "nothing left behind"
    );

    // (Not the fake host's Debug: it records the option strings written to the kernel.)
    let debug = format!(
        "{:?} {:?} {err:?} {:?}",
        e.volumes.config(),
        e.enrolment,
        e.store.all().unwrap()
    );
    for text in [e.records_text(), log, log2, log3, err.to_string(), debug] {
        assert!(!text.contains("DHHC-1"), "a secret leaked: {text}");
        assert!(!text.contains(&"h".repeat(42)), "{text}");
    }
}

#[test]
fn without_keys_the_connect_says_so_and_carries_none() {
    let e = env_on(FakeHost::new(), false);
    let (staged, log) = capture(|| e.volumes.stage(&e.stage_req(1, true)));
    staged.unwrap();
    assert!(!e.host.fabrics_writes()[0].contains("dhchap"));
    assert!(log.contains("authentication=\"none\""), "{log}");
    assert_eq!(e.volumes.refresh_keys().unwrap(), 0);
    assert_eq!(e.enrolment.calls(), 0);
}

#[test]
fn a_refused_or_unreachable_enrolment_fails_the_stage_before_the_kernel_is_touched() {
    let e = env();
    let req = e.stage_req(1, true);
    e.enrolment.answer(Err(Error::FailedPrecondition(
        "the appliance refused to enrol host NQN: bound to another node".into(),
    )));
    let err = e.volumes.stage(&req).unwrap_err();
    assert!(matches!(&err, Error::FailedPrecondition(m) if m.contains("bound to another node")));
    e.enrolment.answer(Err(Error::Unavailable(
        "enrolment: connection refused".into(),
    )));
    let err = e.volumes.stage(&req).unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    assert!(
        e.host.fabrics_writes().is_empty(),
        "no connect without keys"
    );
    assert!(e.store.get("vol1").unwrap().is_none(), "no record left");

    // Once the appliance answers, the stage goes through; later an unreachable control
    // endpoint does not fail a retry whose controller is connected already.
    e.enrolment.answer(Ok(pair(1)));
    e.volumes.stage(&req).unwrap();
    e.enrolment.answer(Err(Error::Unavailable(
        "enrolment: connection refused".into(),
    )));
    e.volumes.stage(&req).unwrap();
    assert_eq!(e.host.fabrics_writes().len(), 1);
}

#[test]
fn a_kernel_without_nvme_authentication_is_named_before_connecting() {
    let e = env();
    e.host.set_kernel_auth(false);
    // Debian 12's 6.1 cloud kernel: nvme-core without nvme-auth.
    e.host.set_modules(
        "6.1.0-28-cloud-amd64",
        "kernel/drivers/nvme/host/nvme-core.ko:\n",
        "",
    );
    let req = e.stage_req(1, true);
    let err = e.volumes.stage(&req).unwrap_err();
    let Error::FailedPrecondition(msg) = &err else {
        panic!("{err}")
    };
    for want in [
        "vol1",
        "6.1.0-28-cloud-amd64",
        "lacks NVMe in-band authentication",
        "CONFIG_NVME_AUTH",
        "bookworm-security",
        "linux-image-6.12",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
    assert!(e.host.fabrics_writes().is_empty());
    assert!(e.store.get("vol1").unwrap().is_none());

    // Nothing to tell from (no module index, no controller): the connect is tried, and its EIO
    // names the kernel among the causes.
    let blind = env_on(FakeHost::new(), true);
    let err = blind.volumes.stage(&blind.stage_req(1, true)).unwrap_err();
    assert!(
        matches!(&err, Error::NotFound(m) if m.contains("CONFIG_NVME_AUTH") && m.contains("could not check")),
        "{err}"
    );
    assert_eq!(blind.host.fabrics_writes().len(), 1);
}

#[test]
fn a_new_generation_goes_to_every_live_controller_and_only_then() {
    let e = env();
    e.volumes.stage(&e.stage_req(1, true)).unwrap();
    e.volumes.stage(&e.stage_req(2, false)).unwrap();
    assert_eq!(e.host.controller_names(), ["nvme0", "nvme1"]);
    // The same generation: nothing written, however often the node enrols.
    assert_eq!(e.volumes.refresh_keys().unwrap(), 0);
    assert_eq!(e.volumes.refresh_keys().unwrap(), 0);
    assert!(e.dhchap_writes().is_empty());

    // An operator rotated: both controllers get the new pair, controller secret first.
    e.enrolment.answer(Ok(pair(5)));
    let (updated, log) = capture(|| e.volumes.refresh_keys());
    assert_eq!(updated.unwrap(), 2);
    assert_eq!(
        e.dhchap_writes(),
        [
            ("nvme0/dhchap_ctrl_secret".to_owned(), secret('c', 5)),
            ("nvme0/dhchap_secret".to_owned(), secret('h', 5)),
            ("nvme1/dhchap_ctrl_secret".to_owned(), secret('c', 5)),
            ("nvme1/dhchap_secret".to_owned(), secret('h', 5)),
        ]
    );
    for c in ["nvme0", "nvme1"] {
        assert_eq!(e.host.attr(c, "dhchap_secret"), secret('h', 5));
        assert_eq!(e.host.attr(c, "dhchap_ctrl_secret"), secret('c', 5));
    }
    assert!(log.contains("DH-HMAC-CHAP keys rotated"), "{log}");
    assert!(!log.contains("DHHC-1"), "{log}");
    assert_eq!(e.volumes.refresh_keys().unwrap(), 0);
    assert_eq!(e.dhchap_writes().len(), 4, "nothing more once they have it");

    // A failed write is retried at the next enrolment, for that controller only.
    e.enrolment.answer(Ok(pair(6)));
    e.host.fail_next("dhchap_ctrl_secret");
    assert_eq!(e.volumes.refresh_keys().unwrap(), 1);
    assert_eq!(e.volumes.refresh_keys().unwrap(), 1);
    assert_eq!(e.volumes.refresh_keys().unwrap(), 0);
    for c in ["nvme0", "nvme1"] {
        assert_eq!(e.host.attr(c, "dhchap_secret"), secret('h', 6));
    }

    // A stage enrols too, and hands a new generation over before it connects.
    e.enrolment.answer(Ok(pair(7)));
    e.volumes.stage(&e.stage_req(3, true)).unwrap();
    assert_eq!(e.host.attr("nvme0", "dhchap_secret"), secret('h', 7));
    assert!(e.host.fabrics_writes()[2].contains(&secret('h', 7)));
}

#[test]
fn after_a_restart_only_controllers_holding_other_keys_are_written() {
    let e = env();
    e.volumes.stage(&e.stage_req(1, true)).unwrap();
    e.volumes.stage(&e.stage_req(2, true)).unwrap();
    // The plugin restarts while an operator rotates; nvme1 got the new pair some other way.
    e.host
        .write_attr(
            &e.host.sys_root().join("class/nvme/nvme1/dhchap_secret"),
            &secret('h', 2),
        )
        .unwrap();
    e.host
        .write_attr(
            &e.host
                .sys_root()
                .join("class/nvme/nvme1/dhchap_ctrl_secret"),
            &secret('c', 2),
        )
        .unwrap();
    let before = e.dhchap_writes().len();
    let dyn_host: Arc<dyn Host> = e.host.clone();
    let enrolment = FakeEnrolment::new(2);
    let restarted = Volumes::new(dyn_host, e.store.clone(), config()).with_keys(enrolment.clone());
    assert_eq!(restarted.refresh_keys().unwrap(), 1);
    let writes = e.dhchap_writes();
    assert_eq!(writes.len(), before + 2);
    assert!(writes[before..]
        .iter()
        .all(|(attr, _)| attr.starts_with("nvme0/")));

    // A controller connected without keys (an appliance that allowed it) is left alone, with a
    // warning: the kernel takes no keys for it.
    let dyn_host: Arc<dyn Host> = e.host.clone();
    let open = Volumes::new(dyn_host, e.store.clone(), config());
    open.stage(&e.stage_req(9, true)).unwrap();
    assert_eq!(e.host.attr("nvme2", "dhchap_secret"), "none");
    enrolment.answer(Ok(pair(3)));
    let (updated, log) = capture(|| restarted.refresh_keys());
    assert_eq!(updated.unwrap(), 2);
    assert_eq!(e.host.attr("nvme2", "dhchap_secret"), "none");
    assert!(log.contains("connected without DH-HMAC-CHAP keys"), "{log}");
}
