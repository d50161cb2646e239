//! The `edgevol` admin CLI: PKI management and the CO-side proxy.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod proxy;
