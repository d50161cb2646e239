//! The CSI services: thin handlers over [`crate::volume::Volumes`].

pub mod identity;
pub mod node;
pub mod request;

/// The driver name, the same as the appliance's controller plugin.
pub const PLUGIN_NAME: &str = "csi.edgevol.io";
