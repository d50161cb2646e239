//! Controller requests, validated: each `TryFrom<…Request>` checks every field the call needs
//! ([`validate`], [`capability`], [`params`], [`qos`], [`SizeRange`], [`SourceRef`]) and yields
//! the operation [`super::volumes`] runs on the pool. Failures here are INVALID_ARGUMENT;
//! nothing here looks at the pool, so ids are kept as given and resolved there.

use std::collections::HashMap;

use edgevol_core::{AccessMode, AccessModes, Provisioning};
use edgevol_proto::csi::v1::validate_volume_capabilities_response::Confirmed;
use edgevol_proto::csi::v1::volume_capability::AccessType;
use edgevol_proto::csi::v1::{
    ControllerExpandVolumeRequest, ControllerGetVolumeRequest, ControllerModifyVolumeRequest,
    ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest, CreateSnapshotRequest,
    CreateVolumeRequest, DeleteSnapshotRequest, DeleteVolumeRequest, GetCapacityRequest,
    GetSnapshotRequest, ListSnapshotsRequest, ListVolumesRequest, Topology,
    ValidateVolumeCapabilitiesRequest,
};
use tonic::Status;

use super::capability::{self, Requested};
use super::capacity::SizeRange;
use super::source::SourceRef;
use super::{params, qos, validate};

/// CreateVolume.
#[derive(Debug)]
pub struct CreateVolume {
    /// The name (the idempotency key).
    pub name: String,
    /// StorageClass parameters, sorted, as core stores them.
    pub parameters: Vec<(String, String)>,
    /// Thin or thick.
    pub provisioning: Provisioning,
    /// The union of the requested access modes.
    pub modes: AccessModes,
    /// Mutable parameters to apply (QoS), sorted.
    pub mutable: Vec<(String, String)>,
    /// The capacity range, if any.
    pub range: Option<SizeRange>,
    /// The content source, if any.
    pub source: Option<SourceRef>,
    /// Requisite topologies (empty: anywhere).
    pub requisite: Vec<Topology>,
    /// Only the existing volume of the name is wanted ([`params::EXISTING_ONLY_PARAM`]).
    pub existing_only: bool,
}

impl TryFrom<CreateVolumeRequest> for CreateVolume {
    type Error = Status;

    fn try_from(mut r: CreateVolumeRequest) -> Result<Self, Status> {
        validate::required("name", &r.name)?;
        validate::map("parameters", &r.parameters)?;
        // Off before anything compares or stores the parameters: the question, not the volume.
        let existing_only = params::take_existing_only(&mut r.parameters)?;
        validate::map("mutable_parameters", &r.mutable_parameters)?;
        validate::secrets(&r.secrets)?;
        let mutable = qos::parse(&r.mutable_parameters)?;
        let requested =
            capability::check_all(&r.volume_capabilities).map_err(Status::invalid_argument)?;
        let provisioning = params::parse(&r.parameters)?.provisioning;
        let range = r
            .capacity_range
            .as_ref()
            .map(SizeRange::parse)
            .transpose()?;
        let source = SourceRef::parse(r.volume_content_source)?;
        let mut parameters: Vec<(String, String)> = r.parameters.into_iter().collect();
        parameters.sort();
        Ok(CreateVolume {
            name: r.name,
            parameters,
            provisioning,
            modes: requested.modes,
            mutable,
            range,
            source,
            requisite: r
                .accessibility_requirements
                .map(|a| a.requisite)
                .unwrap_or_default(),
            existing_only,
        })
    }
}

/// A call on one object named by its CSI id: DeleteVolume, DeleteSnapshot, GetSnapshot,
/// ControllerGetVolume.
#[derive(Debug)]
pub struct ById {
    /// The id, as given.
    pub id: String,
}

impl ById {
    fn new(field: &str, id: String, secrets: &HashMap<String, String>) -> Result<Self, Status> {
        validate::required(field, &id)?;
        validate::secrets(secrets)?;
        Ok(ById { id })
    }
}

impl TryFrom<DeleteVolumeRequest> for ById {
    type Error = Status;

    fn try_from(r: DeleteVolumeRequest) -> Result<Self, Status> {
        ById::new("volume_id", r.volume_id, &r.secrets)
    }
}

impl TryFrom<DeleteSnapshotRequest> for ById {
    type Error = Status;

    fn try_from(r: DeleteSnapshotRequest) -> Result<Self, Status> {
        ById::new("snapshot_id", r.snapshot_id, &r.secrets)
    }
}

impl TryFrom<GetSnapshotRequest> for ById {
    type Error = Status;

