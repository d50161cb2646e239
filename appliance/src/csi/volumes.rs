//! The Controller's operations on the pool: one function per RPC. Each takes its validated
//! request ([`super::request`]), resolves CSI ids ([`Ids`]), makes its core calls (staged: the
//! handler's one [`super::call`] answers once a group commit made them durable) and encodes the
//! answer ([`super::encode`]). They run under the pool lock and fail with [`Error`] only.
//!
//! Idempotency is core's: CreateVolume asks core for the volume the request describes (see
//! [`capacity::choose`] for the size) and core returns the existing one of that name when it
//! matches, or refuses it (ALREADY_EXISTS); CreateSnapshot likewise by name and source.

use std::collections::HashMap;

use edgevol_core::{
    AccessMode, BlockDevice, ContentSource, DeviceError, ObjectRef, Pool, Precondition,
    Provisioning, ReadSegment, SnapshotId, VolumeId, VolumeSpec,
};
use edgevol_proto::csi::v1::validate_volume_capabilities_response::Confirmed;
use edgevol_proto::csi::v1::{
    controller_get_volume_response, list_snapshots_response, list_volumes_response,
    ControllerGetVolumeResponse, GetCapacityResponse, ListSnapshotsResponse, ListVolumesResponse,
    Snapshot, ValidateVolumeCapabilitiesResponse,
};

use super::error::{gone_is_ok, Error};
use super::ids::Ids;
use super::request::{
    ById, CreateSnapshot, CreateVolume, Expand, GetCapacity, ListSnapshots, Modify, Page, Publish,
    Unpublish, ValidateCapabilities,
};
use super::{capacity, encode, encryption, page, topology};
use crate::nvme::stats::IoStats;
use crate::nvme::TargetInfo;
use crate::pool::PoolDevice;
use crate::state::{now_nanos, State};

type Core = Pool<PoolDevice>;

/// Every access mode, for subset checks.
const ALL_MODES: [AccessMode; 7] = [
    AccessMode::SingleNodeWriter,
    AccessMode::SingleNodeReaderOnly,
    AccessMode::MultiNodeReaderOnly,
    AccessMode::MultiNodeSingleWriter,
    AccessMode::MultiNodeMultiWriter,
    AccessMode::SingleNodeSingleWriter,
    AccessMode::SingleNodeMultiWriter,
];

fn ids(state: &State) -> Ids<'_> {
    Ids::new(&state.appliance_id)
}

/// CreateVolume: the volume the request describes, created or (core's rule) found; the caller
/// turns its facts into the answer once the group commit released the pool.
pub fn create_volume(
    state: &State,
    pool: &mut Core,
    op: CreateVolume,
) -> Result<encode::VolumeFacts, Error> {
    topology::check_requisite(state, &op.requisite)?;
    let (source, source_size) = match &op.source {
        Some(s) => {
            let (source, size) = s.resolve(ids(state), pool)?;
            (Some(source), size)
        }
        None => (None, 0),
    };
    let parameters = encryption::inherit(op.parameters, source_parameters(pool, source)?)?;
    let existing = pool.volume_by_name(&op.name).map(|v| v.size());
    let cluster = u64::from(pool.cluster_size());
    let size = capacity::choose(op.range, source_size, cluster, existing)?;
    let id = pool.create_volume(VolumeSpec {
        name: op.name,
        size,
        provisioning: op.provisioning,
        parameters,
        source,
        access_modes: op.modes,
        group: None,
    })?;
    // A second commit: a retry after a crash between the two finishes the job (no commit when
    // nothing changes).
    if !op.mutable.is_empty() {
        pool.modify_volume(id, &op.mutable)?;
    }
    Ok(encode::VolumeFacts::of(pool, pool.volume(id)?))
}

/// What is known of the encryption of the data a content source copies: the parameters of the
/// cloned volume, or of the volume a snapshot was taken of while it exists; once that volume is
/// gone (core keeps snapshots, without parameters), whether the snapshot starts with a LUKS2
/// header ([`snapshot_has_luks2_header`]). `None`: no source, or a snapshot of a deleted volume
/// without that header (encrypted or not, as the request asks).
fn source_parameters(
    pool: &mut Core,
    source: Option<ContentSource>,
) -> Result<Option<encryption::Source<'_>>, Error> {
    let volume = match source {
        None => return Ok(None),
        Some(ContentSource::Volume(id)) => id,
        Some(ContentSource::Snapshot(id)) => {
            let volume = pool.snapshot(id)?.source_volume();
            if pool.volume(volume).is_err() {
                let header = snapshot_has_luks2_header(pool, id)?;
                return Ok(header.then_some(encryption::Source::Luks2Header));
            }
            volume
        }
    };
    Ok(Some(encryption::Source::Parameters(
        pool.volume(volume)?.parameters(),
    )))
}

