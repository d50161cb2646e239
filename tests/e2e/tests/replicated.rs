//! Replicated volumes across appliances, end to end (scripts/test-replicated-qemu.sh):
//! `edgevold` processes on this host (`box-a`, `box-b`: file pools, one site PKI), `edgevol
//! proxy` in front as the CO's controller endpoint, and a node VM (6.1 kernel, raid1, mdadm, fio)
//! whose `edgevol-node` reaches the boxes through slirp (10.0.2.2).
//!
//! * [`replicated_volumes_survive_the_loss_of_either_box`]: a `replicas: "2"` volume staged with
//!   ext4 and another staged as raw block carry `fio --verify=crc32c` writers while box-a is
//!   SIGKILLed, kept down 30 s and restarted, then box-b the same. Pass: no writer error and no
//!   verify error; while the box is down md itself has failed its leg out (`md/degraded` 1, the
//!   member faulty or removed) within the documented bound, the volume condition reports the
//!   missing leg, and the writers' writes keep completing on both md devices; once it is back
//!   md resyncs (idle, not degraded, the leg `in_sync`), the bytes written onto the returning
//!   leg's disk meanwhile stay within the surviving leg's dirty bitmap chunks plus what the
//!   surviving leg got over the same time (a full copy cannot; for the raw volume they are
//!   under half its size), the volume condition is normal again, and md's own check finds both
//!   legs identical. Then the ext4 volume grows online and a snapshot of it restores into a new
//!   replicated volume with the same content; at the end nothing is left on either box or the
//!   node.
//! * [`a_replicated_volume_survives_a_power_cut_of_a_box`]: the same two volumes and writers with
//!   one leg each on box-a and one on box-c, an appliance firmware image VM (emulated NVMe
//!   drive, the site's PKI, reached over a dgram link): box-c's QEMU is SIGKILLed (a power cut:
//!   what its guest had not written to the drive is gone, and the next boot replays no frame of
//!   the last one), kept off 30 s and booted again. The same checks.
//!
//! Ignored by default: they need the VMs and the binaries the script builds.

use std::collections::HashMap;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use edgevol_e2e::host_appliance::{env_path, wait_probe_ready, HostAppliance as Appliance};
use edgevol_e2e::md_resync::{written, BeforeReAdd, LegView, ResyncFigures};
use edgevol_e2e::rig::{capability, Attached, Rig};
use edgevol_e2e::{within, Agent};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::{NodeGetVolumeStatsRequest, VolumeCondition};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

const MIB: i64 = 1 << 20;
/// How long each box stays down, as the check asks.
const DOWN_S: u64 = 30;
/// Budget for a leg to be failed out, for a resync to finish.
const DEGRADED_S: u64 = 60;
const RESYNC_S: u64 = 120;

/// An appliance firmware image VM the script booted: its power is cut by SIGKILLing its QEMU,
/// and the script's boot command (in the environment) boots it again from the same disks.
struct ApplianceVm {
    id: &'static str,
    csi: SocketAddr,
    pidfile: PathBuf,
    boot: String,
}

impl ApplianceVm {
    fn from_env(id: &'static str) -> ApplianceVm {
        let csi = std::env::var("EDGEVOL_E2E_BOX_C_CSI")
            .expect("EDGEVOL_E2E_BOX_C_CSI: run scripts/test-replicated-qemu.sh")
            .parse()
            .expect("EDGEVOL_E2E_BOX_C_CSI: HOST:PORT");
        ApplianceVm {
            id,
            csi,
            pidfile: env_path("EDGEVOL_E2E_BOX_C_PIDFILE"),
            boot: std::env::var("EDGEVOL_E2E_BOX_C_BOOT").expect("EDGEVOL_E2E_BOX_C_BOOT"),
        }
    }

