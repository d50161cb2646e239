//! Calls on a replicated volume or snapshot, done on every leg: each leg's appliance, the
//! dispatch by method, and the calls whose answers merge the legs' (publish, validate, get).

use std::collections::{BTreeSet, HashMap};

use edgevol_driver::fleet::{
    join_legs, leg_key, legs, LegMark, LEG_VOLUME_ID, REPLICAS, REPLICAS_PARAM,
};
use edgevol_proto::csi::v1::controller_get_volume_response::VolumeStatus;
use edgevol_proto::csi::v1::*;
use http::Response;
use prost::Message;
use tonic::{Code, Status};

use crate::fleet_metadata::{GET_METADATA_ALLOCATED, GET_METADATA_DELTA};
use crate::fleet_replica_snapshots::merge_snapshots;
use crate::fleet_replicas::{leg_range, offered, replicated_context, topology_of};
use crate::fleet_router::{Fleet, GET_SNAPSHOT};
use crate::grpc_unary::{reply, Buffered, ProxyBody};

impl Fleet {
    /// The appliance index of each leg of `id`, or NOT_FOUND naming the leg of no appliance.
    pub(crate) fn leg_homes(&self, id: &str) -> Result<Vec<(String, usize)>, Status> {
        legs(id)
            .map(|leg| {
                self.owner(leg).map(|i| (leg.to_owned(), i)).ok_or_else(|| {
                    Status::not_found(format!("{id}: leg {leg} names no appliance of this driver"))
                })
            })
            .collect()
    }

    /// A unary call on every leg of `id`, the request made for each by `make`; the answers in
    /// leg order, or the first leg's failure (naming the leg).
    pub(crate) async fn on_every_leg<Req: Message, Resp: Message + Default>(
        &self,
        b: &Buffered,
        id: &str,
        make: impl Fn(&str) -> Req,
    ) -> Result<Vec<Resp>, Status> {
        let mut out = Vec::new();
        for (leg, i) in self.leg_homes(id)? {
            let m = &self.members[i];
            let answer = m
                .call::<Resp>(b.with_message(&make(&leg)))
                .await
                .map_err(|s| leg_status(&s, &leg, m.id()))?;
            out.push(answer);
        }
        Ok(out)
    }

