//! One CSI driver over several appliances: where each call goes.
//!
//! * Calls that name a volume, snapshot, group or group snapshot go to the appliance whose id
//!   the object's id carries (`box-7-v3` lives on `box-7`), request and answer untouched. An id
//!   of no appliance of this proxy (or an empty one) goes to any reachable appliance, which
//!   answers as CSI says for that call: NOT_FOUND for most, OK for the deletions,
//!   INVALID_ARGUMENT for a missing id.
//! * CreateVolume picks the appliance ([`crate::fleet_placement`]), tells it only the topology
//!   it checks, and adds `{appliance.edgevol.io/<id>: "true"}` to the volume's accessible
//!   topology for nodes that reach several appliances. An appliance that is down or full is
//!   passed over for the next one allowed. Before placing a plain volume it asks every allowed
//!   appliance at once, within [`SURVEY_DEADLINE`], whether it already holds the name (an
//!   earlier attempt whose answer was lost) and how much it has free: the holder's answer is
//!   the call's; else the boxes go by preference, then free space, then the name. When one of
//!   them does not answer, the name's order alone places the volume (free space ignored), the
//!   order every attempt without that box's answer repeats. A name is the driver's: the other
//!   appliances are asked at the same time, and one that holds the name answers the call
//!   ALREADY_EXISTS (the request cannot have that volume there); one of them that does not
//!   answer is passed over (logged). A clone or restore asks every appliance but its source's.
//!   A name is one volume's, plain or replicated: every appliance is also asked for the other
//!   kind (a plain volume of the name, or a replicated volume's leg `<name>+leg`), and one that
//!   holds it answers the call ALREADY_EXISTS; snapshots likewise.
//! * CreateSnapshot of a plain volume asks every other appliance the same (a snapshot of the
//!   name there is of another volume: ALREADY_EXISTS), then goes to the volume's appliance.
//! * A volume group is one appliance's: ModifyVolumeGroupMembership with a volume of another
//!   appliance (or a replicated one) is INVALID_ARGUMENT naming both appliances, not the
//!   NOT_FOUND the group's box alone would answer for a volume that exists; so is
//!   CreateVolumeGroupSnapshot of volumes on several appliances (or a replicated one).
//! * ListVolumes, ListSnapshots (unfiltered) and ListVolumeGroups page across appliances
//!   ([`crate::fleet_paging`]), ListVolumes showing each replicated volume once
//!   ([`crate::fleet_legs`]); an appliance that is down is left out of the listing (logged),
//!   so the others stay listable; only when none answers is the call UNAVAILABLE. Such calls
//!   skip an appliance they could not reach for [`SKIP_UNREACHABLE`].
//! * GetCapacity answers for the appliances the requested topology names (all when it names
//!   none): their free space summed, the largest volume any one of them can hold (for
//!   replicated volumes, see [`crate::fleet_replicas::capacity_of`]).
//! * Ids with several legs (`box-7-v3+box-8-v5`) and CreateVolume with `replicas` above 1 are
//!   replicated volumes ([`crate::fleet_replicas`]).
//! * Everything else (Identity, capabilities, streams of other services) goes untouched to the
//!   first appliance that can be reached: every appliance runs the same driver.
//!
//! Before its first call an appliance is asked its id (GetPluginInfo); one that is not the
//! appliance configured at that address serves nothing (UNAVAILABLE), so a swapped address can
//! never send a volume's calls to the wrong box.

use edgevol_proto::csi::v1::*;
use edgevol_proto::volumegroup::{
    ControllerGetVolumeGroupRequest, DeleteVolumeGroupRequest, ListVolumeGroupsRequest,
    ModifyVolumeGroupMembershipRequest,
};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tonic::{Code, Status};

use crate::fleet_paging::{self, Listing};
use crate::fleet_placement as placement;
use crate::fleet_replicas::{capacity_of, is_replicated, replicas_param};
use crate::grpc_unary::{refuse, reply, Buffered, ProxyBody};
use edgevol_driver::fleet::{legs, APPLIANCE_KEY, REPLICAS_PARAM};

pub use crate::fleet_create::SURVEY_DEADLINE;
pub use crate::fleet_member::{Member, SKIP_UNREACHABLE};

