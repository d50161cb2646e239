//! Encrypted volumes against the fake host: LUKS2 formatted on the first stage and opened on
//! later ones, the mapping staged (mount and block), closed at unstage (the appliance gone
//! too), grown by NodeExpandVolume, re-keyed by a rotation; and the refusals: no secret, a
//! wrong key, no dm-crypt, no cryptsetup, foreign data. Every test checks that the passphrase
//! reached cryptsetup's stdin only.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use edgevol_proto::csi::v1::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume,
};
use edgevol_proto::csi::v1::{NodeExpandVolumeRequest, NodeStageVolumeRequest, VolumeCapability};

use crate::crypt::{self, DISCARD_PARAM, ENCRYPTED_PARAM, OLD_PASSPHRASE_KEY, PASSPHRASE_KEY};
use crate::csi::request;
use crate::error::Error;
use crate::fabrics::{FabricsConfig, HostIdentity};
use crate::host::Host;
use crate::state::StateStore;
use crate::testing::{capture, FakeHost};
use crate::volume::{PublishRequest, StageRequest, Usage, VolumeConfig, Volumes};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const KEY: &str = "correct-horse-battery-staple";
const NEW_KEY: &str = "tr0ub4dor-and-3";
const SECTORS: u64 = 2048;

struct Env {
    host: Arc<FakeHost>,
    volumes: Volumes,
    store: StateStore,
}

fn env() -> Env {
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
    }
}

fn nqn(n: u32) -> String {
    format!("nqn.2024-01.io.edgevol:box1:vol{n}")
}

fn cap(block: bool, mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            })
        }),
    }
}

impl Env {
    fn staging(&self, n: u32) -> PathBuf {
        self.host.work.join(format!("staging/vol{n}"))
    }

    /// NodeStageVolume of encrypted volume `n` (its own subsystem) as the CO sends it.
    fn request(
        &self,
        n: u32,
        block: bool,
        context: &[(&str, &str)],
        secrets: &[(&str, &str)],
    ) -> NodeStageVolumeRequest {
        let mut volume_context = HashMap::from([(ENCRYPTED_PARAM.to_owned(), "true".to_owned())]);
        for (k, v) in context {
            volume_context.insert((*k).to_owned(), (*v).to_owned());
        }
        NodeStageVolumeRequest {
            volume_id: format!("vol{n}"),
            publish_context: HashMap::from([
                ("transport".into(), "tcp".into()),
                ("targetAddress".into(), "10.0.0.2".into()),
                ("targetPort".into(), "4420".into()),
                ("subsystemNqn".into(), nqn(n)),
                ("nguid".into(), format!("{n:032x}")),
            ]),
            staging_target_path: self.staging(n).to_string_lossy().into_owned(),
            volume_capability: Some(cap(block, Mode::SingleNodeWriter)),
            secrets: secrets
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            volume_context,
        }
    }

    /// The parsed stage of volume `n`, its subsystem registered, passphrase [`KEY`].
    fn stage_req(&self, n: u32, block: bool) -> StageRequest {
        self.add_volume(n);
        self.stage_req_with(n, block, &[], &[(PASSPHRASE_KEY, KEY)])
    }

    /// Registers volume `n`'s subsystem with the fake appliance.
    fn add_volume(&self, n: u32) {
        self.host
            .add_subsystem(&nqn(n), &format!("{n:032x}"), "", SECTORS);
    }

    /// The parsed stage of registered volume `n` with this context and these secrets.
    fn stage_req_with(
        &self,
        n: u32,
        block: bool,
        context: &[(&str, &str)],
        secrets: &[(&str, &str)],
    ) -> StageRequest {
        request::stage(&self.request(n, block, context, secrets)).unwrap()
    }

    fn cryptsetup_verbs(&self) -> Vec<String> {
        self.host
            .cryptsetup_runs()
            .into_iter()
            .map(|(args, _)| args[0].clone())
            .collect()
    }

    /// No passphrase in any command's arguments, in the state directory, or in `text` (logs
    /// and error messages); passphrases went to cryptsetup's stdin only.
    fn assert_no_secret(&self, text: &str) {
        for key in [KEY, NEW_KEY] {
            assert!(!text.contains(key), "{key} in {text}");
            for (program, args) in self.host.all_commands() {
                assert!(
                    !args.iter().any(|a| a.contains(key)),
                    "{key} in the arguments of {program}: {args:?}"
                );
            }
            for entry in std::fs::read_dir(self.store.dir()).unwrap() {
                let bytes = std::fs::read(entry.unwrap().path()).unwrap();
                assert!(
                    !String::from_utf8_lossy(&bytes).contains(key),
                    "{key} in the state directory"
                );
            }
        }
        assert!(self
            .host
            .cryptsetup_runs()
            .iter()
            .any(|(_, input)| !input.is_empty()));
    }
}

