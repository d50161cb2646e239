//! Sans-I/O NVMe-over-Fabrics TCP transport for the edgevol appliance.
//!
//! No sockets, no clock, no async runtime: bytes in, bytes and events out, time passed in as a
//! value (the quinn-proto design). The appliance hosts one [`queue::Queue`] per accepted TCP
//! connection and drives it like quinn's `ConnectionDriver`:
//!
//! 1. [`queue::Queue::new`]`(config, now)` when the connection is accepted;
//! 2. [`queue::Queue::handle_input`]`(&bytes)` with whatever the socket returned, in any
//!    chunking; it returns how many bytes it consumed (fewer when its per-call PDU budget is spent
//!    or the queue closed: keep the rest and call again after draining events). While a large
//!    PDU's data is arriving, [`queue::Queue::data_sink`] is where the socket can read it
//!    straight into (then call `handle_input`, with no bytes if there are none);
//! 3. [`queue::Queue::poll_event`] until `None`: `Command` (parse, execute, then
//!    [`queue::Queue::complete`] with status, result and read data; after a successful Fabrics
//!    Connect call [`queue::Queue::install`] first), `Closed` (flush transmit, close the socket);
//! 4. [`queue::Queue::poll_transmit`]`(&mut buf)` and write what it appended; a driver that
//!    completes reads with [`queue::Queue::complete_spliced`] (the data stays in its buffer)
//!    calls [`queue::Queue::poll_transmit_vectored`] instead and writes its buffers in at the
//!    splices;
//! 5. [`queue::Queue::poll_timeout`] / [`queue::Queue::handle_timeout`]`(now)` for the ICReq
//!    deadline.
//!
//! Modules: [`pdu`] (PDU types and encoding), [`decoder`] (incremental, validating decoder),
//! [`pdu_error`] (typed errors with their TermReq FES), [`sqe`], [`cqe`], [`status`],
//! [`fabrics_cmd`] (Connect, Property Get/Set), [`auth`] (DH-HMAC-CHAP in-band authentication:
//! secrets, messages, the per-queue target state machine; its module docs say how to drive it),
//! [`queue`] (the target's connection state
//! machine), [`fabrics`] (`parse(&Sqe, data, &QueueState) -> Result<Command, Rejected>` routing
//! as `nvmet_req_init` does), [`admin`] and [`io_cmd`] (field and length checks) and, with the `test-initiator` feature, `initiator` (a sans-I/O host for the
//! appliance's loopback tests and benches).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod admin;
pub mod auth;
pub mod cqe;
pub mod data_buf;
pub mod decoder;
pub mod fabrics;
pub mod fabrics_cmd;
#[cfg(any(test, feature = "test-initiator"))]
pub mod initiator;
pub mod io_cmd;
pub mod pdu;
pub mod pdu_error;
pub mod queue;
pub mod sqe;
pub mod status;
