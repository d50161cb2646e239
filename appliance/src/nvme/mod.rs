//! The NVMe/TCP target: every volume served to remote hosts as its own subsystem (namespace 1),
//! with a discovery controller on the same listener.
//!
//! Layers, as Linux `drivers/nvme/target` splits them:
//! - [`transport`]: one tokio task per TCP connection (= one NVMe queue) driving the sans-I/O
//!   `edgevol_nvmeof::queue::Queue`; parse → validate → execute → complete → transmit. Its
//!   files: the loop, the socket, dispatch, and an I/O command's three paths (in place, the
//!   queue's io_uring, the worker threads).
//! - [`engine`]: the threads I/O queues run on (one per core, run-to-completion);
//!   [`busy_poll`]: how an engine that was just woken polls before it sleeps again.
//! - [`subsys`]: controllers, dynamic cntlids, the host ACL (the volume's durable
//!   publications), and [`subsys::Access`], the [`HostAccess`] the CSI controller calls.
//! - [`controller`]: one controller's registers (CC/CSTS), features, keep-alive, events.
//! - [`errors`]: each controller's Error Information log, recorded at the transport's one
//!   completion point.
//! - [`auth`]: in-band authentication policy (who must authenticate, with which keys, what a
//!   failure costs); the protocol itself is `edgevol_nvmeof::auth`.
//! - [`fabrics`] (Connect, Property Get/Set), [`admin`] (Identify, logs, features),
//!   [`identify`], [`log_page`], [`discovery`]: admin-side data structures.
//! - [`io`]: Read/Write/Flush/Write Zeroes/DSM over core and hal (its docs say how the pool lock
//!   and core's durability rule are followed).
//! - [`throttle`]: per-volume QoS limits, shared by the volume's queues ([`crate::qos`] is the
//!   sans-I/O limiter).
//! - [`stats`]: per-volume counters for the metrics exporter and the CSI volume condition.
//! - [`status`]: the one mapping from core, device and pool errors to NVMe statuses.
//!
//! The target sees the appliance through [`State`]'s pool handle only; the control plane sees
//! the target through [`TargetInfo`], which the daemon hands to the CSI services.

pub mod admin;
pub mod auth;
pub mod busy_poll;
pub mod controller;
pub mod device_ring;
pub mod discovery;
pub mod engine;
pub mod errors;
pub mod fabrics;
pub mod identify;
pub mod io;
pub mod log_page;
pub mod stats;
pub mod status;
pub mod subsys;
pub mod throttle;
pub mod transport;
pub mod workers;

/// The loopback test host of the integration tests (`tests/nvme_host`), for the target's own.
#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
#[path = "../../tests/nvme_host/mod.rs"]
mod test_host;

/// A target serving one volume on loopback, with a host connected: end-to-end tests' set-up.
#[cfg(test)]
mod test_target;

/// The data path's device handle in unit tests ([`io::DataPath`] takes it in their build).
#[cfg(test)]
mod test_device;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use edgevol_nvmeof::queue::QueueConfig;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use edgevol_core::VolumeId;

use crate::config::NvmeConfig;
use crate::hostkeys::RevokedHost;
use crate::state::State;

use self::auth::HostAuth;
use self::controller::MAX_QUEUE_SIZE;
use self::engine::Engines;
use self::stats::IoStats;
use self::subsys::{Access, Subsystems};

/// In-capsule data accepted on I/O queues (IOCCSZ = (64 + this) / 16).
pub const IO_IN_CAPSULE: u32 = 16 * 1024;
/// Most data one command moves.
pub const MAX_TRANSFER: u32 = 1024 * 1024;
/// MDTS: `MAX_TRANSFER` in 4 KiB pages, as a power of two.
pub const MDTS: u8 = 8;

/// The transport limits every connection gets.
pub fn queue_config() -> QueueConfig {
    QueueConfig {
        io_in_capsule: IO_IN_CAPSULE,
        max_transfer: MAX_TRANSFER,
        max_queue_size: MAX_QUEUE_SIZE,
        ..QueueConfig::default()
    }
}