    /// A call on a replicated volume or snapshot `id`: done on every leg.
    pub(crate) async fn replicated(
        &self,
        path: &str,
        b: &Buffered,
        id: &str,
    ) -> Result<Response<ProxyBody>, Status> {
        match path {
            "/csi.v1.Controller/DeleteVolume" => {
                let r: DeleteVolumeRequest = b.message()?;
                self.delete_legs(b, id, |leg| DeleteVolumeRequest {
                    volume_id: leg.to_owned(),
                    ..r.clone()
                })
                .await?;
                Ok(reply(&DeleteVolumeResponse {}))
            }
            "/csi.v1.Controller/DeleteSnapshot" => {
                let r: DeleteSnapshotRequest = b.message()?;
                self.delete_legs(b, id, |leg| DeleteSnapshotRequest {
                    snapshot_id: leg.to_owned(),
                    ..r.clone()
                })
                .await?;
                Ok(reply(&DeleteSnapshotResponse {}))
            }
            "/csi.v1.Controller/ControllerPublishVolume" => self.publish(b, id).await,
            "/csi.v1.Controller/ControllerUnpublishVolume" => {
                let r: ControllerUnpublishVolumeRequest = b.message()?;
                // Last leg first (publish goes first leg first): while any leg is published to a
                // node, so is leg 0, and the last leg is published only once every leg is —
                // which is what ListVolumes reports.
                for (leg, i) in self.leg_homes(id)?.into_iter().rev() {
                    let m = &self.members[i];
                    let req = ControllerUnpublishVolumeRequest {
                        volume_id: leg.clone(),
                        ..r.clone()
                    };
                    m.call::<ControllerUnpublishVolumeResponse>(b.with_message(&req))
                        .await
                        .map_err(|s| leg_status(&s, &leg, m.id()))?;
                }
                Ok(reply(&ControllerUnpublishVolumeResponse {}))
            }
            "/csi.v1.Controller/ValidateVolumeCapabilities" => self.validate(b, id).await,
            "/csi.v1.Controller/ControllerExpandVolume" => {
                let r: ControllerExpandVolumeRequest = b.message()?;
                let range = leg_range(r.capacity_range.as_ref(), false)?;
                let answers = self
                    .on_every_leg::<_, ControllerExpandVolumeResponse>(b, id, |leg| {
                        ControllerExpandVolumeRequest {
                            volume_id: leg.to_owned(),
                            capacity_range: range,
                            ..r.clone()
                        }
                    })
                    .await?;
                Ok(reply(&ControllerExpandVolumeResponse {
                    capacity_bytes: offered(answers.iter().map(|a| a.capacity_bytes)),
                    // md, then the filesystem, grow on the node.
                    node_expansion_required: true,
                }))
            }
            "/csi.v1.Controller/ControllerModifyVolume" => {
                let r: ControllerModifyVolumeRequest = b.message()?;
                self.on_every_leg::<_, ControllerModifyVolumeResponse>(b, id, |leg| {
                    ControllerModifyVolumeRequest {
                        volume_id: leg.to_owned(),
                        ..r.clone()
                    }
                })
                .await?;
                Ok(reply(&ControllerModifyVolumeResponse {}))
            }
            "/csi.v1.Controller/ControllerGetVolume" => self.get_volume(b, id).await,
            GET_SNAPSHOT => {
                let r: GetSnapshotRequest = b.message()?;
                let answers = self
                    .on_every_leg::<_, GetSnapshotResponse>(b, id, |leg| GetSnapshotRequest {
                        snapshot_id: leg.to_owned(),
                        ..r.clone()
                    })
                    .await?;
                let snaps: Vec<Snapshot> = answers.into_iter().filter_map(|a| a.snapshot).collect();
                let source = join_legs(snaps.iter().map(|s| s.source_volume_id.as_str()));
                Ok(reply(&GetSnapshotResponse {
                    snapshot: Some(merge_snapshots(&snaps, &source)),
                }))
            }
            "/csi.v1.Controller/CreateSnapshot" => self.snapshot(b, id).await,
            "/csi.v1.Controller/ListSnapshots" => self.list_snapshot(b, id).await,
            GET_METADATA_ALLOCATED | GET_METADATA_DELTA => {
                self.replicated_metadata(path, b, id).await
            }
            _ => Err(Status::invalid_argument(format!(
                "{id} is a replicated volume or snapshot, which {path} does not take"
            ))),
        }
    }

    /// Deletes every leg; a leg already gone (or of an appliance no longer served) is deleted.
    async fn delete_legs<Req: Message>(
        &self,
        b: &Buffered,
        id: &str,
        make: impl Fn(&str) -> Req,
    ) -> Result<(), Status> {
        for leg in legs(id) {
            let Some(i) = self.owner(leg) else { continue };
            let m = &self.members[i];
            let resp = m.forward(b.with_message(&make(leg))).await;
            let done = match resp {
                Ok(resp) => crate::grpc_unary::answer::<()>(resp).await,
                Err(s) => Err(s),
            };
            done.map_err(|s| leg_status(&s, leg, m.id()))?;
        }
        Ok(())
    }

    async fn publish(&self, b: &Buffered, id: &str) -> Result<Response<ProxyBody>, Status> {
        let r: ControllerPublishVolumeRequest = b.message()?;
        let mut context = r.volume_context.clone();
        context.remove(REPLICAS);
        let leg_ids: Vec<&str> = legs(id).collect();
        let answers = self
            .on_every_leg::<_, ControllerPublishVolumeResponse>(b, id, |leg| {
                ControllerPublishVolumeRequest {
                    volume_id: leg.to_owned(),
                    volume_context: context.clone(),
                    ..r.clone()
                }
            })
            .await?;
        let mut publish_context = HashMap::from([(REPLICAS.to_owned(), answers.len().to_string())]);
        for (i, (answer, leg)) in answers.into_iter().zip(leg_ids).enumerate() {
            for (k, v) in answer.publish_context {
                publish_context.insert(leg_key(i, &k), v);
            }
            publish_context.insert(leg_key(i, LEG_VOLUME_ID), leg.to_owned());
        }
        Ok(reply(&ControllerPublishVolumeResponse { publish_context }))
    }

