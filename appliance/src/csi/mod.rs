//! The CSI services of the appliance: thin handlers over the appliance's state.
//!
//! Shared by every handler: [`ids`] (CSI ids of core objects), [`validate`] (size limits and
//! uniform INVALID_ARGUMENT messages) and [`status`] (core errors as gRPC statuses).

pub mod identity;
pub mod ids;
pub mod status;
pub mod validate;
