//! Encrypted volumes end to end (scripts/test-encrypted-qemu.sh): an `edgevold` process on this
//! host (`box-e`, a file pool this test reads) and a node VM (6.1 kernel with dm-crypt, Debian's
//! cryptsetup, static edgevol-node reaching the box through slirp at 10.0.2.2).
//!
//! [`encrypted_volumes_keep_the_box_blind`]: an `encrypted: "true"` ext4 volume and a raw block
//! one are staged with a passphrase in NodeStageVolume's secrets, written with a marker,
//! unstaged, staged again and read back; the box's pool file holds no copy of the marker (a
//! plain volume written with another marker shows the scan finds one when it is there); no
//! secret, or a wrong one, is refused with the spec's code and without the key in the message;
//! a rotation re-keys the slot and the old passphrase stops working; ControllerExpandVolume and
//! NodeExpandVolume grow the mapping and then ext4; a snapshot restored into a new volume is
//! encrypted too and opens with the key. Last, every log line (the box's, the node VM's
//! console with edgevol-node's output), every error message and every state file (the node's
//! state dir, the box's data dir) is searched for each passphrase: none holds one.
//!
//! Ignored by default: it needs the VM and the binaries the script builds.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use edgevol_e2e::host_appliance::{env_path, HostAppliance as Appliance};
use edgevol_e2e::rig::{capability, Attached, Rig};
use edgevol_e2e::{appliance_channel, within};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::{NodeExpandVolumeRequest, NodeStageVolumeRequest, Volume};
use tonic::Code;

const MIB: i64 = 1 << 20;
/// A stage formats or opens LUKS2: argon2id under TCG takes seconds.
const STAGE_S: u64 = 120;
const KEY: &str = "e2e-correct-horse-7f3a91";
const NEW_KEY: &str = "e2e-rotated-staple-9c1d44";
const WRONG_KEY: &str = "e2e-wrong-battery-0b2e57";

/// The box: edgevold on a dev file pool, at debug level (the passphrase search reads its log).
async fn box_e(bin: &Path, pki: &Path, work: &Path) -> Appliance {
    let mut b = Appliance::new("box-e", work);
    b.rust_log = "debug";
    b.start(bin, pki).await;
    b
}

/// Searches every file under a directory (argv 2) for a byte string (argv 1), reading only the
/// data of sparse files (SEEK_DATA/SEEK_HOLE: the pool file is 16 GiB, nearly all hole). Exit 0
/// and the file's path when found, 1 when not.
const SCAN: &str = r#"
import os, sys
needle, top, step = sys.argv[1].encode(), sys.argv[2], 8 << 20
for root, _, files in os.walk(top):
    for name in files:
        path = os.path.join(root, name)
        fd = os.open(path, os.O_RDONLY)
        size, off = os.fstat(fd).st_size, 0
        while off < size:
            try:
                off = os.lseek(fd, off, os.SEEK_DATA)
            except OSError:
                break
            end = os.lseek(fd, off, os.SEEK_HOLE)
            pos = max(0, off - len(needle))
            while pos < end:
                if needle in os.pread(fd, min(step, end - pos) + len(needle), pos):
                    print(path)
                    sys.exit(0)
                pos += step
            off = end
        os.close(fd)
sys.exit(1)
"#;

/// True when any file under `dir` holds `needle`.
fn dir_holds(dir: &Path, needle: &[u8]) -> bool {
    let needle = std::str::from_utf8(needle).expect("an ASCII needle");
    let status = Command::new("python3")
        .args(["-c", SCAN, needle])
        .arg(dir)
        .status()
        .expect("run python3");
    match status.code() {
        Some(0) => true,
        Some(1) => false,
        other => panic!("scanning {} failed: {other:?}", dir.display()),
    }
}

