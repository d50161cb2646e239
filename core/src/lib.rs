//! edgevol core: the `no_std` volume manager of the appliance.
//!
//! A [`Pool`] lives on one [`BlockDevice`]: two superblocks (blocks 0 and 1), two checkpoint
//! slots, a journal, then data clusters. Volumes map virtual clusters to physical ones (absent:
//! zeros); snapshots and clones share clusters by reference count; groups snapshot all members in
//! one commit. Core is sans-I/O: it never spawns, sleeps or reads a clock, and touches storage only
//! through the device trait. Control operations return typed [`Error`]s that map 1:1 onto CSI
//! codes; the data path asks [`Pool::map_read`] / [`Pool::map_write`] / [`Pool::trim`] where bytes
//! live and performs the I/O itself.
//!
//! # Durability rule
//!
//! - **Control operations** (create/delete/expand volume, snapshots, groups, publish/unpublish)
//!   are durable when they return `Ok`: their journal record has been written and flushed. Answer
//!   the CSI call only then. With [`Pool::set_group_commit`] they are staged instead, and many
//!   share one hard commit ([`Pool::commit_staged`]); answer each once its [`CommitTicket`] is
//!   committed (the `group_commit` module docs). An operation that returns an error may or may not be durable if the
//!   error is `Error::Device` (the pool then refuses further work until reopened); any other error
//!   changed nothing.
//! - **Data path**: a write through [`Pool::map_write`] may allocate a cluster (first write, or
//!   copy-on-write of a shared cluster) and [`Pool::trim`] may unmap one. These mapping changes
//!   are visible at once and go to the journal in one of two ways:
//!   - [`Pool::persist`] (a *soft* commit) writes the records of every pending change, without a
//!     device flush: they survive a crash of the process (kill -9, panic, OOM), as the data
//!     written through them does (both sit in the OS page cache), but not a power cut. The data
//!     path acknowledges a write or trim only after `persist` returned for the ticket it took
//!     ([`Pool::persist_ticket`]) once its mapping and data I/O were done. Every write does,
//!     allocating or not (it may land in a cluster another command's record gave the volume).
//!     Concurrent writers share one journal append: whoever persists first writes everyone's
//!     records, and the others find their ticket covered ([`Pool::is_persisted`]). Lock, map and
//!     write, take the ticket, unlock; lock, `persist(ticket)`, unlock; acknowledge.
//!   - A *hard* commit: [`Pool::flush`] (NVMe Flush, FUA), [`Pool::sync`] (the appliance's
//!     periodic timer, every second; no I/O when [`Pool::needs_sync`] is false) or any control
//!     operation flushes the data, writes the records still pending, and flushes again, which
//!     also seals the soft frames written before it.
//!
//!   So a crash of the process loses no acknowledged write; a power cut loses at most the writes
//!   persisted since the last hard commit (at most a second of them with the timer), together
//!   with their unflushed data, exactly as for a disk's volatile cache (dm-thin gives the same
//!   rule). What tells the two apart at [`Pool::open_with`] is the [`Epoch`] (the OS boot id)
//!   soft frames carry: see Recovery. A pool with no epoch ([`Pool::open`] without
//!   [`Pool::set_epoch`]) makes every `persist` hard.
//! - Every commit flushes the device *before* writing its record when data was mapped since the
//!   last one, so a durable mapping never points at data that is not; and so a snapshot contains
//!   every write completed before it was taken.
//! - Clusters freed, or left with fewer references, by a change that is not durable yet are not
//!   reused or written in place until it is (pending/unsettled clusters, see [`Capacity`]), so a
//!   power cut never exposes one volume's data through another's map. Durable here means hard:
//!   a soft commit does not release a cluster.
//! - A soft frame never maps data that was not written before it: `persist` requires that every
//!   allocating command's data I/O has completed (they run under the lock), and after a power
//!   cut an unsealed soft frame is dropped whatever survived of it, so an allocation whose data
//!   was lost never shows a reused cluster's old bytes.
//! - **I/O outside the lock**: [`Pool::begin_read`] / [`Pool::begin_write`] pin the clusters of
//!   an I/O until [`Pool::complete`]; a pinned cluster is never reused, and snapshots wait
//!   (through [`Quiesce`]) for in-flight writes, so they contain every write that completed, or
//!   was in flight, before they were taken and nothing later. Details in the `map` module docs
//!   (see [`IoTicket`]).
//!
//! # Recovery
//!
//! [`Pool::open_with`] takes the valid superblock copy with the highest generation and the newest
//! checkpoint whose header and payload CRC32C check, then replays the journal frames that form a
//! chain (consecutive sequence numbers, each frame linked to its predecessor's header CRC): every
//! frame up to the last *hard* one, and after it the *soft* frames written in the epoch `open` is
//! given (same boot: the process crashed, the page cache held them); soft frames of another epoch
//! are a torn tail (a power cut; they may have survived only in part, or out of order). The first
//! frame that fails its CRC ends the journal if it is a torn tail; if an intact hard frame of a
//! later commit lies after it, an acknowledged record was damaged (a hard commit flushes
//! everything before it) and `open` refuses with [`Corruption::JournalGap`] rather than mount
//! without it. Intact soft frames after a damaged one prove nothing and are dropped. `open` then
//! discards the journal past the tail, seals a trusted soft tail with a hard commit and flushes,
//! so what the reopened pool shows survives a power cut right after. No byte is used before its
//! CRC is checked, and every decoded table is cross-checked before use. Frame layout and rules:
//! the `journal` module.
//!
//! # Format version and features
//!
//! A pool without features is on-media version 3 ([`VERSION`]); one with any of the
//! [`feature`] sets' bits is version 4 ([`VERSION_FEATURES`]), which version-3 builds refuse by its
//! version. [`Pool::open_with`] refuses a version outside [`OLDEST_VERSION`]..=[`VERSION_FEATURES`]
//! or an incompatible feature this build lacks (`Error::Unsupported`, nothing written), and mounts
//! the pool read-only for a read-only-compatible one it lacks ([`Pool::read_only`],
//! `Error::ReadOnly` for every change). Only [`Pool::enable_feature`] sets a feature; when a
//! caller may do so (never while older firmware may still need to read the pool) is its call.
//!
//! # Limits
//!
//! See [`limits`]: hitting a count limit is `Error::ResourceExhausted`. The metadata area is sized
//! at format ([`FormatOptions`]); operations that grow the tables are refused with
//! `ResourceExhausted(Limit::Metadata)` once the last checkpoint estimate passes half a slot, so
//! deletions always stay possible.
//!
//! Benchmarks: `core/BENCHMARKS.md`.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