/// GetSnapshot (alpha in CSI 1.12).
pub(crate) const GET_SNAPSHOT: &str = "/csi.v1.Controller/GetSnapshot";

/// The calls routed by the id in their request, and that id.
fn routing_id(path: &str, b: &Buffered) -> Result<Option<String>, Status> {
    Ok(Some(match path {
        "/csi.v1.Controller/DeleteVolume" => b.message::<DeleteVolumeRequest>()?.volume_id,
        "/csi.v1.Controller/ControllerPublishVolume" => {
            b.message::<ControllerPublishVolumeRequest>()?.volume_id
        }
        "/csi.v1.Controller/ControllerUnpublishVolume" => {
            b.message::<ControllerUnpublishVolumeRequest>()?.volume_id
        }
        "/csi.v1.Controller/ValidateVolumeCapabilities" => {
            b.message::<ValidateVolumeCapabilitiesRequest>()?.volume_id
        }
        "/csi.v1.Controller/CreateSnapshot" => {
            b.message::<CreateSnapshotRequest>()?.source_volume_id
        }
        "/csi.v1.Controller/DeleteSnapshot" => b.message::<DeleteSnapshotRequest>()?.snapshot_id,
        "/csi.v1.Controller/ControllerExpandVolume" => {
            b.message::<ControllerExpandVolumeRequest>()?.volume_id
        }
        "/csi.v1.Controller/ControllerGetVolume" => {
            b.message::<ControllerGetVolumeRequest>()?.volume_id
        }
        GET_SNAPSHOT => b.message::<GetSnapshotRequest>()?.snapshot_id,
        "/csi.v1.Controller/ControllerModifyVolume" => {
            b.message::<ControllerModifyVolumeRequest>()?.volume_id
        }
        "/csi.v1.GroupController/CreateVolumeGroupSnapshot" => b
            .message::<CreateVolumeGroupSnapshotRequest>()?
            .source_volume_ids
            .into_iter()
            .next()
            .unwrap_or_default(),
        "/csi.v1.GroupController/DeleteVolumeGroupSnapshot" => {
            b.message::<DeleteVolumeGroupSnapshotRequest>()?
                .group_snapshot_id
        }
        "/csi.v1.GroupController/GetVolumeGroupSnapshot" => {
            b.message::<GetVolumeGroupSnapshotRequest>()?
                .group_snapshot_id
        }
        "/csi.v1.SnapshotMetadata/GetMetadataAllocated" => {
            b.message::<GetMetadataAllocatedRequest>()?.snapshot_id
        }
        "/csi.v1.SnapshotMetadata/GetMetadataDelta" => {
            b.message::<GetMetadataDeltaRequest>()?.target_snapshot_id
        }
        "/volumegroup.Controller/ModifyVolumeGroupMembership" => {
            b.message::<ModifyVolumeGroupMembershipRequest>()?
                .volume_group_id
        }
        "/volumegroup.Controller/DeleteVolumeGroup" => {
            b.message::<DeleteVolumeGroupRequest>()?.volume_group_id
        }
        "/volumegroup.Controller/ControllerGetVolumeGroup" => {
            b.message::<ControllerGetVolumeGroupRequest>()?
                .volume_group_id
        }
        _ => return Ok(None),
    }))
}

/// The calls the router decodes (their request is read whole first).
const DECODED: &[&str] = &[
    "/csi.v1.Controller/CreateVolume",
    "/csi.v1.Controller/DeleteVolume",
    "/csi.v1.Controller/ControllerPublishVolume",
    "/csi.v1.Controller/ControllerUnpublishVolume",
    "/csi.v1.Controller/ValidateVolumeCapabilities",
    "/csi.v1.Controller/ListVolumes",
    "/csi.v1.Controller/GetCapacity",
    "/csi.v1.Controller/CreateSnapshot",
    "/csi.v1.Controller/DeleteSnapshot",
    "/csi.v1.Controller/ListSnapshots",
    "/csi.v1.Controller/ControllerExpandVolume",
    "/csi.v1.Controller/ControllerGetVolume",
    "/csi.v1.Controller/ControllerModifyVolume",
    GET_SNAPSHOT,
    "/csi.v1.Controller/ControllerGetCapabilities",
    "/csi.v1.GroupController/CreateVolumeGroupSnapshot",
    "/csi.v1.GroupController/DeleteVolumeGroupSnapshot",
    "/csi.v1.GroupController/GetVolumeGroupSnapshot",
    "/csi.v1.SnapshotMetadata/GetMetadataAllocated",
    "/csi.v1.SnapshotMetadata/GetMetadataDelta",
    "/volumegroup.Controller/CreateVolumeGroup",
    "/volumegroup.Controller/ModifyVolumeGroupMembership",
    "/volumegroup.Controller/DeleteVolumeGroup",
    "/volumegroup.Controller/ListVolumeGroups",
    "/volumegroup.Controller/ControllerGetVolumeGroup",
];