fn secrets(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn encrypted() -> HashMap<String, String> {
    secrets(&[("encrypted", "true")])
}

/// NodeStageVolume of `a` with `secrets`; the error's code and message when it is refused.
async fn stage(
    rig: &mut Rig,
    a: &Attached,
    secrets: HashMap<String, String>,
) -> Result<(), (Code, String)> {
    let req = NodeStageVolumeRequest {
        secrets,
        ..rig.stage_req(a)
    };
    within(STAGE_S, "NodeStageVolume", rig.node.node_stage_volume(req))
        .await
        .map(|_| ())
        .map_err(|s| (s.code(), s.message().to_owned()))
}

/// NodePublishVolume of a staged `a` at its target.
async fn publish(rig: &mut Rig, a: &Attached) {
    let req = rig.publish_req(a, &a.target, false);
    within(60, "NodePublishVolume", rig.node.node_publish_volume(req))
        .await
        .expect("NodePublishVolume");
}

/// ControllerPublish, NodeStage with `secrets` and NodePublish of `volume`.
async fn attach(
    rig: &mut Rig,
    volume: &Volume,
    block: bool,
    tag: &str,
    secrets: HashMap<String, String>,
) -> Attached {
    let cap = capability(block);
    let context = rig.controller_publish(&volume.volume_id, &cap).await;
    let (staging, target) = edgevol_e2e::rig::paths(tag, block);
    let a = Attached {
        volume_id: volume.volume_id.clone(),
        staging,
        target,
        cap,
        context,
        volume_context: volume.volume_context.clone(),
    };
    rig.agent
        .ok(
            10,
            &format!("mkdir -p {} /var/lib/kubelet/pods/{tag}", a.staging),
        )
        .await;
    stage(rig, &a, secrets).await.expect("NodeStageVolume");
    publish(rig, &a).await;
    a
}

/// The dm-crypt mapping name edgevol-node gives a volume (`edgevol-` and the FNV-1a hash of
/// its id, node/src/crypt.rs).
fn mapping_name(volume_id: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in volume_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("edgevol-{h:016x}")
}

/// NodeUnpublish and NodeUnstage: the volume's mapping is closed.
async fn detach(rig: &mut Rig, a: &Attached) {
    rig.node_unpublish(&a.volume_id, &a.target).await;
    rig.node_unstage(&a.volume_id, &a.staging).await;
    let maps = rig.agent.ok(10, "ls /dev/mapper").await;
    let name = mapping_name(&a.volume_id);
    assert!(!maps.contains(&name), "mapping {name} left open: {maps}");
}

/// Writes the 1 MiB marker file /tmp/marker-TAG to `a` (a file on ext4, or the start of the
/// raw device) and flushes it.
async fn write_marker(rig: &Rig, a: &Attached, tag: &str) {
    let cmd = if a.block() {
        format!(
            "dd if=/tmp/marker-{tag} of={} bs=1M count=1 conv=fsync",
            a.target
        )
    } else {
        format!("cp /tmp/marker-{tag} {}/marker && sync", a.target)
    };
    rig.agent.ok(60, &cmd).await;
}

/// Reads the marker back from `a` and compares it with /tmp/marker-TAG.
async fn verify_marker(rig: &Rig, a: &Attached, tag: &str) {
    let cmd = if a.block() {
        format!(
            "dd if={} of=/tmp/readback bs=1M count=1 && cmp /tmp/readback /tmp/marker-{tag}",
            a.target
        )
    } else {
        format!("cmp {}/marker /tmp/marker-{tag}", a.target)
    };
    rig.agent.ok(60, &cmd).await;
}

/// Asserts a refusal's code and that its message names what it should and no passphrase.
fn refused(got: Result<(), (Code, String)>, code: Code, names: &str, errors: &mut Vec<String>) {
    let (c, msg) = got.expect_err("the stage must be refused");
    assert_eq!(c, code, "{msg}");
    assert!(msg.contains(names), "{msg}");
    for k in [KEY, NEW_KEY, WRONG_KEY] {
        assert!(!msg.contains(k), "the error echoes a passphrase: {msg}");
    }
    errors.push(msg);
}

#[tokio::test]
#[ignore = "needs the node VM: scripts/test-encrypted-qemu.sh"]
async fn encrypted_volumes_keep_the_box_blind() {
    let bin = env_path("EDGEVOL_E2E_BIN");
    let pki = env_path("EDGEVOL_E2E_PKI");
    let work = env_path("EDGEVOL_E2E_WORK");
    let node_log = env_path("EDGEVOL_E2E_NODE_LOG");
    let box_e = box_e(&bin, &pki, &work).await;
    let ctl = ControllerClient::new(appliance_channel(box_e.csi, &pki, "controller").await);
    let mut rig = Rig::with_controller(ctl).await;
    let mut errors = Vec::new();
    // Markers unique to this run, so an old pool cannot hold them by chance.
    let run = std::process::id();
    let (fs_mark, blk_mark, plain_mark) = (
        format!("EDGEVOL-ENCRYPTED-FS-MARKER-{run}-"),
        format!("EDGEVOL-ENCRYPTED-BLK-MARKER-{run}-"),
        format!("EDGEVOL-PLAIN-MARKER-{run}-"),
    );
    for (tag, mark) in [("fs", &fs_mark), ("blk", &blk_mark), ("plain", &plain_mark)] {
        rig.agent
            .ok(
                30,
                &format!("yes {mark} | head -c 1048576 > /tmp/marker-{tag}"),
            )
            .await;
    }

    eprintln!("encrypted: creating, staging and writing an ext4 and a raw block volume");
    let key = || secrets(&[("encryptionPassphrase", KEY)]);
    let fs_vol = rig
        .create_with("enc-fs", 128 * MIB, capability(false), None, encrypted())
        .await;
    let blk_vol = rig
        .create_with("enc-blk", 64 * MIB, capability(true), None, encrypted())
        .await;
    for v in [&fs_vol, &blk_vol] {
        assert_eq!(
            v.volume_context.get("encrypted").map(String::as_str),
            Some("true"),
            "{v:?}"
        );
    }
    let fs = attach(&mut rig, &fs_vol, false, "enc-fs", key()).await;
    let blk = attach(&mut rig, &blk_vol, true, "enc-blk", key()).await;
    let maps = rig.agent.ok(10, "ls /dev/mapper").await;
    for a in [&fs, &blk] {
        let name = mapping_name(&a.volume_id);
        assert!(maps.contains(&name), "no mapping {name}: {maps}");
    }
    let mounts = rig.mounts().await;
    let staged_on = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(fs.staging.as_str()))
        .unwrap_or_else(|| panic!("{} not mounted:\n{mounts}", fs.staging));
    assert!(
        staged_on.starts_with("/dev/dm-") || staged_on.starts_with("/dev/mapper/"),
        "ext4 is mounted from the dm-crypt mapping: {staged_on}"
    );
    write_marker(&rig, &fs, "fs").await;
    write_marker(&rig, &blk, "blk").await;
    // A plain volume with a marker: the pool scan below finds what is in the clear.
    let plain_vol = rig.create("plain-blk", 16 * MIB, true, None).await;
    let plain = rig.attach(&plain_vol, true, "plain-blk").await;
    write_marker(&rig, &plain, "plain").await;

    eprintln!("encrypted: unstage, scan the pool, stage again and read back");
    for a in [&fs, &blk, &plain] {
        detach(&mut rig, a).await;
    }
    assert!(
        dir_holds(&box_e.dir, plain_mark.as_bytes()),
        "the scan does not find the plain volume's marker: it proves nothing"
    );
    for mark in [&fs_mark, &blk_mark] {
        assert!(
            !dir_holds(&box_e.dir, mark.as_bytes()),
            "the box's data dir holds the marker {mark} in the clear"
        );
    }
    for a in [&fs, &blk] {
        stage(&mut rig, a, key()).await.expect("stage again");
        publish(&mut rig, a).await;
    }
    verify_marker(&rig, &fs, "fs").await;
    verify_marker(&rig, &blk, "blk").await;

    eprintln!("encrypted: no secret, a wrong one, then a rotation");
    detach(&mut rig, &blk).await;
    let none = stage(&mut rig, &blk, HashMap::new()).await;
    refused(
        none,
        Code::InvalidArgument,
        "encryptionPassphrase",
        &mut errors,
    );
    let wrong = stage(
        &mut rig,
        &blk,
        secrets(&[("encryptionPassphrase", WRONG_KEY)]),
    )
    .await;
    refused(
        wrong,
        Code::FailedPrecondition,
        "does not open",
        &mut errors,
    );
    let rotate = secrets(&[
        ("encryptionPassphrase", NEW_KEY),
        ("oldEncryptionPassphrase", KEY),
    ]);
    stage(&mut rig, &blk, rotate)
        .await
        .expect("stage with a rotation");
    publish(&mut rig, &blk).await;
    verify_marker(&rig, &blk, "blk").await;
    detach(&mut rig, &blk).await;
    let old = stage(&mut rig, &blk, key()).await;
    refused(old, Code::FailedPrecondition, "does not open", &mut errors);
    let new_key = || secrets(&[("encryptionPassphrase", NEW_KEY)]);
    stage(&mut rig, &blk, new_key())
        .await
        .expect("the new key opens it");
    publish(&mut rig, &blk).await;
    verify_marker(&rig, &blk, "blk").await;

    eprintln!("encrypted: online expansion of the ext4 volume");
    // -P: one line per filesystem, however long its device name (/dev/mapper/…).
    let df = format!("df -P -k {}", fs.target);
    let before = edgevol_e2e::rig::df_kib(&rig.agent.ok(10, &df).await);
    rig.controller_expand(&fs, 192 * MIB).await;
    // Without the node-expand secret the node cannot grow the mapping and says what to set.
    let bare = rig.node_expand_req(&fs, &fs.target, 192 * MIB);
    let err = within(
        STAGE_S,
        "NodeExpandVolume",
        rig.node.node_expand_volume(bare),
    )
    .await
    .expect_err("growing the mapping needs the passphrase here");
    refused(
        Err((err.code(), err.message().to_owned())),
        Code::FailedPrecondition,
        "node-expand-secret-name",
        &mut errors,
    );
    let with_key = NodeExpandVolumeRequest {
        secrets: key(),
        ..rig.node_expand_req(&fs, &fs.target, 192 * MIB)
    };
    within(
        STAGE_S,
        "NodeExpandVolume",
        rig.node.node_expand_volume(with_key),
    )
    .await
    .expect("NodeExpandVolume with the node-expand secret");
    let after = edgevol_e2e::rig::df_kib(&rig.agent.ok(10, &df).await);
    assert!(
        after > before + 32 * 1024,
        "ext4 did not grow with the mapping: {before} KiB -> {after} KiB"
    );
    let size = rig
        .agent
        .ok(
            10,
            "for d in /sys/block/dm-*; do cat $d/dm/name $d/size; done",
        )
        .await;
    eprintln!("encrypted: mappings (name, sectors) after the expansion: {size}");

    eprintln!("encrypted: a snapshot restored with the key");
    let snap = rig.snapshot(&fs.volume_id, "enc-fs-snap").await;
    let restored_vol = rig
        .create_with(
            "enc-fs-restored",
            192 * MIB,
            capability(false),
            Some(&snap.snapshot_id),
            HashMap::new(),
        )
        .await;
    assert_eq!(
        restored_vol
            .volume_context
            .get("encrypted")
            .map(String::as_str),
        Some("true"),
        "a restore of an encrypted snapshot is encrypted: {:?}",
        restored_vol.volume_context
    );
    let restored = attach(&mut rig, &restored_vol, false, "enc-fs-restored", key()).await;
    verify_marker(&rig, &restored, "fs").await;

    eprintln!("encrypted: teardown");
    for a in [&restored, &fs, &blk, &plain] {
        if a.volume_id != plain.volume_id {
            detach(&mut rig, a).await;
        }
        rig.controller_unpublish(&a.volume_id).await;
        rig.delete(&a.volume_id).await;
    }
    rig.delete_snapshot(&snap.snapshot_id).await;
    rig.assert_nothing_left().await;

    eprintln!("encrypted: searching logs, errors and state files for the passphrases");
    let guest = rig
        .agent
        .sh(
            30,
            &format!(
                "grep -r -l -F -e {KEY} -e {NEW_KEY} -e {WRONG_KEY} /var/lib/edgevol-node \
                 /etc /proc/cmdline 2>/dev/null; dmesg | grep -c -F -e {KEY} -e {NEW_KEY} \
                 -e {WRONG_KEY}"
            ),
        )
        .await;
    assert_eq!(
        guest.1.trim(),
        "0",
        "the node VM holds a passphrase: {guest:?}"
    );
    let logs = [
        std::fs::read(&node_log).expect("the node VM's console log"),
        std::fs::read(&box_e.log).expect("the box's log"),
    ];
    assert!(
        logs[0].windows(12).any(|w| w == b"LUKS2 header"),
        "the node log holds edgevol-node's lines"
    );
    for k in [KEY, NEW_KEY, WRONG_KEY] {
        for (what, text) in [("node VM console", &logs[0]), ("box-e", &logs[1])] {
            assert!(
                !text.windows(k.len()).any(|w| w == k.as_bytes()),
                "the {what} log holds a passphrase"
            );
        }
        assert!(!errors.iter().any(|e| e.contains(k)));
        assert!(
            !dir_holds(&box_e.dir, k.as_bytes()),
            "the box's data dir holds a passphrase"
        );
    }
    eprintln!("encrypted: PASS ({} refusals checked)", errors.len());
}