    fn try_from(r: GetSnapshotRequest) -> Result<Self, Status> {
        ById::new("snapshot_id", r.snapshot_id, &r.secrets)
    }
}

impl TryFrom<ControllerGetVolumeRequest> for ById {
    type Error = Status;

    fn try_from(r: ControllerGetVolumeRequest) -> Result<Self, Status> {
        // This request carries no secrets.
        ById::new("volume_id", r.volume_id, &HashMap::new())
    }
}

/// ControllerPublishVolume.
#[derive(Debug)]
pub struct Publish {
    /// The volume, as given.
    pub volume_id: String,
    /// The node: its host NQN.
    pub node_id: String,
    /// The access mode of the capability.
    pub mode: AccessMode,
    /// Read-only: asked for, or implied by a reader-only mode.
    pub readonly: bool,
}

impl TryFrom<ControllerPublishVolumeRequest> for Publish {
    type Error = Status;

    fn try_from(r: ControllerPublishVolumeRequest) -> Result<Self, Status> {
        validate::required("volume_id", &r.volume_id)?;
        validate::required("node_id", &r.node_id)?;
        validate::map("volume_context", &r.volume_context)?;
        validate::secrets(&r.secrets)?;
        let cap = r
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        let mode = capability::check(cap).map_err(Status::invalid_argument)?;
        // Reader-only modes publish read-only whatever the CO says.
        let readonly = r.readonly
            || matches!(
                mode,
                AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly
            );
        Ok(Publish {
            volume_id: r.volume_id,
            node_id: r.node_id,
            mode,
            readonly,
        })
    }
}

/// ControllerUnpublishVolume.
#[derive(Debug)]
pub struct Unpublish {
    /// The volume, as given.
    pub volume_id: String,
    /// The node; empty: every node.
    pub node_id: String,
}

impl TryFrom<ControllerUnpublishVolumeRequest> for Unpublish {
    type Error = Status;

    fn try_from(r: ControllerUnpublishVolumeRequest) -> Result<Self, Status> {
        validate::required("volume_id", &r.volume_id)?;
        validate::string("node_id", &r.node_id)?;
        validate::secrets(&r.secrets)?;
        Ok(Unpublish {
            volume_id: r.volume_id,
            node_id: r.node_id,
        })
    }
}

/// ValidateVolumeCapabilities: what is asked, checked as far as the request alone allows. An
/// unsupported capability or malformed mutable parameter is not an error but the verdict.
#[derive(Debug)]
pub struct ValidateCapabilities {
    /// The volume, as given.
    pub volume_id: String,
    /// The capabilities, or why they are unsupported.
    pub capabilities: Result<Requested, String>,
    /// The parameters, sorted; empty: not asked about.
    pub parameters: Vec<(String, String)>,
    /// The mutable parameters, or why they are malformed.
    pub mutable: Result<Vec<(String, String)>, String>,
    /// What a positive verdict confirms: the request's own fields.
    pub confirmed: Confirmed,
}

impl TryFrom<ValidateVolumeCapabilitiesRequest> for ValidateCapabilities {
    type Error = Status;

    fn try_from(r: ValidateVolumeCapabilitiesRequest) -> Result<Self, Status> {
        validate::required("volume_id", &r.volume_id)?;
        validate::map("volume_context", &r.volume_context)?;
        validate::map("parameters", &r.parameters)?;
        validate::map("mutable_parameters", &r.mutable_parameters)?;
        validate::secrets(&r.secrets)?;
        if r.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        let mut parameters: Vec<(String, String)> = r.parameters.clone().into_iter().collect();
        parameters.sort();
        Ok(ValidateCapabilities {
            volume_id: r.volume_id,
            capabilities: capability::check_all(&r.volume_capabilities),
            parameters,
            mutable: qos::parse(&r.mutable_parameters).map_err(|e| e.message().to_owned()),
            confirmed: Confirmed {
                volume_context: r.volume_context,
                volume_capabilities: r.volume_capabilities,
                parameters: r.parameters,
                mutable_parameters: r.mutable_parameters,
            },
        })
    }
}

/// A page of a List call: its size (0 in the request: all) and the token it starts after.
#[derive(Debug)]
pub struct Page {
    /// Most entries to return.
    pub max_entries: usize,
    /// `starting_token`, as given (checked on the pool: tokens are ids).
    pub starting_token: String,
}

impl TryFrom<ListVolumesRequest> for Page {
    type Error = Status;

    fn try_from(r: ListVolumesRequest) -> Result<Self, Status> {
        Ok(Page {
            max_entries: validate::max_entries(r.max_entries)?,
            starting_token: r.starting_token,
        })
    }
}

