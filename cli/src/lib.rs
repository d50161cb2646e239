//! The `edgevol` admin CLI: PKI management (firmware signing keys included), the CO-side
//! proxy, the operator's status listings, and the nodes' data-path keys.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod boot_files;
pub mod fail_trial;
pub mod firmware;
pub mod firmware_keys;
pub mod fleet_config;
pub mod fleet_create;
pub mod fleet_legs;
pub mod fleet_member;
pub mod fleet_metadata;
pub mod fleet_paging;
pub mod fleet_placement;
pub mod fleet_replica_calls;
pub mod fleet_replica_snapshots;
pub mod fleet_replicas;
pub mod fleet_router;
pub mod grpc_unary;
pub mod keys;
pub mod node_route;
pub mod proxy;
pub mod status;
