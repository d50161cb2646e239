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
    /// CPU time of the whole process (client and daemon) during the row.
    cpu: Duration,
}

fn stats(name: &str, (mut samples, total, cpu): Run) -> Stats {
    samples.sort();
    // Nearest-rank percentile, in integers: index = ceil(q% * n) - 1.
    let pick = |percent: usize| samples[(samples.len() * percent).div_ceil(100).max(1) - 1];
    Stats {
        name: name.into(),
        n: samples.len(),
        total,
        p50: pick(50),
        p99: pick(99),
        cpu,
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

/// CPU time of this process so far: the sum of its threads' on-CPU time (ns precision, unlike
/// getrusage's ticks on some kernels); threads that ended are not counted, and the bench's and
/// the daemon's threads live until the end.
fn cpu_time() -> Duration {
    let mut ns = 0u64;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(task.path().join("schedstat")) {
                ns += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Duration::from_nanos(ns)
}

/// Every call's latency, the wall time of the row, and the process's CPU time during it.
type Run = (Vec<Duration>, Duration, Duration);

/// Runs `n` calls with `depth` of them in flight (each of `depth` workers takes the next index
/// until none is left); returns every call's latency, the total and the CPU time spent.
async fn in_flight<F, Fut>(n: usize, depth: usize, call: F) -> Run
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let call = Arc::new(call);
    let next = Arc::new(AtomicUsize::new(0));
    let cpu = cpu_time();
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
    (samples, all.elapsed(), cpu_time().saturating_sub(cpu))
}

const NODE: &str = "nqn.2014-08.org.nvmexpress:uuid:bench";
const DEPTHS: [usize; 3] = [1, 16, 100];

/// One mutation at every depth: rows in order of [`DEPTHS`].
#[derive(Default)]
struct Scaling {
    rows: Vec<(usize, Stats)>,
}

/// The rows of one mutation; `probe_p99` is Probe's p99 at the same depth where the run measured
/// it (1 and 100 in flight): the last column is the row's p99 over it.
fn print_scaling(name: &str, s: &Scaling, probe_p99: impl Fn(usize) -> Option<Duration>) {
    let base = s.rows[0].1.n as f64 / s.rows[0].1.total.as_secs_f64();
    for (depth, r) in &s.rows {
        let ops = r.n as f64 / r.total.as_secs_f64();
        let vs_probe = probe_p99(*depth).map_or("-".to_owned(), |p| {
            format!("{:.2}x", r.p99.as_secs_f64() / p.as_secs_f64())
        });
        println!(
            "| {:<26} | {:>9} | {:>6} | {:>10.0} | {:>8.0}µs | {:>8.0}µs | {:>9.2}x | {:>13} |",
            name,
            depth,
            r.n,
            ops,
            r.p50.as_secs_f64() * 1e6,
            r.p99.as_secs_f64() * 1e6,
            ops / base,
            vs_probe
        );
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--deep ROUNDS`: only the 100-in-flight rows, ROUNDS times (for profiles, and for p99 over
    // more than one run of 1,000 calls); the default rows are not run then.
    let deep: Option<usize> = args.iter().position(|a| a == "--deep").map(|i| {
        args.get(i + 1)
            .and_then(|r| r.parse().ok())
            .expect("--deep ROUNDS")
    });
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
    if let Err(e) = app.state.wait_ready(Duration::from_secs(60)).await {
        panic!("{e}");
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
    let run = in_flight(n, 1, move |_| {
        let mut identity = probe_client.clone();
        async move {
            identity.probe(ProbeRequest {}).await.unwrap();
        }
    })
    .await;
    let probe = stats("Probe (baseline: mTLS round trip)", run);
    // The ceiling of 100 in flight on this machine: a call that does no work at all.
    let probe_deep_client = identity.clone();
    let run = in_flight(n, 100, move |_| {
        let mut identity = probe_deep_client.clone();
        async move {
            identity.probe(ProbeRequest {}).await.unwrap();
        }
    })
    .await;
    let probe_deep = stats("Probe, 100 in flight (no work: the ceiling)", run);

    if let Some(rounds) = deep {
        deep_rounds(&c, &identity, n, rounds).await;
        app.stop().await.unwrap();
        return;
    }

    // Per depth: create n volumes, publish them to one node, unpublish, delete them (the daemon
    // always runs its NVMe/TCP target).
    let (mut create, mut publish, mut unpublish, mut delete) = (
        Scaling::default(),
        Scaling::default(),
        Scaling::default(),
        Scaling::default(),
    );
    let mut rss_volumes = 0;
    for depth in DEPTHS {
        let rows = cycle(&c, n, depth, &format!("d{depth}"), || {
            if depth == 1 {
                rss_volumes = rss_kib();
            }
        })
        .await;
        let [cr, pu, un, de] = rows;
        create.rows.push((depth, cr));
        publish.rows.push((depth, pu));
        unpublish.rows.push((depth, un));
        delete.rows.push((depth, de));
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
    let run = in_flight(if quick { 3 } else { 10 }, 1, move |_| {
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
    let list = stats(&format!("ListVolumes, all {listed} (pages of 1,000)"), run);
    let pages = std::mem::take(&mut *pages.lock().unwrap());
    let total = pages.iter().sum();
    let page = stats(
        "ListVolumes, per page (at most 1,000)",
        (pages, total, Duration::ZERO),
    );

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
    println!(
        "\nmutations by calls in flight (ops/s vs. the same call sequential; p99 vs. Probe's at \
         the same depth, this run)"
    );
    println!(
        "| {:<26} | {:>9} | {:>6} | {:>10} | {:>10} | {:>10} | {:>10} | {:>13} |",
        "operation", "in flight", "calls", "ops/s", "p50", "p99", "vs 1", "p99/Probe p99"
    );
    println!(
        "|{:-<28}|{:->11}|{:->8}|{:->12}|{:->12}|{:->12}|{:->12}|{:->15}|",
        "", "", "", "", "", "", "", ""
    );
    // Probe at the same depth: sequential, and the ceiling at 100 in flight (none at 16).
    let probe_p99 = |depth: usize| match depth {
        1 => Some(probe.p99),
        100 => Some(probe_deep.p99),
        _ => None,
    };
    print_scaling("CreateVolume", &create, probe_p99);
    print_scaling("ControllerPublishVolume", &publish, probe_p99);
    print_scaling("ControllerUnpublishVolume", &unpublish, probe_p99);
    print_scaling("DeleteVolume", &delete, probe_p99);
    println!(
        "\nRSS (daemon and client in one process): {} KiB empty, {} KiB with {n} volumes (+{} KiB, {:.2} KiB/volume)",
        rss_empty,
        rss_volumes,
        rss_volumes.saturating_sub(rss_empty),
        rss_volumes.saturating_sub(rss_empty) as f64 / n as f64
    );
    app.stop().await.unwrap();
}

/// Creates `n` volumes named `{prefix}-{i}` with `depth` calls in flight, then (after
/// `created`) publishes them to one node, unpublishes and deletes them: the four rows.
async fn cycle(
    c: &ControllerClient<tonic::transport::Channel>,
    n: usize,
    depth: usize,
    prefix: &str,
    created: impl FnOnce(),
) -> [Stats; 4] {
    let (cc, prefix) = (c.clone(), Arc::new(prefix.to_owned()));
    let run = in_flight(n, depth, move |i| {
        let (mut c, name) = (cc.clone(), format!("{prefix}-{i}"));
        async move {
            c.create_volume(block_volume(name)).await.unwrap();
        }
    })
    .await;
    let create = stats("CreateVolume", run);
    created();
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
    let run = in_flight(n, depth, move |i| {
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
    let publish = stats("ControllerPublishVolume", run);
    let (cc, v) = (c.clone(), ids.clone());
    let run = in_flight(n, depth, move |i| {
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
    let unpublish = stats("ControllerUnpublishVolume", run);
    let (cc, v) = (c.clone(), ids.clone());
    let run = in_flight(n, depth, move |i| {
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
    let delete = stats("DeleteVolume", run);
    [create, publish, unpublish, delete]
}

/// `--deep`: per round, Probe then the four mutations, each `n` calls with 100 in flight; every
/// round's figures, then the median of the rounds per row. The last column is the row's p99 over
/// the p99 of that round's Probe (the floor of TLS, HTTP/2 and tonic at 100 in flight): what a
/// durable commit adds to the tail, comparable across machines and loads.
async fn deep_rounds(
    c: &ControllerClient<tonic::transport::Channel>,
    identity: &IdentityClient<tonic::transport::Channel>,
    n: usize,
    rounds: usize,
) {
    let mut all: Vec<Vec<Stats>> = Vec::new();
    let header = || {
        println!(
            "| {:<26} | {:>6} | {:>6} | {:>10} | {:>10} | {:>10} | {:>12} | {:>5} | {:>13} |",
            "operation (100 in flight)",
            "round",
            "calls",
            "ops/s",
            "p50",
            "p99",
            "CPU per call",
            "cores",
            "p99/Probe p99"
        );
        println!(
            "|{:-<28}|{:->8}|{:->8}|{:->12}|{:->12}|{:->12}|{:->14}|{:->7}|{:->15}|",
            "", "", "", "", "", "", "", "", ""
        );
    };
    header();
    for round in 0..rounds {
        let id = identity.clone();
        let run = in_flight(n, 100, move |_| {
            let mut identity = id.clone();
            async move {
                identity.probe(ProbeRequest {}).await.unwrap();
            }
        })
        .await;
        let mut rows = vec![stats("Probe", run)];
        rows.extend(cycle(c, n, 100, &format!("r{round}"), || {}).await);
        let probe_p99 = rows[0].p99.as_secs_f64();
        for r in &rows {
            println!(
                "| {:<26} | {:>6} | {:>6} | {:>10.0} | {:>8.0}µs | {:>8.0}µs | {:>10.1}µs | {:>5.2} | {:>12.2}x |",
                r.name,
                round,
                r.n,
                r.n as f64 / r.total.as_secs_f64(),
                r.p50.as_secs_f64() * 1e6,
                r.p99.as_secs_f64() * 1e6,
                r.cpu.as_secs_f64() * 1e6 / r.n as f64,
                r.cpu.as_secs_f64() / r.total.as_secs_f64(),
                r.p99.as_secs_f64() / probe_p99
            );
        }
        all.push(rows);
    }
    println!("\nmedians of {rounds} rounds (p99/Probe p99: the median of the rounds' ratios):");
    header();
    for row in 0..all[0].len() {
        let median = |f: &dyn Fn(&[Stats]) -> f64| {
            let mut v: Vec<f64> = all.iter().map(|r| f(r)).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "| {:<26} | {:>6} | {:>6} | {:>10.0} | {:>8.0}µs | {:>8.0}µs | {:>10.1}µs | {:>5.2} | {:>12.2}x |",
            all[0][row].name,
            "median",
            all[0][row].n,
            median(&|r| r[row].n as f64 / r[row].total.as_secs_f64()),
            median(&|r| r[row].p50.as_secs_f64() * 1e6),
            median(&|r| r[row].p99.as_secs_f64() * 1e6),
            median(&|r| r[row].cpu.as_secs_f64() * 1e6 / r[row].n as f64),
            median(&|r| r[row].cpu.as_secs_f64() / r[row].total.as_secs_f64()),
            median(&|r| r[row].p99.as_secs_f64() / r[0].p99.as_secs_f64())
        );
    }
}
