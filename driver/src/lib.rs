//! The contract between the two halves of the edgevol CSI driver: `edgevold` (Identity,
//! Controller, GroupController on the appliance) and `edgevol-node` (Identity, Node on each host).
//!
//! The CSI spec asks every instance of one plugin version to report the same name, version and
//! plugin capabilities, whichever services that instance serves (orchestrators such as Nomad read
//! the capabilities from the node plugin to decide whether ControllerPublishVolume is needed).
//! Both binaries build their Identity answers from this crate, and the `publish_context` keys
//! one writes and the other reads are defined here once, so they cannot drift apart.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod fleet;
pub mod identity;
pub mod publish_context;
pub mod units;
