//! Changed-block tracking (the SnapshotMetadata service) of replicated snapshots.
//!
//! Every leg of a replicated volume holds the volume's data [`MD_DATA_OFFSET_BYTES`] into it,
//! md's superblock and write-intent bitmap before that, so any one leg answers for the volume:
//! the first whose appliance can be reached, with `starting_offset` moved forward by the
//! offset and the streamed ranges and `volume_capacity_bytes` moved back by it. Ranges wholly
//! inside md's area are left out (md rewrites its bitmap all the time: no change of the
//! volume); a message left with no range is not sent, as an appliance sends none for a
//! snapshot with nothing allocated. The stream is translated message by message as it comes,
//! so the proxy holds at most one message of it.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use edgevol_driver::fleet::MD_DATA_OFFSET_BYTES;
use edgevol_proto::csi::v1::{
    BlockMetadata, GetMetadataAllocatedRequest, GetMetadataAllocatedResponse,
    GetMetadataDeltaRequest, GetMetadataDeltaResponse,
};
use http::{HeaderMap, HeaderValue, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use prost::Message;
use tonic::{Code, Status};

use crate::fleet_router::Fleet;
use crate::grpc_unary::{frame, Buffered, ProxyBody};

/// GetMetadataAllocated's method path.
pub(crate) const GET_METADATA_ALLOCATED: &str = "/csi.v1.SnapshotMetadata/GetMetadataAllocated";
/// GetMetadataDelta's method path.
pub(crate) const GET_METADATA_DELTA: &str = "/csi.v1.SnapshotMetadata/GetMetadataDelta";

fn md_offset() -> i64 {
    i64::try_from(MD_DATA_OFFSET_BYTES).unwrap_or(i64::MAX)
}

/// A volume offset as the leg's: negative ones stay, for the appliance to refuse as they are.
fn leg_offset(volume_offset: i64) -> i64 {
    if volume_offset < 0 {
        volume_offset
    } else {
        volume_offset.saturating_add(md_offset())
    }
}

/// A leg's ranges as the volume's: moved back by md's offset, cut at its start, those wholly
/// inside md's area left out.
fn volume_ranges(ranges: Vec<BlockMetadata>) -> Vec<BlockMetadata> {
    let md = md_offset();
    ranges
        .into_iter()
        .filter_map(|b| {
            let end = b.byte_offset.saturating_add(b.size_bytes);
            let start = b.byte_offset.max(md);
            (end > start).then(|| BlockMetadata {
                byte_offset: start - md,
                size_bytes: end - start,
            })
        })
        .collect()
}

/// A streamed answer as the volume's, or None when no range is left in it.
trait LegAnswer: Message + Default + Send + 'static {
    fn for_volume(self) -> Option<Self>;
}

impl LegAnswer for GetMetadataAllocatedResponse {
    fn for_volume(self) -> Option<Self> {
        let block_metadata = volume_ranges(self.block_metadata);
        (!block_metadata.is_empty()).then(|| GetMetadataAllocatedResponse {
            volume_capacity_bytes: self.volume_capacity_bytes - md_offset(),
            block_metadata,
            ..self
        })
    }
}

impl LegAnswer for GetMetadataDeltaResponse {
    fn for_volume(self) -> Option<Self> {
        let block_metadata = volume_ranges(self.block_metadata);
        (!block_metadata.is_empty()).then(|| GetMetadataDeltaResponse {
            volume_capacity_bytes: self.volume_capacity_bytes - md_offset(),
            block_metadata,
            ..self
        })
    }
}

/// A leg's response body, each gRPC message translated as it completes; the trailers (the
/// appliance's status) passed on, or an INTERNAL status when the stream cannot be read.
struct Translated<M> {
    inner: Incoming,
    buf: BytesMut,
    out: VecDeque<Frame<Bytes>>,
    done: bool,
    answer: PhantomData<fn() -> M>,
}

impl<M: LegAnswer> Translated<M> {
    /// The complete messages in `buf`, translated, queued as frames.
    fn drain(&mut self) -> Result<(), Status> {
        while self.buf.len() >= 5 {
            if self.buf[0] != 0 {
                return Err(Status::internal(
                    "edgevol proxy: compressed messages are not supported with several appliances",
                ));
            }
            let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            if self.buf.len() - 5 < len {
                break;
            }
            self.buf.advance(5);
            let message = self.buf.split_to(len);
            let answer = M::decode(message.freeze())
                .map_err(|e| Status::internal(format!("edgevol proxy: a leg's answer: {e}")))?;
            if let Some(answer) = answer.for_volume() {
                self.out.push_back(Frame::data(frame(&answer)));
            }
        }
        Ok(())
    }

    /// Ends the stream with `status` in its trailers.
    fn fail(&mut self, status: &Status) {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from(status.code() as i32));
        if let Ok(message) = HeaderValue::from_str(status.message()) {
            trailers.insert("grpc-message", message);
        }
        self.out.push_back(Frame::trailers(trailers));
        self.done = true;
    }
}

