//! Checks the compiled descriptors in `FILE_DESCRIPTOR_SET` against CSI
//! v1.12.0 and the VolumeGroup proposal: packages, services and their exact
//! method lists (with streaming flags), the custom option extensions, and
//! every place a `csi_secret` / alpha marker is applied.
//!
//! `prost_types` drops unknown fields, so extension values on options cannot
//! be read from it. The `lens` module decodes the same bytes through a
//! minimal mirror of `google/protobuf/descriptor.proto` whose option
//! messages declare the extension numbers (1059, 1060, 1101, 1102) as
//! ordinary fields.

use std::collections::BTreeSet;

use edgevol_proto::FILE_DESCRIPTOR_SET;
use prost::Message;
use prost_types::{field_descriptor_proto::Type, FileDescriptorProto, FileDescriptorSet};

/// Just enough of descriptor.proto to read names, numbers and our options.
mod lens {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Set {
        #[prost(message, repeated, tag = "1")]
        pub file: Vec<File>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct File {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, repeated, tag = "4")]
        pub message_type: Vec<Msg>,
        #[prost(message, repeated, tag = "5")]
        pub enum_type: Vec<Enum>,
        #[prost(message, repeated, tag = "6")]
        pub service: Vec<Svc>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Msg {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, repeated, tag = "2")]
        pub field: Vec<Field>,
        #[prost(message, repeated, tag = "3")]
        pub nested_type: Vec<Msg>,
        #[prost(message, repeated, tag = "4")]
        pub enum_type: Vec<Enum>,
        #[prost(message, optional, tag = "7")]
        pub options: Option<Opts>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Field {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "8")]
        pub options: Option<Opts>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Enum {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, repeated, tag = "2")]
        pub value: Vec<EnumValue>,
        #[prost(message, optional, tag = "3")]
        pub options: Option<Opts>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EnumValue {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "3")]
        pub options: Option<Opts>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Svc {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, repeated, tag = "2")]
        pub method: Vec<Method>,
        #[prost(message, optional, tag = "3")]
        pub options: Option<Opts>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Method {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "4")]
        pub options: Option<Opts>,
    }
    /// Any of the *Options messages, seen through our extension numbers.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Opts {
        /// csi.v1.csi_secret (FieldOptions).
        #[prost(bool, optional, tag = "1059")]
        pub csi_secret: Option<bool>,
        /// csi.v1.alpha_* (every options type).
        #[prost(bool, optional, tag = "1060")]
        pub alpha: Option<bool>,
        /// volumegroup.vg_csi_secret (FieldOptions).
        #[prost(bool, optional, tag = "1101")]
        pub vg_csi_secret: Option<bool>,
        /// volumegroup.vg_alpha_* (MessageOptions, MethodOptions).
        #[prost(bool, optional, tag = "1102")]
        pub vg_alpha: Option<bool>,
    }
}

fn fds() -> FileDescriptorSet {
    FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("FILE_DESCRIPTOR_SET decodes")
}

fn file<'a>(set: &'a FileDescriptorSet, name: &str) -> &'a FileDescriptorProto {
    set.file
        .iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("{name} missing from FILE_DESCRIPTOR_SET"))
}

