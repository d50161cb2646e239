//! Faults under live I/O (project issue 13), against the real Linux initiator in a QEMU TCG guest
//! (Debian's nvme-cli and fio copied in), with `edgevold` running as a real process on this host
//! (dev mode: file-backed pool, generated PKI), reached by the guest at 10.0.2.2 through slirp:
//!
//! 1. kill -9 of the appliance, three times, under `fio --verify=crc32c` 4k random writes without
//!    fsync or FUA: once over a region written and flushed before (overwrites), once on a fresh
//!    volume (allocating writes, never flushed). After each SIGKILL edgevold restarts on the same
//!    data dir and ports; the guest's controller (`--ctrl-loss-tmo=120 --reconnect-delay=1`)
//!    reconnects and fio's queued writes go on. Pass: fio exits 0 with every `err=` zero and no
//!    verify error, the guest's dmesg shows a reconnect per kill and no I/O error, writes reached
//!    the target before every kill and after the last restart (so all three kills hit the write
//!    phase), and no Flush reached the target while fio wrote.
//! 2. ControllerUnpublishVolume while the guest writes (connected through /dev/nvme-fabrics with
//!    `fast_io_fail_tmo`, as the node plugin connects): fio must get an I/O error within
//!    [`io_fail_bound_s`] of the call's return, the kernel's reconnects must be refused by the
//!    target (dmesg: "is not allowed"), and the appliance log must show the revoke and a
//!    refused Connect naming the host after it.
//!
//! Volumes are created and published over CSI with mTLS (the dev PKI's controller pair). The
//! guest (qemu/faults-guest.sh) only reports; this test judges its serial log, the daemon's log
//! and the daemon's metrics, and prints one verdict line per check before failing on any.
//! Ignored by default: `scripts/test-faults-qemu.sh` runs it.

mod common;

