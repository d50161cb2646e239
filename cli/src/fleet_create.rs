//! CreateVolume and CreateSnapshot across appliances: where a plain volume is placed, and the
//! survey that asks the appliances whether one already holds the name (a name is the driver's).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use edgevol_proto::csi::v1::volume_content_source::Type as SourceType;
use edgevol_proto::csi::v1::*;
use http::{Request, Response};
use prost::Message;
use tonic::{Code, Status};

use crate::fleet_placement as placement;
use crate::fleet_replicas::{is_replicated, replicas_param, MAX_NAME};
use crate::fleet_router::{passed, Fleet};
use crate::grpc_unary::{reply, request, Buffered, ProxyBody};
use edgevol_driver::fleet::{legs, LEGS_BEFORE_PARAM, LEG_NAME_SUFFIX, LEG_PARAM, REPLICAS_PARAM};

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

impl Fleet {
    pub(crate) async fn create_volume(&self, b: &Buffered) -> Result<Response<ProxyBody>, Status> {
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
        let replicas = match (replicas_param(&req.parameters)?, source_legs) {
            (None, 1) => None,
            (Some(1), 1) => {
                req.parameters.remove(REPLICAS_PARAM);
                None
            }
            (Some(n), _) | (None, n) => Some(n),
        };
        self.no_volume_of_the_other_kind(b, &req, replicas).await?;
        match replicas {
            Some(n) => self.create_replicated(b, req, n).await,
            None => self.create_plain(b, req).await,
        }
    }

    /// A name is one volume's, plain or replicated: ALREADY_EXISTS when an appliance holds the
    /// other kind of volume of `req`'s name (for a replicated request of `replicas` legs, a
    /// plain volume of the name; for a plain one, a leg `<name>+leg`). Every appliance is asked
    /// the existing-only question at once; a compatible repeat of the same kind finds nothing
    /// of the other and goes on to its own idempotent path.
    async fn no_volume_of_the_other_kind(
        &self,
        b: &Buffered,
        req: &CreateVolumeRequest,
        replicas: Option<usize>,
    ) -> Result<(), Status> {
        let mut probe = req.clone();
        probe.parameters.remove(REPLICAS_PARAM);
        // Asked without the source: a source id of another appliance would answer NOT_FOUND there.
        probe.volume_content_source = None;
        if replicas.is_none() {
            probe.name = format!("{}{LEG_NAME_SUFFIX}", req.name);
            if probe.name.len() > MAX_NAME {
                return Ok(()); // no replicated volume can have this name
            }
        }
        let ids = self.ids();
        let all: Vec<usize> = (0..ids.len()).collect();
        let held = self.holder_among::<CreateVolumeResponse>(&probe.name, &all, |i| {
            b.with_message(&existing_only_probe(&probe, ids[i]))
        });
        let Some((i, said)) = held.await else {
            return Ok(());
        };
        let what = match said {
            Ok(m) => m.held_id(),
            Err(s) => s.message().to_owned(),
        };
        let name = &req.name;
        Err(Status::already_exists(match replicas {
            Some(n) => format!(
                "volume {name:?} already exists on appliance {} as a plain volume ({what}), and \
                 this request is for a replicated one ({REPLICAS_PARAM}={n}): a name is this \
                 driver's across all its appliances",
                ids[i]
            ),
            None => format!(
                "volume {name:?} already exists as a replicated volume: appliance {} holds its \
                 leg {:?} ({what}), and this request is for a plain one: a name is this \
                 driver's across all its appliances",
                ids[i], probe.name
            ),
        }))
    }

    /// A snapshot name is one snapshot's, plain or replicated: ALREADY_EXISTS when an appliance
    /// holds the other kind of snapshot of `r`'s name (for a snapshot of a replicated volume, a
    /// plain snapshot of the name; for one of a plain volume, a leg snapshot `<name>+leg`).
    async fn no_snapshot_of_the_other_kind(
        &self,
        b: &Buffered,
        r: &CreateSnapshotRequest,
    ) -> Result<(), Status> {
        let replicated = is_replicated(&r.source_volume_id);
        let mut probe = r.clone();
        probe
            .parameters
            .insert(placement::EXISTING_ONLY_PARAM.to_owned(), "true".to_owned());
        if !replicated {
            probe.name = format!("{}{LEG_NAME_SUFFIX}", r.name);
            if probe.name.len() > MAX_NAME {
                return Ok(());
            }
        }
        // The source asked is not the holder's (a leg snapshot's source is a leg, a plain
        // snapshot's is not a replicated volume): a holder answers ALREADY_EXISTS.
        let all: Vec<usize> = (0..self.members.len()).collect();
        let held = self
            .holder_among::<CreateSnapshotResponse>(&probe.name, &all, |_| b.with_message(&probe))
            .await;
        let Some((i, said)) = held else {
            return Ok(());
        };
        let what = match said {
            Ok(a) => a.snapshot.map(|s| s.snapshot_id).unwrap_or_default(),
            Err(s) => s.message().to_owned(),
        };
        let (name, at) = (&r.name, self.ids()[i]);
        Err(Status::already_exists(if replicated {
            format!(
                "snapshot {name:?} already exists on appliance {at} as a snapshot of a plain \
                 volume ({what}), and {} is replicated: a name is this driver's across all its \
                 appliances",
                r.source_volume_id
            )
        } else {
            format!(
                "snapshot {name:?} already exists as a snapshot of a replicated volume: \
                 appliance {at} holds its leg {:?} ({what}), not of {}: a name is this \
                 driver's across all its appliances",
                probe.name, r.source_volume_id
            )
        }))
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
    pub(crate) async fn create_snapshot(
        &self,
        b: &Buffered,
    ) -> Result<Response<ProxyBody>, Status> {
        let r: CreateSnapshotRequest = b.message()?;
        if r.parameters.contains_key(placement::EXISTING_ONLY_PARAM) {
            return Err(Status::invalid_argument(format!(
                "parameter {} is set by the proxy only, to ask an appliance for a snapshot it \
                 already holds",
                placement::EXISTING_ONLY_PARAM
            )));
        }
        if !r.name.is_empty() {
            self.no_snapshot_of_the_other_kind(b, &r).await?;
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