/// (method, input, output, client_streaming, server_streaming)
type MethodSig = (&'static str, &'static str, &'static str, bool, bool);

fn check_service(file: &FileDescriptorProto, service: &str, expected: &[MethodSig]) {
    let package = file.package();
    let svc = file
        .service
        .iter()
        .find(|s| s.name() == service)
        .unwrap_or_else(|| panic!("service {package}.{service} missing"));
    let actual: Vec<(String, String, String, bool, bool)> = svc
        .method
        .iter()
        .map(|m| {
            (
                m.name().to_owned(),
                m.input_type().to_owned(),
                m.output_type().to_owned(),
                m.client_streaming(),
                m.server_streaming(),
            )
        })
        .collect();
    let expected: Vec<(String, String, String, bool, bool)> = expected
        .iter()
        .map(|&(name, input, output, cs, ss)| {
            (
                name.to_owned(),
                format!(".{package}.{input}"),
                format!(".{package}.{output}"),
                cs,
                ss,
            )
        })
        .collect();
    assert_eq!(actual, expected, "methods of {package}.{service}");
}

/// Unary method `X(XRequest) returns (XResponse)`.
macro_rules! unary {
    ($name:literal) => {
        (
            $name,
            concat!($name, "Request"),
            concat!($name, "Response"),
            false,
            false,
        )
    };
}

#[test]
fn csi_file_header() {
    let set = fds();
    let csi = file(&set, "csi.proto");
    assert_eq!(csi.package(), "csi.v1");
    assert_eq!(csi.syntax(), "proto3");
    assert_eq!(
        csi.dependency,
        [
            "google/protobuf/descriptor.proto",
            "google/protobuf/timestamp.proto",
            "google/protobuf/wrappers.proto",
        ]
    );
    assert_eq!(
        csi.options.as_ref().and_then(|o| o.go_package.as_deref()),
        Some("github.com/container-storage-interface/spec/lib/go/csi")
    );
    let services: Vec<&str> = csi.service.iter().map(|s| s.name()).collect();
    assert_eq!(
        services,
        [
            "Identity",
            "Controller",
            "GroupController",
            "SnapshotMetadata",
            "Node"
        ]
    );

    let vg = file(&set, "volumegroup.proto");
    assert_eq!(vg.package(), "volumegroup");
    assert_eq!(vg.dependency, ["google/protobuf/descriptor.proto"]);
    assert_eq!(
        vg.options.as_ref().and_then(|o| o.go_package.as_deref()),
        Some(".;volumegroup")
    );
    let services: Vec<&str> = vg.service.iter().map(|s| s.name()).collect();
    assert_eq!(services, ["Controller"]);
}

/// edgevol's own API: the services, methods and field numbers that `edgevol-node` and the CLI
/// depend on.
#[test]
fn edgevol_v1_services_and_enrolment_fields() {
    let set = fds();
    let ev = file(&set, "edgevol.proto");
    assert_eq!(ev.package(), "edgevol.v1");
    assert_eq!(ev.syntax(), "proto3");
    assert_eq!(ev.dependency, ["google/protobuf/timestamp.proto"]);
    let services: Vec<&str> = ev.service.iter().map(|s| s.name()).collect();
    assert_eq!(services, ["Enrolment", "HostKeys", "Firmware"]);
    check_service(ev, "Enrolment", &[unary!("Enrol")]);
    check_service(
        ev,
        "HostKeys",
        &[unary!("Rotate"), unary!("Revoke"), unary!("List")],
    );
    // The CLI streams a bundle in chunks (Update); the rest are unary.
    check_service(
        ev,
        "Firmware",
        &[
            (
                "Status",
                "FirmwareStatusRequest",
                "FirmwareStatusResponse",
                false,
                false,
            ),
            (
                "Update",
                "FirmwareChunk",
                "FirmwareUpdateResponse",
                true,
                false,
            ),
            (
                "Activate",
                "FirmwareActivateRequest",
                "FirmwareActivateResponse",
                false,
                false,
            ),
            (
                "Rollback",
                "FirmwareRollbackRequest",
                "FirmwareRollbackResponse",
                false,
                false,
            ),
        ],
    );
    let fields = |message: &str| -> Vec<(String, i32)> {
        ev.message_type
            .iter()
            .find(|m| m.name() == message)
            .unwrap_or_else(|| panic!("message {message} missing"))
            .field
            .iter()
            .map(|f| (f.name().to_owned(), f.number()))
            .collect()
    };
    let want = |items: &[(&str, i32)]| -> Vec<(String, i32)> {
        items.iter().map(|&(n, i)| (n.to_owned(), i)).collect()
    };
    assert_eq!(fields("EnrolRequest"), want(&[("host_nqn", 1)]));
    assert_eq!(
        fields("EnrolResponse"),
        want(&[("host_secret", 1), ("ctrl_secret", 2), ("generation", 3)])
    );
    let listed: Vec<String> = fields("NodeKeys").into_iter().map(|f| f.0).collect();
    assert!(
        listed.iter().all(|name| !name.contains("secret")),
        "List never carries a secret: {listed:?}"
    );
}

#[test]
fn csi_identity_methods() {
    let set = fds();
    check_service(
        file(&set, "csi.proto"),
        "Identity",
        &[
            unary!("GetPluginInfo"),
            unary!("GetPluginCapabilities"),
            unary!("Probe"),
        ],
    );
}

#[test]
fn csi_controller_methods() {
    let set = fds();
    check_service(
        file(&set, "csi.proto"),
        "Controller",
        &[
            unary!("CreateVolume"),
            unary!("DeleteVolume"),
            unary!("ControllerPublishVolume"),
            unary!("ControllerUnpublishVolume"),
            unary!("ValidateVolumeCapabilities"),
            unary!("ListVolumes"),
            unary!("GetCapacity"),
            unary!("ControllerGetCapabilities"),
            unary!("CreateSnapshot"),
            unary!("DeleteSnapshot"),
            unary!("ListSnapshots"),
            unary!("GetSnapshot"),
            unary!("ControllerExpandVolume"),
            unary!("ControllerGetVolume"),
            unary!("ControllerModifyVolume"),
        ],
    );
}

#[test]
fn csi_group_controller_methods() {
    let set = fds();
    check_service(
        file(&set, "csi.proto"),
        "GroupController",
        &[
            unary!("GroupControllerGetCapabilities"),
            unary!("CreateVolumeGroupSnapshot"),
            unary!("DeleteVolumeGroupSnapshot"),
            unary!("GetVolumeGroupSnapshot"),
        ],
    );
}

#[test]
fn csi_snapshot_metadata_methods_stream_responses() {
    let set = fds();
    check_service(
        file(&set, "csi.proto"),
        "SnapshotMetadata",
        &[
            (
                "GetMetadataAllocated",
                "GetMetadataAllocatedRequest",
                "GetMetadataAllocatedResponse",
                false,
                true,
            ),
            (
                "GetMetadataDelta",
                "GetMetadataDeltaRequest",
                "GetMetadataDeltaResponse",
                false,
                true,
            ),
        ],
    );
}

#[test]
fn csi_node_methods() {
    let set = fds();
    check_service(
        file(&set, "csi.proto"),
        "Node",
        &[
            unary!("NodeStageVolume"),
            unary!("NodeUnstageVolume"),
            unary!("NodePublishVolume"),
            unary!("NodeUnpublishVolume"),
            unary!("NodeGetVolumeStats"),
            unary!("NodeExpandVolume"),
            unary!("NodeGetCapabilities"),
            unary!("NodeGetInfo"),
        ],
    );
}

#[test]
fn volumegroup_controller_methods() {
    let set = fds();
    check_service(
        file(&set, "volumegroup.proto"),
        "Controller",
        &[
            unary!("CreateVolumeGroup"),
            unary!("ModifyVolumeGroupMembership"),
            unary!("DeleteVolumeGroup"),
            unary!("ListVolumeGroups"),
            unary!("ControllerGetVolumeGroup"),
        ],
    );
}

#[test]
fn option_extensions_are_declared_with_spec_numbers() {
    let set = fds();
    let declared = |file: &FileDescriptorProto| -> BTreeSet<(String, i32, String)> {
        file.extension
            .iter()
            .map(|e| {
                assert_eq!(e.r#type(), Type::Bool, "{} must be bool", e.name());
                (e.name().to_owned(), e.number(), e.extendee().to_owned())
            })
            .collect()
    };
    let want = |items: &[(&str, i32, &str)]| -> BTreeSet<(String, i32, String)> {
        items
            .iter()
            .map(|&(n, num, ext)| (n.to_owned(), num, format!(".google.protobuf.{ext}")))
            .collect()
    };
    assert_eq!(
        declared(file(&set, "csi.proto")),
        want(&[
            ("alpha_enum", 1060, "EnumOptions"),
            ("alpha_enum_value", 1060, "EnumValueOptions"),
            ("csi_secret", 1059, "FieldOptions"),
            ("alpha_field", 1060, "FieldOptions"),
            ("alpha_message", 1060, "MessageOptions"),
            ("alpha_method", 1060, "MethodOptions"),
            ("alpha_service", 1060, "ServiceOptions"),
        ])
    );
    assert_eq!(
        declared(file(&set, "volumegroup.proto")),
        want(&[
            ("vg_csi_secret", 1101, "FieldOptions"),
            ("vg_alpha_message", 1102, "MessageOptions"),
            ("vg_alpha_method", 1102, "MethodOptions"),
        ])
    );
}

/// Where each option is set to true, as "Kind:Path" strings.
#[derive(Default, Debug)]
struct Marks {
    csi_secret: BTreeSet<String>,
    alpha: BTreeSet<String>,
    vg_csi_secret: BTreeSet<String>,
    vg_alpha: BTreeSet<String>,
}

impl Marks {
    fn record(&mut self, what: String, opts: Option<&lens::Opts>) {
        let Some(o) = opts else { return };
        let set = |flag: Option<bool>, into: &mut BTreeSet<String>| {
            if let Some(v) = flag {
                assert!(v, "{what}: option present but false");
                into.insert(what.clone());
            }
        };
        set(o.csi_secret, &mut self.csi_secret);
        set(o.alpha, &mut self.alpha);
        set(o.vg_csi_secret, &mut self.vg_csi_secret);
        set(o.vg_alpha, &mut self.vg_alpha);
    }

    fn walk_enum(&mut self, prefix: &str, e: &lens::Enum) {
        let path = format!("{prefix}{}", e.name);
        self.record(format!("enum:{path}"), e.options.as_ref());
        for v in &e.value {
            self.record(format!("value:{path}.{}", v.name), v.options.as_ref());
        }
    }

    fn walk_msg(&mut self, prefix: &str, m: &lens::Msg) {
        let path = format!("{prefix}{}", m.name);
        self.record(format!("message:{path}"), m.options.as_ref());
        for f in &m.field {
            self.record(format!("field:{path}.{}", f.name), f.options.as_ref());
        }
        for n in &m.nested_type {
            self.walk_msg(&format!("{path}."), n);
        }
        for e in &m.enum_type {
            self.walk_enum(&format!("{path}."), e);
        }
    }

    fn of_file(name: &str) -> Self {
        let set = lens::Set::decode(FILE_DESCRIPTOR_SET).expect("lens decode");
        let file = set
            .file
            .iter()
            .find(|f| f.name == name)
            .expect("file present");
        let mut marks = Self::default();
        for m in &file.message_type {
            marks.walk_msg("", m);
        }
        for e in &file.enum_type {
            marks.walk_enum("", e);
        }
        for s in &file.service {
            marks.record(format!("service:{}", s.name), s.options.as_ref());
            for m in &s.method {
                marks.record(format!("method:{}.{}", s.name, m.name), m.options.as_ref());
            }
        }
        marks
    }
}

fn set_of(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn csi_secret_marks_exactly_the_secret_maps() {
    let marks = Marks::of_file("csi.proto");
    assert_eq!(
        marks.csi_secret,
        set_of(&[
            "field:CreateVolumeRequest.secrets",
            "field:DeleteVolumeRequest.secrets",
            "field:ControllerPublishVolumeRequest.secrets",
            "field:ControllerUnpublishVolumeRequest.secrets",
            "field:ValidateVolumeCapabilitiesRequest.secrets",
            "field:ControllerModifyVolumeRequest.secrets",
            "field:CreateSnapshotRequest.secrets",
            "field:DeleteSnapshotRequest.secrets",
            "field:ListSnapshotsRequest.secrets",
            "field:GetSnapshotRequest.secrets",
            "field:ControllerExpandVolumeRequest.secrets",
            "field:NodeStageVolumeRequest.secrets",
            "field:NodePublishVolumeRequest.secrets",
            "field:NodeExpandVolumeRequest.secrets",
            "field:CreateVolumeGroupSnapshotRequest.secrets",
            "field:DeleteVolumeGroupSnapshotRequest.secrets",
            "field:GetVolumeGroupSnapshotRequest.secrets",
            "field:GetMetadataAllocatedRequest.secrets",
            "field:GetMetadataDeltaRequest.secrets",
        ])
    );
    assert!(marks.vg_csi_secret.is_empty() && marks.vg_alpha.is_empty());
}

#[test]
fn csi_alpha_marks_match_v1_12() {
    // Since v1.10: ControllerModifyVolume and the GroupController (volume group snapshots) are
    // GA, so their markers are gone; GetSnapshot arrived as alpha.
    let marks = Marks::of_file("csi.proto");
    assert_eq!(
        marks.alpha,
        set_of(&[
            // Services.
            "service:SnapshotMetadata",
            // Methods.
            "method:Controller.ControllerGetVolume",
            "method:Controller.GetSnapshot",
            // Messages.
            "message:ControllerGetVolumeRequest",
            "message:ControllerGetVolumeResponse",
            "message:GetSnapshotRequest",
            "message:GetSnapshotResponse",
            "message:VolumeCondition",
            // Fields.
            "field:ListVolumesResponse.VolumeStatus.volume_condition",
            "field:GetCapacityResponse.minimum_volume_size",
            "field:NodeGetVolumeStatsResponse.volume_condition",
            "field:NodeExpandVolumeRequest.secrets",
            // Enum values.
            "value:PluginCapability.Service.Type.SNAPSHOT_METADATA_SERVICE",
            "value:VolumeCapability.AccessMode.Mode.SINGLE_NODE_SINGLE_WRITER",
            "value:VolumeCapability.AccessMode.Mode.SINGLE_NODE_MULTI_WRITER",
            "value:ControllerServiceCapability.RPC.Type.VOLUME_CONDITION",
            "value:ControllerServiceCapability.RPC.Type.GET_VOLUME",
            "value:ControllerServiceCapability.RPC.Type.SINGLE_NODE_MULTI_WRITER",
            "value:ControllerServiceCapability.RPC.Type.GET_SNAPSHOT",
            "value:NodeServiceCapability.RPC.Type.VOLUME_CONDITION",
            "value:NodeServiceCapability.RPC.Type.SINGLE_NODE_MULTI_WRITER",
        ])
    );
}

#[test]
fn volumegroup_marks_match_proposal() {
    let marks = Marks::of_file("volumegroup.proto");
    assert!(marks.csi_secret.is_empty() && marks.alpha.is_empty());
    assert_eq!(
        marks.vg_csi_secret,
        set_of(&[
            "field:CreateVolumeGroupRequest.secrets",
            "field:DeleteVolumeGroupRequest.secrets",
            "field:ModifyVolumeGroupMembershipRequest.secrets",
            "field:ControllerGetVolumeGroupRequest.secrets",
            "field:ListVolumeGroupsRequest.secrets",
        ])
    );
    assert_eq!(
        marks.vg_alpha,
        set_of(&[
            "method:Controller.CreateVolumeGroup",
            "method:Controller.ModifyVolumeGroupMembership",
            "method:Controller.DeleteVolumeGroup",
            "method:Controller.ListVolumeGroups",
            "method:Controller.ControllerGetVolumeGroup",
            "message:CreateVolumeGroupRequest",
            "message:CreateVolumeGroupResponse",
            "message:VolumeGroup",
            "message:DeleteVolumeGroupRequest",
            "message:DeleteVolumeGroupResponse",
            "message:ModifyVolumeGroupMembershipRequest",
            "message:ModifyVolumeGroupMembershipResponse",
            "message:ControllerGetVolumeGroupRequest",
            "message:ControllerGetVolumeGroupResponse",
            "message:ListVolumeGroupsRequest",
            "message:ListVolumeGroupsResponse",
        ])
    );
}

#[test]
fn every_csi_secrets_map_is_marked_secret() {
    // Independent of the list above: any field named `secrets` in either file
    // must carry its file's secret option, and be a string map.
    let set = fds();
    for name in ["csi.proto", "volumegroup.proto"] {
        let marks = Marks::of_file(name);
        let secret = if name == "csi.proto" {
            &marks.csi_secret
        } else {
            &marks.vg_csi_secret
        };
        let f = file(&set, name);
        let mut seen = 0;
        for m in &f.message_type {
            for field in &m.field {
                if field.name() == "secrets" {
                    seen += 1;
                    assert!(
                        secret.contains(&format!("field:{}.secrets", m.name())),
                        "{name}: {}.secrets lacks the secret option",
                        m.name()
                    );
                    assert_eq!(field.r#type(), Type::Message);
                    assert!(field.type_name().ends_with("SecretsEntry"));
                }
            }
        }
        assert_eq!(
            seen,
            secret.len(),
            "{name}: secret option on a non-secrets field"
        );
    }
}
