//! The Prometheus exporter: what the appliance counts, and how it is rendered.
//!
//! Sources, gathered at each scrape (nothing is sampled in the background):
//! - per-volume NVMe/TCP I/O counters and latency ([`crate::nvme::stats::IoStats`]) and live
//!   controllers of the target, for connected hosts per volume, and in-band authentication
//!   outcomes (all from [`Subsystems`]);
//! - the pool's capacity and failure state (one short call under the pool lock);
//! - the SMART / Health log of the pool device when it is an NVMe namespace ([`health`]);
//! - CSI calls by method and code with latency ([`csi::CsiMetricsLayer`]);
//! - metadata commit latency: how long each mutating CSI call took from staging under the pool
//!   lock to the end of the group commit covering it (the CSI layer observes the pool handle,
//!   see [`Registry::observe_commit`]);
//! - the firmware life cycle, a trial running or rolled back (the manager the daemon registers
//!   with [`Registry::watch_firmware`], [`firmware`]).
//!
//! The daemon hands the exporter these sources; nothing below (state, target) knows of it.
//! Volumes are labelled with their CSI `volume_id`. Nothing derived from a request body is
//! exported but the checked leg marking of replicated volumes' legs ([`legs`]: digits and
//! volume ids), so CSI secrets never reach a metric.

pub mod csi;
pub mod firmware;
pub mod health;
pub mod histogram;
pub mod http;
pub mod legs;
pub mod text;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use edgevol_core::VolumeId;

use crate::csi::ids::Ids;
use crate::nvme::stats::{OpCounters, LATENCY_BUCKETS_US};
use crate::nvme::subsys::Subsystems;
use crate::state::State;

use self::histogram::{Histogram, HistogramSnapshot};
use self::text::{Exposition, Kind};

pub use self::http::MetricsServer;
pub use self::text::CONTENT_TYPE;

/// What the appliance records as it runs (the rest is read at scrape time).
#[derive(Debug, Default)]
pub struct Registry {
    /// CSI calls.
    pub csi: csi::CsiCalls,
    commits: Mutex<BTreeMap<String, Histogram>>,
    firmware: OnceLock<crate::firmware::Shared>,
}

impl Registry {
    /// Records how long the mutating CSI call `method` held the pool: its metadata change, the
    /// journal append and the flush that makes it durable. (A repeat that changes nothing, such
    /// as an idempotent CreateVolume, is included: it is what the caller waited for.)
    pub fn observe_commit(&self, method: &str, elapsed: Duration) {
        let mut commits = self.commits.lock().unwrap_or_else(|p| p.into_inner());
        match commits.get(method) {
            Some(h) => h.observe(elapsed),
            None => {
                let h = Histogram::default();
                h.observe(elapsed);
                commits.insert(method.to_owned(), h);
            }
        }
    }

    /// The firmware manager whose trial and rollback state scrapes report (an appliance image;
    /// a daemon without one reports no sample). The first registration holds.
    pub fn watch_firmware(&self, firmware: crate::firmware::Shared) {
        let _ = self.firmware.set(firmware);
    }

    fn commit_snapshot(&self) -> Vec<(String, HistogramSnapshot)> {
        let commits = self.commits.lock().unwrap_or_else(|p| p.into_inner());
        commits
            .iter()
            .map(|(m, h)| (m.clone(), h.snapshot()))
            .collect()
    }
}

/// Everything a scrape reads.
#[derive(Debug)]
pub struct Sources {
    /// The appliance state (id, pool).
    pub state: Arc<State>,
    /// The NVMe/TCP target's controllers and per-volume counters.
    pub subsystems: Option<Arc<Subsystems>>,
    /// The pool's devices, as configured.
    pub devices: Vec<PathBuf>,
    /// What the CSI layer records (calls, commit latency).
    pub registry: Arc<Registry>,
}

