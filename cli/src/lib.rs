//! The `edgevol` admin CLI: PKI management, the CO-side proxy, and the operator's status
//! listings.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod proxy;
pub mod status;
