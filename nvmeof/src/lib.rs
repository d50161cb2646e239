//! Sans-I/O NVMe-over-Fabrics TCP transport for the edgevol appliance.
//!
//! No sockets, no clock, no async runtime: bytes in, bytes and events out, time passed in as a
//! value (the quinn-proto design).
//!
//! Modules: [`pdu`] (PDU types and encoding), [`decoder`] (incremental, validating decoder),
//! [`pdu_error`] (typed errors with their TermReq FES), [`sqe`], [`cqe`], [`status`], [`fabrics_cmd`] (Connect, Property Get/Set).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cqe;
pub mod decoder;
pub mod fabrics_cmd;
pub mod pdu;
pub mod pdu_error;
pub mod sqe;
pub mod status;