    fn power_cut(&self) {
        let pid = std::fs::read_to_string(&self.pidfile).expect("the VM's pidfile");
        let pid = pid.trim();
        let status = Command::new("kill").args(["-KILL", pid]).status().unwrap();
        assert!(status.success(), "kill -KILL {pid} (QEMU of {})", self.id);
        let t = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() {
            assert!(
                t.elapsed() < edgevol_e2e::scaled_secs(10),
                "QEMU {pid} outlived SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    async fn boot(&self, pki: &Path) {
        let boot = self.boot.clone();
        let status =
            tokio::task::spawn_blocking(move || Command::new("bash").arg("-c").arg(boot).status())
                .await
                .expect("the boot command's thread")
                .expect("run the VM's boot command");
        assert!(
            status.success(),
            "{} did not boot again: {}",
            self.id,
            self.boot
        );
        wait_probe_ready(
            self.id,
            self.csi,
            pki,
            "qemu/.cache/logs/replicated-box-c.log",
        )
        .await;
    }
}

/// How a box goes away in an [`outage`], and comes back.
enum Down<'a> {
    /// SIGKILL of the daemon (its host's page cache keeps what it wrote), then a restart.
    Kill9 {
        b: &'a mut Appliance,
        bin: &'a Path,
        pki: &'a Path,
    },
    /// SIGKILL of the appliance VM's QEMU, then a boot.
    PowerCut { b: &'a ApplianceVm, pki: &'a Path },
}

impl Down<'_> {
    fn id(&self) -> &'static str {
        match self {
            Down::Kill9 { b, .. } => b.id,
            Down::PowerCut { b, .. } => b.id,
        }
    }

    /// How soon md must have failed the box's legs out, as docs/node.md puts it: the legs'
    /// `fast_io_fail_tmo` (5 s) after the host notices the loss (at once for a daemon killed,
    /// whose connections close; within about twice `keep_alive_tmo`, 10 s, for a box whose
    /// power is cut), plus 10 s for polling on a busy machine.
    fn md_fail_bound(&self) -> Duration {
        let noticed = match self {
            Down::Kill9 { .. } => 0,
            Down::PowerCut { .. } => 10,
        };
        edgevol_e2e::scaled_secs(5 + noticed + 10)
    }

    fn go(&mut self) {
        match self {
            Down::Kill9 { b, .. } => {
                eprintln!("replicated: SIGKILL {}", b.id);
                b.kill9();
            }
            Down::PowerCut { b, .. } => {
                eprintln!("replicated: power cut of {} (SIGKILL of its QEMU)", b.id);
                b.power_cut();
            }
        }
    }

    async fn come_back(&mut self) {
        match self {
            Down::Kill9 { b, bin, pki } => b.start(bin, pki).await,
            Down::PowerCut { b, pki } => b.boot(pki).await,
        }
    }
}

struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `edgevol proxy` in front of `boxes` (id, CSI address), on a unix socket, and a Controller
/// client through it.
async fn proxy(
    bin: &Path,
    pki: &Path,
    work: &Path,
    boxes: &[(&str, SocketAddr)],
) -> (Proxy, Channel) {
    let socket = work.join("csi.sock");
    let _ = std::fs::remove_file(&socket);
    let mut cmd = Command::new(bin.join("edgevol"));
    cmd.arg("proxy")
        .arg("--listen")
        .arg(format!("unix://{}", socket.display()));
    for (id, csi) in boxes {
        cmd.arg("--appliance").arg(format!("{id}={csi}"));
    }
    cmd.arg("--server-name")
        .arg("localhost")
        .arg("--ca")
        .arg(pki.join("ca.pem"))
        .arg("--cert")
        .arg(pki.join("controller.pem"))
        .arg("--key")
        .arg(pki.join("controller.key"))
        .stdin(Stdio::null())
        .stdout(File::create(work.join("proxy.log")).expect("proxy log"))
        .stderr(File::create(work.join("proxy.err")).expect("proxy log"));
    let child = Proxy(cmd.spawn().expect("spawn edgevol proxy"));
    let t = Instant::now();
    while !socket.exists() {
        assert!(
            t.elapsed() < edgevol_e2e::scaled_secs(20),
            "proxy socket missing"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
        .expect("connect to the proxy's socket");
    (child, channel)
}

fn replicas(n: u32) -> HashMap<String, String> {
    HashMap::from([("replicas".to_owned(), n.to_string())])
}

/// The md device (`md127`) behind a staged or published path: a block device node, or the
/// source of the mount at that path.
async fn md_of(agent: &Agent, path: &str, block: bool) -> String {
    let dev = if block {
        path.to_owned()
    } else {
        agent
            .ok(
                10,
                &format!("awk '$2 == \"{path}\" {{ print $1 }}' /proc/mounts"),
            )
            .await
            .trim()
            .to_owned()
    };
    let name = agent
        .ok(
            10,
            &format!(
                "t=$(stat -L -c %t {dev}); m=$(stat -L -c %T {dev}); \
                 basename $(readlink -f /sys/dev/block/$((0x$t)):$((0x$m)))"
            ),
        )
        .await
        .trim()
        .to_owned();
    assert!(
        name.starts_with("md"),
        "{path} is on {name}, not an md array"
    );
    name
}

/// The member block devices of `md` and the subsystem NQN each leg is served by.
async fn legs_of(agent: &Agent, md: &str) -> Vec<(String, String)> {
    let out = agent
        .ok(
            10,
            &format!(
                "for d in /sys/block/{md}/md/dev-*; do b=$(basename $(readlink -f $d/block)); \
                 echo $b $(cat /sys/block/$b/device/subsysnqn 2>/dev/null || \
                 cat /sys/block/$b/device/device/subsysnqn); done"
            ),
        )
        .await;
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(d, n)| (d.to_owned(), n.to_owned()))
        .collect()
}

async fn condition(rig: &mut Rig, a: &Attached) -> VolumeCondition {
    within(
        30,
        "NodeGetVolumeStats",
        rig.node.node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: a.volume_id.clone(),
            volume_path: a.target.clone(),
            staging_target_path: a.staging.clone(),
        }),
    )
    .await
    .expect("NodeGetVolumeStats")
    .into_inner()
    .volume_condition
    .expect("a volume condition (VOLUME_CONDITION capability)")
}

