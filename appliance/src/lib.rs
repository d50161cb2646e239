//! edgevold, the edgevol appliance daemon.
//!
//! It serves CSI (Identity, Controller, GroupController and the VolumeGroup API) over gRPC on
//! TCP with mutual TLS, and every volume over NVMe/TCP ([`nvme`]). Layers, outside in:
//! [`transport`] (TCP + TLS handshake, peer identity) → [`auth`] (role policy, call log) → the
//! [`csi`] services; the [`nvme`] target beside them; both over [`state`], the pool handle,
//! which knows neither. [`metrics`] reads all of them. [`daemon`] checks the [`config`],
//! composes the parts and hands each the handles it needs.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod auth;
pub mod config;
pub mod csi;
pub mod daemon;
pub mod format;
pub mod metrics;
pub mod naming;
pub mod nvme;
pub mod pool;
pub mod progress;
pub mod state;
pub mod sync;
pub mod transport;

pub use config::{Args, Command, Config};
pub use daemon::{start, DaemonError, Running};

