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
//! * CreateSnapshot of a plain volume asks every other appliance the same (a snapshot of the
//!   name there is of another volume: ALREADY_EXISTS), then goes to the volume's appliance.
//! * A volume group is one appliance's: ModifyVolumeGroupMembership with a volume of another
//!   appliance (or a replicated one) is INVALID_ARGUMENT naming both appliances, not the
//!   NOT_FOUND the group's box alone would answer for a volume that exists.
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

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::task::Poll;
use std::time::{Duration, Instant};

use edgevol_proto::csi::v1::volume_content_source::Type as SourceType;
use edgevol_proto::csi::v1::*;
use edgevol_proto::volumegroup::{
    ControllerGetVolumeGroupRequest, DeleteVolumeGroupRequest, ListVolumeGroupsRequest,
    ModifyVolumeGroupMembershipRequest,
};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use prost::Message;
use tonic::{Code, Status};

use crate::fleet_paging::{self, Listing};
use crate::fleet_placement as placement;
use crate::fleet_replicas::{capacity_of, is_replicated, replicas_param};
use crate::grpc_unary::{answer, refuse, reply, request, Buffered, ProxyBody};
use crate::proxy::{Forwarder, CONNECT_TIMEOUT};
use edgevol_driver::fleet::{legs, APPLIANCE_KEY, LEGS_BEFORE_PARAM, LEG_PARAM, REPLICAS_PARAM};

/// The manifest key of GetPluginInfo that carries the appliance's id.
const MANIFEST_ID: &str = "appliance-id";

/// How long calls that ask every appliance (listings, GetCapacity) leave out an appliance they
/// could not reach, without trying it again: an appliance that is off (no answer at all) would
/// otherwise hold each of them for the whole connect timeout. Calls that need one appliance of
/// several (Identity, ids of no appliance) try it after the others; CreateVolume keeps the
/// name's order (the volume may be there already) and calls on its own volumes always try it.
pub const SKIP_UNREACHABLE: Duration = Duration::from_secs(30);

/// How long CreateVolume waits for the allowed appliances to say whether they hold the name
/// and how much they have free; one that has not answered by then counts as unknown.
pub const SURVEY_DEADLINE: Duration = Duration::from_secs(5);

/// What an allowed appliance said before a plain volume is placed.
#[derive(Debug)]
enum Survey {
    /// It holds the name (or refused the request): its answer is the call's.
    Answers(Result<CreateVolumeResponse, Status>),
    /// It holds no volume of the name; its free bytes, if GetCapacity answered.
    Lacks(Option<i64>),
    /// No answer in time, unreachable, or an edgevold that predates the question.
    Unknown(String),
}

/// Polls `futures` together; their outputs in the same order.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// One appliance of the fleet.
#[derive(Debug)]
pub struct Member {
    id: String,
    forwarder: Forwarder,
    verified: AtomicBool,
    /// When a call last failed to reach it, and why; cleared by the next call that does.
    unreachable: Mutex<Option<(Instant, String)>>,
}

impl Member {
    /// Appliance `id`, reached through `forwarder`.
    pub fn new(id: String, forwarder: Forwarder) -> Member {
        Member {
            id,
            forwarder,
            verified: AtomicBool::new(false),
            unreachable: Mutex::new(None),
        }
    }

    fn unreachable(&self) -> std::sync::MutexGuard<'_, Option<(Instant, String)>> {
        self.unreachable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// UNAVAILABLE when a call failed to reach the appliance less than [`SKIP_UNREACHABLE`] ago.
    fn recently_unreachable(&self) -> Result<(), Status> {
        match &*self.unreachable() {
            Some((at, why)) if at.elapsed() < SKIP_UNREACHABLE => Err(Status::unavailable(
                format!("{why} (left out for {}s)", SKIP_UNREACHABLE.as_secs()),
            )),
            _ => Ok(()),
        }
    }

    /// Notes whether `result` reached the appliance.
    fn note<T>(&self, result: Result<T, Status>) -> Result<T, Status> {
        match &result {
            Err(s) if s.code() == Code::Unavailable => {
                *self.unreachable() = Some((Instant::now(), s.message().to_owned()));
            }
            _ => *self.unreachable() = None,
        }
        result
    }

