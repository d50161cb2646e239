//! The subsystems of this appliance and their controllers (Linux `core.c`): who may connect
//! (`nvmet_host_allowed`, from the volume's durable publications), dynamic controller ids, and
//! the [`HostAccess`] hooks the CSI controller calls after unpublish and expansion.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use edgevol_core::VolumeId;
use edgevol_nvmeof::fabrics::Rejected;
use edgevol_nvmeof::fabrics_cmd::{connect_data_offset, ConnectError};
use edgevol_nvmeof::status::StatusCode;

use crate::naming::{parse_subsystem_nqn, DISCOVERY_NQN};
use crate::state::State;

use super::auth::HostAuth;
use super::controller::{Controller, Kind, DISCOVERY_KATO};
use super::engine::Engines;
use super::io::DataPath;
use super::stats::IoStats;
use super::status::TargetStatus;
use super::throttle::{stored_limits, Throttles};
use super::transport::IoJob;
use super::workers::Workers;
use super::HostAccess;

/// Highest dynamic controller id (`NVME_CNTLID_MAX`).
pub const CNTLID_MAX: u16 = 0xffef;
/// The namespace id of every volume's namespace.
pub const NSID: u32 = 1;

/// Everything the queues of the target share.
#[derive(Debug)]
pub struct Subsystems {
    /// The appliance state (pool, id).
    pub state: Arc<State>,
    /// Where hosts connect (advertised address, bound port).
    pub endpoint: SocketAddr,
    /// Per-volume counters.
    pub stats: IoStats,
    controllers: Mutex<BTreeMap<u16, Arc<Controller>>>,
    next_cntlid: Mutex<u16>,
    /// Bumped when access changes in a way the discovery log must show.
    changes: AtomicU64,
    /// I/O outside the pool lock, once opened (`None`: the second handle could not be opened,
    /// so every command runs under the lock).
    data: OnceLock<Option<Arc<DataPath>>>,
    /// Who authenticates, with which keys.
    pub auth: HostAuth,
    /// The threads I/O queues run on.
    pub engines: Arc<Engines>,
    /// Per-volume QoS limiters.
    pub throttles: Throttles,
    /// Threads for the I/O commands engines hand off.
    pub(crate) workers: Workers<IoJob>,
}

/// Blocking I/O commands running at once, over every queue: the depth a drive can be given.
const WORKERS: usize = 64;

/// Who a Connect wants, before the pool is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The discovery subsystem.
    Discovery,
    /// A volume's subsystem.
    Volume(VolumeId),
}

pub(super) fn connect_data_error(code: StatusCode, offset: u16) -> Rejected {
    let mut e = ConnectError::data_field(offset);
    e.status = code.status();
    e.into()
}

impl Subsystems {
    /// An empty registry.
    pub fn new(
        state: Arc<State>,
        endpoint: SocketAddr,
        auth: HostAuth,
        engines: Engines,
    ) -> Arc<Self> {
        Arc::new(Subsystems {
            auth,
            engines: Arc::new(engines),
            state,
            endpoint,
            stats: IoStats::default(),
            controllers: Mutex::new(BTreeMap::new()),
            next_cntlid: Mutex::new(1),
            changes: AtomicU64::new(0),
            data: OnceLock::new(),
            throttles: Throttles::default(),
            workers: Workers::new(WORKERS),
        })
    }

    /// The data path outside the pool lock, opened on first use. Blocking (locks the pool).
    pub fn data_path(&self) -> Option<Arc<DataPath>> {
        if let Some(d) = self.data.get() {
            return d.clone();
        }
        let mut pool = self.state.lock_pool().ok()?;
        // Checked again under the lock: one opener installs the quiesce hook.
        if let Some(d) = self.data.get() {
            return d.clone();
        }
        let opened = match DataPath::open(&mut pool) {
            Ok(d) => Some(Arc::new(d)),
            Err(e) => {
                tracing::warn!(%e, "no second device handle: NVMe I/O runs under the pool lock");
                None
            }
        };
        let _ = self.data.set(opened.clone());
        opened
    }

    fn table(&self) -> MutexGuard<'_, BTreeMap<u16, Arc<Controller>>> {
        self.controllers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves a subsystem NQN: discovery or one of our volumes' (Invalid Parameters naming
    /// SUBNQN otherwise, as Linux `nvmet_find_get_subsys` failing does).
    pub fn resolve(&self, subnqn: &str) -> Result<Target, Rejected> {
        if subnqn == DISCOVERY_NQN {
            return Ok(Target::Discovery);
        }
        parse_subsystem_nqn(&self.state.appliance_id, subnqn)
            .map(Target::Volume)
            .ok_or_else(|| {
                connect_data_error(
                    StatusCode::ConnectInvalidParameters,
                    connect_data_offset::SUBSYSNQN,
                )
            })
    }

