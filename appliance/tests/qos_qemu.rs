//! Per-volume QoS against the real Linux initiator and fio in a QEMU TCG guest (Debian's nvme-cli
//! and fio copied in), which reaches this process's target at 10.0.2.2 through slirp. Volumes
//! are created over CSI with mTLS, their limits in CreateVolume's mutable_parameters; the guest
//! (qemu/qos-guest.sh) measures and this test judges, printing one line per figure:
//!
//! - a volume limited to 300 IOPS measures 270-330 IOPS at QD16;
//! - raised live to 600 with ControllerModifyVolume while fio runs (no reconnect), the first five
//!   whole seconds after the call measure 540-660;
//! - a volume limited to 5 MiB/s measures 4.5-5.5 MiB/s with 128 KiB reads;
//! - the limited volume next to a QD16 neighbour still measures 270-330;
//! - the neighbour: an unlimited volume at QD1 and at QD16, alone and next to the limited volume
//!   (at QD16), and at QD1 next to an unlimited volume doing the same 300 IOPS paced by fio.
//!   Printed, not judged: in a TCG guest on two host cores the whole rig is CPU-bound, and the
//!   neighbour's IOPS alone vary from run to run by more than 2x (170-530 at QD1), so no ratio
//!   of them holds still. Any 300 IOPS of guest work (fio and the emulated nvme-tcp) take their
//!   share of the CPU whatever the target does. The loopback bench (`benches/qos.rs`) measures
//!   the target's part: a neighbour next to a held volume keeps what it has alone.
//!
//! The upper bound of each band is always judged; the lower bound only where the guest, without
//! a limit, reached 1.2 times the limit in the same run (the unlimited volume alone at QD16, or
//! at 128k for the bandwidth): on a busy machine the TCG guest may not issue 300 IOPS at all,
//! which says nothing about the limiter. A skipped lower bound is printed as such.
//!
//! Ignored by default: `scripts/test-nvme-qemu.sh` runs it.

mod common;

use std::collections::HashMap;

use common::guest::{steps, GuestRun, Step};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::{
    CapacityRange, ControllerModifyVolumeRequest, ControllerPublishVolumeRequest,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tonic::transport::Channel;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0e0e0e0e-9005-4000-8000-000000000017";
const NVME_CLI: &str = "/usr/sbin/nvme";
const FIO: &str = "/usr/bin/fio";
const LIMIT_IOPS: f64 = 300.0;
const RAISED_IOPS: f64 = 600.0;
const LIMIT_BYTES: f64 = 5.0 * 1024.0 * 1024.0;

/// The band a limited volume must measure in, as a fraction of its limit.
const LOW: f64 = 0.9;
const HIGH: f64 = 1.1;
/// The lower bound is judged only where the guest, unlimited in the same run, reached this
/// multiple of the limit: a TCG guest on a busy machine may not reach the limit at all, and
/// that says nothing about the limiter. The upper bound is always judged.
const REACHABLE: f64 = 1.2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pass,
    /// Under the limit, but the guest could not go much past it unlimited either.
    PassUpperOnly,
    Fail,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::PassUpperOnly => {
                "PASS (upper bound only: the guest could not reach the limit)"
            }
            Verdict::Fail => "FAIL",
        })
    }
}

fn judge(measured: f64, limit: f64, capacity: f64) -> Verdict {
    let ratio = measured / limit;
    if ratio > HIGH {
        Verdict::Fail
    } else if ratio >= LOW {
        Verdict::Pass
    } else if capacity < REACHABLE * limit {
        Verdict::PassUpperOnly
    } else {
        Verdict::Fail
    }
}