/// Polls the condition of `a` until `want(cond)`, for at most `secs`.
async fn wait_condition(
    rig: &mut Rig,
    a: &Attached,
    secs: u64,
    what: &str,
    want: impl Fn(&VolumeCondition) -> bool,
) -> VolumeCondition {
    let t = Instant::now();
    loop {
        let c = condition(rig, a).await;
        if want(&c) {
            return c;
        }
        assert!(
            t.elapsed() < edgevol_e2e::scaled_secs(secs),
            "{}: {what} not seen within {:?}; last condition {c:?}",
            a.volume_id,
            edgevol_e2e::scaled_secs(secs)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A writer loop in the VM: `fio --verify=crc32c` rounds over `file` until /tmp/stop exists.
/// Leaves /tmp/fio-TAG.fail (the failing round) or /tmp/fio-TAG.done (rounds run).
async fn start_writer(agent: &Agent, tag: &str, file: &str, size: &str) {
    let fio = format!(
        "fio --name={tag} --filename={file} --size={size} --rw=randwrite --bs=4k \
         --ioengine=psync --direct=1 --verify=crc32c --verify_backlog=256 --do_verify=1 \
         --time_based --runtime=5 --randrepeat=0"
    );
    agent
        .ok(
            10,
            &format!(
                "(i=0; while [ ! -e /tmp/stop ]; do i=$((i+1)); \
                 {fio} --output=/tmp/fio-{tag}.$i.out || {{ echo $i >/tmp/fio-{tag}.fail; break; }}; \
                 done; echo $i >/tmp/fio-{tag}.done) </dev/null >/dev/null 2>&1 &"
            ),
        )
        .await;
}

async fn writers_alive(agent: &Agent, tags: &[&str]) {
    for tag in tags {
        let (code, out) = agent
            .sh(10, &format!("cat /tmp/fio-{tag}.fail /tmp/fio-{tag}.*.out 2>/dev/null | tail -40; test ! -e /tmp/fio-{tag}.fail && test ! -e /tmp/fio-{tag}.done"))
            .await;
        assert_eq!(code, 0, "writer {tag} stopped:\n{out}");
    }
}

/// True when the comma-separated md member `state` has `flag`.
fn raid_flag(state: &str, flag: &str) -> bool {
    state.split(',').any(|f| f == flag)
}

/// One array of the [`Pair`] during an outage: its leg on the box that goes away, and the leg
/// that carries it meanwhile.
struct ArrayLegs {
    md: String,
    away: String,
    survivor: String,
}

impl ArrayLegs {
    async fn of(agent: &Agent, md: &str, id: &str) -> ArrayLegs {
        let legs = legs_of(agent, md).await;
        let on_box = |(_, nqn): &&(String, String)| nqn.contains(&format!(":{id}:"));
        let away = legs.iter().find(on_box);
        let survivor = legs.iter().find(|l| !on_box(l));
        let (Some(away), Some(survivor)) = (away, survivor) else {
            panic!("{md}: no leg on {id} and one elsewhere: {legs:?}");
        };
        ArrayLegs {
            md: md.to_owned(),
            away: away.0.clone(),
            survivor: survivor.0.clone(),
        }
    }
}

/// Polls md until it has failed the leg of every array in `arrays` out (`md/degraded` 1, the
/// member faulty or removed); fails past `bound`. Returns when it saw that.
async fn md_fails_the_legs_out(agent: &Agent, arrays: &[ArrayLegs], bound: Duration) -> Duration {
    let t = Instant::now();
    for a in arrays {
        loop {
            let v = LegView::read(agent, &a.md, &a.away).await;
            if v.leg_failed_out() {
                eprintln!(
                    "replicated: {}: md/degraded {}, member {} {:?}, {:?} after the loss",
                    a.md,
                    v.degraded,
                    a.away,
                    v.leg_state,
                    t.elapsed()
                );
                break;
            }
            assert!(
                t.elapsed() < bound,
                "{}: md did not fail the leg {} out within {bound:?}: {v:?}",
                a.md,
                a.away
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    t.elapsed()
}

/// Takes box `b` down, keeps it down [`DOWN_S`] while the writers run, brings it back, and
/// waits for both volumes to be whole again. While it is down: md has failed its legs out
/// within the documented bound, the volume condition names it, and the writers' writes keep
/// reaching both md arrays. Once back: md's resync wrote onto each returning leg no more than
/// its bitmap's dirty chunks (see [`ResyncFigures`]), and for the raw volume, whose writer
/// touches its first 64 MiB, far less than the leg's size. Returns (bitmap bits, dirty bits)
/// of the block volume's surviving leg just before it came back.
async fn outage(rig: &mut Rig, mut b: Down<'_>, pair: &Pair) -> (u64, u64) {
    let id = b.id();
    let vols = [&pair.fs, &pair.blk];
    let mut arrays = Vec::new();
    for md in [&pair.fs_md, &pair.blk_md] {
        arrays.push(ArrayLegs::of(&rig.agent, md, id).await);
    }
    b.go();
    let down = Instant::now();
    let failed_out = md_fails_the_legs_out(&rig.agent, &arrays, b.md_fail_bound()).await;
    for a in vols {
        let c = wait_condition(rig, a, DEGRADED_S, "the degraded condition", |c| c.abnormal).await;
        assert!(
            c.message.contains("degraded") && c.message.contains(id),
            "{}: condition should name the missing leg on {id}: {c:?}",
            a.volume_id,
        );
        eprintln!(
            "replicated: {} {:?} after {:?}",
            a.volume_id,
            c.message,
            down.elapsed()
        );
    }
    writers_alive(&rig.agent, &["fs", "blk"]).await;
    // The writers' I/O keeps completing on the degraded arrays: md's own write counters grow
    // over the rest of the outage (at least a few seconds of it).
    let mut md_written = Vec::new();
    for a in &arrays {
        md_written.push(written(&rig.agent, &a.md).await);
    }
    let window = Instant::now();
    let left = Duration::from_secs(DOWN_S)
        .saturating_sub(down.elapsed())
        .max(Duration::from_secs(5));
    tokio::time::sleep(left).await;
    for (a, before) in arrays.iter().zip(md_written) {
        let now = written(&rig.agent, &a.md).await;
        let v = LegView::read(&rig.agent, &a.md, &a.away).await;
        assert!(
            v.leg_failed_out(),
            "{}: still down, yet md has the leg {} back: {v:?}",
            a.md,
            a.away
        );
        assert!(
            now > before,
            "{}: no write completed in the {:?} of the outage after md failed the leg out",
            a.md,
            window.elapsed()
        );
        eprintln!(
            "replicated: {}: {:.1} MiB written to md in {:?} while {id} was down (degraded {})",
            a.md,
            (now - before) as f64 / MIB as f64,
            window.elapsed(),
            v.degraded
        );
    }
    writers_alive(&rig.agent, &["fs", "blk"]).await;
    eprintln!(
        "replicated: md failed {id}'s legs out {failed_out:?} after the loss; it was down {:?}",
        down.elapsed()
    );
    let mut before = Vec::new();
    for a in &arrays {
        let early = BeforeReAdd::read(&rig.agent, &a.md, &a.away, &a.survivor).await;
        assert!(
            early.leg_out,
            "{}: {} back while {id} is down",
            a.md, a.away
        );
        before.push(early);
    }
    let blk_bits = before[1].bitmap;
    eprintln!("replicated: {id} comes back (block volume bitmap {blk_bits:?})");
    b.come_back().await;
    let back = Instant::now();
    // Read again now that the box answers, if md has not taken the leg back yet: the closer to
    // the re-add, the tighter the bound (the surviving leg's writes before it count in it).
    for (a, early) in arrays.iter().zip(before.iter_mut()) {
        let late = BeforeReAdd::read(&rig.agent, &a.md, &a.away, &a.survivor).await;
        if late.leg_out {
            *early = late;
        }
    }
    for a in vols {
        wait_condition(rig, a, RESYNC_S, "normal after the resync", |c| !c.abnormal).await;
    }
    for (a, before) in arrays.iter().zip(&before) {
        let sync = rig
            .agent
            .ok(
                10,
                &format!(
                    "cat /sys/block/{md}/md/sync_action /sys/block/{md}/md/degraded                      /sys/block/{md}/md/dev-{leg}/state",
                    md = a.md,
                    leg = a.away
                ),
            )
            .await;
        let words: Vec<&str> = sync.split_whitespace().collect();
        assert!(
            words.len() == 3
                && words[..2] == ["idle", "0"]
                && raid_flag(words[2], "in_sync")
                && !raid_flag(words[2], "faulty"),
            "{}: sync_action, degraded, state of {}: {sync}",
            a.md,
            a.away
        );
        let again = ArrayLegs::of(&rig.agent, &a.md, id).await;
        assert_eq!(
            again.away, a.away,
            "{}: {id}'s leg came back on another disk; its write counter restarted",
            a.md
        );
        let size: u64 = rig
            .agent
            .ok(10, &format!("cat /sys/block/{}/size", a.md))
            .await
            .trim()
            .parse()
            .expect("md size in sectors");
        let figures = ResyncFigures::new(
            before,
            written(&rig.agent, &a.away).await,
            written(&rig.agent, &a.survivor).await,
            size * 512,
        );
        eprintln!(
            "replicated: {} resync of {id}'s leg {}: {figures}",
            a.md, a.away
        );
        let checked = if a.md == pair.blk_md {
            figures.check_well_below_size()
        } else {
            figures.check()
        };
        if let Err(e) = checked {
            panic!("{}: {e}", a.md);
        }
    }
    eprintln!(
        "replicated: {id} back, both volumes whole {:?} after it came back",
        back.elapsed()
    );
    writers_alive(&rig.agent, &["fs", "blk"]).await;
    (blk_bits.bits, blk_bits.dirty)
}

/// The set-up both tests share: the two boxes, the proxy in front of them, the node VM's rig.
struct Site {
    bin: PathBuf,
    pki: PathBuf,
    a: Appliance,
    b: Appliance,
    _proxy: Proxy,
    rig: Rig,
}

impl Site {
    async fn start() -> Site {
        let bin = env_path("EDGEVOL_E2E_BIN");
        let pki = env_path("EDGEVOL_E2E_PKI");
        let work = env_path("EDGEVOL_E2E_WORK");
        let mut a = Appliance::new("box-a", &work);
        let mut b = Appliance::new("box-b", &work);
        a.start(&bin, &pki).await;
        b.start(&bin, &pki).await;
        let (_proxy, channel) = proxy(&bin, &pki, &work, &[(a.id, a.csi), (b.id, b.csi)]).await;
        let rig = Rig::with_controller(ControllerClient::new(channel)).await;
        Site {
            bin,
            pki,
            a,
            b,
            _proxy,
            rig,
        }
    }
}

/// The two volumes both tests write: `replicas: "2"`, one staged with ext4 and one as raw block.
struct Pair {
    fs: Attached,
    blk: Attached,
    fs_md: String,
    blk_md: String,
}

/// Creates, stages and publishes the [`Pair`] (names starting with `tag`), checks each has one
/// leg on each of `boxes`, and starts their writers: 32 MiB of ext4 file, and the first 64 MiB
/// of the raw volume, so that the bitmap shows a partial resync.
async fn replicated_pair(rig: &mut Rig, tag: &str, boxes: [&str; 2]) -> Pair {
    let (fs_name, blk_name) = (format!("{tag}-fs"), format!("{tag}-blk"));
    let fs_vol = rig
        .create_with(&fs_name, 512 * MIB, capability(false), None, replicas(2))
        .await;
    let blk_vol = rig
        .create_with(&blk_name, 512 * MIB, capability(true), None, replicas(2))
        .await;
    for v in [&fs_vol, &blk_vol] {
        assert_eq!(v.capacity_bytes, 512 * MIB, "{v:?}");
        let legs: Vec<&str> = v.volume_id.split('+').collect();
        assert_eq!(legs.len(), 2, "two legs in {}", v.volume_id);
        for id in boxes {
            assert!(
                legs.iter().any(|l| l.starts_with(&format!("{id}-"))),
                "one leg per box, one on {id}: {legs:?}"
            );
        }
    }
    let fs = rig.attach(&fs_vol, false, &fs_name).await;
    let blk = rig.attach(&blk_vol, true, &blk_name).await;
    assert_eq!(
        fs.context.get("replicas").map(String::as_str),
        Some("2"),
        "{:?}",
        fs.context
    );
    let fs_md = md_of(&rig.agent, &fs.staging, false).await;
    let blk_md = md_of(&rig.agent, &blk.target, true).await;
    for md in [&fs_md, &blk_md] {
        let legs = legs_of(&rig.agent, md).await;
        assert_eq!(legs.len(), 2, "{md}: {legs:?}");
        for id in boxes {
            assert!(
                legs.iter().any(|(_, n)| n.contains(&format!(":{id}:"))),
                "{md} has no leg on {id}: {legs:?}"
            );
        }
    }
    let size = rig
        .agent
        .ok(10, &format!("blockdev --getsize64 {}", blk.target))
        .await;
    assert_eq!(
        size.trim(),
        (512 * MIB).to_string(),
        "the block volume offers exactly its capacity"
    );
    assert!(!condition(rig, &fs).await.abnormal);

    rig.agent.ok(10, "rm -f /tmp/stop /tmp/fio-*").await;
    start_writer(&rig.agent, "fs", &format!("{}/fio.dat", fs.target), "32M").await;
    start_writer(&rig.agent, "blk", &blk.target, "64M").await;
    // The writers get going (a busy machine's guest: longer).
    tokio::time::sleep(edgevol_e2e::scaled_secs(5)).await;
    writers_alive(&rig.agent, &["fs", "blk"]).await;
    Pair {
        fs,
        blk,
        fs_md,
        blk_md,
    }
}

/// Stops the writers and checks what the workload saw: every fio round without an error or a
/// verify failure, no I/O or file-system error in the node's dmesg; each outage's resync
/// covered only the dirty chunks (`partial`: the bitmaps [`outage`] returned); md's own check
/// finds the legs of both arrays identical.
async fn writers_and_legs_check_out(rig: &mut Rig, pair: &Pair, partial: &[(u64, u64)]) {
    rig.agent.ok(10, "touch /tmp/stop").await;
    let t = Instant::now();
    loop {
        let (code, _) = rig
            .agent
            .sh(10, "test -e /tmp/fio-fs.done -a -e /tmp/fio-blk.done")
            .await;
        if code == 0 {
            break;
        }
        assert!(
            t.elapsed() < edgevol_e2e::scaled_secs(60),
            "writers did not stop"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for tag in ["fs", "blk"] {
        let out = rig
            .agent
            .ok(
                10,
                &format!("cat /tmp/fio-{tag}.*.out; ls /tmp/fio-{tag}.fail 2>/dev/null || true"),
            )
            .await;
        assert!(
            !out.contains(&format!("/tmp/fio-{tag}.fail")),
            "writer {tag} failed:\n{out}"
        );
        assert!(
            !out.contains("verify:") && !out.contains("bad magic"),
            "verify errors ({tag}):\n{out}"
        );
        let rounds = out.matches(" err= 0").count();
        assert!(
            rounds >= 2,
            "writer {tag}: rounds without error {rounds}:\n{out}"
        );
    }
    let dmesg = rig.agent.ok(10, "dmesg").await;
    for bad in [
        "EXT4-fs error",
        "Buffer I/O error on dev md",
        "I/O error, dev md",
    ] {
        assert!(
            !dmesg.contains(bad),
            "the workload saw an error ({bad}):\n{dmesg}"
        );
    }
    for (bits, dirty) in partial {
        assert!(
            *dirty > 0 && dirty < bits,
            "resync should copy only the dirty chunks: {dirty} of {bits}"
        );
    }
    eprintln!("replicated: block volume bitmap before each return (bits, dirty): {partial:?}");
    // md's own comparison of the two legs. It reads both legs whole; md paces a check down to
    // speed_limit_min when it sees other I/O, and on a TCG guest it once outlasted a 120 s
    // budget: raise the floor for the check, and allow it longer.
    rig.agent
        .ok(10, "echo 100000 >/proc/sys/dev/raid/speed_limit_min")
        .await;
    for md in [&pair.fs_md, &pair.blk_md] {
        rig.agent
            .ok(
                300,
                &format!(
                    "echo check >/sys/block/{md}/md/sync_action; sleep 1; \
             while [ \"$(cat /sys/block/{md}/md/sync_action)\" != idle ]; do sleep 1; done"
                ),
            )
            .await;
        let mismatch = rig
            .agent
            .ok(10, &format!("cat /sys/block/{md}/md/mismatch_cnt"))
            .await;
        assert_eq!(mismatch.trim(), "0", "{md}: legs differ");
    }
}

#[tokio::test]
#[ignore = "needs the node VM: scripts/test-replicated-qemu.sh"]
async fn replicated_volumes_survive_the_loss_of_either_box() {
    let Site {
        bin,
        pki,
        mut a,
        mut b,
        _proxy,
        mut rig,
    } = Site::start().await;

    let pair = replicated_pair(&mut rig, "rep", ["box-a", "box-b"]).await;
    let Pair { fs, .. } = &pair;
    let (bin, pki) = (bin.as_path(), pki.as_path());
    let partial = [
        outage(
            &mut rig,
            Down::Kill9 {
                b: &mut a,
                bin,
                pki,
            },
            &pair,
        )
        .await,
        outage(
            &mut rig,
            Down::Kill9 {
                b: &mut b,
                bin,
                pki,
            },
            &pair,
        )
        .await,
    ];
    writers_and_legs_check_out(&mut rig, &pair, &partial).await;

    // Online growth of the ext4 volume: every leg, md, then the filesystem.
    let before = edgevol_e2e::rig::df_kib(&rig.agent.ok(10, &format!("df -k {}", fs.target)).await);
    let grown = rig.expand(fs, 768 * MIB).await;
    assert!(
        grown == 0 || grown >= 768 * MIB,
        "NodeExpandVolume said {grown}"
    );
    let after = edgevol_e2e::rig::df_kib(&rig.agent.ok(10, &format!("df -k {}", fs.target)).await);
    assert!(
        after > before + 200 * 1024,
        "ext4 grew from {before} KiB to {after} KiB"
    );

    // A snapshot of the replicated volume, restored into a new replicated volume.
    let sum = rig
        .agent
        .ok(60, &format!(
            "dd if=/dev/urandom of={t}/payload bs=1M count=8 2>/dev/null && sync && sha256sum {t}/payload | cut -d' ' -f1",
            t = fs.target
        ))
        .await;
    let snap = rig.snapshot(&fs.volume_id, "rep-fs-snap").await;
    assert_eq!(
        snap.snapshot_id.split('+').count(),
        2,
        "one snapshot per leg: {snap:?}"
    );
    let restored_vol = rig
        .create_with(
            "rep-restored",
            768 * MIB,
            capability(false),
            Some(&snap.snapshot_id),
            replicas(2),
        )
        .await;
    let restored = rig.attach(&restored_vol, false, "rep-restored").await;
    let sum2 = rig
        .agent
        .ok(
            60,
            &format!("sha256sum {}/payload | cut -d' ' -f1", restored.target),
        )
        .await;
    assert_eq!(
        sum.trim(),
        sum2.trim(),
        "the restored volume holds the snapshot's data"
    );

    rig.detach_and_delete(&restored).await;
    rig.delete_snapshot(&snap.snapshot_id).await;
    nothing_left(&mut rig, &pair).await;
}

/// Detaches and deletes the [`Pair`]; then no md array is left on the node, and nothing on the
/// boxes or the node.
async fn nothing_left(rig: &mut Rig, pair: &Pair) {
    for v in [&pair.fs, &pair.blk] {
        rig.detach_and_delete(v).await;
    }
    let mdstat = rig.agent.ok(10, "cat /proc/mdstat").await;
    assert!(
        !mdstat.lines().any(|l| l.starts_with("md")),
        "md arrays left:\n{mdstat}"
    );
    rig.assert_nothing_left().await;
}

#[tokio::test]
#[ignore = "needs the node VM and box-c's VM: scripts/test-replicated-qemu.sh"]
async fn a_replicated_volume_survives_a_power_cut_of_a_box() {
    let bin = env_path("EDGEVOL_E2E_BIN");
    let pki = env_path("EDGEVOL_E2E_PKI");
    let work = env_path("EDGEVOL_E2E_WORK");
    let mut a = Appliance::new("box-a", &work);
    a.start(&bin, &pki).await;
    let c = ApplianceVm::from_env("box-c");
    let (_proxy, channel) = proxy(&bin, &pki, &work, &[(a.id, a.csi), (c.id, c.csi)]).await;
    let mut rig = Rig::with_controller(ControllerClient::new(channel)).await;

    let pair = replicated_pair(&mut rig, "cut", ["box-a", "box-c"]).await;
    let cut = Down::PowerCut { b: &c, pki: &pki };
    let partial = [outage(&mut rig, cut, &pair).await];
    writers_and_legs_check_out(&mut rig, &pair, &partial).await;
    nothing_left(&mut rig, &pair).await;
}

/// The fio rows of the bench: name, fio job options.
const BENCH_ROWS: [(&str, &str); 6] = [
    ("4k randread QD1", "--rw=randread --bs=4k --iodepth=1"),
    ("4k randread QD16", "--rw=randread --bs=4k --iodepth=16"),
    ("4k randwrite QD1", "--rw=randwrite --bs=4k --iodepth=1"),
    ("4k randwrite QD16", "--rw=randwrite --bs=4k --iodepth=16"),
    ("128k read QD8", "--rw=read --bs=128k --iodepth=8"),
    ("128k write QD8", "--rw=write --bs=128k --iodepth=8"),
];
const BENCH_ROUNDS: usize = 3;
const BENCH_SECONDS: u64 = 5;
const BENCH_BYTES: i64 = 256 * MIB;
/// What the resync figure writes while a leg is away.
const RESYNC_CHANGED_MIB: u64 = 128;

/// IOPS of one fio run on `dev` (`--minimal`: field 8 is read IOPS, field 49 write IOPS).
async fn fio_iops(agent: &Agent, dev: &str, job: &str) -> f64 {
    let out = agent
        .ok(
            BENCH_SECONDS + 60,
            &format!(
                "fio --name=b --filename={dev} --size={BENCH_BYTES} {job} --ioengine=libaio \
                 --direct=1 --time_based --runtime={BENCH_SECONDS} --ramp_time=1 --minimal"
            ),
        )
        .await;
    let line = out.lines().last().unwrap_or_default();
    let f: Vec<&str> = line.split(';').collect();
    assert!(f.len() > 49, "fio --minimal said {out:?}");
    let iops = if job.contains("read") { f[7] } else { f[48] };
    iops.parse()
        .unwrap_or_else(|_| panic!("fio IOPS field {iops:?}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Replicated against single volumes through the same node VM and appliances, in one run:
/// each fio row on a plain volume (on one box) and on a `replicas: "2"` volume (box-a and box-b),
/// interleaved, [`BENCH_ROUNDS`] rounds, medians; then the time md takes to resync a leg that
/// missed [`RESYNC_CHANGED_MIB`] MiB of writes. Prints a markdown table (run by
/// `scripts/test-replicated-qemu.sh --bench` on a quiet machine).
#[tokio::test]
#[ignore = "a benchmark: scripts/test-replicated-qemu.sh --bench"]
async fn bench_replicated_against_single() {
    // `_a` keeps box-a running (dropping it would stop it).
    let Site {
        bin,
        pki,
        a: _a,
        mut b,
        _proxy,
        mut rig,
    } = Site::start().await;
    let single_vol = rig
        .create_with(
            "bench-single",
            BENCH_BYTES,
            capability(true),
            None,
            HashMap::from([("replicas".to_owned(), "1".to_owned())]),
        )
        .await;
    let rep_vol = rig
        .create_with(
            "bench-rep",
            BENCH_BYTES,
            capability(true),
            None,
            replicas(2),
        )
        .await;
    let single = rig.attach(&single_vol, true, "bench-single").await;
    let rep = rig.attach(&rep_vol, true, "bench-rep").await;
    // Reads of never-written thin clusters cost the target nothing: write both volumes first.
    for v in [&single, &rep] {
        rig.agent
            .ok(
                300,
                &format!(
                    "dd if=/dev/urandom of={} bs=1M count=256 oflag=direct 2>/dev/null",
                    v.target
                ),
            )
            .await;
    }
    let mut figures: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); BENCH_ROWS.len()];
    for round in 0..BENCH_ROUNDS {
        for (row, (_, job)) in BENCH_ROWS.iter().enumerate() {
            // Alternate which volume goes first, so drift in the machine falls on both.
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for replicated in order {
                let v = if replicated { &rep } else { &single };
                let iops = fio_iops(&rig.agent, &v.target, job).await;
                let slot = &mut figures[row];
                if replicated {
                    slot.1.push(iops)
                } else {
                    slot.0.push(iops)
                }
            }
        }
    }

    // Resync: box-b away while RESYNC_CHANGED_MIB MiB are written, then back.
    let md = md_of(&rig.agent, &rep.target, true).await;
    b.kill9();
    wait_condition(&mut rig, &rep, DEGRADED_S, "the degraded condition", |c| {
        c.abnormal
    })
    .await;
    rig.agent
        .ok(
            300,
            &format!(
                "dd if=/dev/urandom of={} bs=1M count={RESYNC_CHANGED_MIB} oflag=direct 2>/dev/null",
                rep.target
            ),
        )
        .await;
    b.start(&bin, &pki).await;
    let back = Instant::now();
    // From the box's return until md started recovering, then until it is idle and whole.
    let t = Instant::now();
    let mut recovery_started = None;
    loop {
        let state = rig
            .agent
            .ok(
                10,
                &format!("cat /sys/block/{md}/md/sync_action /sys/block/{md}/md/degraded"),
            )
            .await;
        let words: Vec<&str> = state.split_whitespace().collect();
        if words.first() != Some(&"idle") && recovery_started.is_none() {
            recovery_started = Some(Instant::now());
        }
        if words == ["idle", "0"] {
            break;
        }
        assert!(
            t.elapsed() < edgevol_e2e::scaled_secs(RESYNC_S),
            "{md}: not whole: {state}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let whole = back.elapsed().as_secs_f64();
    let resync = recovery_started.map_or(0.0, |s| s.elapsed().as_secs_f64());
    let per_gib = resync * 1024.0 / RESYNC_CHANGED_MIB as f64;

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("\n| row | single volume IOPS | replicated (2 legs) IOPS | replicated / single |");
    println!("|---|---:|---:|---:|");
    for ((name, _), (s, r)) in BENCH_ROWS.iter().zip(figures) {
        let (s, r) = (median(s), median(r));
        println!("| {name} | {s:.0} | {r:.0} | {:.2} |", r / s);
    }
    println!(
        "\nresync of a leg that missed {RESYNC_CHANGED_MIB} MiB: md recovering {resync:.1} s \
         ({per_gib:.1} s per GiB changed); whole again {whole:.1} s after its box came back"
    );
    println!(
        "medians of {BENCH_ROUNDS} interleaved rounds of {BENCH_SECONDS} s, fio libaio direct on \
         the raw volumes, node VM 1 vCPU (TCG); load average at the end: {}",
        load.trim()
    );
    for v in [&rep, &single] {
        rig.detach_and_delete(v).await;
    }
}
