//! CSI SnapshotMetadata: the allocated ranges of a snapshot, and the ranges that may differ
//! between two snapshots of one volume, answered from core's cluster maps without reading data
//! (changed-block tracking for backup tools, through Kubernetes' external-snapshot-metadata
//! sidecar).
//!
//! What we answer, where the spec leaves us a choice:
//! - **VARIABLE_LENGTH** ranges: consecutive clusters are joined into one range, so a
//!   sequentially written volume is a handful of ranges (fewer messages than one FIXED_LENGTH
//!   range per cluster), and each range is exactly the clusters it names.
//! - **Allocated** means mapped when the snapshot was taken: written and not deallocated since.
//!   A hole (never written, or deallocated by Deallocate or Write Zeroes) is not allocated; a
//!   cluster written with zeros is.
//! - **Delta** means mapped differently in the two snapshots: written (copy-on-write gives a new
//!   cluster), deallocated in the target where the base had data (a change: it now reads as
//!   zeros), or written past the base's end after an expansion. A hole in both is no change. A
//!   cluster rewritten with identical bytes is reported as changed: we never read data, so the
//!   answer is a superset of the changed bytes, exact to the cluster otherwise.
//! - Ranges are whole clusters ([`edgevol_core::Pool::cluster_size`]), in ascending order; the
//!   first is cut to `starting_offset` if it starts before it, so resuming at the end of the
//!   last range received gives exactly the rest. `volume_capacity_bytes` is the target's size.
//! - `max_results` 0 means [`metadata_stream::DEFAULT_MAX_RESULTS`] ranges per message; more
//!   than [`metadata_stream::MAX_RESULTS_CAP`] are cut to it (the spec lets a plugin send fewer).
//!
//! Errors (the spec's tables): no id, negative `max_results`: INVALID_ARGUMENT; unknown
//! snapshot: NOT_FOUND; base and target of different volumes: INVALID_ARGUMENT; a base taken
//! after its target: FAILED_PRECONDITION; `starting_offset` negative or past the volume's end:
//! OUT_OF_RANGE. Memory and lock holds per stream: [`metadata_stream`].

use std::pin::Pin;
use std::sync::Arc;

use edgevol_core::Pool;
use edgevol_proto::csi::v1::snapshot_metadata_server::SnapshotMetadata;
use edgevol_proto::csi::v1::{
    BlockMetadata, BlockMetadataType, GetMetadataAllocatedRequest, GetMetadataAllocatedResponse,
    GetMetadataDeltaRequest, GetMetadataDeltaResponse,
};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::encode::i64_of;
use super::error::Error;
use super::ids::Ids;
use super::metadata_stream::{self, Buffered, ByteRange, Shape, Walk};
use super::validate;
use crate::pool::PoolDevice;
use crate::state::State;

type Ranges<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The SnapshotMetadata service.
#[derive(Debug, Clone)]
pub struct SnapshotMetadataService {
    state: Arc<State>,
    buffered: Arc<Buffered>,
}

impl SnapshotMetadataService {
    /// Serves the snapshots of `state`'s pool.
    pub fn new(state: Arc<State>) -> Self {
        SnapshotMetadataService {
            state,
            buffered: Arc::default(),
        }
    }

    /// The most messages any of its streams has had produced and not yet counted off by the
    /// transport: bounded by [`metadata_stream::STREAM_DEPTH`], plus the one being sent, plus
    /// the one the transport has taken but not yet counted off.
    pub fn peak_buffered(&self) -> usize {
        self.buffered.peak()
    }
}

/// A validated request: the walk's ids as given, the offset, and ranges per message.
#[derive(Debug)]
struct Ask {
    base: Option<String>,
    snapshot: String,
    start: i64,
    max: usize,
}

fn max_results(n: i32) -> Result<usize, Status> {
    match usize::try_from(n) {
        Ok(0) => Ok(metadata_stream::DEFAULT_MAX_RESULTS),
        Ok(n) => Ok(n.min(metadata_stream::MAX_RESULTS_CAP)),
        Err(_) => Err(Status::invalid_argument(format!(
            "max_results is {n}; it must not be negative"
        ))),
    }
}

impl TryFrom<GetMetadataAllocatedRequest> for Ask {
    type Error = Status;

