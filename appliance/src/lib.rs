//! edgevold, the edgevol appliance daemon.
//!
//! It serves CSI (Identity, Controller, GroupController and the VolumeGroup API) over gRPC on
//! TCP with mutual TLS, and every volume over NVMe/TCP ([`nvme`]). Layers, outside in:
//! [`transport`] (TCP + TLS handshake, peer identity) → [`auth`] (role policy, call log) → the
//! [`csi`] services; the [`nvme`] target beside them; both over [`state`], the pool handle,
//! which knows neither. [`metrics`] reads all of them. [`daemon`] checks the [`config`],
//! composes the parts and hands each the handles it needs.
//!
//! # Panics
//!
//! edgevold unwinds (`panic = "unwind"`, also in the release profile; it does not build
//! otherwise). A panic while serving one NVMe command is caught around that command
//! ([`nvme::transport`]): the command fails with Internal Error, the connection and every other
//! command go on. A panic elsewhere ends only its task (a CSI call fails, a connection closes).
//! A panic while holding the pool poisons it, since its in-memory state may be half-updated:
//! every later pool call then fails ([`state::PoolUnavailable::Poisoned`]) until the daemon is
//! restarted, which recovers the pool from its journal as after a crash. Aborting instead would
//! end every host's I/O for a bug in one command.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(not(panic = "unwind"))]
compile_error!(
    "edgevold must be built with panic = \"unwind\": a panic in one NVMe command must fail only \
     that command (see the crate docs)"
);

pub mod auth;
pub mod config;
pub mod csi;
pub mod daemon;
pub mod firmware;
pub mod format;
pub mod group_commit;
pub mod hostkeys;
pub mod metrics;
pub mod naming;
pub mod nvme;
pub mod pool;
pub mod pool_features;
pub mod pool_words;
pub mod progress;
pub mod qos;
pub mod state;
pub mod sync;
pub mod transport;

pub use config::{Args, Command, Config};
pub use daemon::{start, DaemonError, Running};

#[cfg(test)]
mod tests {
    /// Tests always unwind, whatever the profile says; this checks what release builds get.
    #[test]
    fn the_release_profile_unwinds() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
        let manifest: toml::Table = std::fs::read_to_string(path).unwrap().parse().unwrap();
        let panic = manifest["profile"]["release"].get("panic");
        assert!(
            panic.is_none_or(|p| p.as_str() == Some("unwind")),
            "the release profile sets panic = {panic:?}; edgevold relies on unwinding"
        );
    }
}