extern crate alloc;

mod changed;
mod checkpoint;
mod cluster;
mod cluster_map;
mod control;
mod crc;
pub mod device;
mod error;
pub mod feature;
mod format;
mod group;
mod group_commit;
mod id;
mod journal;
pub mod limits;
mod map;
mod pool;
mod ram;
mod record;
mod snapshot;
mod state;
mod superblock;
mod volume;

pub use crate::changed::{ClusterRun, ClusterRuns};
pub use crate::cluster::Capacity;
pub use crc::{crc32c, crc32c_append};
pub use device::{BlockDevice, DeviceError, DeviceErrorKind, ErrorType};
pub use error::{Corruption, Error, Field, Limit, ObjectRef, Precondition, Problem, Range, Result, Unsupported};
pub use feature::{Feature, FeatureSet, Features};
pub use format::{Progress, DISCARD_CHUNK_MAX};
pub use group::{Group, GroupSnapshot};
pub use group_commit::CommitTicket;
pub use id::{GroupId, GroupSnapshotId, ImageId, SnapshotId, VolumeId};
pub use map::{IoTicket, Prepare, Quiesce, ReadMap, ReadSegment, WriteSegment};
pub use pool::{Epoch, FormatOptions, OpenOptions, PersistTicket, Pool};
pub use ram::RamDevice;
pub use snapshot::Snapshot;
pub use superblock::{OLDEST_VERSION, VERSION, VERSION_FEATURES};
pub use volume::{AccessMode, AccessModes, ContentSource, Provisioning, Publication, Volume, VolumeSpec};

/// Entry points for `fuzz/`: the decoders behind the CRCs, which a fuzzer cannot reach through
/// `Pool::open` because it cannot forge checksums. Not API.
#[doc(hidden)]
pub mod fuzzing {
    /// Decodes `bytes` as checkpoint tables and as a journal payload, validating what decodes the
    /// way `Pool::open` does. Must never panic.
    pub fn decode_metadata(bytes: &[u8]) {
        if let Ok(tables) = postcard::from_bytes::<crate::state::Tables>(bytes) {
            let _ = crate::state::State::load(tables, 64, 4096);
        }
        let Some(mut state) = crate::state::State::load(crate::state::Tables::default(), 64, 4096) else {
            return;
        };
        let mut rest = bytes;
        while let Ok((rec, tail)) = postcard::take_from_bytes::<crate::record::Record>(rest) {
            if state.validate(&rec).is_ok() {
                state.apply(rec);
                state.alloc.release_pending();
            }
            rest = tail;
        }
    }
}
