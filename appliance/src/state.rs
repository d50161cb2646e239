//! What every service of the appliance shares.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use edgevol_core::{Pool, VolumeId};

use tonic::Status;

use crate::csi::ids::Ids;
use crate::pool::PoolDevice;

/// What the control plane needs from the NVMe/TCP target: kept as a trait so the CSI services
/// do not depend on the target's internals.
pub trait HostAccess: Send + Sync + fmt::Debug {
    /// Tears down every live controller `host` has on `volume`'s subsystem (after unpublish).
    fn revoke(&self, volume: VolumeId, host: &str);
    /// Tells hosts connected to `volume` that its namespace changed (size): an async event.
    fn namespace_changed(&self, volume: VolumeId);
}

/// The running NVMe/TCP target, as the control plane sees it.
#[derive(Debug, Clone)]
pub struct TargetInfo {
    /// The address and port hosts connect to (publish_context).
    pub endpoint: SocketAddr,
    /// Access control and notifications.
    pub access: Arc<dyn HostAccess>,
    /// Per-volume I/O counters (for metrics).
    pub stats: crate::nvme::stats::IoStats,
}

/// The appliance's shared state.
#[derive(Debug)]
pub struct State {
    /// This appliance's id.
    pub appliance_id: String,
    /// Its topology segments, the appliance segment included.
    pub topology: BTreeMap<String, String>,
    /// The pool, once opened and recovered.
    pool: OnceLock<Mutex<Pool<PoolDevice>>>,
    /// The NVMe/TCP target, once listening.
    target: OnceLock<TargetInfo>,
    /// What the metrics exporter counts as the appliance runs.
    pub metrics: Arc<crate::metrics::Registry>,
}

impl State {
    /// A state whose pool is still opening.
    pub fn new(appliance_id: String, topology: BTreeMap<String, String>) -> Self {
        State {
            appliance_id,
            topology,
            pool: OnceLock::new(),
            target: OnceLock::new(),
            metrics: Arc::default(),
        }
    }

    /// Whether the pool is open and recovered: what CSI Probe reports.
    pub fn is_ready(&self) -> bool {
        self.pool.get().is_some()
    }

    /// Installs the opened pool; from now on the appliance is ready.
    pub fn set_pool(&self, pool: Pool<PoolDevice>) {
        if self.pool.set(Mutex::new(pool)).is_err() {
            tracing::error!("pool opened twice; keeping the first");
        }
    }

    /// Registers the running NVMe/TCP target.
    pub fn set_target(&self, target: TargetInfo) {
        if self.target.set(target).is_err() {
            tracing::error!("NVMe/TCP target registered twice; keeping the first");
        }
    }

    /// The NVMe/TCP target, if running.
    pub fn target(&self) -> Option<&TargetInfo> {
        self.target.get()
    }

    /// The pool, if open.
    pub fn pool(&self) -> Option<&Mutex<Pool<PoolDevice>>> {
        self.pool.get()
    }

    /// The CSI ids of this appliance's objects.
    pub fn ids(&self) -> Ids<'_> {
        Ids::new(&self.appliance_id)
    }

    /// Runs `f` on the pool on the blocking pool (core commits flush the device), one call at a
    /// time: calls on the pool are serialized, so two calls on the same volume never interleave.
    /// `UNAVAILABLE` while the pool is still opening.
    pub async fn with_pool<T, F>(self: &Arc<Self>, f: F) -> Result<T, Status>
    where
        F: FnOnce(&State, &mut Pool<PoolDevice>) -> Result<T, Status> + Send + 'static,
        T: Send + 'static,
    {
        if !self.is_ready() {
            return Err(Status::unavailable(
                "the pool is still opening; retry shortly",
            ));
        }
        let state = self.clone();
        // Serving a mutating CSI call: time its hold of the pool (metadata commit latency).
        let mutation = crate::metrics::csi::current_mutation();
        tokio::task::spawn_blocking(move || {
            let pool = state.pool().expect("checked ready");
            let mut pool = pool
                .lock()
                .map_err(|_| Status::internal("pool lock poisoned by an earlier failure"))?;
            let started = std::time::Instant::now();
            let result = f(&state, &mut pool);
            if let (Some(method), Ok(_)) = (mutation, &result) {
                state.metrics.observe_commit(&method, started.elapsed());
            }
            result
        })
        .await
        .map_err(|e| Status::internal(format!("pool task failed: {e}")))?
    }
}

/// Now, as nanoseconds since the Unix epoch: what core stores as creation times.
pub fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
