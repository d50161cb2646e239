//! edgevol-cli's integration tests, one module per file, in one test binary: as a crate of its
//! own, each file built the appliance's and tonic's generics again and was linked again (about
//! 8 s of CPU each). `cargo test -p edgevol-cli --test cli proxy_fleet::` runs one file's tests.

#[path = "../common/mod.rs"]
mod common;
#[path = "../controller_suite/mod.rs"]
mod controller_suite;
#[path = "../fleet/mod.rs"]
mod fleet;
#[path = "../../../appliance/tests/nvme_host/mod.rs"]
mod nvme_host;

mod firmware;
mod keys;
mod pki_cli;
mod proxy;
mod proxy_conformance;
mod proxy_controller_suite;
mod proxy_fleet;
mod proxy_fleet_cli;
mod proxy_fleet_hang;
mod proxy_fleet_metadata;
mod proxy_node_route;
mod proxy_replicated;
mod proxy_streaming;
mod snapshots_diff;
mod status;