    fn try_from(r: GetMetadataAllocatedRequest) -> Result<Self, Status> {
        validate::required("snapshot_id", &r.snapshot_id)?;
        validate::secrets(&r.secrets)?;
        Ok(Ask {
            base: None,
            snapshot: r.snapshot_id,
            start: r.starting_offset,
            max: max_results(r.max_results)?,
        })
    }
}

impl TryFrom<GetMetadataDeltaRequest> for Ask {
    type Error = Status;

    fn try_from(r: GetMetadataDeltaRequest) -> Result<Self, Status> {
        validate::required("base_snapshot_id", &r.base_snapshot_id)?;
        validate::required("target_snapshot_id", &r.target_snapshot_id)?;
        validate::secrets(&r.secrets)?;
        Ok(Ask {
            base: Some(r.base_snapshot_id),
            snapshot: r.target_snapshot_id,
            start: r.starting_offset,
            max: max_results(r.max_results)?,
        })
    }
}

/// Checks the snapshots and the offset on the pool: what to walk, and how.
fn plan(state: &State, pool: &mut Pool<PoolDevice>, ask: &Ask) -> Result<(Walk, Shape), Error> {
    let ids = Ids::new(&state.appliance_id);
    let target = ids.require_snapshot(&ask.snapshot)?;
    let t = pool.snapshot(target)?;
    let (capacity, volume) = (t.size(), t.source_volume());
    let walk = match &ask.base {
        None => Walk::Allocated(target),
        Some(base) => {
            let base = ids.require_snapshot(base)?;
            if pool.snapshot(base)?.source_volume() != volume {
                return Err(Error::SnapshotsOfDifferentVolumes { base, target });
            }
            // Ids are handed out in creation order.
            if base.0 > target.0 {
                return Err(Error::BaseNewerThanTarget { base, target });
            }
            Walk::Delta { base, target }
        }
    };
    let start = u64::try_from(ask.start)
        .ok()
        .filter(|&s| s <= capacity)
        .ok_or(Error::OffsetOutOfRange {
            offset: ask.start,
            capacity,
        })?;
    let shape = Shape {
        cluster: u64::from(pool.cluster_size()),
        start,
        capacity,
        max: ask.max,
    };
    Ok((walk, shape))
}

fn blocks(ranges: Vec<ByteRange>) -> Vec<BlockMetadata> {
    ranges
        .into_iter()
        .map(|r| BlockMetadata {
            byte_offset: i64_of(r.offset),
            size_bytes: i64_of(r.len),
        })
        .collect()
}

impl SnapshotMetadataService {
    /// Plans `ask` (answered once durable, like every CSI call) and streams its ranges.
    async fn ranges<M, F>(&self, ask: Ask, message: F) -> Result<Ranges<M>, Status>
    where
        M: Send + 'static,
        F: Fn(u64, Vec<ByteRange>) -> M + Send + 'static,
    {
        let (walk, shape) =
            super::call(&self.state, move |state, pool| plan(state, pool, &ask)).await?;
        let capacity = shape.capacity;
        Ok(Box::pin(metadata_stream::stream(
            &self.state,
            walk,
            shape,
            self.buffered.clone(),
            move |ranges| message(capacity, ranges),
        )))
    }
}

#[tonic::async_trait]
impl SnapshotMetadata for SnapshotMetadataService {
    type GetMetadataAllocatedStream = Ranges<GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Ranges<GetMetadataDeltaResponse>;

    async fn get_metadata_allocated(
        &self,
        request: Request<GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let ask = Ask::try_from(request.into_inner())?;
        let stream = self
            .ranges(ask, |capacity, ranges| GetMetadataAllocatedResponse {
                block_metadata_type: BlockMetadataType::VariableLength as i32,
                volume_capacity_bytes: i64_of(capacity),
                block_metadata: blocks(ranges),
            })
            .await?;
        Ok(Response::new(stream))
    }

    async fn get_metadata_delta(
        &self,
        request: Request<GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let ask = Ask::try_from(request.into_inner())?;
        let stream = self
            .ranges(ask, |capacity, ranges| GetMetadataDeltaResponse {
                block_metadata_type: BlockMetadataType::VariableLength as i32,
                volume_capacity_bytes: i64_of(capacity),
                block_metadata: blocks(ranges),
            })
            .await?;
        Ok(Response::new(stream))
    }
}