#[test]
fn first_stage_formats_later_stages_open_and_unstage_closes() {
    let e = env();
    let s = e.stage_req(1, false);
    let mapping = crypt::mapping_name("vol1");
    let ((), log) = capture(|| e.volumes.stage(&s).unwrap());
    assert_eq!(e.cryptsetup_verbs(), ["luksFormat", "open"]);
    let runs = e.host.cryptsetup_runs();
    let format = runs[0].0.join(" ");
    assert!(
        format.contains("--type luks2 --pbkdf argon2id --pbkdf-memory 65536"),
        "{format}"
    );
    assert!(
        format.ends_with("--key-file=- ") || format.contains("--key-file=-"),
        "{format}"
    );
    assert_eq!(runs[0].1, KEY.as_bytes(), "the passphrase on stdin");
    assert_eq!(
        e.host.luks_mapping(&mapping),
        Some(("dm-0".to_owned(), "nvme0n1".to_owned()))
    );
    // The filesystem is made and mounted on the mapping, never on the namespace.
    let mkfs = e.host.commands_of("mkfs.ext4");
    assert_eq!(mkfs.len(), 1);
    assert!(mkfs[0].last().unwrap().ends_with("/dm-0"), "{mkfs:?}");
    let mount = e.host.commands_of("mount");
    assert!(mount[0].iter().any(|a| a.ends_with("/dm-0")), "{mount:?}");
    let rec = e.store.get("vol1").unwrap().unwrap();
    assert_eq!(rec.disk.as_deref(), Some("dm-0"));
    assert_eq!(rec.encrypted.as_ref().unwrap().mapping, mapping);

    // A retried stage finds the mapping open: nothing formats or opens again.
    e.volumes.stage(&s).unwrap();
    assert_eq!(e.cryptsetup_verbs(), ["luksFormat", "open"]);

    // Publish, stats and unpublish work on the mapping.
    let p = PublishRequest {
        volume_id: "vol1".into(),
        staging_path: s.staging_path.clone(),
        target_path: e.host.work.join("pods/a/vol1"),
        capability: s.capability.clone(),
        read_only: false,
    };
    e.volumes.publish(&p).unwrap();
    let stats = e.volumes.stats("vol1", &p.target_path).unwrap();
    assert!(matches!(stats.usage, Usage::Filesystem(_)));
    assert_eq!(stats.abnormal, None);
    assert!(matches!(
        e.volumes.unstage("vol1", &s.staging_path),
        Err(Error::FailedPrecondition(_))
    ));
    e.volumes.unpublish("vol1", &p.target_path).unwrap();

    let from = e.host.ops().len();
    e.volumes.unstage("vol1", &s.staging_path).unwrap();
    let ops = e.host.ops()[from..].to_vec();
    let at = |prefix: &str| ops.iter().position(|o| o.starts_with(prefix)).unwrap();
    assert!(
        at("run umount") < at("sync ") && at("sync ") < at("run cryptsetup close"),
        "{ops:?}"
    );
    assert!(
        at("run cryptsetup close") < at("write delete_controller"),
        "{ops:?}"
    );
    assert_eq!(e.host.luks_mapping(&mapping), None);
    assert_eq!(e.store.get("vol1").unwrap(), None);

    // The next stage opens the header it finds, and the filesystem on it stays.
    e.volumes.stage(&s).unwrap();
    assert_eq!(
        e.cryptsetup_verbs(),
        ["luksFormat", "open", "close", "open"]
    );
    assert_eq!(e.host.commands_of("mkfs.ext4").len(), 1);
    e.assert_no_secret(&log);
}

#[test]
fn a_block_volume_publishes_its_mapping() {
    let e = env();
    let s = e.stage_req(2, true);
    e.volumes.stage(&s).unwrap();
    assert!(e.host.commands_of("mkfs.ext4").is_empty());
    let target = e.host.work.join("pods/b/dev");
    let p = PublishRequest {
        volume_id: "vol2".into(),
        staging_path: s.staging_path.clone(),
        target_path: target.clone(),
        capability: s.capability.clone(),
        read_only: false,
    };
    e.volumes.publish(&p).unwrap();
    let bind = e.host.commands_of("mount");
    assert!(bind[0][1].ends_with("/dm-0"), "{bind:?}");
    // The bind shows as /mapper/NAME (mount(8) canonicalises /dev/dm-N): still this volume's.
    assert!(matches!(
        e.volumes.unstage("vol2", &s.staging_path),
        Err(Error::FailedPrecondition(_))
    ));
    let stats = e.volumes.stats("vol2", &target).unwrap();
    assert_eq!(
        stats.usage,
        Usage::Block((SECTORS - crate::testing::LUKS_HEADER_SECTORS) * 512)
    );
    e.volumes.unpublish("vol2", &target).unwrap();
    e.volumes.unstage("vol2", &s.staging_path).unwrap();
    assert_eq!(e.host.luks_mapping(&crypt::mapping_name("vol2")), None);
    e.assert_no_secret("");
}