    async fn validate(&self, b: &Buffered, id: &str) -> Result<Response<ProxyBody>, Status> {
        let r: ValidateVolumeCapabilitiesRequest = b.message()?;
        let mut parameters = r.parameters.clone();
        parameters.remove(REPLICAS_PARAM);
        let mut context = r.volume_context.clone();
        context.remove(REPLICAS);
        let leg_ids: Vec<&str> = legs(id).collect();
        let answers = self
            .on_every_leg::<_, ValidateVolumeCapabilitiesResponse>(b, id, |leg| {
                // Each leg was created with its marking besides the class's parameters.
                let mut parameters = parameters.clone();
                if !parameters.is_empty() {
                    let index = leg_ids.iter().position(|l| *l == leg).unwrap_or(0);
                    parameters
                        .extend(LegMark::new(index, leg_ids.len(), &leg_ids[..index]).params());
                }
                ValidateVolumeCapabilitiesRequest {
                    volume_id: leg.to_owned(),
                    parameters,
                    volume_context: context.clone(),
                    ..r.clone()
                }
            })
            .await?;
        // Confirmed only when every leg confirms; then with what the request gave.
        let mut out = answers
            .iter()
            .find(|a| a.confirmed.is_none())
            .cloned()
            .unwrap_or_else(|| answers[0].clone());
        if let Some(c) = out.confirmed.as_mut() {
            c.volume_context = r.volume_context.clone();
            c.parameters = r.parameters.clone();
        }
        Ok(reply(&out))
    }

    async fn get_volume(&self, b: &Buffered, id: &str) -> Result<Response<ProxyBody>, Status> {
        let homes = self.leg_homes(id)?;
        let ids = self.ids();
        let mut answered: Vec<ControllerGetVolumeResponse> = Vec::new();
        let mut troubles = Vec::new();
        let mut not_found = 0;
        for (leg, i) in &homes {
            let m = &self.members[*i];
            let req = ControllerGetVolumeRequest {
                volume_id: leg.clone(),
            };
            match m
                .call::<ControllerGetVolumeResponse>(b.with_message(&req))
                .await
            {
                Ok(a) => {
                    if let Some(c) = a
                        .status
                        .as_ref()
                        .and_then(|s| s.volume_condition.as_ref())
                        .filter(|c| c.abnormal)
                    {
                        troubles.push(format!("leg {leg} on {}: {}", m.id(), c.message));
                    }
                    answered.push(a);
                }
                Err(s) if s.code() == Code::NotFound => {
                    not_found += 1;
                    troubles.push(format!("leg {leg} on {}: missing", m.id()));
                }
                Err(s) if s.code() == Code::Unavailable => {
                    troubles.push(format!("leg {leg} on {}: unreachable", m.id()));
                }
                Err(s) => return Err(leg_status(&s, leg, m.id())),
            }
        }
        let Some(last) = answered.last() else {
            return Err(if not_found == homes.len() {
                Status::not_found(format!("volume {id} does not exist"))
            } else {
                Status::unavailable(format!("volume {id}: {}", troubles.join("; ")))
            });
        };
        let mut volume = last.volume.clone().unwrap_or_default();
        volume.volume_id = id.to_owned();
        volume.capacity_bytes = offered(
            answered
                .iter()
                .filter_map(|a| a.volume.as_ref().map(|v| v.capacity_bytes)),
        );
        volume.volume_context = replicated_context(&volume.volume_context, homes.len());
        volume.content_source = None;
        let boxes: Vec<&str> = homes.iter().map(|(_, i)| ids[*i]).collect();
        volume.accessible_topology = topology_of(&boxes);
        // Published where every leg that answered is published.
        let mut nodes: Option<BTreeSet<String>> = None;
        for a in &answered {
            let these: BTreeSet<String> = a
                .status
                .as_ref()
                .map(|s| s.published_node_ids.iter().cloned().collect())
                .unwrap_or_default();
            nodes = Some(match nodes {
                None => these,
                Some(n) => n.intersection(&these).cloned().collect(),
            });
        }
        let condition = VolumeCondition {
            abnormal: !troubles.is_empty(),
            message: if troubles.is_empty() {
                format!("all {} legs healthy", homes.len())
            } else {
                format!("degraded: {}", troubles.join("; "))
            },
        };
        Ok(reply(&ControllerGetVolumeResponse {
            volume: Some(volume),
            status: Some(VolumeStatus {
                published_node_ids: nodes.unwrap_or_default().into_iter().collect(),
                volume_condition: Some(condition),
            }),
        }))
    }
}

/// A leg's failure, its code kept and the leg and appliance named.
pub(crate) fn leg_status(s: &Status, leg: &str, appliance: &str) -> Status {
    Status::new(
        s.code(),
        format!("leg {leg} on appliance {appliance}: {}", s.message()),
    )
}
