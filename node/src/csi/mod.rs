//! The CSI services: thin handlers over [`crate::volume::Volumes`].

pub mod identity;
pub mod node;
pub mod request;