/// Renders every metric (see the family help texts for their meaning).
pub async fn gather(sources: &Sources) -> String {
    let state = &sources.state;
    let mut e = Exposition::new();

    e.family(
        "edgevol_build_info",
        Kind::Gauge,
        "Always 1; labels carry the daemon version and the appliance id.",
    );
    e.sample(
        "edgevol_build_info",
        &[
            ("version", env!("CARGO_PKG_VERSION")),
            ("appliance", &state.appliance_id),
        ],
        1,
    );

    pool_metrics(&mut e, state).await;
    let devices = sources.devices.clone();
    let health = tokio::task::spawn_blocking(move || {
        devices.iter().map(|d| health::probe(d)).collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    health_metrics(&mut e, &health);
    let view = match sources.registry.firmware.get().cloned() {
        Some(fw) => tokio::task::spawn_blocking(move || firmware::FirmwareView::read(&fw))
            .await
            .ok(),
        None => None,
    };
    firmware::render(&mut e, view);
    io_metrics(&mut e, sources);
    csi_metrics(&mut e, &sources.registry);
    e.finish()
}

async fn pool_metrics(e: &mut Exposition, state: &Arc<State>) {
    let pool = if state.is_ready() {
        state
            .on_pool(|_, pool| {
                let limited: Vec<(VolumeId, Vec<(String, String)>)> = pool
                    .volumes(None)
                    .filter(|v| !v.mutable_parameters().is_empty())
                    .map(|v| (v.id(), v.mutable_parameters().to_vec()))
                    .collect();
                let legs = legs::marked(pool);
                (pool.capacity(), pool.failure().is_none(), limited, legs)
            })
            .await
            .ok()
    } else {
        None
    };
    e.family(
        "edgevol_pool_ready",
        Kind::Gauge,
        "1 once the pool is open and recovered (what CSI Probe reports).",
    );
    e.sample("edgevol_pool_ready", &[], u8::from(pool.is_some()));
    let Some((c, healthy, limited, leg_marks)) = pool else {
        return;
    };
    qos_limit_metrics(e, state, &limited);
    legs::render(e, state, &leg_marks);
    e.family(
        "edgevol_pool_healthy",
        Kind::Gauge,
        "0 after a device failure stopped the pool (volumes are then abnormal), else 1.",
    );
    e.sample("edgevol_pool_healthy", &[], u8::from(healthy));
    for (name, help, value) in [
        ("total", "Bytes of data clusters in the pool.", c.total),
        ("used", "Bytes in referenced clusters.", c.used),
        (
            "free",
            "Bytes neither referenced nor reserved (pending_free included).",
            c.free,
        ),
        (
            "reserved",
            "Bytes reserved for thick volumes' unwritten clusters.",
            c.reserved,
        ),
        (
            "pending_free",
            "Part of free that becomes allocatable at the next flush or commit.",
            c.pending_free,
        ),
    ] {
        let metric = format!("edgevol_pool_{name}_bytes");
        e.family(&metric, Kind::Gauge, help);
        e.sample(&metric, &[], value);
    }
}

/// The QoS limits each volume's mutable parameters set (enforced by the target).
fn qos_limit_metrics(
    e: &mut Exposition,
    state: &State,
    limited: &[(VolumeId, Vec<(String, String)>)],
) {
    let ids = Ids::new(&state.appliance_id);
    e.family(
        "edgevol_volume_qos_limit",
        Kind::Gauge,
        "A QoS limit set on the volume (mutable parameter `limit`): commands or bytes per second.",
    );
    for (v, params) in limited {
        let name = ids.volume(*v);
        for (key, value) in params {
            e.sample(
                "edgevol_volume_qos_limit",
                &[("volume_id", &name), ("limit", key)],
                value,
            );
        }
    }
}

fn health_metrics(e: &mut Exposition, health: &[health::DeviceHealth]) {
    e.family(
        "edgevol_pool_device_info",
        Kind::Gauge,
        "Always 1; kind is nvme (an NVMe namespace), block or file.",
    );
    for h in health {
        let path = h.path.display().to_string();
        e.sample(
            "edgevol_pool_device_info",
            &[("device", &path), ("kind", h.kind)],
            1,
        );
    }
    e.family(
        "edgevol_nvme_smart_available",
        Kind::Gauge,
        "1 if the pool device's NVMe SMART log was read at this scrape; 0 if the device is not an NVMe namespace or the log could not be read.",
    );
    for h in health {
        let path = h.path.display().to_string();
        e.sample(
            "edgevol_nvme_smart_available",
            &[("device", &path)],
            u8::from(h.smart.is_some()),
        );
    }
    let with_smart: Vec<_> = health
        .iter()
        .filter_map(|h| h.smart.as_ref().map(|s| (h.path.display().to_string(), s)))
        .collect();
    if with_smart.is_empty() {
        return;
    }
    type Field = fn(&edgevol_hal::nvme::SmartLog) -> String;
    let fields: [(&str, Kind, &str, Field); 5] = [
        (
            "edgevol_nvme_temperature_celsius",
            Kind::Gauge,
            "Composite temperature of the pool's NVMe drive.",
            |s| s.temperature_celsius().to_string(),
        ),
        (
            "edgevol_nvme_media_errors_total",
            Kind::Counter,
            "Unrecovered data integrity errors over the drive's life.",
            |s| s.media_errors.to_string(),
        ),
        (
            "edgevol_nvme_percentage_used",
            Kind::Gauge,
            "Vendor estimate of the drive's life used, percent (may exceed 100).",
            |s| s.percentage_used.to_string(),
        ),
        (
            "edgevol_nvme_available_spare_percent",
            Kind::Gauge,
            "Remaining spare capacity, percent.",
            |s| s.available_spare.to_string(),
        ),
        (
            "edgevol_nvme_critical_warning",
            Kind::Gauge,
            "Critical warning bits of the SMART log (0 = none).",
            |s| s.critical_warning.to_string(),
        ),
    ];
    for (name, kind, help, field) in fields {
        e.family(name, kind, help);
        for (path, s) in &with_smart {
            e.sample(name, &[("device", path)], field(s));
        }
    }
}

fn io_metrics(e: &mut Exposition, sources: &Sources) {
    let ids = Ids::new(&sources.state.appliance_id);
    let stats = sources
        .subsystems
        .as_ref()
        .map(|s| s.stats.all())
        .unwrap_or_default();
    // Live controllers per volume and host NQN.
    let mut hosts: BTreeMap<VolumeId, BTreeMap<String, u64>> = BTreeMap::new();
    let mut controllers = 0u64;
    if let Some(subs) = &sources.subsystems {
        for c in subs.controllers() {
            controllers += 1;
            if let Some(v) = c.volume() {
                *hosts
                    .entry(v)
                    .or_default()
                    .entry(c.host.clone())
                    .or_default() += 1;
            }
        }
    }
    let names: BTreeMap<VolumeId, String> = stats
        .iter()
        .map(|(v, _)| *v)
        .chain(hosts.keys().copied())
        .map(|v| (v, ids.volume(v)))
        .collect();

    e.family(
        "edgevol_nvme_controllers",
        Kind::Gauge,
        "Live NVMe/TCP controllers (I/O and discovery).",
    );
    e.sample("edgevol_nvme_controllers", &[], controllers);
    if let Some(subs) = &sources.subsystems {
        let c = &subs.auth.counters;
        e.family(
            "edgevol_nvme_auth_total",
            Kind::Counter,
            "In-band authentication (DH-HMAC-CHAP) by outcome: succeeded (queues, re-authentications included), failed (transactions failed or timed out), refused (Connects turned away before any transaction: no keys, or an address after repeated failures).",
        );
        for (outcome, n) in [
            ("succeeded", &c.succeeded),
            ("failed", &c.failed),
            ("refused", &c.refused),
        ] {
            e.sample(
                "edgevol_nvme_auth_total",
                &[("outcome", outcome)],
                n.load(Ordering::Relaxed),
            );
        }
    }
    e.family(
        "edgevol_volume_connected_hosts",
        Kind::Gauge,
        "Distinct host NQNs with a live controller on the volume's subsystem.",
    );
    for (v, name) in &names {
        let n = hosts.get(v).map_or(0, BTreeMap::len);
        e.sample("edgevol_volume_connected_hosts", &[("volume_id", name)], n);
    }
    e.family(
        "edgevol_volume_host_controllers",
        Kind::Gauge,
        "Live NVMe/TCP controllers on the volume's subsystem, by host NQN (hosts with none are not listed).",
    );
    for (v, name) in &names {
        for (host, n) in hosts.get(v).into_iter().flatten() {
            e.sample(
                "edgevol_volume_host_controllers",
                &[("volume_id", name), ("host_nqn", host)],
                n,
            );
        }
    }

    type Pick = fn(&OpCounters) -> u64;
    let families: [(&str, &str, Pick); 3] = [
        (
            "edgevol_volume_io_ops_total",
            "NVMe commands completed successfully, by op (read, write incl. write zeroes, flush, deallocate).",
            |c| c.ops.load(Ordering::Relaxed),
        ),
        (
            "edgevol_volume_io_bytes_total",
            "Bytes moved by successful commands, by op.",
            |c| c.bytes.load(Ordering::Relaxed),
        ),
        (
            "edgevol_volume_io_errors_total",
            "NVMe commands that failed, by op.",
            |c| c.errors.load(Ordering::Relaxed),
        ),
    ];
    for (family, help, pick) in families {
        e.family(family, Kind::Counter, help);
        for (v, c) in &stats {
            let name = &names[v];
            for (op, counters) in [
                ("read", &c.read),
                ("write", &c.write),
                ("flush", &c.flush),
                ("deallocate", &c.deallocate),
            ] {
                e.sample(family, &[("volume_id", name), ("op", op)], pick(counters));
            }
        }
    }
    e.family(
        "edgevol_volume_media_errors_total",
        Kind::Counter,
        "NVMe commands on the volume failed by the pool device's medium (Unrecovered Read Error, Write Fault); the volume is reported abnormal.",
    );
    for (v, c) in &stats {
        let n = c.media_errors.load(Ordering::Relaxed);
        e.sample(
            "edgevol_volume_media_errors_total",
            &[("volume_id", &names[v])],
            n,
        );
    }
    e.family(
        "edgevol_volume_qos_delayed_total",
        Kind::Counter,
        "NVMe commands held back by the volume's QoS limits before they started.",
    );
    for (v, c) in &stats {
        let n = c.qos_delayed.load(Ordering::Relaxed);
        e.sample(
            "edgevol_volume_qos_delayed_total",
            &[("volume_id", &names[v])],
            n,
        );
    }
    e.family(
        "edgevol_volume_qos_wait_seconds_total",
        Kind::Counter,
        "Time the held-back commands waited for the volume's QoS limits, in all.",
    );
    for (v, c) in &stats {
        let us = c.qos_wait_us.load(Ordering::Relaxed);
        e.sample(
            "edgevol_volume_qos_wait_seconds_total",
            &[("volume_id", &names[v])],
            text::seconds(us),
        );
    }
    e.family(
        "edgevol_volume_io_latency_seconds",
        Kind::Histogram,
        "Latency of every NVMe command on the volume, from parse to completion (no _sum: the target counts buckets only).",
    );
    for (v, c) in &stats {
        let h = HistogramSnapshot {
            bounds_us: LATENCY_BUCKETS_US.to_vec(),
            counts: c
                .latency
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            sum_us: None,
        };
        e.histogram(
            "edgevol_volume_io_latency_seconds",
            &[("volume_id", &names[v])],
            &h,
        );
    }
}

fn csi_metrics(e: &mut Exposition, registry: &Registry) {
    let calls = registry.csi.snapshot();
    e.family(
        "edgevol_csi_calls_total",
        Kind::Counter,
        "CSI calls answered, by service, method and gRPC status code (refused calls included).",
    );
    for m in &calls {
        for (code, n) in &m.codes {
            e.sample(
                "edgevol_csi_calls_total",
                &[
                    ("service", &m.service),
                    ("method", &m.method),
                    ("code", code),
                ],
                n,
            );
        }
    }
    e.family(
        "edgevol_csi_call_duration_seconds",
        Kind::Histogram,
        "CSI call latency from request to status, by service and method.",
    );
    for m in &calls {
        e.histogram(
            "edgevol_csi_call_duration_seconds",
            &[("service", &m.service), ("method", &m.method)],
            &m.latency,
        );
    }
    e.family(
        "edgevol_metadata_commit_seconds",
        Kind::Histogram,
        "Time a mutating CSI call held the pool: metadata change, journal append and flush.",
    );
    for (method, h) in registry.commit_snapshot() {
        e.histogram(
            "edgevol_metadata_commit_seconds",
            &[("method", &method)],
            &h,
        );
    }
}