#[test]
fn the_lower_bound_is_judged_only_where_the_guest_could_reach_the_limit() {
    assert_eq!(judge(300.0, 300.0, 2000.0), Verdict::Pass);
    assert_eq!(judge(340.0, 300.0, 2000.0), Verdict::Fail);
    assert_eq!(
        judge(340.0, 300.0, 200.0),
        Verdict::Fail,
        "above: always judged"
    );
    assert_eq!(judge(225.0, 300.0, 2000.0), Verdict::Fail);
    assert_eq!(judge(225.0, 300.0, 280.0), Verdict::PassUpperOnly);
    assert_eq!(judge(225.0, 300.0, 359.0), Verdict::PassUpperOnly);
    assert_eq!(judge(225.0, 300.0, 360.0), Verdict::Fail);
}

/// Creates a 64 MiB block volume with `mutable` limits, published to the guest: its CSI id and
/// subsystem NQN.
async fn volume(
    c: &mut ControllerClient<Channel>,
    name: &str,
    mutable: &[(&str, &str)],
) -> (String, String) {
    let request = edgevol_proto::csi::v1::CreateVolumeRequest {
        capacity_range: Some(CapacityRange {
            required_bytes: 64 << 20,
            limit_bytes: 0,
        }),
        mutable_parameters: mutable
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..common::block_volume(name.to_owned())
    };
    let capability = request.volume_capabilities[0].clone();
    let v = c
        .create_volume(request)
        .await
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("a volume");
    let context = c
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            node_id: HOST.into(),
            volume_capability: Some(capability),
            ..Default::default()
        })
        .await
        .expect("ControllerPublishVolume")
        .into_inner()
        .publish_context;
    (v.volume_id, context["subsystemNqn"].clone())
}

/// Serves the guest's one "raise" request: the limited volume goes to 600 IOPS.
async fn serve_raise(listener: tokio::net::TcpListener, channel: Channel, volume_id: String) {
    let (stream, _) = listener.accept().await.unwrap();
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await.unwrap();
    let answer = match line.trim() {
        "raise" => match ControllerClient::new(channel)
            .controller_modify_volume(ControllerModifyVolumeRequest {
                volume_id,
                mutable_parameters: HashMap::from([(
                    "maxIops".to_owned(),
                    format!("{RAISED_IOPS:.0}"),
                )]),
                ..Default::default()
            })
            .await
        {
            Ok(_) => "raised".to_owned(),
            Err(status) => format!("failed: {status}"),
        },
        other => format!("unknown request {other:?}"),
    };
    let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
}

