//! edgevold, the edgevol appliance daemon.
//!
//! It serves CSI (Identity now; Controller, GroupController and VolumeGroup as they land) over
//! gRPC on TCP with mutual TLS. Layers, outside in: [`transport`] (TCP + TLS handshake, peer
//! identity) → [`auth`] (role policy, call log) → the [`csi`] services → [`state`].
//! [`daemon`] checks the [`config`] and composes them.
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
