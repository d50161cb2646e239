//! DH-HMAC-CHAP (issue 15) against the real Linux initiator: a QEMU TCG guest booting the 6.12
//! kernel (CONFIG_NVME_AUTH) with Debian's nvme-cli connects through slirp (10.0.2.2) to
//! appliances running in this test process, every one requiring authentication except one
//! open appliance kept for comparison. The guest (qemu/nvme-auth-guest.sh) only reports; this
//! test judges its serial log and reads the volumes back through core:
//! - no key, a wrong host key, a wrong controller key and another node's pair are refused, and
//!   nothing reaches the volume they aimed at (no command counted, all zeros), each failure
//!   counted by the target;
//! - the right pair (bidirectional) connects, and the guest's bytes are in the volume;
//! - a key rotation while fio writes and verifies: the new pair written to the controller's
//!   sysfs, the kernel re-authenticates, fio ends clean, the store keeps only the new pair, the
//!   old pair is refused on a new connect and the new pair connects;
//! - every hash (SHA-256/384/512) and every DH group (null, ffdhe2048 .. ffdhe8192) completes,
//!   each forced by an appliance whose `nvme.auth_hashes` / `nvme.auth_dh_groups` allow only it;
//! - the connect time of each, against the open appliance's (printed as a table;
//!   `EDGEVOL_AUTH_QEMU_RUNS` rounds, default 1).
//!
//! Ignored by default: `scripts/test-auth-qemu.sh` runs it (the QEMU harness of
//! `scripts/setup-qemu.sh` with the 6.12 kernel, the host's nvme-cli and fio).

mod common;

use common::guest::{steps, GuestRun, Step};
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use edgevol_appliance::hostkeys::{HostKey, HostKeys, Secret};
use edgevol_appliance::{naming, start, Args, Config, Running};
use edgevol_core::{VolumeId, VolumeSpec};
use edgevol_nvmeof::auth::{DhGroup, HashId};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const HOSTID: &str = "15a0b0c0-d0e0-4f00-8a15-0000000000a1";
const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:15a0b0c0-d0e0-4f00-8a15-0000000000b2";
const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;
const NVME_CLI: &str = "/usr/sbin/nvme";
const FIO: &str = "/usr/bin/fio";
/// Where and how much the guest writes its pattern (qemu/nvme-auth-guest.sh --roundtrip).
const PATTERN_AT: u64 = MIB;
const PATTERN_LEN: u64 = 4 * MIB;

fn host_nqn() -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:{HOSTID}")
}

/// One appliance of this test, on its own data dir and ports.
struct App {
    _dir: tempfile::TempDir,
    running: Running,
    port: u16,
    id: String,
}

impl App {
    /// A dev appliance listening for the guest; `open` lets hosts without keys in, `policy`
    /// restricts the hashes and DH groups it takes.
    async fn start(id: &str, open: bool, policy: Option<(HashId, DhGroup)>) -> App {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::from_args(Args {
            dev: true,
            data_dir: Some(dir.path().to_path_buf()),
            listen: Some("127.0.0.1:0".parse().unwrap()),
            nvme_listen: Some("0.0.0.0:0".parse().unwrap()),
            nvme_advertise: Some("10.0.2.2".parse().unwrap()),
            appliance_id: Some(id.into()),
            nvme_allow_unauthenticated_hosts: Some(open),
            ..Args::default()
        })
        .unwrap();
        if let Some((hash, group)) = policy {
            config.host_auth.hashes = vec![hash];
            config.host_auth.dh_groups = vec![group];
        }
        let running = start(config).await.unwrap();
        common::pool_ready(&running.state).await;
        let port = running.target.endpoint.port();
        App {
            _dir: dir,
            running,
            port,
            id: id.to_owned(),
        }
    }

