//! Control-plane benchmark over mTLS with durable commits: prints a table.
//!
//! `cargo bench -p edgevol-appliance --bench control_plane` (add `-- --quick` for a smoke run).
//! The baseline is Probe, an RPC that touches no metadata, over the same mTLS channel in the
//! same run: the ratios say what a durable metadata commit costs on top of a round trip.

use std::time::{Duration, Instant};

#[path = "../tests/common/mod.rs"]
mod common;

use common::{block_volume, channel};
use edgevol_appliance::{start, Args, Config};
use edgevol_pki::tls::{client_config, TlsFiles};
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::*;

struct Stats {
    name: String,
    n: usize,
    total: Duration,
    p50: Duration,
    p99: Duration,
}

fn stats(name: &str, mut samples: Vec<Duration>, total: Duration) -> Stats {
    samples.sort();
    // Nearest-rank percentile, in integers: index = ceil(q% * n) - 1.
    let pick = |percent: usize| samples[(samples.len() * percent).div_ceil(100).max(1) - 1];
    Stats {
        name: name.into(),
        n: samples.len(),
        total,
        p50: pick(50),
        p99: pick(99),
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Times `n` sequential calls; returns the samples and the total.
async fn timed<F, Fut>(n: usize, mut call: F) -> (Vec<Duration>, Duration)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut samples = Vec::with_capacity(n);
    let all = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        call(i).await;
        samples.push(t.elapsed());
    }
    (samples, all.elapsed())
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (n, listed) = if quick { (50, 500) } else { (1000, 10_000) };
    let dir = tempfile::tempdir().unwrap();
    let config = Config::from_args(Args {
        dev: true,
        data_dir: Some(dir.path().to_path_buf()),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        nvme_listen: Some("127.0.0.1:0".parse().unwrap()),
        appliance_id: Some("bench".into()),
        ..Args::default()
    })
    .unwrap();
    let app = start(config).await.unwrap();
    while !app.state.is_ready() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pki = dir.path().join("pki");
    let tls = client_config(TlsFiles {
        ca: &pki.join("ca.pem"),
        cert: &pki.join("admin.pem"),
        key: &pki.join("admin.key"),
    })
    .unwrap();
    let addr = app.local_addr;
    let channel = channel(addr, tls).await;
    let mut identity = IdentityClient::new(channel.clone());
    let mut c = ControllerClient::new(channel.clone());
    let rss_empty = rss_kib();

    let mut rows = Vec::new();
    let (s, t) = timed(n, |_| {
        let mut identity = identity.clone();
        async move {
            identity.probe(ProbeRequest {}).await.unwrap();
        }
    })
    .await;
    rows.push(stats("Probe (baseline: mTLS round trip)", s, t));
    identity.probe(ProbeRequest {}).await.unwrap();

    let mut ids = Vec::new();
    let (s, t) = timed(n, |i| {
        let mut c = c.clone();
        let name = format!("seq-{i}");
        async move {
            c.create_volume(block_volume(name)).await.unwrap();
        }
    })
    .await;
    rows.push(stats("CreateVolume, sequential", s, t));
    let rss_volumes = rss_kib();
    for e in c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
    {
        ids.push(e.volume.unwrap().volume_id);
    }

    // The daemon always runs its NVMe/TCP target.
    {
        let (s, t) = timed(n, |i| {
            let mut c = c.clone();
            let id = ids[i].clone();
            async move {
                c.controller_publish_volume(ControllerPublishVolumeRequest {
                    volume_id: id,
                    node_id: "nqn.2014-08.org.nvmexpress:uuid:bench".into(),
                    volume_capability: block_volume(String::new()).volume_capabilities.pop(),
                    ..Default::default()
                })
                .await
                .unwrap();
            }
        })
        .await;
        rows.push(stats("ControllerPublishVolume", s, t));
        let (s, t) = timed(n, |i| {
            let mut c = c.clone();
            let id = ids[i].clone();
            async move {
                c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                    volume_id: id,
                    node_id: "nqn.2014-08.org.nvmexpress:uuid:bench".into(),
                    ..Default::default()
                })
                .await
                .unwrap();
            }
        })
        .await;
        rows.push(stats("ControllerUnpublishVolume", s, t));
    }

    let (s, t) = timed(n, |i| {
        let mut c = c.clone();
        let id = ids[i].clone();
        async move {
            c.delete_volume(DeleteVolumeRequest {
                volume_id: id,
                ..Default::default()
            })
            .await
            .unwrap();
        }
    })
    .await;
    rows.push(stats("DeleteVolume, sequential", s, t));

    // 16 calls in flight: what a CO's worker pool sees.
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let per = n / 16;
    for w in 0..16 {
        let mut c = c.clone();
        tasks.spawn(async move {
            let mut samples = Vec::new();
            for i in 0..per {
                let t = Instant::now();
                c.create_volume(block_volume(format!("par-{w}-{i}")))
                    .await
                    .unwrap();
                samples.push(t.elapsed());
            }
            samples
        });
    }
    let mut samples = Vec::new();
    while let Some(s) = tasks.join_next().await {
        samples.extend(s.unwrap());
    }
    rows.push(stats(
        "CreateVolume, 16 in flight",
        samples,
        started.elapsed(),
    ));

    // ListVolumes over `listed` volumes, in pages of 1,000.
    let have = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .len();
    for i in have..listed {
        c.create_volume(block_volume(format!("list-{i}")))
            .await
            .unwrap();
    }
    let (s, t) = timed(if quick { 3 } else { 10 }, |_| {
        let mut c = c.clone();
        async move {
            let mut token = String::new();
            loop {
                let page = c
                    .list_volumes(ListVolumesRequest {
                        max_entries: 1000,
                        starting_token: token,
                    })
                    .await
                    .unwrap()
                    .into_inner();
                if page.next_token.is_empty() {
                    break;
                }
                token = page.next_token;
            }
        }
    })
    .await;
    rows.push(stats(
        &format!("ListVolumes, all {listed} (pages of 1,000)"),
        s,
        t,
    ));

    let base = rows[0].p50.as_secs_f64();
    println!(
        "\ncontrol plane over mTLS, durable commits (pool file in {})",
        dir.path().display()
    );
    println!(
        "| {:<42} | {:>6} | {:>10} | {:>10} | {:>10} | {:>9} |",
        "operation", "calls", "ops/s", "p50", "p99", "p50/Probe"
    );
    println!(
        "|{:-<44}|{:->8}|{:->12}|{:->12}|{:->12}|{:->11}|",
        "", "", "", "", "", ""
    );
    for r in &rows {
        println!(
            "| {:<42} | {:>6} | {:>10.0} | {:>8.0}µs | {:>8.0}µs | {:>8.1}x |",
            r.name,
            r.n,
            r.n as f64 / r.total.as_secs_f64(),
            r.p50.as_secs_f64() * 1e6,
            r.p99.as_secs_f64() * 1e6,
            r.p50.as_secs_f64() / base
        );
    }
    println!(
        "\nRSS (daemon and client in one process): {} KiB empty, {} KiB with {n} volumes (+{} KiB, {:.2} KiB/volume)",
        rss_empty,
        rss_volumes,
        rss_volumes.saturating_sub(rss_empty),
        rss_volumes.saturating_sub(rss_empty) as f64 / n as f64
    );
    app.stop().await.unwrap();
}
