//! Interop with Debian's nvme-cli (what users run) in a QEMU TCG guest, which reaches this
//! process's target at 10.0.2.2 through slirp: discovery lists exactly the host's subsystems,
//! connect, `nvme list` / `id-ctrl` / `id-ns` / `ns-descs` show our model, serial, NGUID and
//! UUID, a dd round trip, `fio --verify=crc32c` random writes, a CSI snapshot cut while the guest
//! writes (checked on a clone), ext4 files md5-verified across a disconnect and a new connect,
//! and connects the access list refuses. The guest (qemu/nvme-cli-guest.sh) only reports; this
//! test judges its serial log and reads the volume back through core. Ignored by default:
//! `scripts/test-nvme-qemu.sh` runs it (it needs the QEMU harness of `scripts/setup-qemu.sh` and
//! the host's nvme-cli).

mod common;

use common::guest::{steps, GuestRun, Step};
use std::time::Duration;

use edgevol_appliance::csi::ids::Ids;
use edgevol_appliance::naming;
use edgevol_core::{VolumeId, VolumeSpec};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_content_source::{SnapshotSource, Type};
use edgevol_proto::csi::v1::{CreateSnapshotRequest, VolumeContentSource};
use std::sync::atomic::Ordering;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::oneshot;
use tonic::transport::Channel;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0e0e0e0e-5555-6666-7777-888888888888";
const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0e0e0e0e-9999-aaaa-bbbb-cccccccccccc";
const STRANGER: &str = "nqn.2014-08.org.nvmexpress:uuid:deadbeef-0000-0000-0000-000000000001";
const APPLIANCE: &str = "qemu-cli";
const MIB: u64 = 1 << 20;
const SIZE: u64 = 256 * MIB;
/// Where the guest writes before and after the snapshot (qemu/nvme-cli-guest.sh).
const SNAP_AT: u64 = 128 * MIB;
const SNAP_LEN: u64 = 8 * MIB;
const NVME_CLI: &str = "/usr/sbin/nvme";
const FIO: &str = "/usr/bin/fio";
const MKFS: &str = "/usr/sbin/mkfs.ext4";

