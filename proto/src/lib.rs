//! Generated gRPC code for edgevol's control plane.
//!
//! * [`csi::v1`]: the Container Storage Interface, wire-identical to CSI
//!   spec v1.12.0 (`csi.proto`): the `Identity`, `Controller`, `Node`,
//!   `GroupController` and `SnapshotMetadata` services, their messages and
//!   the `csi_secret` / `alpha_*` custom options.
//! * [`volumegroup`]: the alpha VolumeGroup API (`volumegroup.proto`).
//! * [`edgevol::v1`]: edgevol's own API (`edgevol.proto`): `Enrolment`, with which a node
//!   obtains its NVMe data-path keys, and `HostKeys`, with which an operator manages them.
//!
//! Each service comes with a tonic client (`<service>_client`) and server
//! (`<service>_server`) module. Messages are plain prost structs.
//! [`FILE_DESCRIPTOR_SET`] is the encoded descriptor set of these files and
//! their imports, custom options included.
//!
//! This crate holds generated code only; no hand-written logic lives here.

/// Container Storage Interface (`package csi.v1`).
pub mod csi {
    /// CSI v1 (spec v1.12.0).
    #[allow(
        missing_docs,
        missing_debug_implementations,
        unreachable_pub,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        clippy::cast_possible_truncation
    )]
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/csi.v1.rs"));
    }
}

/// VolumeGroup API (`package volumegroup`, alpha).
#[allow(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    clippy::cast_possible_truncation
)]
pub mod volumegroup {
    include!(concat!(env!("OUT_DIR"), "/volumegroup.rs"));
}

/// edgevol's own API (`package edgevol.v1`).
pub mod edgevol {
    /// Version 1: node enrolment and host key management.
    #[allow(
        missing_docs,
        missing_debug_implementations,
        unreachable_pub,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        clippy::cast_possible_truncation
    )]
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/edgevol.v1.rs"));
    }
}

/// Encoded `google.protobuf.FileDescriptorSet` of `csi.proto`,
/// `volumegroup.proto`, `edgevol.proto` and the google/protobuf files they import, without
/// source info. Extension options (`csi_secret` = 1059, `alpha_*` = 1060,
/// `vg_csi_secret` = 1101, `vg_alpha_*` = 1102) are preserved.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/edgevol_descriptor_set.bin"));
