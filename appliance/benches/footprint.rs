//! Memory footprint of the daemon process alone: spawns `edgevold --dev` and reads its VmRSS
//! from /proc while volumes are created over mTLS (16 in flight). Prints a markdown table.
//!
//! `cargo bench -p edgevol-appliance --bench footprint` (add `-- --quick` for a smoke run:
//! 0 and 200 volumes). The baseline is the same process with 0 volumes.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use edgevol_pki::tls::{client_config, TlsFiles};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::*;
use tonic::transport::Channel;

/// Kills the daemon when the bench ends, however it ends.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[path = "../tests/common/mod.rs"]
mod common;

use common::{block_volume, try_channel};

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let steps: &[usize] = if quick {
        &[0, 200]
    } else {
        &[0, 1_000, 10_000]
    };
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let daemon = Daemon(
        Command::new(env!("CARGO_BIN_EXE_edgevold"))
            .args(["--dev", "--data-dir"])
            .arg(dir.path())
            .args(["--listen", &addr.to_string()])
            .args(["--nvme-listen", "127.0.0.1:0", "--metrics-listen", "off"])
            .args(["--appliance-id", "footprint"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn edgevold"),
    );
    let pid = daemon.0.id();
    let pki = dir.path().join("pki");
    // The daemon writes the dev PKI at start: wait for the admin key and the port.
    let channel: Channel = loop {
        if pki.join("admin.key").exists() {
            let tls = client_config(TlsFiles {
                ca: &pki.join("ca.pem"),
                cert: &pki.join("admin.pem"),
                key: &pki.join("admin.key"),
            });
            if let Ok(tls) = tls {
                let connected = try_channel(addr, tls).await;
                if let Ok(c) = connected {
                    break c;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut identity = IdentityClient::new(channel.clone());
    while identity
        .probe(ProbeRequest {})
        .await
        .ok()
        .and_then(|r| r.into_inner().ready)
        != Some(true)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = ControllerClient::new(channel);
    println!("| volumes | daemon VmRSS | daemon VmHWM | vs 0 volumes | per volume |");
    println!("|---:|---:|---:|---:|---:|");
    let mut created = 0usize;
    let mut base = 0u64;
    for &target in steps {
        while created < target {
            let batch = (target - created).min(16);
            let calls: Vec<_> = (created..created + batch)
                .map(|i| {
                    let mut c = c.clone();
                    tokio::spawn(
                        async move { c.create_volume(block_volume(format!("fp-{i}"))).await },
                    )
                })
                .collect();
            for call in calls {
                call.await.unwrap().expect("CreateVolume");
            }
            created += batch;
        }
        let rss = status_kib(pid, "VmRSS:");
        let hwm = status_kib(pid, "VmHWM:");
        if target == 0 {
            base = rss;
        }
        let per = if target == 0 {
            "-".to_owned()
        } else {
            format!(
                "{:.2} KiB",
                (rss.saturating_sub(base)) as f64 / target as f64
            )
        };
        println!(
            "| {target} | {rss} KiB | {hwm} KiB | {:.2}x | {per} |",
            rss as f64 / base.max(1) as f64
        );
    }
    drop(daemon);
}
