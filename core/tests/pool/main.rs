//! core's integration tests against the pool API, one module per file, in one test binary: as a
//! crate of its own, each file built core's generics again at opt-level 2 and was linked again
//! (about 9 s of CPU each). `cargo test -p edgevol-core --test pool crash::` runs one file's tests.
//! Apart, for their builds: `golden_features.rs` (core's test-feature-x) and `ticket_alloc.rs`
//! (a counting global allocator).

#[path = "../common/mod.rs"]
mod common;

mod api;
mod changed;
mod corruption;
mod crash;
mod crash_persist;
mod format;
mod golden;
mod group_commit;
mod inflight;
mod model;
mod persist;
mod scale;
mod ticket;