impl Step {
    /// The value of an nvme-cli `key : value` line (id-ctrl, id-ns), trimmed.
    fn field(&self, key: &str) -> Option<String> {
        self.out.iter().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        })
    }

    /// Values of `key: value` lines of discovery log entries (`subnqn:`, `traddr:`, ...).
    fn all(&self, key: &str) -> Vec<String> {
        self.out
            .iter()
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_owned())
            })
            .collect()
    }

    /// `Discovery Log Number of Records N, ...`.
    fn records(&self) -> Option<u64> {
        self.out.iter().find_map(|l| {
            let rest = l.split("Number of Records").nth(1)?;
            rest.trim()
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
    }
}

fn sha256(data: &[u8]) -> String {
    naming::hex(ring::digest::digest(&ring::digest::SHA256, data).as_ref())
}

/// What the control port saw: the snapshot cut while the guest wrote, and the volume's write
/// counter when the request came and when the answer went.
struct Snapped {
    snapshot_id: String,
    writes_before: u64,
    writes_after: u64,
}

/// Serves the guest's one "snapshot" request: CreateSnapshot over CSI (mTLS, controller role)
/// while the guest's fio keeps writing, then the answer once a write after the cut was counted
/// (polled: a guest on a busy machine may take a while).
async fn serve_snapshot(
    listener: tokio::net::TcpListener,
    channel: Channel,
    stats: edgevol_appliance::nvme::stats::IoStats,
    volume: VolumeId,
    volume_id: String,
    done: oneshot::Sender<Snapped>,
) {
    let (stream, _) = listener.accept().await.unwrap();
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await.unwrap();
    assert_eq!(line.trim(), "snapshot", "control request");
    let writes = || {
        let counters = stats.volume(volume);
        counters.write.ops.load(Ordering::Relaxed)
    };
    let writes_before = writes();
    let snapshot = ControllerClient::new(channel)
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: volume_id,
            name: "while-the-guest-writes".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let at_cut = writes();
    let deadline = tokio::time::Instant::now() + common::scaled(Duration::from_secs(30));
    while writes() == at_cut && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let writes_after = writes();
    write
        .write_all(format!("{} {writes_before} {writes_after}\n", snapshot.snapshot_id).as_bytes())
        .await
        .unwrap();
    drop(write);
    let _ = done.send(Snapped {
        snapshot_id: snapshot.snapshot_id,
        writes_before,
        writes_after,
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "boots a QEMU guest with the host's nvme-cli: scripts/test-nvme-qemu.sh"]
async fn nvme_cli_discovers_connects_identifies_and_is_refused() {
    for tool in [NVME_CLI, FIO, MKFS] {
        assert!(
            std::path::Path::new(tool).exists(),
            "{tool} missing: scripts/test-nvme-qemu.sh installs nvme-cli, fio and e2fsprogs"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let running = common::qemu_appliance(dir.path(), APPLIANCE).await;
    let state = running.state.clone();
    let port = running.target.endpoint.port();
    // Two volumes: one published to the guest's host NQN, one to another host only.
    let (id, other, pool_uuid) = state
        .on_pool(|_, pool| {
            let other = pool
                .create_volume(VolumeSpec::new("someone-else", SIZE))
                .unwrap();
            pool.publish(other, OTHER_HOST, false).unwrap();
            // Created second, so its id (in the serial and the NGUID) is not 0.
            let id = pool.create_volume(VolumeSpec::new("cli", SIZE)).unwrap();
            pool.publish(id, HOST, false).unwrap();
            (id, other, pool.uuid())
        })
        .await
        .unwrap();
    let nqn = naming::subsystem_nqn(APPLIANCE, id);
    let other_nqn = naming::subsystem_nqn(APPLIANCE, other);

    // The control port through which the guest asks for its snapshot, answered over CSI.
    let pki = dir.path().join("pki");
    let channel = common::channel(
        running.local_addr,
        common::tls_for(
            &pki,
            &pki.join("controller.pem"),
            &pki.join("controller.key"),
        ),
    )
    .await;
    let ctl = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let ctl_port = ctl.local_addr().unwrap().port();
    let volume_id = Ids::new(APPLIANCE).volume(id);
    let (snapped_tx, snapped) = oneshot::channel();
    tokio::spawn(serve_snapshot(
        ctl,
        channel.clone(),
        running.target.stats.clone(),
        id,
        volume_id.clone(),
        snapped_tx,
    ));

    let cache = common::qemu_cache();
    let log = cache.join("logs/nvme-cli.log");
    let cmd =
        format!("sh /etc/nvme-cli-guest.sh {port} {ctl_port} {nqn} {other_nqn} {HOST} {STRANGER}");
    // fio's libraries take ~80 MiB of the initramfs.
    let status = GuestRun::new("nvme-cli", &log, 420, 1024)
        .args([
            "--host-bin",
            NVME_CLI,
            "--host-bin",
            FIO,
            "--host-bin",
            MKFS,
        ])
        .args(["--file", "/etc/mke2fs.conf:/etc/mke2fs.conf"])
        .script("nvme-cli-guest.sh")
        .run(&cmd, "EVCLI-DONE")
        .await;
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.success(),
        "guest run failed: {status} (see {})",
        log.display()
    );
    let steps = steps(&log_text, "EVCLI");
    let step = |name: &str| {
        steps
            .get(name)
            .unwrap_or_else(|| panic!("guest step {name} missing from {}", log.display()))
    };
    step("net").ok("net");

    // Discovery shows exactly the subsystems published to the connecting host.
    let discover = step("discover").ok("discover");
    assert_eq!(discover.records(), Some(1), "{}", discover.text());
    assert_eq!(discover.all("subnqn"), vec![nqn.clone()]);
    assert_eq!(discover.all("traddr"), vec!["10.0.2.2".to_owned()]);
    assert_eq!(discover.all("trsvcid"), vec![port.to_string()]);
    assert_eq!(discover.all("trtype"), vec!["tcp".to_owned()]);
    let stranger = step("discover-stranger");
    assert!(
        stranger.all("subnqn").is_empty() && stranger.records().unwrap_or(0) == 0,
        "a host published to nothing discovers nothing:\n{}",
        stranger.text()
    );

    step("connect").ok("connect");
    step("namespace").ok("namespace");
    let serial = format!("ev{:x}", id.0);
    let list = step("list").ok("list").text();
    let row = list
        .lines()
        .find(|l| l.starts_with("/dev/nvme"))
        .unwrap_or_else(|| panic!("nvme list shows the namespace:\n{list}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert!(cols.contains(&serial.as_str()), "serial in `{row}`");
    assert!(cols.contains(&"edgevol"), "model in `{row}`");

    let id_ctrl = step("id-ctrl").ok("id-ctrl");
    assert_eq!(id_ctrl.field("sn").as_deref(), Some(serial.as_str()));
    assert_eq!(id_ctrl.field("mn").as_deref(), Some("edgevol"));
    assert_eq!(id_ctrl.field("subnqn").as_deref(), Some(nqn.as_str()));

    let id_ns = step("id-ns").ok("id-ns");
    let nguid = naming::hex(&naming::nguid(pool_uuid, id));
    assert_eq!(id_ns.field("nguid").as_deref(), Some(nguid.as_str()));
    let descs = step("ns-descs").ok("ns-descs");
    assert_eq!(descs.field("nguid").as_deref(), Some(nguid.as_str()));
    let uuid = naming::uuid_string(naming::namespace_uuid(pool_uuid, id));
    assert_eq!(descs.field("uuid").as_deref(), Some(uuid.as_str()));
    let blocks = id_ns
        .field("nsze")
        .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok())
        .expect("nsze");
    let lbads = id_ns
        .out
        .iter()
        .find(|l| l.contains("in use"))
        .and_then(|l| l.split("lbads:").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u32>().ok())
        .expect("the LBA format in use");
    assert_eq!(blocks << lbads, SIZE, "namespace size");

    // The round trip: same checksum written and read back, and the same bytes in the volume.
    let io = step("io").ok("io");
    assert_eq!(io.word_after("written "), io.word_after("read "));
    let data = common::volume_bytes(&state, id, 64 * MIB, 4 * MIB).await;
    let line = b"EDGEVOL-NVME-CLI\n";
    let expected: Vec<u8> = line.iter().copied().cycle().take(data.len()).collect();
    assert!(data == expected, "the guest's bytes are in the volume");

    // A read past the end: LBA Out of Range, and the newest Error Information log entry names it.
    let past = step("past-end");
    assert!(
        matches!(past.rc, Some(rc) if rc != 0 && rc != 124 && rc != 143),
        "a read past the end fails at once:\n{}",
        past.text()
    );
    assert!(past.text().contains("LBA Out of Range"), "{}", past.text());
    let end: u64 = past
        .word_after("blocks ")
        .parse()
        .expect("the namespace's block count");
    let log = step("error-log").ok("error-log");
    let hex = |key: &str| {
        let v = log
            .field(key)
            .unwrap_or_else(|| panic!("{key} in:\n{}", log.text()));
        // `0x4080(LBA Out of Range: ...)`: the number before the decoded text.
        let v = v.split('(').next().unwrap_or("").trim().to_owned();
        u64::from_str_radix(v.trim_start_matches("0x"), 16)
            .or_else(|_| v.parse())
            .unwrap_or_else(|_| panic!("{key}: {v}"))
    };
    // The first failure of the whole session: nothing Linux sent at connect was refused.
    assert_eq!(hex("error_count"), 1, "{}", log.text());
    assert_eq!(hex("lba"), end, "{}", log.text());
    assert_eq!(hex("nsid"), 1, "{}", log.text());
    // nvme-cli prints the status without the phase bit: SCT 0, SC 80h in the low 11 bits.
    assert_eq!(
        hex("status_field") & 0x7ff,
        0x080,
        "LBA Out of Range:\n{}",
        log.text()
    );

    // fio wrote, read back and checked every block itself.
    let fio = step("fio-verify").ok("fio-verify").text();
    assert!(fio.contains("err= 0"), "fio verify run:\n{fio}");

    // The snapshot cut while fio wrote: the clone holds what was flushed before it, the volume
    // what came after; writes kept arriving around the cut.
    let snap = step("snapshot").ok("snapshot");
    let (before, after) = (snap.word_after("before "), snap.word_after("after "));
    assert_ne!(before, after);
    let snapped = snapped.await.expect("the guest asked for its snapshot");
    assert_eq!(
        snap.word_after("host "),
        snapped.snapshot_id,
        "the guest got the answer"
    );
    assert!(
        snapped.writes_after > snapped.writes_before,
        "the guest kept writing while the snapshot was cut ({} -> {})",
        snapped.writes_before,
        snapped.writes_after
    );
    let clone = ControllerClient::new(channel)
        .create_volume(edgevol_proto::csi::v1::CreateVolumeRequest {
            volume_content_source: Some(VolumeContentSource {
                r#type: Some(Type::Snapshot(SnapshotSource {
                    snapshot_id: snapped.snapshot_id.clone(),
                })),
            }),
            capacity_range: None,
            ..common::block_volume("clone-of-the-cut".into())
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let ids = Ids::new(APPLIANCE);
    let clone = ids.parse_volume(&clone.volume_id).expect("one of ours");
    let at_cut = common::volume_bytes(&state, clone, SNAP_AT, SNAP_LEN).await;
    assert_eq!(
        sha256(&at_cut),
        before,
        "the clone holds the data flushed before the cut"
    );
    let now = common::volume_bytes(&state, id, SNAP_AT, SNAP_LEN).await;
    assert_eq!(
        sha256(&now),
        after,
        "the volume holds the data written after it"
    );

    // ext4: files written, then checked over a new connection (no page cache survives it).
    let sums = step("fs-write").ok("fs-write").text();
    assert_eq!(sums.lines().filter(|l| l.len() > 34).count(), 5, "{sums}");
    for name in ["disconnect", "disconnect-again"] {
        let d = step(name).ok(name);
        assert!(
            d.text().contains("disconnected 1 controller"),
            "{}",
            d.text()
        );
    }
    step("reconnect").ok("reconnect");
    step("namespace-again").ok("namespace-again");
    let verified = step("fs-verify").ok("fs-verify").text();
    assert_eq!(verified.matches(": OK").count(), 5, "{verified}");

    // The access list: an unpublished host, and this host on another host's volume.
    for name in ["connect-stranger", "connect-other"] {
        let s = step(name);
        assert!(
            matches!(s.rc, Some(rc) if rc != 0 && rc != 124 && rc != 143),
            "{name} must be refused at once:\n{} (rc {:?})",
            s.text(),
            s.rc
        );
    }
    assert_eq!(
        step("leftovers").text().trim(),
        "none",
        "no controller left"
    );
    running.stop().await.unwrap();
}

/// The guest-log parser the QEMU tests share (common/guest.rs).
#[test]
fn steps_split_a_serial_log_by_their_marks() {
    let log =
        "boot noise\r\nEVX-BEGIN one\r\nhello world\r\nelapsed 0.25 s\r\nEVX-END one rc=0\r\n\
               between\nEVX-BEGIN two\nEVX-END two rc=3\n";
    let steps = steps(log, "EVX");
    let one = steps["one"].ok("one");
    assert_eq!(one.out, ["hello world", "elapsed 0.25 s"]);
    assert_eq!(one.word_after("elapsed "), "0.25");
    assert_eq!(one.find_word_after("missing "), None);
    assert_eq!(steps["two"].rc, Some(3));
    assert!(steps["two"].out.is_empty());
    assert_eq!(steps.len(), 2);
}