/// An appliance's answer passed on as it came.
pub(crate) fn passed(resp: Response<Incoming>) -> Response<ProxyBody> {
    resp.map(BodyExt::boxed)
}

/// Several appliances behind one driver.
#[derive(Debug)]
pub struct Fleet {
    pub(crate) members: Vec<Member>,
}

impl Fleet {
    /// A fleet of `members`, in the order listings visit them.
    pub fn new(members: Vec<Member>) -> Fleet {
        Fleet { members }
    }

    pub(crate) fn ids(&self) -> Vec<&str> {
        self.members.iter().map(Member::id).collect()
    }

    /// `order` with the appliances recently found unreachable moved last: a call that needs
    /// one appliance of several tries those that answered first, and waits on one that may be
    /// off only when no other would do.
    pub(crate) fn reachable_first(&self, order: Vec<usize>) -> Vec<usize> {
        let (up, down): (Vec<usize>, Vec<usize>) = order
            .into_iter()
            .partition(|&i| self.members[i].recently_unreachable().is_ok());
        up.into_iter().chain(down).collect()
    }

    /// The appliance whose object `id` names (`<appliance id>-<kind><n>`).
    pub fn owner(&self, id: &str) -> Option<usize> {
        self.members.iter().position(|m| {
            id.strip_prefix(m.id.as_str())
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|local| {
                    let digits = local.trim_start_matches(|c: char| c.is_ascii_lowercase());
                    let kind = &local[..local.len() - digits.len()];
                    matches!(kind, "v" | "s" | "g" | "gs")
                        && !digits.is_empty()
                        && digits.bytes().all(|b| b.is_ascii_digit())
                })
        })
    }

    /// Answers one call.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        let path = req.uri().path().to_owned();
        match self.route(&path, req).await {
            Ok(resp) => resp,
            Err(status) => {
                tracing::warn!(method = %path, code = ?status.code(), error = %status.message(), "call refused");
                refuse(status)
            }
        }
    }

    async fn route(
        &self,
        path: &str,
        req: Request<Incoming>,
    ) -> Result<Response<ProxyBody>, Status> {
        if !DECODED.contains(&path) {
            return self.any_raw(req).await;
        }
        let b = Buffered::read(req).await?;
        match path {
            "/csi.v1.Controller/CreateVolume" => self.create_volume(&b).await,
            "/csi.v1.Controller/GetCapacity" => self.get_capacity(&b).await,
            "/csi.v1.Controller/ControllerGetCapabilities" => self.capabilities(&b).await,
            "/csi.v1.Controller/ListVolumes" => self.list::<ListVolumesRequest>(&b).await,
            "/csi.v1.Controller/ListSnapshots" => {
                let r: ListSnapshotsRequest = b.message()?;
                match (r.snapshot_id.as_str(), r.source_volume_id.as_str()) {
                    ("", "") => self.list::<ListSnapshotsRequest>(&b).await,
                    ("", volume) if is_replicated(volume) => {
                        self.replicated(path, &b, volume).await
                    }
                    ("", volume) => self.by_id(&b, volume).await,
                    (snapshot, _) if is_replicated(snapshot) => {
                        self.replicated(path, &b, snapshot).await
                    }
                    (snapshot, _) => self.by_id(&b, snapshot).await,
                }
            }
            "/csi.v1.Controller/ValidateVolumeCapabilities" => {
                let mut r: ValidateVolumeCapabilitiesRequest = b.message()?;
                if is_replicated(&r.volume_id) {
                    return self.replicated(path, &b, &r.volume_id).await;
                }
                // A plain volume made with replicas=1 was created without the parameter.
                if r.parameters.get(REPLICAS_PARAM).is_some_and(|n| n == "1") {
                    r.parameters.remove(REPLICAS_PARAM);
                }
                match self.owner(&r.volume_id) {
                    Some(i) => Ok(passed(self.members[i].forward(b.with_message(&r)).await?)),
                    None => self.any(&b).await,
                }
            }
            "/csi.v1.Controller/CreateSnapshot" => self.create_snapshot(&b).await,
            "/volumegroup.Controller/ModifyVolumeGroupMembership" => {
                let r: ModifyVolumeGroupMembershipRequest = b.message()?;
                if let Some(home) = self.owner(&r.volume_group_id) {
                    self.members_of_one_appliance(&r, home)?;
                }
                self.by_id(&b, &r.volume_group_id).await
            }
            "/csi.v1.GroupController/CreateVolumeGroupSnapshot" => {
                let r: CreateVolumeGroupSnapshotRequest = b.message()?;
                self.sources_of_one_appliance(&r.source_volume_ids)?;
                match r.source_volume_ids.first() {
                    Some(id) => self.by_id(&b, id).await,
                    None => self.any(&b).await, // INVALID_ARGUMENT, in the appliance's words
                }
            }
            "/volumegroup.Controller/ListVolumeGroups" => {
                self.list::<ListVolumeGroupsRequest>(&b).await
            }
            "/volumegroup.Controller/CreateVolumeGroup" => {
                let r: edgevol_proto::volumegroup::CreateVolumeGroupRequest = b.message()?;
                let order = placement::order(None, &self.ids(), &r.name);
                self.first_that_answers(&b, order).await
            }
            _ => match routing_id(path, &b)? {
                Some(id) if is_replicated(&id) => self.replicated(path, &b, &id).await,
                Some(id) => self.by_id(&b, &id).await,
                None => self.any(&b).await,
            },
        }
    }

    /// INVALID_ARGUMENT (the VolumeGroup spec's code for volumes a group cannot take) for a
    /// volume of `r` that lies on another appliance than group `r`'s (on `home`): a group, and
    /// its group snapshots, are one appliance's, so that box alone could not find the volume
    /// and would answer NOT_FOUND for a volume that exists. Ids of no appliance are left to the
    /// group's box (NOT_FOUND, truthfully).
    fn members_of_one_appliance(
        &self,
        r: &ModifyVolumeGroupMembershipRequest,
        home: usize,
    ) -> Result<(), Status> {
        let ids = self.ids();
        for v in &r.volume_ids {
            let lies = if is_replicated(v) {
                let boxes: Vec<&str> = legs(v)
                    .filter_map(|l| self.owner(l))
                    .map(|i| ids[i])
                    .collect();
                format!("is replicated over appliances {}", boxes.join(" and "))
            } else {
                match self.owner(v) {
                    Some(i) if i != home => format!("lies on appliance {}", ids[i]),
                    _ => continue,
                }
            };
            return Err(Status::invalid_argument(format!(
                "volume {v} {lies}, volume group {} on appliance {}: a volume group's volumes \
                 live on the group's one appliance (create the volume there, with the requisite \
                 topology {APPLIANCE_KEY}={})",
                r.volume_group_id, ids[home], ids[home]
            )));
        }
        Ok(())
    }

    /// INVALID_ARGUMENT for CreateVolumeGroupSnapshot of `volumes` that lie on several
    /// appliances (or a replicated one, whose legs do): a group snapshot is made by one
    /// appliance, which could not find the others' volumes and would answer NOT_FOUND for
    /// volumes that exist. Ids of no appliance are left to the box (NOT_FOUND, truthfully).
    fn sources_of_one_appliance(&self, volumes: &[String]) -> Result<(), Status> {
        let ids = self.ids();
        let rule = "a group snapshot's volumes must share one appliance";
        let mut placed: Vec<(&str, &str)> = Vec::new();
        for v in volumes {
            if is_replicated(v) {
                let boxes: Vec<&str> = legs(v)
                    .filter_map(|l| self.owner(l))
                    .map(|i| ids[i])
                    .collect();
                return Err(Status::invalid_argument(format!(
                    "volume {v} is replicated over appliances {}: {rule}",
                    boxes.join(" and ")
                )));
            }
            if let Some(i) = self.owner(v) {
                placed.push((v, ids[i]));
            }
        }
        if placed.iter().any(|(_, at)| *at != placed[0].1) {
            let on: Vec<String> = placed
                .iter()
                .map(|(v, at)| format!("{v} on appliance {at}"))
                .collect();
            return Err(Status::invalid_argument(format!(
                "the source volumes lie on several appliances ({}): {rule} (create them there, \
                 with the requisite topology {APPLIANCE_KEY}=<that appliance>)",
                on.join(", ")
            )));
        }
        Ok(())
    }

    /// The call sent to the appliance `id` names, or (an id of none of ours) to any.
    async fn by_id(&self, b: &Buffered, id: &str) -> Result<Response<ProxyBody>, Status> {
        match self.owner(id) {
            Some(i) => Ok(passed(self.members[i].forward(b.replay()).await?)),
            None => self.any(b).await,
        }
    }

    /// The call sent to the first appliance of `order` that can be reached.
    async fn first_that_answers(
        &self,
        b: &Buffered,
        order: Vec<usize>,
    ) -> Result<Response<ProxyBody>, Status> {
        let mut failed = Vec::new();
        for i in order {
            match self.members[i].forward(b.replay()).await {
                Ok(resp) => return Ok(passed(resp)),
                Err(s) if s.code() == Code::Unavailable => failed.push(s.message().to_owned()),
                Err(s) => return Err(s),
            }
        }
        Err(Status::unavailable(format!(
            "edgevol proxy: no appliance could be reached: {}",
            failed.join("; ")
        )))
    }

    /// The (buffered) call sent to any reachable appliance.
    pub(crate) async fn any(&self, b: &Buffered) -> Result<Response<ProxyBody>, Status> {
        self.first_that_answers(b, self.reachable_first((0..self.members.len()).collect()))
            .await
    }

    /// A call the proxy does not read, sent as it streams to the first reachable appliance.
    async fn any_raw(&self, req: Request<Incoming>) -> Result<Response<ProxyBody>, Status> {
        let mut failed = Vec::new();
        for i in self.reachable_first((0..self.members.len()).collect()) {
            let m = &self.members[i];
            match m.ready().await {
                Ok(()) => return Ok(passed(m.forwarder.forward(req.map(BodyExt::boxed)).await?)),
                Err(s) => failed.push(s.message().to_owned()),
            }
        }
        Err(Status::unavailable(format!(
            "edgevol proxy: no appliance could be reached: {}",
            failed.join("; ")
        )))
    }

    /// The appliances' controller capabilities, as every appliance runs the same driver.
    /// LIST_VOLUMES_PUBLISHED_NODES holds for replicated volumes too: ListVolumes lists each
    /// once, published where its last leg is ([`crate::fleet_legs`]).
    async fn capabilities(&self, b: &Buffered) -> Result<Response<ProxyBody>, Status> {
        let mut failed = Vec::new();
        for i in self.reachable_first((0..self.members.len()).collect()) {
            match self.members[i]
                .call::<ControllerGetCapabilitiesResponse>(b.replay())
                .await
            {
                Ok(caps) => return Ok(reply(&caps)),
                Err(s) if s.code() == Code::Unavailable => failed.push(s.message().to_owned()),
                Err(s) => return Err(s),
            }
        }
        Err(Status::unavailable(format!(
            "edgevol proxy: no appliance could be reached: {}",
            failed.join("; ")
        )))
    }

    async fn get_capacity(&self, b: &Buffered) -> Result<Response<ProxyBody>, Status> {
        let mut req: GetCapacityRequest = b.message()?;
        let replicas = replicas_param(&req.parameters)?.unwrap_or(1);
        req.parameters.remove(REPLICAS_PARAM);
        let ids = self.ids();
        let named: Vec<usize> = match &req.accessible_topology {
            Some(t) if placement::names_an_appliance(&t.segments) => (0..ids.len())
                .filter(|&i| placement::allows(&t.segments, ids[i]))
                .collect(),
            _ => (0..ids.len()).collect(),
        };
        let mut answers = Vec::new();
        let mut down = Vec::new();
        for i in named {
            let m = &self.members[i];
            let mut r = req.clone();
            if let Some(t) = &req.accessible_topology {
                r.accessible_topology = Some(Topology {
                    segments: placement::for_appliance(&t.segments, m.id()),
                });
            }
            match m
                .call_fanned::<GetCapacityResponse>(b.with_message(&r))
                .await
            {
                Ok(c) => answers.push(c),
                Err(s) if s.code() == Code::Unavailable => down.push(s.message().to_owned()),
                Err(s) => return Err(s),
            }
        }
        if answers.is_empty() && !down.is_empty() {
            return Err(Status::unavailable(down.join("; ")));
        }
        Ok(reply(&capacity_of(&answers, replicas)))
    }

    /// A listing paged across appliances.
    async fn list<L: Listing>(&self, b: &Buffered) -> Result<Response<ProxyBody>, Status> {
        let r: L = b.message()?;
        let Ok(max) = usize::try_from(r.max_entries()) else {
            return self.any(b).await; // INVALID_ARGUMENT, in the appliance's words
        };
        let ids = self.ids();
        let start = fleet_paging::parse(r.starting_token(), &ids)?;
        let (mut i, mut token) = (start.appliance, start.token);
        let mut entries = Vec::new();
        let mut answered = false;
        let mut down = Vec::new();
        let next = loop {
            if i >= ids.len() {
                break String::new();
            }
            let want = if max == 0 { 0 } else { max - entries.len() };
            let page = r.page(i32::try_from(want).unwrap_or(i32::MAX), token.clone());
            match self.members[i]
                .call_fanned::<L::Answer>(b.with_message(&page))
                .await
            {
                Ok(a) => {
                    answered = true;
                    let (got, next) = L::split(a);
                    let listed = got.len();
                    entries.extend(got.into_iter().filter_map(L::shown));
                    if !next.is_empty() {
                        // Hidden legs can leave the page short: go on with this appliance.
                        if listed > 0 && (max == 0 || entries.len() < max) {
                            token = next;
                            continue;
                        }
                        break fleet_paging::render(ids[i], &next);
                    }
                }
                Err(s) if s.code() == Code::Unavailable => {
                    tracing::warn!(appliance = %ids[i], error = %s.message(), "left out of a listing: unreachable");
                    down.push(s.message().to_owned());
                }
                Err(s) => return Err(s),
            }
            i += 1;
            token.clear();
            if max != 0 && entries.len() >= max {
                break match ids.get(i) {
                    Some(id) => fleet_paging::render(id, ""),
                    None => String::new(),
                };
            }
        };
        if !answered && !down.is_empty() {
            return Err(Status::unavailable(down.join("; ")));
        }
        Ok(reply(&L::join(entries, next)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::{Forwarder, Upstream};
    use std::sync::Arc;

    fn fleet(ids: &[&str]) -> Fleet {
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let tls = Arc::new(
            tokio_rustls::rustls::ClientConfig::builder()
                .with_root_certificates(tokio_rustls::rustls::RootCertStore::empty())
                .with_no_client_auth(),
        );
        Fleet::new(
            ids.iter()
                .enumerate()
                .map(|(n, id)| {
                    let up = Upstream::new(&format!("127.0.0.1:{}", 1000 + n), None, tls.clone())
                        .unwrap();
                    Member::new((*id).to_owned(), Forwarder::new(up))
                })
                .collect(),
        )
    }

    #[test]
    fn ids_name_their_appliance_even_when_appliance_ids_share_a_prefix() {
        let f = fleet(&["box", "box-7"]);
        assert_eq!(f.owner("box-v3"), Some(0));
        assert_eq!(f.owner("box-7-v3"), Some(1));
        assert_eq!(f.owner("box-7-gs12"), Some(1));
        assert_eq!(f.owner("box-s1"), Some(0));
        for foreign in ["box-8-v3", "box-7-v", "box-7-x3", "", "box-7-v3+box-v1"] {
            assert_eq!(f.owner(foreign), None, "{foreign:?}");
        }
    }
}