/// What the control plane needs from the NVMe/TCP target: kept as a trait so the CSI services
/// do not depend on the target's internals.
pub trait HostAccess: Send + Sync + fmt::Debug {
    /// Tears down every live controller `host` has on `volume`'s subsystem (after unpublish).
    fn revoke(&self, volume: VolumeId, host: &str);
    /// Tells hosts connected to `volume` that its namespace changed (size): an async event.
    fn namespace_changed(&self, volume: VolumeId);
    /// `volume`'s mutable parameters are now `parameters` (ControllerModifyVolume, committed):
    /// its connected queues enforce the limits they set from now on.
    fn parameters_changed(&self, volume: VolumeId, parameters: &[(String, String)]);
}

/// The running NVMe/TCP target, as the control plane sees it.
#[derive(Debug, Clone)]
pub struct TargetInfo {
    /// The address and port hosts connect to (publish_context).
    pub endpoint: SocketAddr,
    /// Access control and notifications.
    pub access: Arc<dyn HostAccess>,
    /// Per-volume I/O counters (media health for the CSI volume condition).
    pub stats: IoStats,
    /// Authentication outcomes (for the exporter).
    pub auth: Arc<auth::AuthCounters>,
    /// The threads I/O queues run on.
    pub engines: Arc<Engines>,
}

/// Why the target could not start.
#[derive(Debug)]
pub struct BindError {
    /// The listen address.
    pub addr: SocketAddr,
    /// What the OS said.
    pub error: std::io::Error,
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NVMe/TCP listen {}: {}", self.addr, self.error)
    }
}

impl std::error::Error for BindError {}

/// The running target.
#[derive(Debug)]
pub struct Target {
    /// Where hosts connect: the advertised address and the bound port.
    pub endpoint: SocketAddr,
    /// The shared registry (controllers, counters).
    pub subsystems: Arc<Subsystems>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Binds `config.listen` and starts accepting; [`Target::info`] is what the control plane needs.
/// `auth` decides who authenticates; a revocation in its key store disconnects the host.
pub async fn start(
    state: Arc<State>,
    config: &NvmeConfig,
    auth: HostAuth,
) -> Result<Target, BindError> {
    let bind_err = |error| BindError {
        addr: config.listen,
        error,
    };
    let listener = TcpListener::bind(config.listen).await.map_err(bind_err)?;
    let port = listener.local_addr().map_err(bind_err)?.port();
    let endpoint = SocketAddr::new(config.advertise, port);
    // Revocations reach the accept loop through a channel: the store holds no reference to
    // the target, so neither keeps the other alive.
    let (revoked_tx, revoked) = mpsc::unbounded_channel();
    auth.keys().on_revoke(Arc::new(move |r: &RevokedHost| {
        let _ = revoked_tx.send(r.host_nqn.clone());
    }));
    let engines = match config.io_threads {
        _ if !config.io_cpus.is_empty() => Engines::pinned(&config.io_cpus, config.busy_poll),
        0 => Engines::per_core(config.busy_poll),
        n => Engines::start(n, config.busy_poll),
    }
    .map_err(|e| {
        bind_err(std::io::Error::new(
            e.kind(),
            format!("starting the I/O engine threads: {e}"),
        ))
    })?;
    let subsystems = Subsystems::new(state, endpoint, auth, engines);
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(accept(listener, subsystems.clone(), stop_rx, revoked));
    tracing::info!(listen = %config.listen, %endpoint, "NVMe/TCP target listening");
    Ok(Target {
        endpoint,
        subsystems,
        stop,
        task,
    })
}

async fn accept(
    listener: TcpListener,
    subs: Arc<Subsystems>,
    mut stop: watch::Receiver<bool>,
    mut revoked: mpsc::UnboundedReceiver<String>,
) {
    let epoch = Instant::now();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            Some(host_nqn) = revoked.recv() => subs.shut_host(&host_nqn),
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(transport::serve(subs.clone(), stream, epoch, stop.clone()));
                }
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(%e, "NVMe/TCP accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    subs.shut_all();
    while connections.join_next().await.is_some() {}
}

impl Target {
    /// The target as the control plane sees it: endpoint, access hooks, counters.
    pub fn info(&self) -> TargetInfo {
        TargetInfo {
            endpoint: self.endpoint,
            access: Arc::new(Access(self.subsystems.clone())),
            stats: self.subsystems.stats.clone(),
            auth: self.subsystems.auth.counters.clone(),
            engines: self.subsystems.engines.clone(),
        }
    }

    /// Stops accepting, closes every connection and waits for their tasks.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let _ = self.task.await;
    }
}
