//! Replicated volumes, controller side: one ordinary volume ("leg") per appliance, mirrored by
//! md RAID1 on the node.
//!
//! * CreateVolume with `replicas: "2"` or `"3"` creates a leg named `<name>+leg` on that many
//!   distinct appliances, chosen like a plain volume's box (the allowed topology, then the
//!   per-name order), with every leg's box allowed by one requisite segment. Each leg is
//!   [`MD_DATA_OFFSET_BYTES`] larger than asked, for md's superblock and bitmap, and carries
//!   its [`LegMark`] (position, and the legs before it), made first leg first, so the last leg
//!   names the volume ([`crate::fleet_legs`] lists it from there). No leg is made while fewer
//!   than `replicas` appliances answer; legs made before a full appliance refused one stay
//!   (RESOURCE_EXHAUSTED), and the retry finds them by name in their places and completes the
//!   volume.
//! * The volume's id is its legs' ids joined by '+', in leg order; every call on it acts on
//!   every leg; ControllerPublishVolume merges the legs' publish contexts under `leg<i>.` keys.
//! * A snapshot of a replicated volume is one snapshot per leg (id joined likewise); a volume
//!   restored or cloned from it has each leg restored on that leg's appliance; its changed
//!   blocks (SnapshotMetadata) are one leg's, in the volume's offsets ([`crate::fleet_metadata`]).

use std::collections::{BTreeSet, HashMap, VecDeque};

use edgevol_driver::fleet::{
    join_legs, legs, reach_key, LegMark, LEGS_BEFORE_PARAM, LEG_NAME_SUFFIX, LEG_PARAM,
    MD_DATA_OFFSET_BYTES, REACHES, REPLICAS, REPLICAS_PARAM,
};
use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
use edgevol_proto::csi::v1::volume_content_source::{
    SnapshotSource, Type as SourceType, VolumeSource,
};
use edgevol_proto::csi::v1::*;
use http::Response;
use tonic::{Code, Status};

use crate::fleet_placement as placement;
use crate::fleet_replica_calls::leg_status;
use crate::fleet_router::Fleet;
use crate::grpc_unary::{reply, request, Buffered, ProxyBody};

/// The CSI limit on a name, which each leg's name must keep too.
pub(crate) const MAX_NAME: usize = 128;
/// Size of a volume created without capacity_range, as the appliances choose it: 1 GiB.
const DEFAULT_VOLUME_BYTES: i64 = 1 << 30;

fn offset() -> i64 {
    i64::try_from(MD_DATA_OFFSET_BYTES).unwrap_or(i64::MAX)
}

/// The `replicas` parameter: 1 (absent) to 3.
pub fn replicas_param(params: &HashMap<String, String>) -> Result<Option<usize>, Status> {
    match params.get(REPLICAS_PARAM).map(String::as_str) {
        None => Ok(None),
        Some("1") => Ok(Some(1)),
        Some("2") => Ok(Some(2)),
        Some("3") => Ok(Some(3)),
        Some(other) => Err(Status::invalid_argument(format!(
            "parameter {REPLICAS_PARAM}={other:?}: expected 1, 2 or 3"
        ))),
    }
}

/// Whether a leg's refusal comes again for the same request (OUT_OF_RANGE, INVALID_ARGUMENT,
/// ALREADY_EXISTS, NOT_FOUND), so the legs made before it can never be completed into the
/// volume or snapshot; RESOURCE_EXHAUSTED, UNAVAILABLE and the rest may pass.
pub(crate) fn refused_for_good(code: Code) -> bool {
    matches!(
        code,
        Code::OutOfRange | Code::InvalidArgument | Code::AlreadyExists | Code::NotFound
    )
}

/// Whether `id` names a replicated volume or snapshot.
pub fn is_replicated(id: &str) -> bool {
    legs(id).nth(1).is_some()
}

/// The capacity a replicated volume offers, from its legs' capacities.
pub(crate) fn offered(leg_capacities: impl IntoIterator<Item = i64>) -> i64 {
    leg_capacities
        .into_iter()
        .min()
        .map_or(0, |c| c.saturating_sub(offset()))
}

