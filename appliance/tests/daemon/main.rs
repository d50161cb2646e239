//! edgevold's in-process integration tests, one module per file, in one test binary: as a crate of
//! its own, each file built tonic's and tokio's generics again and was linked again (about 4.6 s
//! of CPU each). `cargo test -p edgevol-appliance --test daemon controller::` runs one file's tests.
//! Apart: the QEMU tests the scripts run by name (`nvme_linux`, `nvme_cli`, `qos_qemu`,
//! `faults_qemu`, `nvme_auth_qemu`), those that measure the process (`busy_poll`'s CPU time,
//! `qos`'s rates; `write_allocations` and `write_zero_copy` count its allocations; `secrets` and
//! `host_keys_log` capture its log), and `crash_kill9`, which kills processes.

#[path = "../common/mod.rs"]
mod common;
#[path = "../../../cli/tests/controller_suite/mod.rs"]
mod controller_suite;
#[path = "../nvme_host/mod.rs"]
mod nvme_host;

mod bad_input;
mod controller;
mod encrypted_params;
mod existing_only;
mod first_start;
mod format_cmd;
mod group_commit;
mod group_controller;
mod host_auth;
mod host_keys;
mod leg_params;
mod load;
mod media_errors;
mod metrics;
mod mtls;
mod node_enrol;
mod nvme_csi;
mod nvme_target;
mod plugin_identity;
mod read_only_pool;
mod shipped_devices;
mod snapshot_metadata;
mod snapshot_metadata_stream;
mod volume_group;