use common::guest::{steps, GuestRun, Step};
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::{
    CapacityRange, ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tonic::transport::Channel;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0e0e0e0e-fa17-4000-8000-000000000013";
const APPLIANCE: &str = "faults";
const MIB: i64 = 1 << 20;
const NVME_CLI: &str = "/usr/sbin/nvme";
const FIO: &str = "/usr/bin/fio";
/// SIGKILLs of edgevold per workload.
const KILLS: usize = 3;
/// Writes the target must have completed in an incarnation before it is killed, and after the
/// last restart: proof that the guest reconnected and fio was still in its write phase. At the
/// guest's 100 IOPS this is ~1.5 s of writes, longer than the pool's 1 s periodic sync.
const WRITES_BEFORE_KILL: u64 = 150;
/// Budget for the writes above to arrive, for a restart to be ready, for a CSI call (each
/// times the load's scale, [`budget`]).
const WAIT_WRITES_S: u64 = 60;
const READY_S: u64 = 60;
const CALL_S: u64 = 60;
/// The guest's fast_io_fail_tmo in check 2.
const FAST_IO_FAIL_TMO: u64 = 5;
/// The guest's slack beyond fast_io_fail_tmo in check 2, see [`io_fail_bound_s`].
const IO_FAIL_SLACK_S: u32 = 10;
/// Whole guest run: boot, both workloads with their kills, the unpublish check (run-guest.sh
/// widens it by the load's scale).
const GUEST_S: u64 = 540;

/// `secs` times the load's scale (`EDGEVOL_TEST_TIME_SCALE`).
fn budget(secs: u64) -> Duration {
    common::scaled(Duration::from_secs(secs))
}

/// The documented bound: after ControllerUnpublishVolume returns, the host's I/O fails within
/// fast_io_fail_tmo plus 10 s (the connection is closed at once; the rest is TCG slack, times
/// the load's scale: a busy host's guest).
fn io_fail_bound_s() -> f64 {
    FAST_IO_FAIL_TMO as f64 + f64::from(IO_FAIL_SLACK_S * common::time_scale())
}

/// The daemon as a child process, restarted on the same data dir and ports.
struct Daemon {
    bin: PathBuf,
    dir: PathBuf,
    csi: SocketAddr,
    nvme_port: u16,
    metrics: SocketAddr,
    log: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Daemon {
    fn spawn(&mut self) {
        self.starts += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("daemon log");
        writeln!(
            log,
            "----- faults_qemu: edgevold start {} -----",
            self.starts
        )
        .unwrap();
        let child = Command::new(&self.bin)
            .arg("--dev")
            .arg("--data-dir")
            .arg(&self.dir)
            .args(["--appliance-id", APPLIANCE])
            .args(["--listen", &self.csi.to_string()])
            .args(["--nvme-listen", &format!("127.0.0.1:{}", self.nvme_port)])
            .args(["--nvme-advertise", "10.0.2.2"])
            .args(["--metrics-listen", &self.metrics.to_string()])
            // The guest's 6.1 kernel has no NVMe authentication.
            .args(["--nvme-allow-unauthenticated-hosts", "true"])
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn edgevold");
        self.child = Some(child);
    }

    /// SIGKILL, and reap.
    fn kill9(&mut self) {
        let mut child = self.child.take().expect("a running edgevold");
        child.kill().expect("SIGKILL edgevold");
        child.wait().expect("reap edgevold");
    }

    /// `GET /metrics`, or None while the exporter is not up.
    async fn scrape(&self) -> Option<String> {
        let exchange = async {
            let mut tcp = TcpStream::connect(self.metrics).await.ok()?;
            tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut raw = String::new();
            tcp.read_to_string(&mut raw).await.ok()?;
            let (head, body) = raw.split_once("\r\n\r\n")?;
            head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
        };
        tokio::time::timeout(budget(5), exchange)
            .await
            .ok()
            .flatten()
    }

    /// Waits until the pool is open (metrics `edgevol_pool_ready 1`).
    async fn wait_ready(&mut self) -> Result<Duration, String> {
        let t = Instant::now();
        while t.elapsed() < budget(READY_S) {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(format!("edgevold exited ({status}) while starting"));
            }
            if let Some(text) = self.scrape().await {
                if text.lines().any(|l| l.trim() == "edgevol_pool_ready 1") {
                    return Ok(t.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("edgevold not ready within {:?}", budget(READY_S)))
    }

    /// Successful commands of `op` on `volume_id` in this incarnation (0 before the first).
    async fn ops(&self, volume_id: &str, op: &str) -> Option<u64> {
        let text = self.scrape().await?;
        let vol = format!("volume_id=\"{volume_id}\"");
        let op = format!("op=\"{op}\"");
        Some(
            text.lines()
                .filter(|l| l.starts_with("edgevol_volume_io_ops_total{"))
                .filter(|l| l.contains(&vol) && l.contains(&op))
                .find_map(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or(0),
        )
    }

    /// Waits until `volume_id` has at least `n` writes in this incarnation; returns the count.
    async fn wait_writes(&self, volume_id: &str, n: u64) -> Result<u64, String> {
        let t = Instant::now();
        let mut last = 0;
        while t.elapsed() < budget(WAIT_WRITES_S) {
            last = self.ops(volume_id, "write").await.unwrap_or(last);
            if last >= n {
                return Ok(last);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "only {last} writes of {n} reached the target within {:?}",
            budget(WAIT_WRITES_S)
        ))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One SIGKILL: the incarnation's writes and flushes before it, and how long the restart took.
#[derive(Debug)]
struct Kill {
    writes: u64,
    flushes: u64,
    ready_after: Duration,
}

/// What the host did for one workload's "kill" request.
#[derive(Debug, Default)]
struct KillRun {
    kills: Vec<Kill>,
    /// Writes and flushes of the incarnation after the last restart, once writes resumed.
    resumed_writes: u64,
    resumed_flushes: u64,
    error: Option<String>,
}

/// What the host did for the "unpublish" request.
#[derive(Debug, Default)]
struct UnpublishRun {
    call: Option<Duration>,
    error: Option<String>,
}

#[derive(Default)]
struct Records {
    kills: HashMap<String, KillRun>,
    unpublish: UnpublishRun,
}

/// Shared by the control port's handler and the test body.
struct Rig {
    daemon: Mutex<Daemon>,
    records: Mutex<Records>,
    /// Workload name -> CSI volume id.
    volumes: HashMap<String, String>,
    unpublish_volume: String,
    pki: PathBuf,
}

impl Rig {
    async fn controller(&self) -> ControllerClient<Channel> {
        let csi = self.daemon.lock().await.csi;
        let tls = common::tls_for(
            &self.pki,
            &self.pki.join("controller.pem"),
            &self.pki.join("controller.key"),
        );
        let channel = tokio::time::timeout(budget(CALL_S), common::try_channel(csi, tls))
            .await
            .expect("mTLS connection to edgevold within the budget")
            .expect("mTLS connection to edgevold");
        ControllerClient::new(channel)
    }

    /// Three cycles of: writes flowing in this incarnation, SIGKILL, restart on the same data
    /// dir, pool ready; then writes flowing again after the last restart.
    async fn kill_cycles(&self, workload: &str) -> KillRun {
        let mut run = KillRun::default();
        let Some(volume_id) = self.volumes.get(workload) else {
            run.error = Some(format!("unknown workload {workload:?}"));
            return run;
        };
        let mut daemon = self.daemon.lock().await;
        // The first incarnation may hold earlier writes (the overwrite prefill): count from here.
        let mut base_writes = daemon.ops(volume_id, "write").await.unwrap_or(0);
        let mut base_flushes = daemon.ops(volume_id, "flush").await.unwrap_or(0);
        for i in 1..=KILLS {
            let writes = match daemon
                .wait_writes(volume_id, base_writes + WRITES_BEFORE_KILL)
                .await
            {
                Ok(w) => w - base_writes,
                Err(e) => {
                    run.error = Some(format!("before kill {i}: {e}"));
                    return run;
                }
            };
            let flushes = daemon
                .ops(volume_id, "flush")
                .await
                .unwrap_or(0)
                .saturating_sub(base_flushes);
            daemon.kill9();
            eprintln!(
                "faults_qemu: {workload}: kill -9 #{i} after {writes} writes, {flushes} flushes"
            );
            daemon.spawn();
            match daemon.wait_ready().await {
                Ok(ready_after) => run.kills.push(Kill {
                    writes,
                    flushes,
                    ready_after,
                }),
                Err(e) => {
                    run.error = Some(format!("restart {i}: {e}"));
                    return run;
                }
            }
            base_writes = 0;
            base_flushes = 0;
        }
        match daemon.wait_writes(volume_id, WRITES_BEFORE_KILL).await {
            Ok(w) => run.resumed_writes = w,
            Err(e) => run.error = Some(format!("after the last restart: {e}")),
        }
        run.resumed_flushes = daemon.ops(volume_id, "flush").await.unwrap_or(0);
        run
    }

    async fn unpublish(&self) -> UnpublishRun {
        let mut run = UnpublishRun::default();
        let mut ctl = self.controller().await;
        let t = Instant::now();
        let call = ctl.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: self.unpublish_volume.clone(),
            node_id: HOST.into(),
            ..Default::default()
        });
        match tokio::time::timeout(budget(CALL_S), call).await {
            Ok(Ok(_)) => run.call = Some(t.elapsed()),
            Ok(Err(status)) => run.error = Some(format!("ControllerUnpublishVolume: {status}")),
            Err(_) => {
                run.error = Some(format!(
                    "ControllerUnpublishVolume: no answer in {:?}",
                    budget(CALL_S)
                ))
            }
        }
        run
    }

    /// Serves the guest's requests, one line per connection, answered when done.
    async fn serve(self: Arc<Self>, listener: tokio::net::TcpListener) {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            if BufReader::new(read).read_line(&mut line).await.is_err() {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let answer = match words.as_slice() {
                ["kill", workload] => {
                    let run = self.kill_cycles(workload).await;
                    let answer = match &run.error {
                        None => format!("killed {}", run.kills.len()),
                        Some(e) => format!("failed after {} kills: {e}", run.kills.len()),
                    };
                    self.records
                        .lock()
                        .await
                        .kills
                        .insert((*workload).to_owned(), run);
                    answer
                }
                ["unpublish"] => {
                    let run = self.unpublish().await;
                    let answer = match &run.error {
                        None => "unpublished".to_owned(),
                        Some(e) => format!("failed: {e}"),
                    };
                    self.records.lock().await.unpublish = run;
                    answer
                }
                _ => format!("unknown request {line:?}"),
            };
            let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
        }
    }
}

impl Step {
    /// Lines after the step's `dmesg:` line.
    fn dmesg(&self) -> Vec<&str> {
        self.out
            .iter()
            .skip_while(|l| l.as_str() != "dmesg:")
            .skip(1)
            .map(String::as_str)
            .collect()
    }

    /// The values of every `err=` field of fio's output.
    fn fio_errs(&self) -> Vec<i64> {
        self.out
            .iter()
            .flat_map(|l| l.split("err=").skip(1))
            .filter_map(|rest| {
                rest.trim_start()
                    .split(|c: char| !c.is_ascii_digit())
                    .next()
            })
            .filter_map(|n| n.parse().ok())
            .collect()
    }
}

/// Kernel lines that mean an I/O error reached (or was about to reach) a block device user.
fn io_error_lines<'a>(dmesg: &[&'a str]) -> Vec<&'a str> {
    const BAD: [&str; 6] = [
        "I/O error",
        "I/O Cmd(",
        "Buffer I/O",
        "blk_update_request",
        "critical",
        "Removing ctrl",
    ];
    dmesg
        .iter()
        .copied()
        .filter(|l| BAD.iter().any(|b| l.contains(b)))
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Verdict of one check: PASS, or FAIL with the reasons; printed either way.
struct Verdict {
    name: &'static str,
    facts: Vec<String>,
    failures: Vec<String>,
}

impl Verdict {
    fn new(name: &'static str) -> Verdict {
        Verdict {
            name,
            facts: Vec::new(),
            failures: Vec::new(),
        }
    }

    fn fact(&mut self, s: String) {
        self.facts.push(s);
    }

    fn require(&mut self, ok: bool, why: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(why());
        }
    }

    fn print(&self) {
        let word = if self.failures.is_empty() {
            "PASS"
        } else {
            "FAIL"
        };
        eprintln!("FAULTS {word} {}: {}", self.name, self.facts.join("; "));
        for f in &self.failures {
            eprintln!("FAULTS   {}: {f}", self.name);
        }
    }
}

/// Check 1 for one workload: the host's kill cycles and the guest's fio and dmesg.
fn judge_kills(
    v: &mut Verdict,
    run: Option<&KillRun>,
    step: Option<&Step>,
    expect_prefill_flush: Option<&Step>,
) {
    if let Some(prefill) = expect_prefill_flush {
        v.require(prefill.rc == Some(0), || {
            format!("prefill failed:\n{}", prefill.text())
        });
    }
    match run {
        None => v.require(false, || "the guest never asked for the kills".into()),
        Some(run) => {
            let kills: Vec<String> = run
                .kills
                .iter()
                .map(|k| {
                    format!(
                        "{} writes/{} flushes, ready {:.1} s",
                        k.writes,
                        k.flushes,
                        k.ready_after.as_secs_f64()
                    )
                })
                .collect();
            v.fact(format!(
                "{} kills [{}], {} writes after the last restart",
                run.kills.len(),
                kills.join(" | "),
                run.resumed_writes
            ));
            v.require(run.error.is_none(), || {
                format!("host side: {}", run.error.as_deref().unwrap_or_default())
            });
            v.require(run.kills.len() == KILLS, || {
                format!("{} kills of {KILLS}", run.kills.len())
            });
            let flushes: u64 =
                run.kills.iter().map(|k| k.flushes).sum::<u64>() + run.resumed_flushes;
            v.require(flushes == 0, || {
                format!("{flushes} Flush commands reached the target while fio wrote (it must not flush)")
            });
        }
    }
    let Some(step) = step else {
        v.require(false, || "guest step missing from the serial log".into());
        return;
    };
    let verify_errors: Option<u64> = step
        .find_word_after("verify-errors ")
        .and_then(|n| n.parse().ok());
    let fio_rc = step.find_word_after("fio rc=");
    let errs = step.fio_errs();
    let issued: Vec<&str> = step
        .out
        .iter()
        .filter(|l| l.contains("issued rwts"))
        .map(|l| l.trim())
        .collect();
    let dmesg = step.dmesg();
    let reconnects = dmesg
        .iter()
        .filter(|l| l.contains("Successfully reconnected"))
        .count();
    let io_errors = io_error_lines(&dmesg);
    v.fact(format!(
        "fio rc={} err={:?} verify errors={} ({}), {} reconnects in dmesg, {} I/O error lines",
        fio_rc.unwrap_or("?"),
        errs,
        verify_errors.map_or("?".into(), |n| n.to_string()),
        issued.join(" / "),
        reconnects,
        io_errors.len()
    ));
    v.require(step.rc == Some(0) && fio_rc == Some("0"), || {
        format!("fio failed (step rc {:?}):\n{}", step.rc, step.text())
    });
    v.require(!errs.is_empty() && errs.iter().all(|e| *e == 0), || {
        format!("fio err= fields {errs:?}")
    });
    v.require(verify_errors == Some(0), || {
        let shown: Vec<&str> = step
            .out
            .iter()
            .filter(|l| l.contains("verify") || l.contains("bad magic"))
            .take(6)
            .map(String::as_str)
            .collect();
        format!(
            "{} blocks failed fio's crc32c verify (acknowledged writes lost across kill -9):\n{}",
            verify_errors.map_or("?".into(), |n| n.to_string()),
            shown.join("\n")
        )
    });
    v.require(reconnects >= KILLS, || {
        format!(
            "{reconnects} 'Successfully reconnected' in dmesg, want {KILLS}:\n{}",
            dmesg.join("\n")
        )
    });
    v.require(io_errors.is_empty(), || {
        format!("I/O errors in the guest's dmesg:\n{}", io_errors.join("\n"))
    });
}

/// Check 2: the guest's I/O failed within the bound, its reconnects were refused, and the
/// appliance log shows the revoke and the refusal.
fn judge_unpublish(v: &mut Verdict, run: &UnpublishRun, step: Option<&Step>, daemon_log: &str) {
    v.require(run.error.is_none(), || {
        format!("host side: {}", run.error.as_deref().unwrap_or_default())
    });
    if let Some(call) = run.call {
        v.fact(format!(
            "ControllerUnpublishVolume took {:.2} s",
            call.as_secs_f64()
        ));
    }
    let Some(step) = step else {
        v.require(false, || "guest step missing from the serial log".into());
        return;
    };
    let failed_after: Option<f64> = step
        .find_word_after("io-failed-after-s ")
        .and_then(|n| n.parse().ok());
    let fio_rc: Option<i32> = step.find_word_after("fio rc=").and_then(|n| n.parse().ok());
    let still = step.out.iter().any(|l| l.contains("fio still writing"));
    let dmesg = step.dmesg();
    let refused = dmesg
        .iter()
        .filter(|l| l.contains("is not allowed"))
        .count();
    let bound = io_fail_bound_s();
    v.fact(format!(
        "guest I/O failed {} s after the call returned (bound {bound} s, fast_io_fail_tmo {FAST_IO_FAIL_TMO}), fio rc={}, {} refused reconnects in dmesg",
        failed_after.map_or("?".into(), |s| format!("{s:.1}")),
        fio_rc.map_or("?".into(), |n| n.to_string()),
        refused
    ));
    v.require(step.rc == Some(0) && !still, || {
        format!("guest step failed or fio never failed:\n{}", step.text())
    });
    v.require(fio_rc.is_some_and(|rc| rc != 0), || {
        format!("fio did not fail:\n{}", step.text())
    });
    v.require(
        step.fio_errs().contains(&5) || step.text().contains("Input/output error"),
        || format!("fio's error is not EIO:\n{}", step.text()),
    );
    v.require(failed_after.is_some_and(|s| s <= bound), || {
        format!("I/O failed {failed_after:?} s after the unpublish, bound {bound} s")
    });
    v.require(refused >= 1, || {
        format!(
            "no refused reconnect ('is not allowed') in the guest's dmesg:\n{}",
            dmesg.join("\n")
        )
    });
    // The appliance's side: the revoke, then a refused Connect of this host after it.
    let lines: Vec<&str> = daemon_log.lines().collect();
    let revoked = lines
        .iter()
        .position(|l| l.contains("revoked: closing controller") && l.contains(HOST));
    v.require(revoked.is_some(), || {
        "no 'revoked: closing controller' line naming the host in the appliance log".into()
    });
    if let Some(at) = revoked {
        const REFUSAL: [&str; 6] = [
            "refus",
            "reject",
            "denied",
            "not allowed",
            "not published",
            "invalid host",
        ];
        let refusals = lines[at + 1..]
            .iter()
            .filter(|l| l.contains(HOST))
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                REFUSAL.iter().any(|w| l.contains(w))
            })
            .count();
        v.fact(format!(
            "{refusals} refused Connects of the host in the appliance log after the revoke"
        ));
        v.require(refusals >= 1, || {
            "the appliance log shows no refused Connect of the host after the revoke (a line naming the host NQN with refused/rejected/denied/not allowed/not published/invalid host)".into()
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "boots a QEMU guest with the host's nvme-cli and fio: scripts/test-faults-qemu.sh"]
async fn faults_under_live_io() {
    for tool in [NVME_CLI, FIO] {
        assert!(
            Path::new(tool).exists(),
            "{tool} missing: scripts/test-faults-qemu.sh installs nvme-cli and fio"
        );
    }
    let cache = common::qemu_cache();
    let dir = tempfile::tempdir().unwrap();
    let daemon_log = cache.join("logs/faults-edgevold.log");
    let _ = std::fs::remove_file(&daemon_log);
    let mut daemon = Daemon {
        bin: PathBuf::from(env!("CARGO_BIN_EXE_edgevold")),
        dir: dir.path().join("data"),
        csi: SocketAddr::from(([127, 0, 0, 1], free_port())),
        nvme_port: free_port(),
        metrics: SocketAddr::from(([127, 0, 0, 1], free_port())),
        log: daemon_log.clone(),
        child: None,
        starts: 0,
    };
    daemon.spawn();
    let first = daemon
        .wait_ready()
        .await
        .unwrap_or_else(|e| panic!("{e} (log {})", daemon_log.display()));
    eprintln!(
        "faults_qemu: edgevold ready in {:.1} s (log {})",
        first.as_secs_f64(),
        daemon_log.display()
    );
    let pki = daemon.dir.join("pki");
    let nvme_port = daemon.nvme_port;

    let mut rig = Rig {
        daemon: Mutex::new(daemon),
        records: Mutex::new(Records::default()),
        volumes: HashMap::new(),
        unpublish_volume: String::new(),
        pki,
    };
    // Three block volumes, published to the guest's host NQN over CSI (mTLS, controller role).
    let mut ctl = rig.controller().await;
    let mut nqns = HashMap::new();
    for (name, size) in [
        ("overwrite", 64 * MIB),
        ("allocate", 1024 * MIB),
        ("unpublish", 64 * MIB),
    ] {
        let request = edgevol_proto::csi::v1::CreateVolumeRequest {
            capacity_range: Some(CapacityRange {
                required_bytes: size,
                limit_bytes: 0,
            }),
            ..common::block_volume(format!("faults-{name}"))
        };
        let capability = request.volume_capabilities[0].clone();
        let volume = ctl
            .create_volume(request)
            .await
            .expect("CreateVolume")
            .into_inner()
            .volume
            .expect("a volume");
        let context = ctl
            .controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: volume.volume_id.clone(),
                node_id: HOST.into(),
                volume_capability: Some(capability),
                readonly: false,
                ..Default::default()
            })
            .await
            .expect("ControllerPublishVolume")
            .into_inner()
            .publish_context;
        assert_eq!(
            context.get("targetAddress").map(String::as_str),
            Some("10.0.2.2")
        );
        assert_eq!(
            context.get("targetPort").map(String::as_str),
            Some(nvme_port.to_string().as_str())
        );
        nqns.insert(name, context["subsystemNqn"].clone());
        rig.volumes.insert(name.to_owned(), volume.volume_id);
    }
    rig.unpublish_volume = rig.volumes["unpublish"].clone();
    let rig = Arc::new(rig);

    let ctl_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ctl_port = ctl_listener.local_addr().unwrap().port();
    let server = tokio::spawn(rig.clone().serve(ctl_listener));

    let log = cache.join("logs/faults-guest.log");
    let cmd = format!(
        "sh /etc/faults-guest.sh {nvme_port} {ctl_port} {HOST} {} {} {} {FAST_IO_FAIL_TMO}",
        nqns["overwrite"], nqns["allocate"], nqns["unpublish"]
    );
    let started = Instant::now();
    // fio's libraries take ~80 MiB of the initramfs.
    let status = GuestRun::new("faults", &log, GUEST_S, 1024)
        .args(["--host-bin", NVME_CLI, "--host-bin", FIO])
        .script("faults-guest.sh")
        .run(&cmd, "EVF-DONE")
        .await;
    eprintln!(
        "faults_qemu: guest finished in {:.0} s ({status})",
        started.elapsed().as_secs_f64()
    );
    server.abort();
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    let steps = steps(&log_text, "EVF");
    let records = std::mem::take(&mut *rig.records.lock().await);
    {
        let mut daemon = rig.daemon.lock().await;
        if let Some(mut child) = daemon.child.take() {
            // SIGTERM: a clean stop, so the log's last lines are the daemon's own.
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let t = Instant::now();
            while child.try_wait().ok().flatten().is_none() && t.elapsed() < budget(10) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    let daemon_text = strip_ansi(&std::fs::read_to_string(&daemon_log).unwrap_or_default());

    let mut verdicts = Vec::new();
    let mut setup = Verdict::new("guest");
    setup.fact(format!("run-guest {status}, log {}", log.display()));
    setup.require(status.success(), || {
        format!("the guest run failed: {status} (see {})", log.display())
    });
    for name in [
        "net",
        "ow-connect",
        "ow-namespace",
        "ow-disconnect",
        "alloc-connect",
        "alloc-namespace",
        "alloc-disconnect",
        "up-connect",
        "up-namespace",
        "up-disconnect",
    ] {
        let rc = steps.get(name).and_then(|s| s.rc);
        setup.require(rc == Some(0), || {
            format!(
                "guest step {name} rc {rc:?}:\n{}",
                steps.get(name).map(Step::text).unwrap_or_default()
            )
        });
    }
    let leftovers = steps.get("leftovers").map(|s| s.text()).unwrap_or_default();
    setup.require(leftovers.trim() == "none", || {
        format!("controllers left in the guest: {leftovers}")
    });
    verdicts.push(setup);

    let mut ow = Verdict::new("1a kill -9 x3 under fio verify, overwrites of a flushed region");
    judge_kills(
        &mut ow,
        records.kills.get("overwrite"),
        steps.get("ow-faults"),
        steps.get("ow-prefill"),
    );
    verdicts.push(ow);
    let mut alloc = Verdict::new("1b kill -9 x3 under fio verify, allocating writes, no Flush");
    judge_kills(
        &mut alloc,
        records.kills.get("allocate"),
        steps.get("alloc-faults"),
        None,
    );
    verdicts.push(alloc);
    let mut up = Verdict::new("2 unpublish during I/O");
    judge_unpublish(
        &mut up,
        &records.unpublish,
        steps.get("up-io"),
        &daemon_text,
    );
    verdicts.push(up);

    for v in &verdicts {
        v.print();
    }
    let failed: Vec<&str> = verdicts
        .iter()
        .filter(|v| !v.failures.is_empty())
        .map(|v| v.name)
        .collect();
    assert!(
        failed.is_empty(),
        "failed: {} (guest log {}, appliance log {})",
        failed.join(", "),
        log.display(),
        daemon_log.display()
    );
}
