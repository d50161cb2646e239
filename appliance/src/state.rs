//! What every service of the appliance shares.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// The appliance's shared state.
#[derive(Debug)]
pub struct State {
    /// This appliance's id.
    pub appliance_id: String,
    /// Its topology segments, the appliance segment included.
    pub topology: BTreeMap<String, String>,
    ready: AtomicBool,
}

impl State {
    /// A state that is not ready until [`State::set_ready`].
    pub fn new(appliance_id: String, topology: BTreeMap<String, String>) -> Self {
        State {
            appliance_id,
            topology,
            ready: AtomicBool::new(false),
        }
    }

    /// Whether the pool is open and recovered: what CSI Probe reports.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Marks the pool open.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }
}