#[test]
fn a_missing_or_malformed_secret_is_invalid_argument_naming_the_key() {
    let e = env();
    for secrets in [vec![], vec![("password", KEY)], vec![(PASSPHRASE_KEY, "")]] {
        let err = request::stage(&e.request(3, false, &[], &secrets)).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::InvalidArgument(_)), "{text}");
        assert!(text.contains(PASSPHRASE_KEY), "{text}");
        assert!(!text.contains(KEY), "{text}");
    }
    // A plain volume's secrets are not read at all.
    let mut plain = e.request(3, false, &[], &[]);
    plain.volume_context.clear();
    assert_eq!(request::stage(&plain).unwrap().encrypted, None);
}

#[test]
fn a_wrong_key_is_refused_without_echoing_it_and_the_right_one_then_works() {
    let e = env();
    let s = e.stage_req(4, false);
    e.volumes.stage(&s).unwrap();
    e.volumes.unstage("vol4", &s.staging_path).unwrap();
    let wrong = e.stage_req_with(4, false, &[], &[(PASSPHRASE_KEY, NEW_KEY)]);
    let (err, log) = capture(|| e.volumes.stage(&wrong).unwrap_err());
    let text = err.to_string();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{text}");
    assert!(
        text.contains("does not open") && text.contains(PASSPHRASE_KEY),
        "{text}"
    );
    assert_eq!(e.host.luks_mapping(&crypt::mapping_name("vol4")), None);
    assert!(e.host.mounts().iter().all(|(p, _)| *p != s.staging_path));
    e.assert_no_secret(&format!("{text}\n{log}"));
    // The CO retries with the fixed secret: it converges.
    e.volumes.stage(&s).unwrap();
    assert!(e.host.luks_mapping(&crypt::mapping_name("vol4")).is_some());
}

#[test]
fn no_dm_crypt_is_failed_precondition_naming_the_module() {
    let e = env();
    e.host.remove_dm_crypt();
    let s = e.stage_req(5, false);
    let err = e.volumes.stage(&s).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{text}");
    assert!(
        text.contains("dm-crypt") && text.contains("CONFIG_DM_CRYPT"),
        "{text}"
    );
    assert!(e.host.controller_names().is_empty(), "nothing connected");
    assert_eq!(e.store.get("vol5").unwrap(), None, "nothing recorded");
    assert_eq!(
        e.host.commands_of("modprobe"),
        [vec!["dm-crypt".to_owned()]]
    );
    // A module the plugin can load is loaded, and the stage goes on.
    e.host.set_loadable(&["dm-crypt"]);
    e.volumes.stage(&s).unwrap();
    assert!(e.host.luks_mapping(&crypt::mapping_name("vol5")).is_some());
}

#[test]
fn no_cryptsetup_in_the_image_is_failed_precondition() {
    let e = env();
    e.host.remove_cryptsetup();
    let s = e.stage_req(6, false);
    let err = e.volumes.stage(&s).unwrap_err();
    assert!(
        matches!(&err, Error::FailedPrecondition(m) if m.contains("cryptsetup is not installed")),
        "{err}"
    );
}

#[test]
fn an_unencrypted_filesystem_is_never_formatted_over() {
    let e = env();
    let s = e.stage_req(7, false);
    // The namespace appears as nvme0n1 at the connect; it holds a plain volume's ext4.
    e.host.set_signature("nvme0n1", "TYPE=ext4\n");
    let err = e.volumes.stage(&s).unwrap_err();
    assert!(
        matches!(&err, Error::FailedPrecondition(m) if m.contains("unencrypted ext4")),
        "{err}"
    );
    assert!(!e.cryptsetup_verbs().contains(&"luksFormat".to_owned()));
}