/// GetCapacity over the appliances that answered, for volumes of `replicas` legs: a plain
/// volume can use any box, so their free space adds up and the largest volume is the largest
/// any one box takes; a volume of N legs needs N boxes, so it is bounded by the N-th largest
/// box (less the md offset), and a single such volume is the most that can be promised.
pub fn capacity_of(answers: &[GetCapacityResponse], replicas: usize) -> GetCapacityResponse {
    let minimum = answers.iter().filter_map(|a| a.minimum_volume_size).min();
    if replicas <= 1 {
        return GetCapacityResponse {
            available_capacity: answers
                .iter()
                .fold(0i64, |t, a| t.saturating_add(a.available_capacity)),
            maximum_volume_size: Some(
                answers
                    .iter()
                    .filter_map(|a| a.maximum_volume_size)
                    .max()
                    .unwrap_or(0),
            ),
            minimum_volume_size: minimum,
        };
    }
    let nth_largest = |mut v: Vec<i64>| {
        v.sort_unstable_by(|a, b| b.cmp(a));
        v.get(replicas - 1)
            .map_or(0, |c| c.saturating_sub(offset()).max(0))
    };
    let available = nth_largest(answers.iter().map(|a| a.available_capacity).collect());
    let maximum = nth_largest(
        answers
            .iter()
            .map(|a| a.maximum_volume_size.unwrap_or(a.available_capacity))
            .collect(),
    );
    GetCapacityResponse {
        available_capacity: available,
        maximum_volume_size: Some(maximum),
        minimum_volume_size: minimum,
    }
}

/// A leg's capacity range for a replicated volume's: [`MD_DATA_OFFSET_BYTES`] more at both
/// ends; with no requirement (and no source to size from), the appliances' 1 GiB default.
pub(crate) fn leg_range(
    range: Option<&CapacityRange>,
    has_source: bool,
) -> Result<Option<CapacityRange>, Status> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return Err(Status::invalid_argument(
            "capacity_range bounds must not be negative",
        ));
    }
    if required == 0 && has_source {
        // Each leg takes its source leg's size, which already holds the offset.
        return Ok(range.cloned());
    }
    let required = match (required, limit) {
        (0, 0) => DEFAULT_VOLUME_BYTES,
        (0, l) => DEFAULT_VOLUME_BYTES.min(l),
        (r, _) => r,
    };
    let add = |v: i64| {
        v.checked_add(offset()).ok_or_else(|| {
            Status::out_of_range(format!(
                "{v} bytes plus the {MD_DATA_OFFSET_BYTES} bytes of md metadata on each leg \
                 exceed what a volume can hold"
            ))
        })
    };
    Ok(Some(CapacityRange {
        required_bytes: add(required)?,
        limit_bytes: if limit == 0 { 0 } else { add(limit)? },
    }))
}

/// Gives leg request `r` the marking of position `index` of `n`, after the legs `made`.
fn mark(r: &mut CreateVolumeRequest, index: usize, n: usize, made: &[(usize, Volume)]) {
    let before: Vec<&str> = made[..index]
        .iter()
        .map(|(_, v)| v.volume_id.as_str())
        .collect();
    r.parameters.remove(LEGS_BEFORE_PARAM);
    r.parameters
        .extend(LegMark::new(index, n, &before).params());
}

/// RESOURCE_EXHAUSTED: fewer than `n` appliances took a leg; `kept` were made.
fn too_few(n: usize, kept: &[&str], passed_over: &[String]) -> Status {
    Status::resource_exhausted(format!(
        "{REPLICAS_PARAM}={n} needs {n} appliances of the allowed topology; {} took a leg{}{}",
        kept.len(),
        if kept.is_empty() {
            String::new()
        } else {
            format!(
                " (kept for a retry, which completes the volume: {})",
                kept.join(", ")
            )
        },
        if passed_over.is_empty() {
            String::new()
        } else {
            format!("; passed over: {}", passed_over.join("; "))
        }
    ))
}