    /// The admission decision for `host` on `volume`: read-only flag, or the Connect error.
    /// Reads the volume's durable publications under the pool lock (off the reactor).
    pub async fn admit(&self, volume: VolumeId, host: String) -> Result<bool, Rejected> {
        if !self.state.is_ready() {
            // Right after a start the listener is up before the pool: a host reconnecting now
            // must retry (Linux keeps reconnecting on a status without DNR), not give up.
            tracing::warn!(%host, volume = ?volume, "Connect before the pool is open: answered Controller Busy (retryable)");
            return Err(StatusCode::ConnectControllerBusy.status().into());
        }
        let who = host.clone();
        let looked_up = self
            .state
            .on_pool(move |_, pool| {
                pool.volume(volume).ok().map(|v| {
                    v.publications()
                        .iter()
                        .find(|p| p.host == who)
                        .map(|p| p.readonly)
                })
            })
            .await;
        match looked_up {
            Ok(Some(Some(readonly))) => Ok(readonly),
            Ok(Some(None)) => {
                // Also what a host still connected after ControllerUnpublishVolume sees on
                // every reconnect: worth a line each (it names the host, never a secret).
                tracing::warn!(%host, volume = ?volume, "Connect refused: the volume is not published to this host");
                Err(connect_data_error(
                    StatusCode::ConnectInvalidHost,
                    connect_data_offset::HOSTNQN,
                ))
            }
            Ok(None) => Err(connect_data_error(
                StatusCode::ConnectInvalidParameters,
                connect_data_offset::SUBSYSNQN,
            )),
            Err(e) => {
                tracing::error!(%host, volume = ?volume, error = %e, "Connect: pool unusable");
                Err(TargetStatus::from(e).status().into())
            }
        }
    }

    /// Allocates a controller id and registers a new controller.
    pub fn create(
        &self,
        host: &str,
        subnqn: &str,
        kind: Kind,
        kato_ms: u32,
    ) -> Result<Arc<Controller>, Rejected> {
        let kato = match (kato_ms, &kind) {
            (0, Kind::Discovery) => Some(DISCOVERY_KATO),
            (0, _) => None,
            // Linux rounds up to whole seconds.
            (ms, _) => Some(Duration::from_secs(u64::from(ms).div_ceil(1000))),
        };
        let mut table = self.table();
        let mut next = self.next_cntlid.lock().unwrap_or_else(|p| p.into_inner());
        let start = *next;
        let mut id = start;
        while table.contains_key(&id) {
            id = if id >= CNTLID_MAX { 1 } else { id + 1 };
            if id == start {
                return Err(StatusCode::ConnectControllerBusy.status().into());
            }
        }
        *next = if id >= CNTLID_MAX { 1 } else { id + 1 };
        let ctrl = Controller::new(id, host.to_owned(), subnqn.to_owned(), kind, kato);
        table.insert(id, ctrl.clone());
        Ok(ctrl)
    }

    /// The live controller an I/O queue Connect names: same host and subsystem, else Invalid
    /// Parameters on CNTLID (Linux `nvmet_ctrl_find_get`).
    pub fn find(&self, cntlid: u16, host: &str, subnqn: &str) -> Result<Arc<Controller>, Rejected> {
        self.table()
            .get(&cntlid)
            .filter(|c| c.host == host && c.subnqn == subnqn && !c.is_shut())
            .cloned()
            .ok_or_else(|| {
                connect_data_error(
                    StatusCode::ConnectInvalidParameters,
                    connect_data_offset::CNTLID,
                )
            })
    }

    /// Tears a controller down and forgets it.
    pub fn remove(&self, ctrl: &Controller) {
        ctrl.shut();
        let mut table = self.table();
        if table
            .get(&ctrl.cntlid)
            .is_some_and(|c| std::ptr::eq(c.as_ref(), ctrl))
        {
            table.remove(&ctrl.cntlid);
        }
    }

    /// Tears down every controller (target stop).
    pub fn shut_all(&self) {
        let all: Vec<_> = std::mem::take(&mut *self.table()).into_values().collect();
        for c in all {
            c.shut();
        }
    }

    /// Tears down every controller of `host_nqn` (its keys were revoked).
    pub fn shut_host(&self, host_nqn: &str) {
        let doomed: Vec<_> = self
            .controllers()
            .into_iter()
            .filter(|c| c.host == host_nqn)
            .collect();
        if !doomed.is_empty() {
            tracing::info!(
                host_nqn,
                controllers = doomed.len(),
                "keys revoked: disconnecting the host"
            );
        }
        for c in doomed {
            self.remove(&c);
        }
    }

    /// Live controllers (for tests and metrics).
    pub fn controllers(&self) -> Vec<Arc<Controller>> {
        self.table().values().cloned().collect()
    }

    /// The discovery generation salt: changes on every revoke.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }
}

/// The [`HostAccess`] the CSI controller sees. The state owns nothing of the target, so this
/// strong reference makes no cycle: it lives as long as the CSI services that hold it. After the
/// target stopped, its controllers are gone and both hooks find nothing to do.
#[derive(Debug)]
pub struct Access(pub Arc<Subsystems>);

impl HostAccess for Access {
    fn revoke(&self, volume: VolumeId, host: &str) {
        let subs = &self.0;
        subs.changes.fetch_add(1, Ordering::Relaxed);
        let doomed: Vec<_> = subs
            .controllers()
            .into_iter()
            .filter(|c| c.volume() == Some(volume) && c.host == host)
            .collect();
        for c in doomed {
            tracing::info!(
                cntlid = c.cntlid,
                host,
                volume = volume.0,
                "revoked: closing controller"
            );
            subs.remove(&c);
        }
    }

    fn parameters_changed(&self, volume: VolumeId, parameters: &[(String, String)]) {
        let limits = stored_limits(volume, parameters);
        tracing::info!(volume = volume.0, ?limits, "QoS limits changed");
        self.0.throttles.set(volume, limits);
    }

    fn namespace_changed(&self, volume: VolumeId) {
        for c in self.0.controllers() {
            if c.volume() == Some(volume) && c.regs().namespace_changed(NSID) {
                c.aen.notify_one();
            }
        }
    }
}