/// The number after `prefix` in `step`, which must be there.
fn figure(step: &Step, prefix: &str) -> f64 {
    step.word_after(prefix)
        .parse()
        .unwrap_or_else(|_| panic!("`{prefix}` is not a number in:\n{}", step.text()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "boots a QEMU guest with the host's nvme-cli and fio: scripts/test-nvme-qemu.sh"]
async fn linux_hosts_get_the_limits_set_and_raised_live() {
    for tool in [NVME_CLI, FIO] {
        assert!(
            std::path::Path::new(tool).exists(),
            "{tool} missing: scripts/test-nvme-qemu.sh installs nvme-cli and fio"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let running = common::qemu_appliance(dir.path(), "qemu-qos").await;
    let port = running.target.endpoint.port();
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
    let mut c = ControllerClient::new(channel.clone());
    let (limited, limited_nqn) = volume(&mut c, "qos-limited", &[("maxIops", "300")]).await;
    let (_, free_nqn) = volume(&mut c, "qos-free", &[]).await;
    let (_, bw_nqn) = volume(&mut c, "qos-bw", &[("maxBandwidthBytes", "5242880")]).await;
    let (_, paced_nqn) = volume(&mut c, "qos-paced", &[]).await;

    let ctl = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let ctl_port = ctl.local_addr().unwrap().port();
    tokio::spawn(serve_raise(ctl, channel, limited));

    let cache = common::qemu_cache();
    let log = cache.join("logs/qos.log");
    let cmd =
        format!("sh /etc/qos-guest.sh {port} {ctl_port} {HOST} {limited_nqn} {free_nqn} {bw_nqn} {paced_nqn}");
    // fio's libraries take ~80 MiB of the initramfs; one vCPU per fio.
    let status = GuestRun::new("qos", &log, 240, 1024)
        .args(["--smp", "2", "--host-bin", NVME_CLI, "--host-bin", FIO])
        .script("qos-guest.sh")
        .run(&cmd, "EVQ-DONE")
        .await;
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.success(),
        "guest run failed: {status} (see {})",
        log.display()
    );
    let steps = steps(&log_text, "EVQ");
    let step = |name: &str| {
        let s = steps
            .get(name)
            .unwrap_or_else(|| panic!("guest step {name} missing from {}", log.display()));
        s.ok(name)
    };
    for name in [
        "net",
        "connect-limited",
        "connect-free",
        "connect-bw",
        "connect-paced",
    ] {
        step(name);
    }
    let alone = figure(step("free-alone-qd1"), "iops ");
    let both = step("together-qd1");
    let (limited_iops, free_with) = (figure(both, "other-iops "), figure(both, "free-iops "));
    let paced = step("paced-qd1");
    let (paced_iops, free_with_paced) = (figure(paced, "other-iops "), figure(paced, "free-iops "));
    let alone_qd16 = figure(step("free-alone-qd16"), "iops ");
    let both_qd16 = step("together-qd16");
    let (limited_qd16, free_with_qd16) = (
        figure(both_qd16, "other-iops "),
        figure(both_qd16, "free-iops "),
    );
    let raise = step("raise");
    assert_eq!(raise.word_after("host "), "raised", "{}", raise.text());
    let (before, after) = (figure(raise, "before "), figure(raise, "after "));
    let kib_s = figure(step("bandwidth"), "kib_s ");
    step("disconnect");

    let kib_s_free = figure(step("free-alone-128k"), "kib_s ");
    // (what, measured, limit, the guest's unlimited capacity in this run); bandwidths in B/s.
    let checks = [
        (
            "limited to 300 IOPS, QD16",
            limited_iops,
            LIMIT_IOPS,
            alone_qd16,
        ),
        ("before the raise", before, LIMIT_IOPS, alone_qd16),
        (
            "raised live to 600, next 5 s",
            after,
            RAISED_IOPS,
            alone_qd16,
        ),
        (
            "5 MiB/s at 128k",
            kib_s * 1024.0,
            LIMIT_BYTES,
            kib_s_free * 1024.0,
        ),
        (
            "limited to 300 IOPS next to a QD16 neighbour",
            limited_qd16,
            LIMIT_IOPS,
            alone_qd16,
        ),
    ];
    // The neighbour's figures: reported only (see the module docs).
    eprintln!(
        "qos_qemu: unlimited QD1 neighbour: alone {alone:.0} IOPS, next to the limited volume \
         {free_with:.0} (with / alone {:.2}), next to {paced_iops:.0} IOPS paced by fio \
         {free_with_paced:.0} ({:.2}); QD16 neighbour: alone {alone_qd16:.0}, next to the limited volume \
         {free_with_qd16:.0} ({:.2}); limited {limited_iops:.0} / {limited_qd16:.0}; raise: \
         before {before:.0}, after {after:.0}; bandwidth {kib_s:.0} KiB/s (unlimited {kib_s_free:.0})",
        free_with / alone,
        free_with_paced / alone,
        free_with_qd16 / alone_qd16
    );
    let mut failed = Vec::new();
    for (what, measured, limit, capacity) in checks {
        let verdict = judge(measured, limit, capacity);
        eprintln!(
            "QOS {verdict} {what}: {:.3} of the limit (want {LOW}..{HIGH}; unlimited {:.2})",
            measured / limit,
            capacity / limit
        );
        if verdict == Verdict::Fail {
            failed.push(what);
        }
    }
    assert!(failed.is_empty(), "QoS checks failed: {failed:?}");
    running.stop().await.unwrap();
}