/// A replicated volume's volume_context, from its (last) leg's: without the leg marking, with
/// the number of legs. CreateVolume, ControllerGetVolume and ListVolumes all show this one.
pub(crate) fn replicated_context(
    leg: &HashMap<String, String>,
    n: usize,
) -> HashMap<String, String> {
    let mut context = leg.clone();
    context.remove(LEG_PARAM);
    context.remove(LEGS_BEFORE_PARAM);
    context.insert(REPLICAS.to_owned(), n.to_string());
    context
}

/// The accessible topology of a volume with legs on `boxes`: nodes that reach every one.
pub(crate) fn topology_of(boxes: &[&str]) -> Vec<Topology> {
    vec![Topology {
        segments: boxes
            .iter()
            .map(|b| (reach_key(b), REACHES.to_owned()))
            .collect(),
    }]
}

/// The id of the snapshot or volume a CreateVolume copies.
fn source_id(source: &VolumeContentSource) -> Option<&str> {
    match source.r#type.as_ref()? {
        SourceType::Snapshot(s) => Some(&s.snapshot_id),
        SourceType::Volume(v) => Some(&v.volume_id),
    }
}

/// `source` with its id replaced by `id` (a leg's).
fn with_source_id(source: &VolumeContentSource, id: &str) -> VolumeContentSource {
    VolumeContentSource {
        r#type: source.r#type.as_ref().map(|t| match t {
            SourceType::Snapshot(_) => SourceType::Snapshot(SnapshotSource {
                snapshot_id: id.to_owned(),
            }),
            SourceType::Volume(_) => SourceType::Volume(VolumeSource {
                volume_id: id.to_owned(),
            }),
        }),
    }
}

/// Whether one requisite segment allows every one of `boxes` (no requisite: any boxes).
fn jointly_allowed(req: Option<&TopologyRequirement>, boxes: &[&str]) -> bool {
    req.is_none_or(|r| {
        r.requisite.is_empty()
            || r.requisite
                .iter()
                .any(|t| boxes.iter().all(|b| placement::allows(&t.segments, b)))
    })
}