    /// A volume published to `host`, and its subsystem NQN.
    async fn volume(&self, name: &str, host: &str) -> (VolumeId, String) {
        let (name, host) = (name.to_owned(), host.to_owned());
        let id = self
            .running
            .state
            .on_pool(move |_, pool| {
                let id = pool.create_volume(VolumeSpec::new(&name, SIZE)).unwrap();
                pool.publish(id, &host, false).unwrap();
                id
            })
            .await
            .unwrap();
        (id, naming::subsystem_nqn(&self.id, id))
    }

    /// Enrols `host` for node `node` with a node certificate of this appliance's dev PKI.
    fn enrol(&self, node: &str, host: &str) -> HostKey {
        common::enrol_node(&self.running, &self._dir.path().join("pki"), node, host)
    }

    fn counter(&self, which: fn(&edgevol_appliance::nvme::auth::AuthCounters) -> u64) -> u64 {
        which(&self.running.target.auth)
    }
}

fn enc(s: &Secret) -> String {
    s.encode().to_string()
}

fn random_secret(seed: u64) -> Secret {
    let mut rng = edgevol_nvmeof::auth::host::TestRng::new(seed);
    Secret::generate_for(HashId::Sha256, &mut rng)
}

impl Step {
    /// The connect's wall time in the guest (`elapsed S`).
    fn elapsed(&self) -> f64 {
        self.word_after("elapsed ")
            .parse()
            .expect("elapsed seconds")
    }
}

/// The guest's control port: "rotate" rotates `node`'s keys and answers the new pair,
/// "current" answers the newest pair, "pairs" how many pairs authenticate the host.
async fn serve_control(listener: tokio::net::TcpListener, keys: Arc<HostKeys>, host: String) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let (read, mut write) = stream.into_split();
        let mut line = String::new();
        if BufReader::new(read).read_line(&mut line).await.is_err() {
            continue;
        }
        let answer = match line.trim() {
            "rotate" => {
                let k = keys.clone();
                let generation = tokio::task::spawn_blocking(move || k.rotate("node").unwrap())
                    .await
                    .unwrap();
                let new = keys
                    .keys_for(&host)
                    .into_iter()
                    .find(|k| k.generation == generation)
                    .expect("the new pair");
                eprintln!("control: rotated to generation {generation}");
                format!("keys {} {}", enc(&new.host_secret), enc(&new.ctrl_secret))
            }
            "current" => {
                let newest = keys.keys_for(&host).into_iter().next().expect("a pair");
                format!(
                    "keys {} {}",
                    enc(&newest.host_secret),
                    enc(&newest.ctrl_secret)
                )
            }
            "pairs" => {
                let pairs = keys.keys_for(&host);
                let generations: Vec<String> =
                    pairs.iter().map(|k| k.generation.to_string()).collect();
                format!(
                    "pairs {} generations {}",
                    pairs.len(),
                    generations.join(",")
                )
            }
            other => format!("unknown request {other:?}"),
        };
        let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
    }
}

/// The forced (hash, DH group) of each matrix appliance: every group with SHA-256, and the
/// other two hashes with ffdhe2048.
const MATRIX: [(&str, HashId, DhGroup); 8] = [
    ("sha256-null", HashId::Sha256, DhGroup::Null),
    ("sha256-ffdhe2048", HashId::Sha256, DhGroup::Ffdhe2048),
    ("sha256-ffdhe3072", HashId::Sha256, DhGroup::Ffdhe3072),
    ("sha256-ffdhe4096", HashId::Sha256, DhGroup::Ffdhe4096),
    ("sha256-ffdhe6144", HashId::Sha256, DhGroup::Ffdhe6144),
    ("sha256-ffdhe8192", HashId::Sha256, DhGroup::Ffdhe8192),
    ("sha384-ffdhe2048", HashId::Sha384, DhGroup::Ffdhe2048),
    ("sha512-ffdhe2048", HashId::Sha512, DhGroup::Ffdhe2048),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "boots a QEMU guest with the 6.12 kernel and the host's nvme-cli: scripts/test-auth-qemu.sh"]
