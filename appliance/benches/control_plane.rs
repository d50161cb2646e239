//! Control-plane benchmark over mTLS with durable commits: prints a table.
//!
//! `cargo bench -p edgevol-appliance --bench control_plane` (add `-- --quick` for a smoke run).
//! Baselines in the same run: Probe, an RPC that touches no metadata, over the same mTLS channel
//! (what a durable metadata commit costs on top of a round trip); and for each mutation its own
//! sequential figure (1 in flight), against which 16 and 100 in flight are compared (what group
//! commit buys: concurrent calls share journal writes and flushes). Then ListVolumes over 10,000
//! volumes, every page.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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

/// Runs `n` calls with `depth` of them in flight (each of `depth` workers takes the next index
/// until none is left); returns every call's latency and the total.
async fn in_flight<F, Fut>(n: usize, depth: usize, call: F) -> (Vec<Duration>, Duration)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let call = Arc::new(call);
    let next = Arc::new(AtomicUsize::new(0));
    let all = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..depth.min(n) {
        let (call, next) = (call.clone(), next.clone());
        workers.spawn(async move {
            let mut samples = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return samples;
                }
                let t = Instant::now();
                call(i).await;
                samples.push(t.elapsed());
            }
        });
    }
    let mut samples = Vec::with_capacity(n);
    while let Some(s) = workers.join_next().await {
        samples.extend(s.unwrap());
    }
    (samples, all.elapsed())
}

const NODE: &str = "nqn.2014-08.org.nvmexpress:uuid:bench";
const DEPTHS: [usize; 3] = [1, 16, 100];

/// One mutation at every depth: rows in order of [`DEPTHS`].
#[derive(Default)]
struct Scaling {
    rows: Vec<(usize, Stats)>,
}