/// Whether snapshot `id` starts with a LUKS2 header: its first block, read through core's map
/// from the pool device under the pool lock like any read. Only the header's magic and version
/// are looked at ([`encryption::starts_with_luks2`]): the appliance never parses, keeps or logs
/// key slots or any other key material. A snapshot smaller than a block holds no header. A failed
/// read fails the CreateVolume (a retry may succeed) rather than guess the copy plain.
fn snapshot_has_luks2_header(pool: &mut Core, id: SnapshotId) -> Result<bool, Error> {
    let block_size = pool.device_mut().block_size();
    let block = u64::from(block_size);
    if pool.snapshot(id)?.size() < block {
        return Ok(false);
    }
    // The first block lies in the first cluster (a whole number of blocks): one segment.
    let Some(ReadSegment::Data { device_offset, .. }) = pool.map_read(id, 0, block)?.next() else {
        // Never written: a hole reads as zeros.
        return Ok(false);
    };
    let mut first = vec![0u8; block_size as usize];
    pool.device_mut()
        .read(device_offset / block, &mut first)
        .map_err(|e| edgevol_core::Error::Device(e.kind()))?;
    Ok(encryption::starts_with_luks2(&first))
}

/// DeleteVolume: gone, or never ours, is success.
pub fn delete_volume(state: &State, pool: &mut Core, op: &ById) -> Result<(), Error> {
    gone_is_ok(
        ids(state)
            .require_volume(&op.id)
            .and_then(|id| Ok(pool.delete_volume(id)?)),
    )
}

/// A publication made (or found): what its publish context is built from, after the commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The volume published.
    pub volume: VolumeId,
    /// The pool's UUID (the namespace's NGUID and UUID derive from it).
    pub pool_uuid: [u8; 16],
    /// Read-only, as asked.
    pub readonly: bool,
}

impl Published {
    /// Where and how the node reaches the volume ([`encode::publish_context`]).
    pub fn context(&self, state: &State, target: &TargetInfo) -> HashMap<String, String> {
        encode::publish_context(
            &state.appliance_id,
            target.endpoint,
            self.pool_uuid,
            self.volume,
            self.readonly,
        )
    }
}

/// ControllerPublishVolume: the node's host NQN joins the volume's durable publications (the
/// target's ACL); the caller builds the publish context ([`Published::context`]) once the
/// group commit released the pool.
pub fn publish(state: &State, pool: &mut Core, op: Publish) -> Result<Published, Error> {
    if !crate::naming::is_host_nqn(&op.node_id) {
        return Err(Error::UnknownNode(op.node_id));
    }
    let id = ids(state).require_volume(&op.volume_id)?;
    if !pool.volume(id)?.access_modes().contains(op.mode) {
        return Err(Error::ModeNotCreated(id));
    }
    match pool.publish(id, &op.node_id, op.readonly) {
        Ok(()) => {}
        Err(edgevol_core::Error::FailedPrecondition(Precondition::PublishedToOtherHost(_))) => {
            return Err(Error::PublishedElsewhere {
                volume: id,
                holders: encode::published_nodes(pool.volume(id)?),
                readonly: op.readonly,
            });
        }
        Err(edgevol_core::Error::AlreadyExists(_)) => {
            return Err(Error::PublishedOtherwise {
                volume: id,
                node: op.node_id,
                readonly: op.readonly,
            });
        }
        Err(e) => return Err(e.into()),
    }
    Ok(Published {
        volume: id,
        pool_uuid: pool.uuid(),
        readonly: op.readonly,
    })
}