impl Fleet {
    /// CreateVolume of a replicated volume (`n` legs), parameters already checked.
    pub(crate) async fn create_replicated(
        &self,
        b: &Buffered,
        req: CreateVolumeRequest,
        n: usize,
    ) -> Result<Response<ProxyBody>, Status> {
        if req.name.len() + LEG_NAME_SUFFIX.len() > MAX_NAME {
            return Err(Status::invalid_argument(format!(
                "name is {} bytes; a replicated volume's may have at most {} (each leg is named \
                 after it, with {LEG_NAME_SUFFIX:?})",
                req.name.len(),
                MAX_NAME - LEG_NAME_SUFFIX.len()
            )));
        }
        let multi_writer = [Mode::MultiNodeSingleWriter, Mode::MultiNodeMultiWriter];
        if req.volume_capabilities.iter().any(|c| {
            c.access_mode
                .as_ref()
                .is_some_and(|m| multi_writer.iter().any(|w| *w as i32 == m.mode))
        }) {
            return Err(Status::invalid_argument(format!(
                "{REPLICAS_PARAM}={n} with a multi-node writer access mode: md RAID1 on the node \
                 mirrors one writer's I/O, it is not a cluster filesystem"
            )));
        }
        let ids = self.ids();
        let source = req.volume_content_source.as_ref();
        let source_legs: Option<Vec<(String, usize)>> = match source.and_then(source_id) {
            None => None,
            Some(sid) if !is_replicated(sid) => {
                return Err(Status::invalid_argument(format!(
                    "{sid} lies on one appliance: a replicated volume is restored or cloned from \
                     a replicated snapshot or volume with as many legs"
                )))
            }
            Some(sid) => {
                let homes = self.leg_homes(sid)?;
                if homes.len() != n {
                    return Err(Status::invalid_argument(format!(
                        "{sid} has {} legs; {REPLICAS_PARAM}={n} needs as many",
                        homes.len()
                    )));
                }
                Some(homes)
            }
        };
        let range = leg_range(req.capacity_range.as_ref(), source.is_some())?;
        let mut leg_req = req.clone();
        leg_req.name = format!("{}{LEG_NAME_SUFFIX}", req.name);
        leg_req.parameters.remove(REPLICAS_PARAM);
        leg_req.capacity_range = range;
        let topo = req.accessibility_requirements.as_ref();

        // The boxes to try, in order: the source's legs' (fixed), or the placement order.
        let candidates: Vec<(usize, Option<String>)> = match &source_legs {
            Some(homes) => {
                let boxes: Vec<&str> = homes.iter().map(|(_, i)| ids[*i]).collect();
                if !jointly_allowed(topo, &boxes) {
                    return Err(Status::resource_exhausted(format!(
                        "the source's legs lie on {}, which no requisite segment allows together",
                        boxes.join(", ")
                    )));
                }
                homes
                    .iter()
                    .map(|(leg, i)| (*i, Some(leg.clone())))
                    .collect()
            }
            None => placement::order(topo, &ids, &req.name)
                .into_iter()
                .map(|i| (i, None))
                .collect(),
        };
        let fresh = source_legs.is_none();
        let mut passed_over = Vec::new();
        let candidates = if fresh {
            // A leg's position is fixed when it is made, and positions follow the boxes that
            // answer: make none unless enough answer now, or a box that is down now but up at
            // the retry would take a position another box's leg already holds.
            let mut up = Vec::new();
            for (i, none) in candidates {
                match self.members[i].ready().await {
                    Ok(()) => up.push((i, none)),
                    Err(s) => passed_over.push(format!("{}: {}", ids[i], s.message())),
                }
            }
            if up.len() < n {
                return Err(too_few(n, &[], &passed_over));
            }
            up
        } else {
            candidates
        };
        let mut queue: VecDeque<(usize, Option<String>)> = candidates.into();
        let mut made: Vec<(usize, Volume)> = Vec::new();
        // Boxes that hold a leg of this name at a later position (one made after a box before
        // them was full): asked again once the next leg is made.
        let mut waiting: Vec<usize> = Vec::new();
        let mut deferred: BTreeSet<usize> = BTreeSet::new();
        while let Some((i, source_leg)) = queue.pop_front().or_else(|| Some((waiting.pop()?, None)))
        {
            if made.len() == n {
                break;
            }
            let mut chosen: Vec<&str> = made.iter().map(|(j, _)| ids[*j]).collect();
            chosen.push(ids[i]);
            if !jointly_allowed(topo, &chosen) {
                continue;
            }
            let m = &self.members[i];
            let mut r = leg_req.clone();
            if let Some(t) = topo {
                r.accessibility_requirements = Some(placement::requirement_for(t, m.id()));
            }
            if let (Some(src), Some(leg)) = (source, &source_leg) {
                r.volume_content_source = Some(with_source_id(src, leg));
            }
            mark(&mut r, made.len(), n, &made);
            match m.call::<CreateVolumeResponse>(b.with_message(&r)).await {
                Ok(resp) => {
                    let leg = resp.volume.ok_or_else(|| {
                        Status::internal(format!("appliance {} answered no volume", m.id()))
                    })?;
                    made.push((i, leg));
                    for j in waiting.drain(..).rev() {
                        queue.push_front((j, None));
                    }
                }
                Err(s)
                    if fresh && matches!(s.code(), Code::Unavailable | Code::ResourceExhausted) =>
                {
                    passed_over.push(format!("{}: {}", m.id(), s.message()));
                }
                Err(s) if fresh && s.code() == Code::AlreadyExists => {
                    let Some((k, leg)) = self.earlier_position(b, &r, i, n, &made).await? else {
                        if deferred.insert(i) {
                            waiting.push(i);
                            continue;
                        }
                        return Err(leg_status(&s, &r.name, m.id()));
                    };
                    // This box's leg, made by an earlier attempt while a box before it was full,
                    // holds position k: the legs this attempt made from k on make way for it.
                    let displaced = made.split_off(k);
                    made.push((i, leg));
                    for (j, v) in displaced.into_iter().rev() {
                        let why = "made way for an earlier attempt's leg";
                        self.remove_leg(j, &v.volume_id, &r.secrets, why).await?;
                        queue.push_front((j, None));
                    }
                }
                Err(s) => {
                    let refused = leg_status(&s, &r.name, m.id());
                    return Err(self.undo_refused(b, &r, i, &made, refused).await);
                }
            }
        }
        if made.len() < n {
            let kept: Vec<&str> = made.iter().map(|(_, v)| v.volume_id.as_str()).collect();
            return Err(too_few(n, &kept, &passed_over));
        }
        let boxes: Vec<&str> = made.iter().map(|(i, _)| ids[*i]).collect();
        let last = &made[n - 1].1;
        let volume_context = replicated_context(&last.volume_context, n);
        let volume = Volume {
            capacity_bytes: offered(made.iter().map(|(_, v)| v.capacity_bytes)),
            volume_id: join_legs(made.iter().map(|(_, v)| v.volume_id.as_str())),
            volume_context,
            content_source: req.volume_content_source.clone(),
            accessible_topology: topology_of(&boxes),
        };
        tracing::info!(volume = %volume.volume_id, bytes = volume.capacity_bytes, "replicated volume created");
        Ok(reply(&CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    /// The position below `made.len()` at which box `i` already holds leg `r.name` of this
    /// chain, with that leg. Each try names a leg that exists on the box, so none creates one.
    async fn earlier_position(
        &self,
        b: &Buffered,
        r: &CreateVolumeRequest,
        i: usize,
        n: usize,
        made: &[(usize, Volume)],
    ) -> Result<Option<(usize, Volume)>, Status> {
        let m = &self.members[i];
        for k in 0..made.len() {
            let mut probe = r.clone();
            mark(&mut probe, k, n, made);
            match m.call::<CreateVolumeResponse>(b.with_message(&probe)).await {
                Ok(resp) => return Ok(resp.volume.map(|v| (k, v))),
                Err(s) if s.code() == Code::AlreadyExists => {}
                Err(s) => return Err(leg_status(&s, &r.name, m.id())),
            }
        }
        Ok(None)
    }

    /// `refused`, the answer of box `i` to leg request `r`, after the legs `made` before it are
    /// deleted when the refusal is permanent. A permanent refusal (OUT_OF_RANGE,
    /// INVALID_ARGUMENT, ALREADY_EXISTS, NOT_FOUND) comes again for the same request, so the
    /// volume can never be completed from those legs: kept, they would be hidden (ListVolumes
    /// shows a replicated volume from its last leg), have no id the CO could delete, and make a
    /// corrected retry meet ALREADY_EXISTS. A transient one (RESOURCE_EXHAUSTED, UNAVAILABLE,
    /// anything else) keeps them: the retry finds them by name and completes the volume.
    /// They are deleted only when box `i` holds no leg of the name (asked with the existing-only
    /// question): legs are made in order and a volume is answered only once its last leg
    /// exists, so a chain missing a leg was never acknowledged, while one whose refusing box
    /// holds a leg may be a volume the CO has.
    async fn undo_refused(
        &self,
        b: &Buffered,
        r: &CreateVolumeRequest,
        i: usize,
        made: &[(usize, Volume)],
        refused: Status,
    ) -> Status {
        if !refused_for_good(refused.code()) || made.is_empty() {
            return refused;
        }
        let m = &self.members[i];
        let mut probe = r.clone();
        probe
            .parameters
            .insert(placement::EXISTING_ONLY_PARAM.to_owned(), "true".to_owned());
        let asked = m.call::<CreateVolumeResponse>(b.with_message(&probe)).await;
        match asked {
            Err(s) if s.code() == Code::NotFound => {}
            _ => {
                tracing::warn!(leg = %r.name, appliance = %m.id(), "legs of a refused CreateVolume kept: the refusing appliance may hold a leg of the name");
                return refused;
            }
        }
        let mut left = Vec::new();
        for (j, v) in made.iter().rev() {
            let why = "a later leg was refused for good";
            if let Err(s) = self.remove_leg(*j, &v.volume_id, &r.secrets, why).await {
                left.push(s.message().to_owned());
            }
        }
        if left.is_empty() {
            let removed: Vec<&str> = made.iter().map(|(_, v)| v.volume_id.as_str()).collect();
            Status::new(
                refused.code(),
                format!(
                    "{} (the legs made before it were deleted: {})",
                    refused.message(),
                    removed.join(", ")
                ),
            )
        } else {
            Status::new(
                refused.code(),
                format!(
                    "{} (and legs made before it could not be deleted: {})",
                    refused.message(),
                    left.join("; ")
                ),
            )
        }
    }

    /// Deletes leg `id` on box `i`, made by this CreateVolume and not to be kept (`why`, logged).
    async fn remove_leg(
        &self,
        i: usize,
        id: &str,
        secrets: &HashMap<String, String>,
        why: &str,
    ) -> Result<(), Status> {
        let m = &self.members[i];
        let req = DeleteVolumeRequest {
            volume_id: id.to_owned(),
            secrets: secrets.clone(),
        };
        m.call::<DeleteVolumeResponse>(request("/csi.v1.Controller/DeleteVolume", &req))
            .await
            .map_err(|s| leg_status(&s, id, m.id()))?;
        tracing::info!(leg = %id, appliance = %m.id(), why = %why, "leg deleted");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legs_carry_the_md_offset_and_the_volume_offers_the_smallest_leg_less_it() {
        let mib = 1 << 20;
        let r = leg_range(
            Some(&CapacityRange {
                required_bytes: 64 * mib,
                limit_bytes: 0,
            }),
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!((r.required_bytes, r.limit_bytes), (65 * mib, 0));
        let r = leg_range(None, false).unwrap().unwrap();
        assert_eq!(r.required_bytes, (1 << 30) + mib);
        let r = leg_range(
            Some(&CapacityRange {
                required_bytes: 0,
                limit_bytes: 8 * mib,
            }),
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!((r.required_bytes, r.limit_bytes), (9 * mib, 9 * mib));
        assert_eq!(
            leg_range(None, true).unwrap(),
            None,
            "sized by the source legs"
        );
        let huge = CapacityRange {
            required_bytes: i64::MAX,
            limit_bytes: 0,
        };
        assert_eq!(
            leg_range(Some(&huge), false).unwrap_err().code(),
            Code::OutOfRange
        );
        assert_eq!(offered([66 * mib, 65 * mib]), 64 * mib);
    }

    #[test]
    fn capacity_adds_up_for_plain_volumes_and_is_the_nth_box_for_replicated_ones() {
        let mib = 1 << 20;
        let box_ = |free: i64| GetCapacityResponse {
            available_capacity: free * mib,
            maximum_volume_size: Some(free * mib),
            minimum_volume_size: Some(mib),
        };
        let boxes = [box_(100), box_(40), box_(70)];
        let plain = capacity_of(&boxes, 1);
        assert_eq!(plain.available_capacity, 210 * mib);
        assert_eq!(plain.maximum_volume_size, Some(100 * mib));
        let two = capacity_of(&boxes, 2);
        assert_eq!(two.available_capacity, 69 * mib);
        assert_eq!(two.maximum_volume_size, Some(69 * mib));
        assert_eq!(capacity_of(&boxes, 3).available_capacity, 39 * mib);
        assert_eq!(capacity_of(&boxes[..1], 2).available_capacity, 0);
        assert_eq!(two.minimum_volume_size, Some(mib));
    }

    #[test]
    fn the_replicas_parameter_is_one_to_three() {
        let p = |v: &str| HashMap::from([(REPLICAS_PARAM.to_owned(), v.to_owned())]);
        assert_eq!(replicas_param(&HashMap::new()).unwrap(), None);
        assert_eq!(replicas_param(&p("2")).unwrap(), Some(2));
        for bad in ["0", "4", "two", ""] {
            assert_eq!(
                replicas_param(&p(bad)).unwrap_err().code(),
                Code::InvalidArgument
            );
        }
        assert!(is_replicated("a-v1+b-v2") && !is_replicated("a-v1"));
    }
}