fn print_scaling(name: &str, s: &Scaling) {
    let base = s.rows[0].1.n as f64 / s.rows[0].1.total.as_secs_f64();
    for (depth, r) in &s.rows {
        let ops = r.n as f64 / r.total.as_secs_f64();
        println!(
            "| {:<26} | {:>9} | {:>6} | {:>10.0} | {:>8.0}µs | {:>8.0}µs | {:>9.2}x |",
            name,
            depth,
            r.n,
            ops,
            r.p50.as_secs_f64() * 1e6,
            r.p99.as_secs_f64() * 1e6,
            ops / base
        );
    }
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
    let identity = IdentityClient::new(channel.clone());
    let c = ControllerClient::new(channel.clone());
    let rss_empty = rss_kib();

    let probe_client = identity.clone();
    let (s, t) = in_flight(n, 1, move |_| {
        let mut identity = probe_client.clone();
        async move {
            identity.probe(ProbeRequest {}).await.unwrap();
        }
    })
    .await;
    let probe = stats("Probe (baseline: mTLS round trip)", s, t);
    // The ceiling of 100 in flight on this machine: a call that does no work at all.
    let (s, t) = in_flight(n, 100, move |_| {
        let mut identity = identity.clone();
        async move {
            identity.probe(ProbeRequest {}).await.unwrap();
        }
    })
    .await;
    let probe_deep = stats("Probe, 100 in flight (no work: the ceiling)", s, t);

    // Per depth: create n volumes, publish them to one node, unpublish, delete them (the daemon
    // always runs its NVMe/TCP target).
    let (mut create, mut publish, mut unpublish, mut delete) = Default::default();
    let mut rss_volumes = 0;
    for depth in DEPTHS {
        let cc = c.clone();
        let (s, t) = in_flight(n, depth, move |i| {
            let mut c = cc.clone();
            async move {
                c.create_volume(block_volume(format!("d{depth}-{i}")))
                    .await
                    .unwrap();
            }
        })
        .await;
        push(&mut create, depth, "CreateVolume", s, t);
        if depth == 1 {
            rss_volumes = rss_kib();
        }
        let ids: Arc<Vec<String>> = Arc::new(
            c.clone()
                .list_volumes(ListVolumesRequest::default())
                .await
                .unwrap()
                .into_inner()
                .entries
                .into_iter()
                .map(|e| e.volume.unwrap().volume_id)
                .collect(),
        );
        assert_eq!(ids.len(), n);
        let (cc, v) = (c.clone(), ids.clone());
        let (s, t) = in_flight(n, depth, move |i| {
            let (mut c, id) = (cc.clone(), v[i].clone());
            async move {
                c.controller_publish_volume(ControllerPublishVolumeRequest {
                    volume_id: id,
                    node_id: NODE.into(),
                    volume_capability: block_volume(String::new()).volume_capabilities.pop(),
                    ..Default::default()
                })
                .await
                .unwrap();
            }
        })
        .await;
        push(&mut publish, depth, "ControllerPublishVolume", s, t);
        let (cc, v) = (c.clone(), ids.clone());
        let (s, t) = in_flight(n, depth, move |i| {
            let (mut c, id) = (cc.clone(), v[i].clone());
            async move {
                c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                    volume_id: id,
                    node_id: NODE.into(),
                    ..Default::default()
                })
                .await
                .unwrap();
            }
        })
        .await;
        push(&mut unpublish, depth, "ControllerUnpublishVolume", s, t);
        let (cc, v) = (c.clone(), ids.clone());
        let (s, t) = in_flight(n, depth, move |i| {
            let (mut c, id) = (cc.clone(), v[i].clone());
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
        push(&mut delete, depth, "DeleteVolume", s, t);
    }

    // ListVolumes over `listed` volumes, every page of 1,000 (created 100 in flight).
    let cc = c.clone();
    in_flight(listed, 100, move |i| {
        let mut c = cc.clone();
        async move {
            c.create_volume(block_volume(format!("list-{i}")))
                .await
                .unwrap();
        }
    })
    .await;
    let (cc, pages) = (c.clone(), Arc::new(std::sync::Mutex::new(Vec::new())));
    let page_times = pages.clone();
    let (s, t) = in_flight(if quick { 3 } else { 10 }, 1, move |_| {
        let (mut c, pages) = (cc.clone(), page_times.clone());
        async move {
            let (mut token, mut seen) = (String::new(), 0);
            loop {
                let started = Instant::now();
                let page = c
                    .list_volumes(ListVolumesRequest {
                        max_entries: 1000,
                        starting_token: token,
                    })
                    .await
                    .unwrap()
                    .into_inner();
                pages.lock().unwrap().push(started.elapsed());
                seen += page.entries.len();
                if page.next_token.is_empty() {
                    break;
                }
                token = page.next_token;
            }
            assert_eq!(seen, listed);
        }
    })
    .await;
    let list = stats(&format!("ListVolumes, all {listed} (pages of 1,000)"), s, t);
    let pages = std::mem::take(&mut *pages.lock().unwrap());
    let total = pages.iter().sum();
    let page = stats("ListVolumes, per page (at most 1,000)", pages, total);

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
    let base = probe.p50.as_secs_f64();
    for r in [&probe, &probe_deep, &list, &page] {
        println!(
            "| {:<42} | {:>6} | {:>10.1} | {:>8.0}µs | {:>8.0}µs | {:>8.1}x |",
            r.name,
            r.n,
            r.n as f64 / r.total.as_secs_f64(),
            r.p50.as_secs_f64() * 1e6,
            r.p99.as_secs_f64() * 1e6,
            r.p50.as_secs_f64() / base
        );
    }
    println!("\nmutations by calls in flight (ops/s vs. the same call sequential, this run)");
    println!(
        "| {:<26} | {:>9} | {:>6} | {:>10} | {:>10} | {:>10} | {:>10} |",
        "operation", "in flight", "calls", "ops/s", "p50", "p99", "vs 1"
    );
    println!(
        "|{:-<28}|{:->11}|{:->8}|{:->12}|{:->12}|{:->12}|{:->12}|",
        "", "", "", "", "", "", ""
    );
    print_scaling("CreateVolume", &create);
    print_scaling("ControllerPublishVolume", &publish);
    print_scaling("ControllerUnpublishVolume", &unpublish);
    print_scaling("DeleteVolume", &delete);
    println!(
        "\nRSS (daemon and client in one process): {} KiB empty, {} KiB with {n} volumes (+{} KiB, {:.2} KiB/volume)",
        rss_empty,
        rss_volumes,
        rss_volumes.saturating_sub(rss_empty),
        rss_volumes.saturating_sub(rss_empty) as f64 / n as f64
    );
    app.stop().await.unwrap();
}

fn push(s: &mut Scaling, depth: usize, name: &str, samples: Vec<Duration>, total: Duration) {
    s.rows.push((depth, stats(name, samples, total)));
}