    /// Its appliance id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Checks once that the appliance at this address is the one configured.
    async fn verify(&self) -> Result<(), Status> {
        if self.verified.load(Ordering::Relaxed) {
            return Ok(());
        }
        let ask = async {
            let resp = self
                .forwarder
                .forward(request(
                    "/csi.v1.Identity/GetPluginInfo",
                    &GetPluginInfoRequest {},
                ))
                .await?;
            answer::<GetPluginInfoResponse>(resp).await
        };
        // The appliance's own answer is quick; one that never comes is a box that hangs.
        let info = tokio::time::timeout(CONNECT_TIMEOUT, ask)
            .await
            .unwrap_or_else(|_| {
                Err(Status::unavailable(format!(
                    "edgevol proxy: appliance {} did not say who it is within {}s",
                    self.forwarder.address(),
                    CONNECT_TIMEOUT.as_secs()
                )))
            })?;
        match info.manifest.get(MANIFEST_ID) {
            Some(id) if *id == self.id => {
                self.verified.store(true, Ordering::Relaxed);
                Ok(())
            }
            other => Err(Status::unavailable(format!(
                "edgevol proxy: the appliance at {} is {}, not {} as configured",
                self.forwarder.address(),
                other.map_or("of unknown id", String::as_str),
                self.id
            ))),
        }
    }