/// ControllerUnpublishVolume: the node (or every node) leaves the publications. Returns the nodes
/// removed; the caller tears down their live connections once the removal is durable (so a host
/// never keeps access the metadata no longer grants after a crash). An unknown volume or node is
/// already unpublished.
pub fn unpublish(state: &State, pool: &mut Core, op: &Unpublish) -> Result<Vec<String>, Error> {
    let Some(id) = ids(state).parse_volume(&op.volume_id) else {
        return Ok(Vec::new());
    };
    let nodes: Vec<String> = match pool.volume(id) {
        Ok(v) => encode::published_nodes(v)
            .into_iter()
            .filter(|h| op.node_id.is_empty() || *h == op.node_id)
            .collect(),
        Err(edgevol_core::Error::NotFound(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    for node in &nodes {
        pool.unpublish(id, node)?;
    }
    Ok(nodes)
}

/// ValidateVolumeCapabilities: confirmed when the volume was created for every mode asked, with
/// the parameters asked (if any), and holds the mutable parameters asked.
pub fn validate_capabilities(
    state: &State,
    pool: &mut Core,
    op: ValidateCapabilities,
) -> Result<ValidateVolumeCapabilitiesResponse, Error> {
    let v = pool.volume(ids(state).require_volume(&op.volume_id)?)?;
    let mut stored = v.parameters().to_vec();
    stored.sort();
    let (modes, mutable) = (v.access_modes(), v.mutable_parameters());
    let verdict = match op.capabilities {
        Err(why) => Err(why),
        Ok(r)
            if ALL_MODES
                .iter()
                .any(|m| r.modes.contains(*m) && !modes.contains(*m)) =>
        {
            Err("the volume was not created for every requested access mode".to_owned())
        }
        Ok(_) if !op.parameters.is_empty() && op.parameters != stored => {
            Err("parameters differ from those the volume was created with".to_owned())
        }
        Ok(_) => match op.mutable {
            Err(e) => Err(e),
            Ok(pairs) if pairs.iter().any(|p| !mutable.contains(p)) => {
                Err("mutable_parameters differ from the volume's".to_owned())
            }
            Ok(_) => Ok(()),
        },
    };
    Ok(confirmation(verdict, op.confirmed))
}

fn confirmation(
    verdict: Result<(), String>,
    confirmed: Confirmed,
) -> ValidateVolumeCapabilitiesResponse {
    match verdict {
        Ok(()) => ValidateVolumeCapabilitiesResponse {
            confirmed: Some(confirmed),
            message: String::new(),
        },
        Err(message) => ValidateVolumeCapabilitiesResponse {
            confirmed: None,
            message,
        },
    }
}

/// A Controller pagination token: the core id after which to continue.
fn after(token: &str) -> Result<Option<u64>, Error> {
    if token.is_empty() {
        return Ok(None);
    }
    token
        .parse()
        .map(Some)
        .map_err(|_| Error::BadToken(token.to_owned()))
}

/// ListVolumes: volumes in id order, each with its nodes and condition.
pub fn list_volumes(
    state: &State,
    pool: &mut Core,
    op: &Page,
    stats: Option<&IoStats>,
) -> Result<ListVolumesResponse, Error> {
    let after = after(&op.starting_token)?.map(edgevol_core::VolumeId);
    let pool = &*pool;
    let (volumes, next_token) = page(pool.volumes(after), op.max_entries, |v| {
        v.id().0.to_string()
    });
    let entries = volumes
        .into_iter()
        .map(|v| list_volumes_response::Entry {
            volume: Some(encode::volume(state, pool, v)),
            status: Some(list_volumes_response::VolumeStatus {
                published_node_ids: encode::published_nodes(v),
                volume_condition: Some(encode::condition(
                    pool,
                    stats.map(|s| s.media_health(v.id())),
                )),
            }),
        })
        .collect();
    Ok(ListVolumesResponse {
        entries,
        next_token,
    })
}

/// GetCapacity: free space where the appliance lies and for capabilities it supports, else 0.
pub fn get_capacity(
    state: &State,
    pool: &mut Core,
    op: &GetCapacity,
) -> Result<GetCapacityResponse, Error> {
    let here = op
        .topology
        .as_ref()
        .is_none_or(|t| topology::contains(state, t));
    let available = if op.usable && here {
        pool.capacity().free
    } else {
        0
    };
    // A thin volume may be larger than the free space (it allocates on write); a thick one
    // reserves everything at creation.
    let maximum = match (op.usable && here, op.provisioning) {
        (false, _) => 0,
        (true, Provisioning::Thin) => edgevol_core::limits::MAX_VOLUME_SIZE,
        (true, Provisioning::Thick) => available,
    };
    Ok(GetCapacityResponse {
        available_capacity: encode::i64_of(available),
        maximum_volume_size: Some(encode::i64_of(maximum)),
        minimum_volume_size: Some(encode::i64_of(u64::from(pool.cluster_size()))),
    })
}

/// CreateSnapshot: created, or (core's rule: same name and source) found.
pub fn create_snapshot(
    state: &State,
    pool: &mut Core,
    op: &CreateSnapshot,
) -> Result<Snapshot, Error> {
    let ids = ids(state);
    let source = ids.require_volume(&op.source_volume_id)?;
    let id = pool.create_snapshot(source, &op.name, now_nanos())?;
    Ok(encode::snapshot(ids, pool.snapshot(id)?))
}

/// CreateSnapshot asked with [`super::params::EXISTING_ONLY_PARAM`]: the snapshot of that name
/// as an idempotent CreateSnapshot answers it (ALREADY_EXISTS when its source is not the one
/// asked), `None` when there is none; creates nothing. The name is looked up before the source
/// id is resolved: the proxy asks with a volume of another appliance, which names nothing here
/// and must not hide a snapshot of the name.
pub fn find_snapshot(
    state: &State,
    pool: &mut Core,
    op: &CreateSnapshot,
) -> Result<Option<Snapshot>, Error> {
    let ids = ids(state);
    let Some(found) = pool.snapshot_by_name(&op.name) else {
        return Ok(None);
    };
    if ids.volume(found.source_volume()) != op.source_volume_id {
        return Err(edgevol_core::Error::AlreadyExists(ObjectRef::Snapshot(found.id())).into());
    }
    Ok(Some(encode::snapshot(ids, found)))
}

/// DeleteSnapshot: gone, or never ours, is success.
pub fn delete_snapshot(state: &State, pool: &mut Core, op: &ById) -> Result<(), Error> {
    gone_is_ok(
        ids(state)
            .require_snapshot(&op.id)
            .and_then(|id| Ok(pool.delete_snapshot(id)?)),
    )
}

/// GetSnapshot: the snapshot exactly as ListSnapshots shows it (one encoding), or NOT_FOUND
/// for an id that is not one of ours or is gone.
pub fn get_snapshot(state: &State, pool: &mut Core, op: &ById) -> Result<Snapshot, Error> {
    let ids = ids(state);
    let id = ids.require_snapshot(&op.id)?;
    Ok(encode::snapshot(ids, pool.snapshot(id)?))
}

/// ListSnapshots: in id order, filtered by id and source volume. A filter naming nothing of
/// ours matches nothing: an empty list, not an error.
pub fn list_snapshots(
    state: &State,
    pool: &mut Core,
    op: &ListSnapshots,
) -> Result<ListSnapshotsResponse, Error> {
    let ids = ids(state);
    let after = after(&op.page.starting_token)?.map(edgevol_core::SnapshotId);
    let by_id = (!op.snapshot_id.is_empty()).then(|| ids.parse_snapshot(&op.snapshot_id));
    let by_source =
        (!op.source_volume_id.is_empty()).then(|| ids.parse_volume(&op.source_volume_id));
    if matches!(by_id, Some(None)) || matches!(by_source, Some(None)) {
        return Ok(ListSnapshotsResponse::default());
    }
    let (by_id, by_source) = (by_id.flatten(), by_source.flatten());
    let matching = pool.snapshots(after).filter(|s| {
        by_id.is_none_or(|id| s.id() == id) && by_source.is_none_or(|v| s.source_volume() == v)
    });
    let (snapshots, next_token) = page(matching, op.page.max_entries, |s| s.id().0.to_string());
    Ok(ListSnapshotsResponse {
        entries: snapshots
            .into_iter()
            .map(|s| list_snapshots_response::Entry {
                snapshot: Some(encode::snapshot(ids, s)),
            })
            .collect(),
        next_token,
    })
}

/// ControllerExpandVolume: the new size (the current one if it already satisfies the range),
/// and whether it changed; the caller tells connected hosts (an async event) once it is durable.
pub fn expand(state: &State, pool: &mut Core, op: &Expand) -> Result<(u64, bool), Error> {
    let id = ids(state).require_volume(&op.volume_id)?;
    let current = pool.volume(id)?.size();
    if current >= op.range.required {
        return Ok((current, false));
    }
    let cluster = u64::from(pool.cluster_size());
    let size = pool.expand_volume(id, capacity::choose(Some(op.range), 0, cluster, None)?)?;
    Ok((size, size != current))
}

/// ControllerGetVolume: the volume, its nodes and its condition.
pub fn get_volume(
    state: &State,
    pool: &mut Core,
    op: &ById,
    stats: Option<&IoStats>,
) -> Result<ControllerGetVolumeResponse, Error> {
    let id = ids(state).require_volume(&op.id)?;
    let v = pool.volume(id)?;
    Ok(ControllerGetVolumeResponse {
        volume: Some(encode::volume(state, pool, v)),
        status: Some(controller_get_volume_response::VolumeStatus {
            published_node_ids: encode::published_nodes(v),
            volume_condition: Some(encode::condition(pool, stats.map(|s| s.media_health(id)))),
        }),
    })
}

/// ControllerModifyVolume: the mutable parameters given take their values (the empty value
/// removes a key). Returns the volume and all of its mutable parameters now.
pub fn modify(
    state: &State,
    pool: &mut Core,
    op: &Modify,
) -> Result<(VolumeId, Vec<(String, String)>), Error> {
    let id = ids(state).require_volume(&op.volume_id)?;
    pool.modify_volume(id, &op.changes)?;
    Ok((id, pool.volume(id)?.mutable_parameters().to_vec()))
}
