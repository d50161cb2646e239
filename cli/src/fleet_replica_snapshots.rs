//! Snapshots of replicated volumes: one snapshot per leg, created, listed and shown as one
//! snapshot whose id joins the legs' ids.

use edgevol_driver::fleet::{join_legs, LEG_NAME_SUFFIX};
use edgevol_proto::csi::v1::*;
use http::Response;
use tonic::Status;

use crate::fleet_replica_calls::leg_status;
use crate::fleet_replicas::{offered, refused_for_good, MAX_NAME};
use crate::fleet_router::Fleet;
use crate::grpc_unary::{reply, request, Buffered, ProxyBody};

impl Fleet {
    pub(crate) async fn snapshot(
        &self,
        b: &Buffered,
        id: &str,
    ) -> Result<Response<ProxyBody>, Status> {
        let r: CreateSnapshotRequest = b.message()?;
        if r.name.len() + LEG_NAME_SUFFIX.len() > MAX_NAME {
            return Err(Status::invalid_argument(format!(
                "name is {} bytes; a replicated snapshot's may have at most {}",
                r.name.len(),
                MAX_NAME - LEG_NAME_SUFFIX.len()
            )));
        }
        let name = if r.name.is_empty() {
            String::new() // INVALID_ARGUMENT from the first leg's appliance
        } else {
            format!("{}{LEG_NAME_SUFFIX}", r.name)
        };
        let mut made: Vec<(usize, Snapshot)> = Vec::new();
        for (leg, i) in self.leg_homes(id)? {
            let m = &self.members[i];
            let req = CreateSnapshotRequest {
                source_volume_id: leg.clone(),
                name: name.clone(),
                ..r.clone()
            };
            match m.call::<CreateSnapshotResponse>(b.with_message(&req)).await {
                Ok(a) => made.extend(a.snapshot.map(|s| (i, s))),
                Err(s) => {
                    let refused = leg_status(&s, &leg, m.id());
                    return Err(self.undo_refused_snapshot(&r, &made, refused).await);
                }
            }
        }
        let snaps: Vec<Snapshot> = made.into_iter().map(|(_, s)| s).collect();
        Ok(reply(&CreateSnapshotResponse {
            snapshot: Some(merge_snapshots(&snaps, id)),
        }))
    }

    /// `refused`, a later leg's answer to CreateSnapshot `r`, after the leg snapshots `made`
    /// before it are deleted when the refusal is for good ([`refused_for_good`]): kept, they
    /// would be hidden (ListSnapshots shows only whole replicated snapshots), have no id the CO
    /// could delete, and stand in the way of the name. A leg snapshot is of its leg volume,
    /// which is this replicated volume's alone, so a snapshot of the name the CO was answered
    /// would have been answered again by the refusing leg's appliance too: the legs made here
    /// belong to no snapshot the CO has. A transient refusal (RESOURCE_EXHAUSTED, UNAVAILABLE)
    /// keeps them: the retry finds them by name and completes the snapshot.
    async fn undo_refused_snapshot(
        &self,
        r: &CreateSnapshotRequest,
        made: &[(usize, Snapshot)],
        refused: Status,
    ) -> Status {
        if !refused_for_good(refused.code()) || made.is_empty() {
            return refused;
        }
        let mut left = Vec::new();
        for (i, s) in made.iter().rev() {
            let m = &self.members[*i];
            let req = DeleteSnapshotRequest {
                snapshot_id: s.snapshot_id.clone(),
                secrets: r.secrets.clone(),
            };
            match m
                .call::<DeleteSnapshotResponse>(request("/csi.v1.Controller/DeleteSnapshot", &req))
                .await
            {
                Ok(_) => {
                    tracing::info!(leg = %s.snapshot_id, appliance = %m.id(), "leg snapshot deleted: a later leg was refused for good");
                }
                Err(e) => left.push(leg_status(&e, &s.snapshot_id, m.id()).message().to_owned()),
            }
        }
        let said = if left.is_empty() {
            let removed: Vec<&str> = made.iter().map(|(_, s)| s.snapshot_id.as_str()).collect();
            format!(
                "the leg snapshots made before it were deleted: {}",
                removed.join(", ")
            )
        } else {
            format!(
                "and leg snapshots made before it could not be deleted: {}",
                left.join("; ")
            )
        };
        Status::new(refused.code(), format!("{} ({said})", refused.message()))
    }

    pub(crate) async fn list_snapshot(
        &self,
        b: &Buffered,
        id: &str,
    ) -> Result<Response<ProxyBody>, Status> {
        let r: ListSnapshotsRequest = b.message()?;
        if r.snapshot_id != id {
            return Err(Status::invalid_argument(format!(
                "listing the snapshots of replicated volume {id} is not supported; list by \
                 snapshot_id or unfiltered"
            )));
        }
        let Ok(homes) = self.leg_homes(id) else {
            return Ok(reply(&ListSnapshotsResponse::default()));
        };
        let mut snaps = Vec::new();
        for (leg, i) in homes {
            let m = &self.members[i];
            let req = ListSnapshotsRequest {
                snapshot_id: leg.clone(),
                source_volume_id: String::new(),
                max_entries: 0,
                starting_token: String::new(),
                ..r.clone()
            };
            let answer = m
                .call::<ListSnapshotsResponse>(b.with_message(&req))
                .await
                .map_err(|s| leg_status(&s, &leg, m.id()))?;
            match answer.entries.into_iter().find_map(|e| e.snapshot) {
                Some(s) => snaps.push(s),
                // A leg gone: the snapshot is not there as a whole.
                None => return Ok(reply(&ListSnapshotsResponse::default())),
            }
        }
        let source = join_legs(snaps.iter().map(|s| s.source_volume_id.as_str()));
        Ok(reply(&ListSnapshotsResponse {
            entries: vec![list_snapshots_response::Entry {
                snapshot: Some(merge_snapshots(&snaps, &source)),
            }],
            next_token: String::new(),
        }))
    }
}

/// One replicated snapshot from its legs' snapshots, of the volume `source`.
pub(crate) fn merge_snapshots(legs_: &[Snapshot], source: &str) -> Snapshot {
    Snapshot {
        size_bytes: offered(legs_.iter().map(|s| s.size_bytes)),
        snapshot_id: join_legs(legs_.iter().map(|s| s.snapshot_id.as_str())),
        source_volume_id: source.to_owned(),
        creation_time: legs_
            .iter()
            .filter_map(|s| s.creation_time)
            .max_by_key(|t| (t.seconds, t.nanos)),
        ready_to_use: legs_.iter().all(|s| s.ready_to_use),
        group_snapshot_id: String::new(),
    }
}