/// ListSnapshots: a page, and the filters.
#[derive(Debug)]
pub struct ListSnapshots {
    /// The page.
    pub page: Page,
    /// Only this snapshot (empty: any).
    pub snapshot_id: String,
    /// Only snapshots of this volume (empty: any).
    pub source_volume_id: String,
}

impl TryFrom<ListSnapshotsRequest> for ListSnapshots {
    type Error = Status;

    fn try_from(r: ListSnapshotsRequest) -> Result<Self, Status> {
        validate::string("snapshot_id", &r.snapshot_id)?;
        validate::string("source_volume_id", &r.source_volume_id)?;
        validate::secrets(&r.secrets)?;
        Ok(ListSnapshots {
            page: Page {
                max_entries: validate::max_entries(r.max_entries)?,
                starting_token: r.starting_token,
            },
            snapshot_id: r.snapshot_id,
            source_volume_id: r.source_volume_id,
        })
    }
}

/// GetCapacity.
#[derive(Debug)]
pub struct GetCapacity {
    /// Thin or thick, from the parameters.
    pub provisioning: Provisioning,
    /// Whether every capability asked about is supported.
    pub usable: bool,
    /// The topology asked about, if any.
    pub topology: Option<Topology>,
}

impl TryFrom<GetCapacityRequest> for GetCapacity {
    type Error = Status;

    fn try_from(r: GetCapacityRequest) -> Result<Self, Status> {
        validate::map("parameters", &r.parameters)?;
        Ok(GetCapacity {
            provisioning: params::parse(&r.parameters)?.provisioning,
            usable: r
                .volume_capabilities
                .iter()
                .all(|c| capability::check(c).is_ok()),
            topology: r.accessible_topology,
        })
    }
}

/// CreateSnapshot.
#[derive(Debug)]
pub struct CreateSnapshot {
    /// The source volume, as given.
    pub source_volume_id: String,
    /// The name (the idempotency key).
    pub name: String,
    /// Only the existing snapshot of the name is wanted ([`params::EXISTING_ONLY_PARAM`]).
    pub existing_only: bool,
}

impl TryFrom<CreateSnapshotRequest> for CreateSnapshot {
    type Error = Status;

    fn try_from(mut r: CreateSnapshotRequest) -> Result<Self, Status> {
        validate::required("source_volume_id", &r.source_volume_id)?;
        validate::required("name", &r.name)?;
        validate::map("parameters", &r.parameters)?;
        // The proxy's question, not a snapshot parameter (snapshots take none).
        let existing_only = params::take_existing_only(&mut r.parameters)?;
        validate::secrets(&r.secrets)?;
        if let Some(key) = r.parameters.keys().next() {
            return Err(Status::invalid_argument(format!(
                "unknown snapshot parameter {key:?} (snapshots take none)"
            )));
        }
        Ok(CreateSnapshot {
            source_volume_id: r.source_volume_id,
            name: r.name,
            existing_only,
        })
    }
}

/// ControllerExpandVolume.
#[derive(Debug)]
pub struct Expand {
    /// The volume, as given.
    pub volume_id: String,
    /// The wanted size range.
    pub range: SizeRange,
    /// A raw block volume (no filesystem to grow on the node).
    pub block: bool,
}

impl TryFrom<ControllerExpandVolumeRequest> for Expand {
    type Error = Status;

    fn try_from(r: ControllerExpandVolumeRequest) -> Result<Self, Status> {
        validate::required("volume_id", &r.volume_id)?;
        validate::secrets(&r.secrets)?;
        let range = r
            .capacity_range
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        Ok(Expand {
            range: SizeRange::parse(range)?,
            block: r
                .volume_capability
                .as_ref()
                .is_some_and(|c| matches!(c.access_type, Some(AccessType::Block(_)))),
            volume_id: r.volume_id,
        })
    }
}

/// ControllerModifyVolume.
#[derive(Debug)]
pub struct Modify {
    /// The volume, as given.
    pub volume_id: String,
    /// The mutable parameters to set, sorted.
    pub changes: Vec<(String, String)>,
}

impl TryFrom<ControllerModifyVolumeRequest> for Modify {
    type Error = Status;

    fn try_from(r: ControllerModifyVolumeRequest) -> Result<Self, Status> {
        validate::required("volume_id", &r.volume_id)?;
        validate::map("mutable_parameters", &r.mutable_parameters)?;
        validate::secrets(&r.secrets)?;
        if r.mutable_parameters.is_empty() {
            return Err(Status::invalid_argument("mutable_parameters is required"));
        }
        Ok(Modify {
            changes: qos::parse_changes(&r.mutable_parameters)?,
            volume_id: r.volume_id,
        })
    }
}