    /// `req` sent to this appliance; its answer as sent.
    pub(crate) async fn forward(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, Status> {
        let verified = self.verify().await;
        self.note(verified)?;
        let forwarded = self.forwarder.forward(req).await;
        self.note(forwarded)
    }

    /// [`Member::call`] for a call that asks every appliance (listings, capacity): fails at
    /// once while the appliance is [recently unreachable](Member::recently_unreachable).
    async fn call_fanned<M: Message + Default>(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<M, Status> {
        self.recently_unreachable()?;
        self.call(req).await
    }

    /// A unary call's answer message, or the status the appliance sent.
    pub(crate) async fn call<M: Message + Default>(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<M, Status> {
        answer(self.forward(req).await?).await
    }

    /// Whether the appliance can be reached and is the one configured.
    pub(crate) async fn ready(&self) -> Result<(), Status> {
        let ready = self.forwarder.ready().await;
        self.note(ready)?;
        let verified = self.verify().await;
        self.note(verified)
    }
}

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
fn passed(resp: Response<Incoming>) -> Response<ProxyBody> {
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
    async fn any(&self, b: &Buffered) -> Result<Response<ProxyBody>, Status> {
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

    async fn create_volume(&self, b: &Buffered) -> Result<Response<ProxyBody>, Status> {
        let mut req: CreateVolumeRequest = b.message()?;
        if req.name.is_empty() {
            return self.any(b).await; // INVALID_ARGUMENT, in the appliance's words
        }
        if req.parameters.contains_key(placement::EXISTING_ONLY_PARAM) {
            return Err(Status::invalid_argument(format!(
                "parameter {} is set by the proxy only, to ask an appliance for a volume it \
                 already holds",
                placement::EXISTING_ONLY_PARAM
            )));
        }
        if let Some(key) = [LEG_PARAM, LEGS_BEFORE_PARAM]
            .into_iter()
            .find(|k| req.parameters.contains_key(*k))
        {
            // Only legs carry it; on any other volume it would hide it from ListVolumes.
            return Err(Status::invalid_argument(format!(
                "parameter {key} is set by the proxy on the legs of replicated volumes; use \
                 {REPLICAS_PARAM}"
            )));
        }
        let source_legs = content_source_id(&req).map_or(1, |s| legs(s).count());
        match (replicas_param(&req.parameters)?, source_legs) {
            (None, 1) => {}
            (Some(1), 1) => {
                req.parameters.remove(REPLICAS_PARAM);
                return self.create_plain(b, req).await;
            }
            (Some(n), _) | (None, n) => return self.create_replicated(b, req, n).await,
        }
        self.create_plain(b, req).await
    }

    /// CreateVolume of a volume on one appliance.
    async fn create_plain(
        &self,
        b: &Buffered,
        req: CreateVolumeRequest,
    ) -> Result<Response<ProxyBody>, Status> {
        let ids = self.ids();
        let mut order = placement::order(req.accessibility_requirements.as_ref(), &ids, &req.name);
        if let Some(source) = content_source_id(&req) {
            // A clone or restore lives where its source does.
            match self.owner(source) {
                Some(home) if order.contains(&home) => order = vec![home],
                Some(home) => {
                    return Err(Status::resource_exhausted(format!(
                        "the content source {source} lies on appliance {}, outside the \
                         requisite topology",
                        ids[home]
                    )))
                }
                None => return self.any(b).await, // NOT_FOUND, in the appliance's words
            }
        }
        // A name is the driver's: a volume of it on an appliance this request cannot place it on
        // (outside the requisite topology, or not where its content source lies) is one the
        // request does not match.
        let outside: Vec<usize> = (0..ids.len()).filter(|i| !order.contains(i)).collect();
        let mut probe = req.clone();
        // Asked without the source: a source id of another appliance would answer NOT_FOUND there.
        probe.volume_content_source = None;
        let elsewhere = self.holder_among::<CreateVolumeResponse>(&req.name, &outside, |i| {
            b.with_message(&existing_only_probe(&probe, ids[i]))
        });
        let why = match content_source_id(&req).and_then(|s| self.owner(s)) {
            Some(home) => format!("and its content source lies on appliance {}", ids[home]),
            None => "which the requisite topology of this request does not allow".to_owned(),
        };
        if order.is_empty() {
            if let Some((i, said)) = elsewhere.await {
                return Err(held_elsewhere("volume", &req.name, ids[i], said, &why));
            }
            return Err(Status::resource_exhausted(format!(
                "no appliance of this driver ({}) lies in the requisite topology",
                ids.join(", ")
            )));
        }
        if content_source_id(&req).is_some() {
            if let Some((i, said)) = elsewhere.await {
                return Err(held_elsewhere("volume", &req.name, ids[i], said, &why));
            }
        } else {
            let (surveys, elsewhere) = tokio::join!(
                join_all(order.iter().map(|&i| self.survey(b, &req, i)).collect()),
                elsewhere
            );
            let mut free = vec![None; ids.len()];
            let mut unknown = Vec::new();
            for (&i, survey) in order.iter().zip(surveys) {
                match survey {
                    Survey::Answers(Ok(mut resp)) => {
                        if let Some(v) = resp.volume.as_mut() {
                            v.accessible_topology
                                .push(placement::presence_segment(ids[i]));
                        }
                        return Ok(reply(&resp));
                    }
                    Survey::Answers(Err(s)) => return Err(s),
                    Survey::Lacks(f) => free[i] = f,
                    Survey::Unknown(why) => unknown.push(format!("{}: {why}", ids[i])),
                }
            }
            if let Some((i, said)) = elsewhere {
                return Err(held_elsewhere("volume", &req.name, ids[i], said, &why));
            }
            if unknown.is_empty() {
                order = placement::order_by_free(
                    req.accessibility_requirements.as_ref(),
                    &ids,
                    &req.name,
                    &free,
                );
            } else {
                // The box that did not answer may hold the volume from an attempt whose answer
                // was lost: the name's order, which that attempt used too if it lacked the
                // same answer, and which tries this box where the name puts it.
                tracing::warn!(volume = %req.name, unknown = %unknown.join("; "), "CreateVolume placed by name alone: not every allowed appliance said whether it holds the name");
            }
        }
        let mut passed_over = Vec::new();
        let mut full = false;
        // The name's order even when an appliance was unreachable a moment ago: the answer of
        // an earlier attempt may be what was lost, and only that appliance has the volume.
        for i in order {
            let m = &self.members[i];
            let mut r = req.clone();
            if let Some(t) = &req.accessibility_requirements {
                r.accessibility_requirements = Some(placement::requirement_for(t, m.id()));
            }
            match m.call::<CreateVolumeResponse>(b.with_message(&r)).await {
                Ok(mut resp) => {
                    if let Some(v) = resp.volume.as_mut() {
                        v.accessible_topology
                            .push(placement::presence_segment(m.id()));
                    }
                    return Ok(reply(&resp));
                }
                Err(s) if matches!(s.code(), Code::Unavailable | Code::ResourceExhausted) => {
                    full |= s.code() == Code::ResourceExhausted;
                    tracing::info!(appliance = %m.id(), error = %s.message(), "CreateVolume passed over an appliance");
                    passed_over.push(format!("{}: {}", m.id(), s.message()));
                }
                Err(s) => return Err(s),
            }
        }
        let message = format!(
            "no allowed appliance could create the volume: {}",
            passed_over.join("; ")
        );
        Err(if full {
            Status::resource_exhausted(message)
        } else {
            Status::unavailable(message)
        })
    }

    /// Whether appliance `i` holds a volume named as `req`'s (asked without creating one), and
    /// how much it has free for it; [`Survey::Unknown`] after [`SURVEY_DEADLINE`].
    async fn survey(&self, b: &Buffered, req: &CreateVolumeRequest, i: usize) -> Survey {
        let m = &self.members[i];
        let probe = existing_only_probe(req, m.id());
        let capacity = GetCapacityRequest {
            volume_capabilities: req.volume_capabilities.clone(),
            parameters: req.parameters.clone(),
            ..Default::default()
        };
        let ask = async {
            let holds = m
                .call_fanned::<CreateVolumeResponse>(b.with_message(&probe))
                .await;
            match holds {
                Err(s) if s.code() == Code::NotFound => {}
                // Passed over by the placement loop below as well (topology, full).
                Err(s) if s.code() == Code::ResourceExhausted => return Survey::Lacks(None),
                Err(s) if s.code() == Code::Unavailable => {
                    return Survey::Unknown(s.message().to_owned())
                }
                Err(s)
                    if s.code() == Code::InvalidArgument
                        && s.message().contains(placement::EXISTING_ONLY_PARAM) =>
                {
                    return Survey::Unknown(format!(
                        "its edgevold cannot be asked: {}",
                        s.message()
                    ))
                }
                answered => return Survey::Answers(answered),
            }
            let free = m
                .call_fanned::<GetCapacityResponse>(request(
                    "/csi.v1.Controller/GetCapacity",
                    &capacity,
                ))
                .await
                .map(|c| c.available_capacity);
            Survey::Lacks(free.ok())
        };
        tokio::time::timeout(SURVEY_DEADLINE, ask)
            .await
            .unwrap_or_else(|_| {
                Survey::Unknown(format!("no answer within {}s", SURVEY_DEADLINE.as_secs()))
            })
    }

    /// Asks appliances `boxes` at once, within [`SURVEY_DEADLINE`], the existing-only question
    /// `ask(i)` about `name`: the first of them (in `boxes` order) that holds an object of the
    /// name, with its answer (the object, or ALREADY_EXISTS). One that does not answer is
    /// logged and counts as not holding it (the documented limit of a holder that is down).
    async fn holder_among<M: Message + Default>(
        &self,
        name: &str,
        boxes: &[usize],
        ask: impl Fn(usize) -> Request<ProxyBody>,
    ) -> Option<(usize, Result<M, Status>)> {
        let asked = boxes.iter().map(|&i| {
            let req = ask(i);
            async move {
                let said =
                    tokio::time::timeout(SURVEY_DEADLINE, self.members[i].call_fanned::<M>(req))
                        .await;
                (i, said)
            }
        });
        let mut holder = None;
        for (i, said) in join_all(asked.collect()).await {
            let why = match said {
                Ok(Ok(m)) => {
                    holder = holder.or(Some((i, Ok(m))));
                    continue;
                }
                Ok(Err(s)) if s.code() == Code::AlreadyExists => {
                    holder = holder.or(Some((i, Err(s))));
                    continue;
                }
                Ok(Err(s)) if matches!(s.code(), Code::NotFound | Code::ResourceExhausted) => {
                    continue
                }
                Ok(Err(s)) => s.message().to_owned(),
                Err(_) => format!("no answer within {}s", SURVEY_DEADLINE.as_secs()),
            };
            tracing::warn!(name = %name, appliance = %self.members[i].id(), error = %why, "could not ask an appliance whether it holds the name; going on without it");
        }
        holder
    }

    /// CreateSnapshot of a volume on one appliance: first every other appliance is asked
    /// whether it holds a snapshot of the name (of its own volume, so not this request's).
    async fn create_snapshot(&self, b: &Buffered) -> Result<Response<ProxyBody>, Status> {
        let r: CreateSnapshotRequest = b.message()?;
        if r.parameters.contains_key(placement::EXISTING_ONLY_PARAM) {
            return Err(Status::invalid_argument(format!(
                "parameter {} is set by the proxy only, to ask an appliance for a snapshot it \
                 already holds",
                placement::EXISTING_ONLY_PARAM
            )));
        }
        if is_replicated(&r.source_volume_id) {
            let path = "/csi.v1.Controller/CreateSnapshot";
            return self.replicated(path, b, &r.source_volume_id).await;
        }
        let Some(home) = self.owner(&r.source_volume_id) else {
            return self.any(b).await; // NOT_FOUND or INVALID_ARGUMENT, in the appliance's words
        };
        if !r.name.is_empty() {
            let others: Vec<usize> = (0..self.members.len()).filter(|&i| i != home).collect();
            let mut probe = r.clone();
            probe
                .parameters
                .insert(placement::EXISTING_ONLY_PARAM.to_owned(), "true".to_owned());
            let asked = self
                .holder_among::<CreateSnapshotResponse>(&r.name, &others, |_| {
                    b.with_message(&probe)
                })
                .await;
            if let Some((i, said)) = asked {
                let why = format!("not of {}", r.source_volume_id);
                let said = said.map(|a| a.snapshot.map(|s| s.snapshot_id).unwrap_or_default());
                return Err(held_elsewhere(
                    "snapshot",
                    &r.name,
                    self.ids()[i],
                    said,
                    &why,
                ));
            }
        }
        Ok(passed(self.members[home].forward(b.replay()).await?))
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

/// `req` as the existing-only question to appliance `id`: marked, and with the topology it
/// checks (none when `id` lies outside the requisite topology: the name is asked anyway).
fn existing_only_probe(req: &CreateVolumeRequest, id: &str) -> CreateVolumeRequest {
    let mut probe = req.clone();
    probe
        .parameters
        .insert(placement::EXISTING_ONLY_PARAM.to_owned(), "true".to_owned());
    if let Some(t) = &req.accessibility_requirements {
        probe.accessibility_requirements = Some(placement::requirement_for(t, id));
    }
    probe
}

/// ALREADY_EXISTS: appliance `appliance` holds the `kind` `name` (`said`: its id, or its
/// refusal), where this request cannot have it (`why`).
fn held_elsewhere<M: HoldsId>(
    kind: &str,
    name: &str,
    appliance: &str,
    said: Result<M, Status>,
    why: &str,
) -> Status {
    let what = match said {
        Ok(m) => m.held_id(),
        Err(s) => s.message().to_owned(),
    };
    Status::already_exists(format!(
        "{kind} {name:?} already exists on appliance {appliance} ({what}), {why}: a name is this \
         driver's across all its appliances"
    ))
}

/// What a holder answered, by id.
trait HoldsId {
    fn held_id(self) -> String;
}

impl HoldsId for CreateVolumeResponse {
    fn held_id(self) -> String {
        self.volume.map(|v| v.volume_id).unwrap_or_default()
    }
}

impl HoldsId for String {
    fn held_id(self) -> String {
        self
    }
}

/// The snapshot or volume a CreateVolume copies, if any.
fn content_source_id(req: &CreateVolumeRequest) -> Option<&str> {
    match req.volume_content_source.as_ref()?.r#type.as_ref()? {
        SourceType::Snapshot(s) => Some(&s.snapshot_id),
        SourceType::Volume(v) => Some(&v.volume_id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::Upstream;
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
