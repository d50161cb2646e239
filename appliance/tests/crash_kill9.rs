//! A daemon crash loses no acknowledged write: edgevold (the real binary, dev pool file) is
//! killed with SIGKILL three times while a host has written to a published volume without Flush
//! or FUA, and restarted on the same data dir; every acknowledged write — first writes that
//! allocate clusters, copy-on-write after a snapshot, overwrites, Write Zeroes — reads back.
#![allow(clippy::cast_possible_truncation)] // test sizes and seeds are small constants

mod common;
mod nvme_host;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use edgevol_nvmeof::pdu::Digests;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
use edgevol_proto::csi::v1::{
    CapacityRange, ControllerPublishVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest,
    ProbeRequest, VolumeCapability,
};
use nvme_host::{io, ok, Admin, Queue};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const BLOCK: usize = 4096;
/// Blocks per 64 KiB cluster of a dev pool: writing block `CLUSTER_BLOCKS * k` allocates.
const CLUSTER_BLOCKS: u64 = 16;
const VOLUME_BLOCKS: u64 = 4096; // 16 MiB

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Daemon {
    child: Child,
    csi: SocketAddr,
}

impl Daemon {
    fn start(dir: &Path, csi: SocketAddr, nvme: SocketAddr) -> Daemon {
        let child = Command::new(env!("CARGO_BIN_EXE_edgevold"))
            .args([
                "--dev",
                "--appliance-id",
                "test-box",
                "--metrics-listen",
                "off",
                // The loopback host holds no DH-HMAC-CHAP keys.
                "--nvme-allow-unauthenticated-hosts",
                "true",
            ])
            .arg("--data-dir")
            .arg(dir)
            .arg("--listen")
            .arg(csi.to_string())
            .arg("--nvme-listen")
            .arg(nvme.to_string())
            // A periodic sync would make the writes durable before the kill and hide the bug
            // under test: one minute is far longer than each round.
            .args(["--sync-interval-ms", "60000"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Daemon { child, csi }
    }

    /// SIGKILL: no shutdown flush, no chance to finish anything.
    fn kill9(self) {
        drop(self);
    }

    async fn wait_ready(&mut self, pki: &Path) {
        let deadline = Instant::now() + common::scaled(Duration::from_secs(60));
        loop {
            assert!(Instant::now() < deadline, "daemon never became ready");
            assert!(self.child.try_wait().unwrap().is_none(), "daemon exited");
            // The first start writes the dev PKI: usable once every file is complete.
            let tls = edgevol_pki::tls::client_config(edgevol_pki::tls::TlsFiles {
                ca: &pki.join("ca.pem"),
                cert: &pki.join("controller.pem"),
                key: &pki.join("controller.key"),
            });
            let Ok(tls) = tls else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            if let Ok(ch) = common::try_channel(self.csi, tls).await {
                let ready = IdentityClient::new(ch).probe(ProbeRequest {}).await;
                if matches!(ready.map(|r| r.into_inner().ready), Ok(Some(true))) {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pattern(round: u8, block: u64) -> Vec<u8> {
    (0..BLOCK)
        .map(|i| (block as u8) ^ round.wrapping_mul(31) ^ (i as u8).wrapping_mul(7) | 1)
        .collect()
}

async fn connect(nvme: SocketAddr, nqn: &str) -> (Admin, Queue) {
    let deadline = Instant::now() + common::scaled(Duration::from_secs(30));
    loop {
        match Admin::connect(nvme, nqn, HOST, 0).await {
            Ok(admin) => {
                let q = admin
                    .io_queue(nvme, 1, nqn, HOST, Digests::NONE)
                    .await
                    .unwrap();
                return (admin, q);
            }
            // Controller Busy while the pool opens: retry, as Linux does.
            Err(c) => assert!(
                Instant::now() < deadline,
                "connect kept failing: {:?}",
                c.cqe.status()
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_three_times_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let pki = data.join("pki");
    let csi: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let nvme: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut daemon = Daemon::start(&data, csi, nvme);
    daemon.wait_ready(&pki).await;

    let tls = common::tls_for(
        &pki,
        &pki.join("controller.pem"),
        &pki.join("controller.key"),
    );
    let mut ctl = ControllerClient::new(common::channel(csi, tls).await);
    let cap = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    };
    let volume = ctl
        .create_volume(CreateVolumeRequest {
            name: "crash".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: (VOLUME_BLOCKS * BLOCK as u64) as i64,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let context = ctl
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: HOST.into(),
            volume_capability: Some(cap),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let nqn = context["subsystemNqn"].clone();

    // What the volume must hold: block -> bytes (absent: never written or zeroed).
    let mut expect: std::collections::BTreeMap<u64, Vec<u8>> = Default::default();
    for round in 0..3u8 {
        let (_admin, mut q) = connect(nvme, &nqn).await;
        // Check everything acknowledged before the last kill, then write more.
        for (&block, bytes) in &expect {
            let (sqe, d) = io::read(block, 1);
            let c = q.cmd(sqe, d).await;
            ok(&c);
            assert!(
                c.data == *bytes,
                "round {round}: block {block} lost after kill -9"
            );
        }
        // First writes of fresh clusters (allocating), spread over the volume.
        let base = u64::from(round) * 64;
        for k in 0..64 {
            let block = (base + k) * CLUSTER_BLOCKS % VOLUME_BLOCKS + u64::from(round);
            let bytes = pattern(round, block);
            let (sqe, d) = io::write(block, &bytes, false);
            ok(&q.cmd(sqe, d).await);
            expect.insert(block, bytes);
        }
        // Overwrites of blocks written in earlier rounds (in place, or copy-on-write after
        // the snapshot of round 1).
        let earlier: Vec<u64> = expect.keys().copied().step_by(7).collect();
        for block in earlier {
            let bytes = pattern(round.wrapping_add(100), block);
            let (sqe, d) = io::write(block, &bytes, false);
            ok(&q.cmd(sqe, d).await);
            expect.insert(block, bytes);
        }
        // Write Zeroes of one whole cluster that holds data: it must stay zero.
        let zeroed = *expect.keys().next().unwrap() / CLUSTER_BLOCKS * CLUSTER_BLOCKS;
        let (sqe, d) = io::write_zeroes(zeroed, CLUSTER_BLOCKS as u32);
        ok(&q.cmd(sqe, d).await);
        expect.retain(|&b, _| b / CLUSTER_BLOCKS * CLUSTER_BLOCKS != zeroed);
        for b in zeroed..zeroed + CLUSTER_BLOCKS {
            expect.insert(b, vec![0; BLOCK]);
        }
        if round == 1 {
            // Later overwrites of these clusters are copy-on-write.
            ctl.create_snapshot(CreateSnapshotRequest {
                source_volume_id: volume.volume_id.clone(),
                name: "before-round-2".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        }
        // No Flush, no FUA: kill -9 now.
        daemon.kill9();
        daemon = Daemon::start(&data, csi, nvme);
        daemon.wait_ready(&pki).await;
        ctl = ControllerClient::new(
            common::channel(
                csi,
                common::tls_for(
                    &pki,
                    &pki.join("controller.pem"),
                    &pki.join("controller.key"),
                ),
            )
            .await,
        );
    }
    let (_admin, mut q) = connect(nvme, &nqn).await;
    for (&block, bytes) in &expect {
        let (sqe, d) = io::read(block, 1);
        let c = q.cmd(sqe, d).await;
        ok(&c);
        assert!(c.data == *bytes, "final: block {block} lost after kill -9");
    }
    daemon.kill9();
}