/// One fio workload of the encrypted-against-plain bench: name, unit, rw, block size, queue depth.
struct Workload {
    name: &'static str,
    iops: bool,
    rw: &'static str,
    bs: &'static str,
    qd: u32,
}

const BENCH_WORKLOADS: [Workload; 4] = [
    Workload {
        name: "4k randread QD16",
        iops: true,
        rw: "randread",
        bs: "4k",
        qd: 16,
    },
    Workload {
        name: "4k randwrite QD16",
        iops: true,
        rw: "randwrite",
        bs: "4k",
        qd: 16,
    },
    Workload {
        name: "128k read QD8",
        iops: false,
        rw: "read",
        bs: "128k",
        qd: 8,
    },
    Workload {
        name: "128k write QD8",
        iops: false,
        rw: "write",
        bs: "128k",
        qd: 8,
    },
];

/// The region fio touches on both volumes (filled first, so reads hit written blocks).
const BENCH_REGION_MIB: i64 = 256;

/// IOPS or MiB/s of `w`'s terse fio line in `output`.
fn parse_fio(output: &str, w: &Workload) -> f64 {
    edgevol_e2e::fio::terse_figure(output, w.rw.contains("write"), w.iops)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The bench (scripts/test-encrypted-qemu.sh --bench, on a quiet machine): a plain and an
/// encrypted raw block volume of the same box, the same node VM, fio rows interleaved (plain,
/// encrypted, for every workload, `EDGEVOL_BENCH_RUNS` rounds), medians, and how busy the
/// node's vCPU was: a markdown table on stdout and in `EDGEVOL_BENCH_OUT` when set.
#[tokio::test]
#[ignore = "a benchmark: scripts/test-encrypted-qemu.sh --bench"]
async fn bench_encrypted_against_plain() {
    let bin = env_path("EDGEVOL_E2E_BIN");
    let pki = env_path("EDGEVOL_E2E_PKI");
    let work = env_path("EDGEVOL_E2E_WORK");
    let runs = std::env::var("EDGEVOL_BENCH_RUNS").map_or(3, |v| v.parse().expect("runs"));
    let secs: u64 = std::env::var("EDGEVOL_BENCH_SECS").map_or(10, |v| v.parse().expect("secs"));
    let box_e = box_e(&bin, &pki, &work).await;
    let ctl = ControllerClient::new(appliance_channel(box_e.csi, &pki, "controller").await);
    let mut rig = Rig::with_controller(ctl).await;
    // The header takes 16 MiB of the encrypted one: both offer at least the region.
    let size = BENCH_REGION_MIB * MIB + 32 * MIB;
    let plain_vol = rig.create("bench-plain", size, true, None).await;
    let enc_vol = rig
        .create_with("bench-enc", size, capability(true), None, encrypted())
        .await;
    let plain = rig.attach(&plain_vol, true, "bench-plain").await;
    let enc = attach(
        &mut rig,
        &enc_vol,
        true,
        "bench-enc",
        secrets(&[("encryptionPassphrase", KEY)]),
    )
    .await;
    let targets = [("plain", &plain), ("encrypted", &enc)];
    for (name, a) in targets {
        eprintln!("encrypted bench: filling {BENCH_REGION_MIB} MiB of the {name} volume");
        rig.agent
            .ok(
                900,
                &format!(
                    "fio --name=fill --filename={} --direct=1 --ioengine=libaio --rw=write \
                     --bs=1m --iodepth=8 --size={BENCH_REGION_MIB}m --output-format=terse \
                     --terse-version=3",
                    a.target
                ),
            )
            .await;
    }
    let mut values: HashMap<(&str, &str), Vec<f64>> = HashMap::new();
    let mut busy: HashMap<(&str, &str), Vec<f64>> = HashMap::new();
    for round in 0..runs {
        for w in &BENCH_WORKLOADS {
            for (name, a) in targets {
                let cmd = format!(
                    "head -1 /proc/stat && fio --name=b --filename={} --direct=1 \
                     --ioengine=libaio --rw={} --bs={} --iodepth={} --size={BENCH_REGION_MIB}m \
                     --time_based --runtime={secs} --ramp_time=1 --norandommap --randrepeat=0 \
                     --output-format=terse --terse-version=3 && head -1 /proc/stat",
                    a.target, w.rw, w.bs, w.qd
                );
                let output = rig.agent.ok(secs + 120, &cmd).await;
                let (v, b) = (parse_fio(&output, w), edgevol_e2e::fio::node_busy(&output));
                eprintln!(
                    "encrypted bench: {} round {round} {name}: {v:.1} (node CPU busy {b:.2})",
                    w.name
                );
                values.entry((w.name, name)).or_default().push(v);
                busy.entry((w.name, name)).or_default().push(b);
            }
        }
    }
    let mut table = String::from(
        "| workload | plain | encrypted | encrypted / plain | node CPU busy, plain | node CPU \
         busy, encrypted |\n|---|---|---|---|---|---|\n",
    );
    for w in &BENCH_WORKLOADS {
        let (p, e) = (
            median(&values[&(w.name, "plain")]),
            median(&values[&(w.name, "encrypted")]),
        );
        let unit = if w.iops { "IOPS" } else { "MiB/s" };
        let fmt = |x: f64| {
            if w.iops {
                format!("{x:.0} {unit}")
            } else {
                format!("{x:.1} {unit}")
            }
        };
        table.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.0}% | {:.0}% |\n",
            w.name,
            fmt(p),
            fmt(e),
            e / p,
            100.0 * median(&busy[&(w.name, "plain")]),
            100.0 * median(&busy[&(w.name, "encrypted")])
        ));
    }
    println!("{table}");
    if let Ok(out) = std::env::var("EDGEVOL_BENCH_OUT") {
        std::fs::write(&out, &table).expect("write EDGEVOL_BENCH_OUT");
    }
    for a in [&plain, &enc] {
        rig.detach_and_delete(a).await;
    }
}
