//! What every service of the appliance shares.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use edgevol_core::Pool;

use crate::pool::PoolDevice;

/// The appliance's shared state.
#[derive(Debug)]
pub struct State {
    /// This appliance's id.
    pub appliance_id: String,
    /// Its topology segments, the appliance segment included.
    pub topology: BTreeMap<String, String>,
    /// The pool, once opened and recovered.
    pool: OnceLock<Mutex<Pool<PoolDevice>>>,
}

impl State {
    /// A state whose pool is still opening.
    pub fn new(appliance_id: String, topology: BTreeMap<String, String>) -> Self {
        State {
            appliance_id,
            topology,
            pool: OnceLock::new(),
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

    /// The pool, if open.
    pub fn pool(&self) -> Option<&Mutex<Pool<PoolDevice>>> {
        self.pool.get()
    }
}