async fn linux_authenticates_to_edgevol_refusals_rotation_every_hash_and_group() {
    for tool in [NVME_CLI, FIO] {
        assert!(
            std::path::Path::new(tool).exists(),
            "{tool} missing: scripts/test-auth-qemu.sh installs nvme-cli and fio"
        );
    }
    let runs: usize = std::env::var("EDGEVOL_AUTH_QEMU_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let host = host_nqn();
    let cache = common::qemu_cache();
    // The appliances' log (failures name host NQN, peer and reason), for the record.
    let target_log = cache.join("logs/nvme-auth-target.log");
    let _ = tracing_subscriber::fmt()
        .with_writer(std::sync::Mutex::new(
            std::fs::File::create(&target_log).unwrap(),
        ))
        .with_ansi(false)
        .with_env_filter("warn,edgevol_appliance=info")
        .try_init();

    // The main appliance (default policy): the volume the guest uses, one it only tries, and
    // two enrolled nodes.
    let main = App::start("auth-main", false, None).await;
    let (vol, vol_nqn) = main.volume("main", &host).await;
    let (refuse, refuse_nqn) = main.volume("refused", &host).await;
    let key = main.enrol("node", &host);
    let other = main.enrol("node-2", OTHER);
    let first_generation = key.generation;

    // One appliance per forced hash / DH group, and an open one.
    let mut matrix = Vec::new();
    let mut lines = String::new();
    let open = App::start("auth-open", true, None).await;
    let (_, open_nqn) = open.volume("open", &host).await;
    writeln!(lines, "open {} {open_nqn} - -", open.port).unwrap();
    for (label, hash, group) in MATRIX {
        let app = App::start(&format!("auth-{label}"), false, Some((hash, group))).await;
        let (_, nqn) = app.volume("m", &host).await;
        let k = app.enrol("node", &host);
        writeln!(
            lines,
            "{label} {} {nqn} {} {}",
            app.port,
            enc(&k.host_secret),
            enc(&k.ctrl_secret)
        )
        .unwrap();
        matrix.push((label, app));
    }

    let ctl = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let ctl_port = ctl.local_addr().unwrap().port();
    tokio::spawn(serve_control(
        ctl,
        main.running.host_keys.clone(),
        host.clone(),
    ));

    let files = tempfile::tempdir().unwrap();
    let env_file = files.path().join("nvme-auth.env");
    let matrix_file = files.path().join("nvme-auth-matrix");
    let env = format!(
        "HOST={host}\nHOSTID={HOSTID}\nCTL={ctl_port}\nRUNS={runs}\nMAIN_PORT={}\n\
         MAIN_NQN={vol_nqn}\nREFUSE_NQN={refuse_nqn}\nKEY={}\nCTRL_KEY={}\nWRONG_KEY={}\n\
         WRONG_CTRL_KEY={}\nOTHER_KEY={}\nOTHER_CTRL_KEY={}\n",
        main.port,
        enc(&key.host_secret),
        enc(&key.ctrl_secret),
        enc(&random_secret(7)),
        enc(&random_secret(8)),
        enc(&other.host_secret),
        enc(&other.ctrl_secret),
    );
    std::fs::write(&env_file, env).unwrap();
    std::fs::write(&matrix_file, &lines).unwrap();

    let log = cache.join("logs/nvme-auth.log");
    // Boot, refusals, I/O and rotation take ~4 min under TCG; each round of the matrix ~2 min.
    let budget = 360 + 180 * runs;
    let status = GuestRun::new("nvme-auth", &log, u64::try_from(budget).unwrap(), 1024)
        .args([
            "--kernel",
            "auth",
            "--host-bin",
            NVME_CLI,
            "--host-bin",
            FIO,
        ])
        .script("nvme-auth-guest.sh")
        .args([
            "--file",
            &format!("{}:/etc/nvme-auth.env", env_file.display()),
        ])
        .args([
            "--file",
            &format!("{}:/etc/nvme-auth-matrix", matrix_file.display()),
        ])
        .args(["--module", "virtio_rng"])
        .device("virtio-rng-pci")
        .run("sh /etc/nvme-auth-guest.sh", "EVNA-DONE")
        .await;
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    // The guest's report, for the record (the boot's own messages left out).
    if let (Some(a), Some(b)) = (
        log_text.find("EDGEVOL-GUEST-START"),
        log_text.find("EDGEVOL-GUEST-EXIT"),
    ) {
        println!("{}", &log_text[a..b.max(a)]);
    }
    assert!(
        status.success(),
        "guest run failed: {status} (see {})",
        log.display()
    );
    let steps = steps(&log_text, "EVNA");
    let step = |name: &str| {
        steps
            .get(name)
            .unwrap_or_else(|| panic!("guest step {name} missing from {}", log.display()))
    };
    step("net").ok("net");
    step("entropy").ok("entropy");

    // Refused, and nothing reached the volume they aimed at.
    for name in [
        "refuse-no-key",
        "refuse-wrong-host-key",
        "refuse-wrong-ctrl-key",
        "refuse-other-node",
        "refuse-old-key",
    ] {
        let s = step(name);
        assert!(
            matches!(s.rc, Some(rc) if rc != 0 && rc != 124 && rc != 143),
            "{name} must be refused:\n{} (rc {:?})",
            s.text(),
            s.rc
        );
        assert_eq!(s.word_after("controllers "), "0", "{name}: no controller");
        println!(
            "{name}: refused in {:.2} s; kernel: {}",
            s.elapsed(),
            step(&format!("dmesg-{name}")).text().replace('\n', " | ")
        );
    }
    assert_eq!(step("leftovers-refused").text().trim(), "none");
    let counters = main.running.target.stats.volume(refuse);
    for (what, ops) in [
        ("reads", &counters.read.ops),
        ("writes", &counters.write.ops),
        ("flushes", &counters.flush.ops),
        ("deallocates", &counters.deallocate.ops),
    ] {
        assert_eq!(
            ops.load(Ordering::Relaxed),
            0,
            "no {what} reached the refused volume"
        );
    }
    let refused_bytes = common::volume_bytes(&main.running.state, refuse, 0, SIZE).await;
    assert!(
        refused_bytes.iter().all(|&b| b == 0),
        "the refused volume still reads zeros"
    );
    // Wrong host key, wrong controller key, another node's pair, the old pair: four failed
    // transactions (a host without a key sends none: it gives up at the Connect response),
    // and the re-authentication of the rotation that ran with the new controller key but the
    // old host key, if the kernel ran one between the two sysfs writes (see below).
    let half_applied = step("dmesg-rotate")
        .text()
        .matches("controller authentication failed")
        .count() as u64;
    let failed = main.counter(|c| c.failed.load(Ordering::Relaxed));
    assert_eq!(failed, 4 + half_applied, "failed authentications counted");

    // The right pair: connected, and the guest's bytes are in the volume.
    let connect = step("connect").ok("connect");
    assert_eq!(connect.word_after("controllers "), "1");
    let controller = step("controller").ok("controller").text();
    assert!(controller.contains("state: live"), "{controller}");
    assert!(controller.contains("dhchap_secret: set"), "{controller}");
    assert!(
        controller.contains("dhchap_ctrl_secret: set"),
        "{controller}"
    );
    let io = step("io").ok("io");
    assert_eq!(io.word_after("written "), io.word_after("read "));
    let data = common::volume_bytes(&main.running.state, vol, PATTERN_AT, PATTERN_LEN).await;
    let line = b"EDGEVOL-NVME-AUTH\n";
    let expected: Vec<u8> = line.iter().copied().cycle().take(data.len()).collect();
    assert!(data == expected, "the guest's bytes are in the volume");

    // Rotation while fio wrote and verified.
    let rotate = step("rotate").ok("rotate");
    let rotated = rotate.text();
    assert!(rotated.contains("fio rc=0"), "{rotated}");
    assert!(rotated.contains("err= 0"), "{rotated}");
    assert!(
        rotated.contains("sysfs dhchap_secret: the new one")
            && rotated.contains("sysfs dhchap_ctrl_secret: the new one"),
        "{rotated}"
    );
    assert!(rotated.contains("state live"), "{rotated}");
    let kernel = step("dmesg-rotate").text();
    println!("rotation: kernel: {}", kernel.replace('\n', " | "));
    // Both sysfs writes re-authenticate; the controller neither fails nor reconnects.
    assert_eq!(
        kernel.matches("re-authenticating controller").count(),
        2,
        "{kernel}"
    );
    for bad in ["error recovery", "Reconnecting", "no usable path"] {
        assert!(
            !kernel.contains(bad),
            "{bad} during the rotation:\n{kernel}"
        );
    }
    let pairs = step("pairs").ok("pairs");
    assert_eq!(
        pairs.word_after("pairs "),
        "1",
        "the store dropped the old pair once the host re-authenticated:\n{}",
        pairs.text()
    );
    let now = main.running.host_keys.keys_for(&host);
    assert_eq!(now.len(), 1);
    assert!(now[0].generation > first_generation, "the new pair stays");
    let readback = step("readback").ok("readback");
    assert_eq!(readback.word_after("read "), io.word_after("written "));
    step("disconnect").ok("disconnect");
    step("connect-new-key").ok("connect-new-key");
    let again = step("readback-new-key").ok("readback-new-key");
    assert_eq!(again.word_after("read "), io.word_after("written "));
    step("disconnect-new-key").ok("disconnect-new-key");
    assert_eq!(step("leftovers").text().trim(), "none");

    // Every hash and DH group, and the connect times.
    let mut rows = vec![("open".to_owned(), Vec::new())];
    for (label, _) in &matrix {
        rows.push(((*label).to_owned(), Vec::new()));
    }
    for run in 1..=runs {
        for (label, times) in &mut rows {
            let name = format!("m-{label}-{run}");
            let s = step(&name).ok(&name);
            assert_eq!(s.word_after("controllers "), "1", "{name}");
            times.push(s.elapsed());
        }
    }
    assert_eq!(step("leftovers-matrix").text().trim(), "none");
    // Linux names what it negotiated: the one hash and group each appliance allowed.
    for (label, hash, group) in MATRIX {
        let kernel = step(&format!("dmesg-m-{label}-1")).text();
        let said = format!("authenticated with hash hmac({hash}) dhgroup {group}");
        assert!(kernel.contains(&said), "{label}: `{said}` in:\n{kernel}");
    }
    for (label, app) in &matrix {
        let ok = app.counter(|c| c.succeeded.load(Ordering::Relaxed));
        let failed = app.counter(|c| c.failed.load(Ordering::Relaxed));
        // Admin + one I/O queue (one guest CPU) per connect.
        assert_eq!(ok, 2 * runs as u64, "{label}: every queue authenticated");
        assert_eq!(failed, 0, "{label}: no failure");
    }
    assert_eq!(
        open.counter(|c| c.succeeded.load(Ordering::Relaxed)),
        0,
        "the open appliance authenticates nobody"
    );
    let mean = |t: &[f64]| t.iter().sum::<f64>() / t.len() as f64;
    let base = mean(&rows[0].1);
    println!(
        "\n`nvme connect` wall time in the guest (admin + 1 I/O queue), {runs} run(s) each:\n"
    );
    println!("| target policy | runs (s) | mean (s) | vs. no auth |");
    println!("|---|---|---|---|");
    for (label, times) in &rows {
        let list: Vec<String> = times.iter().map(|t| format!("{t:.2}")).collect();
        println!(
            "| {} | {} | {:.2} | {:.1}x |",
            if label == "open" {
                "no authentication"
            } else {
                label
            },
            list.join(", "),
            mean(times),
            mean(times) / base
        );
    }

    for (_, app) in matrix {
        app.running.stop().await.unwrap();
    }
    open.running.stop().await.unwrap();
    main.running.stop().await.unwrap();
}