#[test]
fn a_rotation_rekeys_the_slot_and_the_old_key_stops_working() {
    let e = env();
    let s = e.stage_req(8, false);
    e.volumes.stage(&s).unwrap();
    e.volumes.unstage("vol8", &s.staging_path).unwrap();
    let rotate = e.stage_req_with(
        8,
        false,
        &[],
        &[(PASSPHRASE_KEY, NEW_KEY), (OLD_PASSPHRASE_KEY, KEY)],
    );
    let ((), log) = capture(|| e.volumes.stage(&rotate).unwrap());
    let runs = e.host.cryptsetup_runs();
    let change = runs
        .iter()
        .find(|(a, _)| a[0] == "luksChangeKey")
        .expect("re-keyed");
    assert_eq!(change.1, format!("{KEY}\n{NEW_KEY}\n").into_bytes());
    assert_eq!(e.host.luks_slots("nvme0n1"), Some(1));
    e.volumes.unstage("vol8", &rotate.staging_path).unwrap();
    // The old passphrase alone no longer opens the volume; the new one does.
    let err = e.volumes.stage(&s).unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err}");
    let new_only = e.stage_req_with(8, false, &[], &[(PASSPHRASE_KEY, NEW_KEY)]);
    e.volumes.stage(&new_only).unwrap();
    e.volumes.unstage("vol8", &new_only.staging_path).unwrap();
    // A header where both open (a rotation half done by hand): the old slot is removed.
    e.host.luks_add_slot("nvme0n1", KEY.as_bytes());
    e.volumes.stage(&rotate).unwrap();
    assert_eq!(e.host.luks_slots("nvme0n1"), Some(1));
    assert!(e.cryptsetup_verbs().contains(&"luksRemoveKey".to_owned()));
    e.assert_no_secret(&log);
}

#[test]
fn discards_pass_only_when_asked() {
    let e = env();
    let plain = e.stage_req(9, true);
    e.volumes.stage(&plain).unwrap();
    e.add_volume(10);
    let with = e.stage_req_with(
        10,
        true,
        &[(DISCARD_PARAM, "true")],
        &[(PASSPHRASE_KEY, KEY)],
    );
    e.volumes.stage(&with).unwrap();
    let opens: Vec<Vec<String>> = e
        .host
        .cryptsetup_runs()
        .into_iter()
        .filter(|(a, _)| a[0] == "open")
        .map(|(a, _)| a)
        .collect();
    assert!(
        !opens[0].contains(&"--allow-discards".to_owned()),
        "{opens:?}"
    );
    assert!(
        opens[1].contains(&"--allow-discards".to_owned()),
        "{opens:?}"
    );
    // A stage of a staged volume asking for other encryption is ALREADY_EXISTS.
    let other = e.stage_req_with(
        9,
        true,
        &[(DISCARD_PARAM, "true")],
        &[(PASSPHRASE_KEY, KEY)],
    );
    assert!(matches!(
        e.volumes.stage(&other),
        Err(Error::AlreadyExists(_))
    ));
}

#[test]
fn expansion_grows_the_mapping_then_the_filesystem() {
    let e = env();
    let s = e.stage_req(11, false);
    e.volumes.stage(&s).unwrap();
    e.host.grow_subsystem(&nqn(11), 4 * SECTORS);
    let req = request::expand(&NodeExpandVolumeRequest {
        volume_id: "vol11".into(),
        volume_path: s.staging_path.to_string_lossy().into_owned(),
        capacity_range: Some(edgevol_proto::csi::v1::CapacityRange {
            required_bytes: i64::try_from(4 * SECTORS * 512).unwrap(),
            limit_bytes: 0,
        }),
        secrets: HashMap::from([(PASSPHRASE_KEY.to_owned(), KEY.to_owned())]),
        ..Default::default()
    })
    .unwrap();
    // Without the node-expand secret: FAILED_PRECONDITION saying what to configure.
    let no_key = crate::volume::ExpandRequest {
        key: None,
        ..req.clone()
    };
    let err = e.volumes.expand(&no_key).unwrap_err();
    assert!(
        matches!(&err, Error::FailedPrecondition(m) if m.contains("node-expand-secret-name")),
        "{err}"
    );
    let from = e.host.ops().len();
    e.volumes.expand(&req).unwrap();
    let ops = e.host.ops()[from..].to_vec();
    let resize = ops
        .iter()
        .position(|o| o.starts_with("run cryptsetup resize"))
        .expect("mapping resized");
    let grow = ops
        .iter()
        .position(|o| o.starts_with("run resize2fs") && o.ends_with("/dm-0"))
        .expect("filesystem grown on the mapping");
    assert!(resize < grow, "{ops:?}");
    let dm = crate::sysfs::disk_size(&*e.host, "dm-0").unwrap();
    assert_eq!(
        dm,
        (4 * SECTORS - crate::testing::LUKS_HEADER_SECTORS) * 512
    );
    e.assert_no_secret("");
}

#[test]
fn unstage_closes_the_mapping_when_the_appliance_is_gone() {
    let e = env();
    let s = e.stage_req(12, false);
    e.volumes.stage(&s).unwrap();
    e.host.set_controller_state("nvme0", "connecting");
    e.host.fail_next("sync");
    e.volumes.unstage("vol12", &s.staging_path).unwrap();
    assert_eq!(e.host.luks_mapping(&crypt::mapping_name("vol12")), None);
    assert!(e.host.controller_names().is_empty());
    assert_eq!(e.store.get("vol12").unwrap(), None);
}
