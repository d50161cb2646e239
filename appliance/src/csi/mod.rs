//! The CSI services of the appliance: thin handlers over the appliance's state.

pub mod identity;
