//! Snapshots of replicated volumes: one snapshot per leg, created, listed and shown as one
//! snapshot whose id joins the legs' ids.

use edgevol_driver::fleet::{join_legs, LEG_NAME_SUFFIX};
use edgevol_proto::csi::v1::*;
use http::Response;
use tonic::Status;

use crate::fleet_replica_calls::leg_status;
use crate::fleet_replicas::{offered, MAX_NAME};
use crate::fleet_router::Fleet;
use crate::grpc_unary::{reply, Buffered, ProxyBody};

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
        let answers = self
            .on_every_leg::<_, CreateSnapshotResponse>(b, id, |leg| CreateSnapshotRequest {
                source_volume_id: leg.to_owned(),
                name: name.clone(),
                ..r.clone()
            })
            .await?;
        let snaps: Vec<Snapshot> = answers.into_iter().filter_map(|a| a.snapshot).collect();
        Ok(reply(&CreateSnapshotResponse {
            snapshot: Some(merge_snapshots(&snaps, id)),
        }))
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