impl<M: LegAnswer> Body for Translated<M> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(f) = this.out.pop_front() {
                return Poll::Ready(Some(Ok(f)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(f)) => match f.into_data() {
                    Ok(data) => {
                        this.buf.extend_from_slice(&data);
                        if let Err(status) = this.drain() {
                            this.fail(&status);
                        }
                    }
                    Err(trailers) if this.buf.is_empty() => this.out.push_back(trailers),
                    Err(_) => this.fail(&Status::internal(
                        "edgevol proxy: a leg's answer ended inside a message",
                    )),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None if this.buf.is_empty() => this.done = true,
                None => this.fail(&Status::internal(
                    "edgevol proxy: a leg's answer ended inside a message",
                )),
            }
        }
    }
}

fn translated<M: LegAnswer>(resp: Response<Incoming>) -> Response<ProxyBody> {
    resp.map(|inner| {
        Translated::<M> {
            inner,
            buf: BytesMut::new(),
            out: VecDeque::new(),
            done: false,
            answer: PhantomData,
        }
        .boxed()
    })
}

impl Fleet {
    /// GetMetadataAllocated or GetMetadataDelta of replicated snapshot `id` (the target of a
    /// delta): asked of the first reachable leg, its answer translated to the volume's offsets.
    pub(crate) async fn replicated_metadata(
        &self,
        path: &str,
        b: &Buffered,
        id: &str,
    ) -> Result<Response<ProxyBody>, Status> {
        let targets = self.leg_homes(id)?;
        // Each leg request, with the appliance it goes to, in leg order.
        let mut calls = Vec::new();
        if path == GET_METADATA_DELTA {
            let r: GetMetadataDeltaRequest = b.message()?;
            let bases = self.leg_homes(&r.base_snapshot_id)?;
            // Snapshots of one replicated volume have a leg on each of its legs' appliances,
            // in the same order.
            let homes = |legs: &[(String, usize)]| legs.iter().map(|l| l.1).collect::<Vec<_>>();
            if homes(&bases) != homes(&targets) {
                return Err(Status::invalid_argument(format!(
                    "base snapshot {} and target snapshot {id} are snapshots of different volumes",
                    r.base_snapshot_id
                )));
            }
            for ((base, _), (target, i)) in bases.into_iter().zip(targets) {
                let leg = GetMetadataDeltaRequest {
                    base_snapshot_id: base,
                    target_snapshot_id: target.clone(),
                    starting_offset: leg_offset(r.starting_offset),
                    ..r.clone()
                };
                calls.push((target, i, b.with_message(&leg)));
            }
        } else {
            let r: GetMetadataAllocatedRequest = b.message()?;
            for (target, i) in targets {
                let leg = GetMetadataAllocatedRequest {
                    snapshot_id: target.clone(),
                    starting_offset: leg_offset(r.starting_offset),
                    ..r.clone()
                };
                calls.push((target, i, b.with_message(&leg)));
            }
        }
        let order = self.reachable_first(calls.iter().map(|c| c.1).collect());
        let mut failed = Vec::new();
        for i in order {
            let Some(at) = calls.iter().position(|c| c.1 == i) else {
                continue;
            };
            let (leg, _, req) = calls.swap_remove(at);
            match self.members[i].forward(req).await {
                Ok(resp) if path == GET_METADATA_DELTA => {
                    return Ok(translated::<GetMetadataDeltaResponse>(resp))
                }
                Ok(resp) => return Ok(translated::<GetMetadataAllocatedResponse>(resp)),
                Err(s) if s.code() == Code::Unavailable => {
                    failed.push(format!(
                        "leg {leg} on appliance {}: {}",
                        self.members[i].id(),
                        s.message()
                    ));
                }
                Err(s) => return Err(s),
            }
        }
        Err(Status::unavailable(format!(
            "edgevol proxy: no leg of {id} could be reached: {}",
            failed.join("; ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: i64 = 1 << 20;

    fn range(byte_offset: i64, size_bytes: i64) -> BlockMetadata {
        BlockMetadata {
            byte_offset,
            size_bytes,
        }
    }

    #[test]
    fn leg_ranges_move_back_past_md_and_md_alone_is_left_out() {
        let got = volume_ranges(vec![
            range(0, MIB),
            range(MIB / 2, MIB),
            range(MIB, 3 * MIB),
            range(9 * MIB, MIB),
        ]);
        assert_eq!(
            got,
            [range(0, MIB / 2), range(0, 3 * MIB), range(8 * MIB, MIB)]
        );
        assert_eq!(leg_offset(0), MIB);
        assert_eq!(leg_offset(5 * MIB), 6 * MIB);
        assert_eq!(leg_offset(-1), -1, "refused by the appliance as sent");
        let only_md = GetMetadataDeltaResponse {
            volume_capacity_bytes: 17 * MIB,
            block_metadata: vec![range(0, MIB)],
            ..Default::default()
        };
        assert_eq!(
            only_md.for_volume(),
            None,
            "a message with no range left is not sent"
        );
    }
}
