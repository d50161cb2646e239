//! The target side of one NVMe/TCP connection (one NVMe queue), sans I/O.
//!
//! Follows Linux `drivers/nvme/target/tcp.c`: the connection starts waiting for an ICReq, answers
//! with an ICResp and goes live; each CapsuleCmd takes a preallocated command slot; writes get
//! their data in the capsule or through one R2T whose transfer tag is the slot index; reads are
//! answered with C2HData PDUs (split at `max_c2h_data`) and a CapsuleResp. A protocol error
//! queues a C2HTermReq carrying the FES/FEI and the offending header, raises
//! [`Event::Closed`], and the queue accepts nothing more: the host flushes
//! [`Queue::poll_transmit`] and closes the socket. Nothing here touches other queues.
//!
//! Commands are handed out by [`Queue::poll_event`] only when all their data has arrived; the
//! host parses and executes them (see `nvmet_req_init`) and answers with [`Queue::complete`].
//! After a successful Fabrics Connect the host calls [`Queue::install`] to size the slots from
//! the Connect's sqsize (Linux `nvmet_tcp_install_queue`); until then one slot exists, so a host
//! that pipelines commands before Connect completes gets a PDU Sequence Error.

use core::time::Duration;
use std::collections::VecDeque;

use crate::cqe::Cqe;
use crate::data_buf::DataBuf;
use crate::decoder::{Decoder, DecoderConfig};
use crate::pdu::{
    C2hDataRef, CapsuleCmd, CapsuleResp, DataPdu, Digests, Direction, EncodeOptions, IcReq, IcResp,
    Pdu, R2t, TermReq, PFV_1_0,
};
use crate::pdu_error::{HeaderField, PduError, SequenceError};
use crate::sqe::{DataDirection, DataPointer, Sqe};
use crate::status::{Status, StatusCode};

/// Most PDUs handled per [`Queue::handle_input`] call (tcp.c's io_work budget).
pub const RECV_BUDGET: usize = 64;
/// Above this many untransmitted bytes, [`Queue::handle_input`] stops consuming until the host
/// drains [`Queue::poll_transmit`]: a host that never reads its responses cannot grow our buffer.
pub const TX_HIGH_WATER: usize = 256 * 1024;
/// Smallest MAXH2CDATA a Linux host accepts (`NVME_TCP_MIN_MAXH2CDATA`).
pub const MIN_MAXH2CDATA: u32 = 4096;
/// In-capsule data limit of an admin queue (`NVME_TCP_ADMIN_CCSZ`).
pub const ADMIN_IN_CAPSULE: u32 = 8192;

/// Target-side limits and policy for one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    /// Digests the target grants when a host asks for them; a request for a digest not allowed
    /// here is refused with an Unsupported Parameter TermReq (a Linux host fails on a mismatch).
    pub allowed_digests: Digests,
    /// Our PDU data alignment requirement, 0's based dwords (CPDA; 0 = none).
    pub cpda: u8,
    /// MAXH2CDATA advertised in the ICResp: most data bytes in one H2CData PDU.
    pub maxh2cdata: u32,
    /// Most data bytes the target puts in one C2HData PDU.
    pub max_c2h_data: u32,
    /// In-capsule data limit on I/O queues (IOCCSZ * 16 - 64 in Identify Controller).
    pub io_in_capsule: u32,
    /// Most data one command may move (the MDTS the controller advertises, in bytes).
    pub max_transfer: u32,
    /// Largest queue (sqsize + 1) [`Queue::install`] accepts.
    pub max_queue_size: u16,
    /// How long a new connection may take to send its ICReq.
    pub ic_timeout: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            allowed_digests: Digests::BOTH,
            cpda: 0,
            maxh2cdata: 128 * 1024,
            max_c2h_data: 128 * 1024,
            io_in_capsule: 16 * 1024,
            max_transfer: 1024 * 1024,
            max_queue_size: 128,
            ic_timeout: Duration::from_secs(10),
        }
    }
}

/// A [`QueueConfig`] that cannot work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// MAXH2CDATA below 4096 or not a multiple of 4 (a Linux host refuses it).
    MaxH2cData,
    /// CPDA above 31.
    Cpda,
    /// A zero C2HData size, transfer size or queue size.
    Zero,
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            ConfigError::MaxH2cData => "maxh2cdata must be >= 4096 and a multiple of 4",
            ConfigError::Cpda => "cpda must be <= 31",
            ConfigError::Zero => "sizes must not be zero",
        })
    }
}

impl std::error::Error for ConfigError {}

impl QueueConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.maxh2cdata < MIN_MAXH2CDATA || !self.maxh2cdata.is_multiple_of(4) {
            return Err(ConfigError::MaxH2cData);
        }
        if self.cpda > 31 {
            return Err(ConfigError::Cpda);
        }
        if self.max_c2h_data == 0 || self.max_transfer == 0 || self.max_queue_size == 0 {
            return Err(ConfigError::Zero);
        }
        Ok(())
    }
}

/// Identifies a command handed out by [`Queue::poll_event`]; give it back to [`Queue::complete`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CommandTag(u16);

impl CommandTag {
    /// The slot index (also the R2T transfer tag).
    pub fn index(self) -> u16 {
        self.0
    }
}

/// A command whose data (if any) has fully arrived, ready to parse and execute.
#[derive(Debug, PartialEq, Eq)]
pub struct Command {
    /// Give this back to [`Queue::complete`].
    pub tag: CommandTag,
    /// The submission queue entry.
    pub sqe: Sqe,
    /// Host-to-controller data (empty if none), page-aligned: give it back to
    /// [`Queue::recycle`] when done.
    pub data: DataBuf,
    /// Bytes of controller-to-host data the command expects (0 if none).
    pub read_len: u32,
}

/// Why the connection ended.
#[derive(Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// We found a protocol error and queued a C2HTermReq about it.
    ProtocolError(PduError),
    /// The host sent an H2CTermReq.
    PeerTerminated {
        /// The host's FES.
        fes: u16,
        /// The host's FEI.
        fei: u32,
    },
    /// No ICReq arrived in time.
    IcReqTimeout,
}

/// What the queue tells its host.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// The ICReq was accepted; these digests are in force.
    Initialized {
        /// Negotiated digests.
        digests: Digests,
    },
    /// A command to execute; answer with [`Queue::complete`].
    Command(Command),
    /// The connection is finished: flush transmit, then close the socket.
    Closed(CloseReason),
}

/// What the host answers to a [`Command`].
#[derive(Clone, Copy, Debug)]
pub struct Completion<'a> {
    /// Completion status.
    pub status: Status,
    /// CQE result (dword 0 low, dword 1 high).
    pub result: u64,
    /// Controller-to-host data: exactly `read_len` bytes on success, ignored on failure.
    pub data: &'a [u8],
}

impl Completion<'_> {
    /// A successful completion without data.
    pub fn success(result: u64) -> Self {
        Completion {
            status: Status::SUCCESS,
            result,
            data: &[],
        }
    }
    /// A failed completion.
    pub fn error(status: Status) -> Self {
        Completion {
            status,
            result: 0,
            data: &[],
        }
    }
}

/// Misuse of [`Queue::complete`] or [`Queue::install`] by the host (not a wire error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostError {
    /// The tag is not a command awaiting completion.
    UnknownTag,
    /// Read data of the wrong length for a successful completion.
    DataLength {
        /// Bytes given.
        given: usize,
        /// Bytes the command expects.
        expected: u32,
    },
    /// The queue is not live, or already installed.
    NotInstallable,
    /// sqsize + 1 above the configured maximum.
    QueueTooLarge,
    /// The connection is closed.
    Closed,
}

impl core::fmt::Display for HostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HostError::UnknownTag => f.write_str("no command awaits completion with this tag"),
            HostError::DataLength { given, expected } => {
                write!(f, "{given} bytes of read data, command expects {expected}")
            }
            HostError::NotInstallable => f.write_str("queue not live or already installed"),
            HostError::QueueTooLarge => f.write_str("queue size above the configured maximum"),
            HostError::Closed => f.write_str("connection closed"),
        }
    }
}

impl std::error::Error for HostError {}

#[derive(Debug)]
struct Receiving {
    sqe: Sqe,
    data: DataBuf,
    expected: u32,
    failed: Option<Status>,
}

#[derive(Debug)]
enum Slot {
    Free,
    Receiving(Receiving),
    Executing { cid: u16, read_len: u32 },
}

#[derive(Clone, Copy, Debug)]
struct Live {
    digests: Digests,
    hpda: u8,
    /// (qid, queue size) once installed.
    installed: Option<(u16, u16)>,
}

#[derive(Clone, Copy, Debug)]
enum State {
    AwaitIcReq { deadline: Duration },
    Live(Live),
    Closed,
}

/// One target connection. See the module docs.
#[derive(Debug)]
pub struct Queue {
    config: QueueConfig,
    state: State,
    decoder: Decoder,
    slots: Vec<Slot>,
    tx: Vec<u8>,
    /// Read data the caller sends from its own buffers, in `tx` order, and its bytes.
    splices: Vec<Splice>,
    spliced: usize,
    events: VecDeque<Event>,
    sq_head: u16,
}

/// Read data the queue does not copy ([`Queue::complete_spliced`]): the caller keeps the
/// buffer and sends its bytes `start..start + len` where the transmit says
/// ([`Queue::poll_transmit_vectored`]), so a read goes from the buffer it was read into straight
/// to the socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Splice {
    /// Offset in the transmitted bytes before which the data goes.
    pub at: usize,
    /// The caller's name for the buffer.
    pub token: u32,
    /// Where the bytes start in the buffer.
    pub start: usize,
    /// How many.
    pub len: usize,
}

impl Queue {
    /// A new connection accepted at `now` (any monotonic clock, as a duration since its origin).
    pub fn new(config: QueueConfig, now: Duration) -> Result<Self, ConfigError> {
        config.validate()?;
        let decoder = Decoder::new(DecoderConfig {
            receiver: Direction::ControllerToHost,
            digests: Digests::NONE,
            pda: config.cpda,
            max_data_pdu: config.maxh2cdata,
            max_in_capsule: ADMIN_IN_CAPSULE.max(config.io_in_capsule),
        });
        Ok(Queue {
            config,
            state: State::AwaitIcReq {
                deadline: now.saturating_add(config.ic_timeout),
            },
            decoder,
            slots: vec![Slot::Free],
            tx: Vec::new(),
            splices: Vec::new(),
            spliced: 0,
            events: VecDeque::new(),
            sq_head: 0,
        })
    }

    /// True once the connection is finished.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Digests in force (none before the ICReq).
    pub fn digests(&self) -> Digests {
        match self.state {
            State::Live(l) => l.digests,
            _ => Digests::NONE,
        }
    }

    /// Number of command slots (1 until [`Queue::install`]).
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Feeds bytes received from the socket. Returns how many were consumed: fewer than given
    /// when the PDU budget is spent, when more than [`TX_HIGH_WATER`] bytes wait for
    /// transmission (drain events and transmit, then call again), or when the queue closed.
    pub fn handle_input(&mut self, input: &[u8]) -> usize {
        let mut consumed = 0;
        let mut pdus = 0;
        // Once even without input: data received through `data_sink` may complete a PDU.
        let mut first = true;
        while (consumed < input.len() || core::mem::take(&mut first))
            && pdus < RECV_BUDGET
            && self.tx.len() + self.spliced <= TX_HIGH_WATER
            && !self.is_closed()
        {
            let d = self.decoder.decode(&input[consumed..]);
            consumed += d.consumed;
            let Some(result) = d.result else { break };
            pdus += 1;
            let outcome = match result {
                Ok(pdu) => self.on_pdu(pdu),
                Err(PduError::DataDigest { pdu, .. }) => self.on_data_digest_error(*pdu),
                Err(e) => Err(e),
            };
            if let Err(e) = outcome {
                self.fail(e);
            }
        }
        consumed
    }

    /// Where the rest of the PDU being received can go straight from the socket: the buffer its
    /// data will be handed over in, and how many bytes it lacks (see [`Decoder::data_sink`]).
    /// Receive at most that many into its [`DataBuf::spare_mut`] and [`DataBuf::commit`] them,
    /// then call [`Queue::handle_input`] (with no input if there is none).
    pub fn data_sink(&mut self) -> Option<(&mut DataBuf, usize)> {
        if self.is_closed() {
            return None;
        }
        self.decoder.data_sink()
    }

    /// Appends bytes to send to `out`; returns true if it appended anything. For a queue that
    /// never splices ([`Queue::poll_transmit_vectored`] otherwise).
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) -> bool {
        debug_assert!(
            self.splices.is_empty(),
            "spliced data needs poll_transmit_vectored"
        );
        if self.tx.is_empty() {
            return false;
        }
        if out.is_empty() {
            // Hand the buffer over instead of copying it; `out`'s capacity comes back as ours.
            std::mem::swap(out, &mut self.tx);
        } else {
            out.append(&mut self.tx);
        }
        true
    }

    /// Appends bytes to send to `out` and, to `splices`, where the caller's spliced data goes
    /// in them (offsets in `out`); returns true if it appended anything.
    pub fn poll_transmit_vectored(&mut self, out: &mut Vec<u8>, splices: &mut Vec<Splice>) -> bool {
        let base = out.len();
        splices.extend(self.splices.drain(..).map(|s| Splice {
            at: s.at + base,
            ..s
        }));
        self.spliced = 0;
        self.poll_transmit(out)
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Takes back the data buffer of a finished command ([`Command::data`]) for the next
    /// PDUs' data (see [`Decoder::recycle`]).
    pub fn recycle(&mut self, data: DataBuf) {
        self.decoder.recycle(data);
    }

    /// Whether events wait to be polled.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// When [`Queue::handle_timeout`] must next be called, if ever.
    pub fn poll_timeout(&self) -> Option<Duration> {
        match self.state {
            State::AwaitIcReq { deadline } => Some(deadline),
            _ => None,
        }
    }

    /// Tells the queue the time; closes the connection if the ICReq deadline passed.
    pub fn handle_timeout(&mut self, now: Duration) {
        if let State::AwaitIcReq { deadline } = self.state {
            if now >= deadline {
                self.state = State::Closed;
                self.events
                    .push_back(Event::Closed(CloseReason::IcReqTimeout));
            }
        }
    }

    /// Sizes the command slots after a successful Connect for queue `qid` with the Connect's
    /// 0's based `sqsize` (2 x queue size, as Linux does). Call before completing the Connect.
    pub fn install(&mut self, qid: u16, sqsize: u16) -> Result<(), HostError> {
        let State::Live(mut live) = self.state else {
            return Err(if self.is_closed() {
                HostError::Closed
            } else {
                HostError::NotInstallable
            });
        };
        if live.installed.is_some() {
            return Err(HostError::NotInstallable);
        }
        let size = sqsize
            .checked_add(1)
            .filter(|&s| s <= self.config.max_queue_size)
            .ok_or(HostError::QueueTooLarge)?;
        self.slots.resize_with(usize::from(size) * 2, || Slot::Free);
        live.installed = Some((qid, size));
        self.state = State::Live(live);
        let mut cfg = *self.decoder.config();
        cfg.max_in_capsule = if qid == 0 {
            ADMIN_IN_CAPSULE
        } else {
            self.config.io_in_capsule
        };
        self.decoder.set_config(cfg);
        Ok(())
    }

    /// Completes a command: queues its C2HData (reads) and CapsuleResp.
    ///
    /// One `handle_input` call may hand out commands and then close on a later bad PDU, so a
    /// command can outlive its connection: completing it then returns [`HostError::Closed`], which
    /// the host drops along with the connection.
    pub fn complete(&mut self, tag: CommandTag, c: Completion<'_>) -> Result<(), HostError> {
        self.complete_with(tag, c, None)
    }

    /// [`Queue::complete`], but the data is not copied: the caller sends it from its buffer
    /// `token` as [`Queue::poll_transmit_vectored`] says, and keeps that buffer until then.
    pub fn complete_spliced(
        &mut self,
        tag: CommandTag,
        c: Completion<'_>,
        token: u32,
    ) -> Result<(), HostError> {
        self.complete_with(tag, c, Some(token))
    }

    fn complete_with(
        &mut self,
        tag: CommandTag,
        c: Completion<'_>,
        token: Option<u32>,
    ) -> Result<(), HostError> {
        let State::Live(live) = self.state else {
            return Err(HostError::Closed);
        };
        let slot = self
            .slots
            .get_mut(usize::from(tag.0))
            .ok_or(HostError::UnknownTag)?;
        let Slot::Executing { cid, read_len } = *slot else {
            return Err(HostError::UnknownTag);
        };
        let send_data = c.status.is_success() && read_len > 0;
        if send_data && c.data.len() != usize::try_from(read_len).unwrap_or(usize::MAX) {
            return Err(HostError::DataLength {
                given: c.data.len(),
                expected: read_len,
            });
        }
        *slot = Slot::Free;
        if send_data {
            let chunk = usize::try_from(self.config.max_c2h_data).unwrap_or(usize::MAX);
            let mut offset = 0usize;
            for part in c.data.chunks(chunk) {
                let end = offset + part.len();
                let pdu = C2hDataRef {
                    cccid: cid,
                    // offset < read_len, a u32
                    offset: u32::try_from(offset).unwrap_or(u32::MAX),
                    last: end == c.data.len(),
                    data: part,
                };
                // Bounded by the config like every PDU of ours (see `send`).
                let opts = Self::encode_options(live);
                let encoded = match token {
                    None => pdu.encode(&opts, &mut self.tx),
                    Some(token) => pdu.encode_around(&opts, &mut self.tx).map(|at| {
                        self.splices.push(Splice {
                            at,
                            token,
                            start: offset,
                            len: part.len(),
                        });
                        self.spliced += part.len();
                    }),
                };
                debug_assert!(encoded.is_ok(), "C2HData failed to encode: {encoded:?}");
                offset = end;
            }
        }
        self.respond(live, cid, c.status, c.result);
        Ok(())
    }

    fn encode_options(live: Live) -> EncodeOptions {
        EncodeOptions {
            digests: live.digests,
            pda: live.hpda,
        }
    }

    fn send(&mut self, live: Live, pdu: &Pdu) {
        // Our own PDUs are bounded by the config (data <= max_c2h_data, TermReq data <= 128),
        // so encoding cannot fail.
        let encoded = pdu.encode(&Self::encode_options(live), &mut self.tx);
        debug_assert!(encoded.is_ok(), "target PDU failed to encode: {encoded:?}");
    }

    fn respond(&mut self, live: Live, cid: u16, status: Status, result: u64) {
        let mut cqe = Cqe::new(cid, status, result);
        cqe.sq_head = self.sq_head;
        cqe.sq_id = live.installed.map_or(0, |(qid, _)| qid);
        self.send(live, &Pdu::CapsuleResp(CapsuleResp { cqe }));
    }

    fn fail(&mut self, error: PduError) {
        let term = Pdu::C2hTermReq(TermReq {
            fes: error.fes() as u16,
            fei: error.fei(),
            header: self.decoder.offending_header().to_vec(),
        });
        // TermReq PDUs never carry digests; options only matter for alignment, which they ignore.
        let encoded = term.encode(&EncodeOptions::default(), &mut self.tx);
        debug_assert!(encoded.is_ok(), "TermReq failed to encode: {encoded:?}");
        self.state = State::Closed;
        self.events
            .push_back(Event::Closed(CloseReason::ProtocolError(error)));
    }

    fn on_pdu(&mut self, pdu: Pdu) -> Result<(), PduError> {
        match (self.state, pdu) {
            (State::AwaitIcReq { .. }, Pdu::IcReq(req)) => self.on_ic_req(req),
            (State::AwaitIcReq { .. }, other) => Err(PduError::Sequence(
                SequenceError::ExpectedInitialization(other.pdu_type()),
            )),
            (State::Live(_), Pdu::IcReq(_)) => {
                Err(PduError::Sequence(SequenceError::RepeatedInitialization))
            }
            (State::Live(_), Pdu::H2cTermReq(t)) => {
                self.state = State::Closed;
                self.events
                    .push_back(Event::Closed(CloseReason::PeerTerminated {
                        fes: t.fes,
                        fei: t.fei,
                    }));
                Ok(())
            }
            (State::Live(live), Pdu::CapsuleCmd(cmd)) => self.on_command(live, cmd),
            (State::Live(live), Pdu::H2cData(data)) => self.on_h2c_data(live, data, None),
            // The decoder refuses controller-to-host types; nothing arrives once closed.
            (_, other) => Err(PduError::Sequence(SequenceError::UnexpectedPdu(
                other.pdu_type(),
            ))),
        }
    }

    fn on_ic_req(&mut self, req: IcReq) -> Result<(), PduError> {
        if req.pfv != PFV_1_0 {
            return Err(PduError::UnsupportedParameter { offset: 8 });
        }
        let allowed = self.config.allowed_digests;
        if (req.digests.header && !allowed.header) || (req.digests.data && !allowed.data) {
            return Err(PduError::UnsupportedParameter { offset: 11 });
        }
        let live = Live {
            digests: req.digests,
            hpda: req.hpda,
            installed: None,
        };
        self.send(
            live,
            &Pdu::IcResp(IcResp {
                pfv: PFV_1_0,
                cpda: self.config.cpda,
                digests: req.digests,
                maxh2cdata: self.config.maxh2cdata,
            }),
        );
        let mut cfg = *self.decoder.config();
        cfg.digests = req.digests;
        self.decoder.set_config(cfg);
        self.state = State::Live(live);
        self.events.push_back(Event::Initialized {
            digests: req.digests,
        });
        Ok(())
    }

    fn take_slot(&mut self) -> Result<u16, PduError> {
        self.slots
            .iter()
            .position(|s| matches!(s, Slot::Free))
            .and_then(|i| u16::try_from(i).ok())
            .ok_or(PduError::Sequence(SequenceError::QueueFull))
    }

    /// Checks a capsule's data pointer against its data; `Err` is the status to complete with.
    fn check_data_pointer(&self, sqe: &Sqe, in_capsule: usize) -> Result<(), Status> {
        let direction = sqe.data_direction();
        match sqe.data_pointer() {
            DataPointer::Unsupported { .. } => Err(StatusCode::SglDescriptorTypeInvalid.status()),
            DataPointer::InCapsule { offset, length } => {
                if direction != DataDirection::HostToController && length > 0 {
                    Err(StatusCode::InvalidField.status())
                } else if offset != 0 {
                    Err(StatusCode::SglOffsetInvalid.status())
                } else if usize::try_from(length).ok() != Some(in_capsule) {
                    Err(StatusCode::DataSglLengthInvalid.status())
                } else {
                    Ok(())
                }
            }
            DataPointer::Transport { length } => {
                if in_capsule != 0 || length > self.config.max_transfer {
                    Err(StatusCode::DataSglLengthInvalid.status())
                } else {
                    Ok(())
                }
            }
        }
    }

    fn advance_sq_head(&mut self, live: Live) {
        let size = live.installed.map_or(1, |(_, size)| size);
        self.sq_head = (self.sq_head + 1) % size;
    }

    fn on_command(&mut self, live: Live, cmd: CapsuleCmd) -> Result<(), PduError> {
        let index = self.take_slot()?;
        self.advance_sq_head(live);
        let sqe = cmd.sqe;
        if let Err(status) = self.check_data_pointer(&sqe, cmd.data.len()) {
            self.respond(live, sqe.cid(), status, 0);
            return Ok(());
        }
        let length = sqe.data_pointer().length();
        let tag = CommandTag(index);
        let slot = &mut self.slots[usize::from(index)];
        match sqe.data_direction() {
            DataDirection::HostToController if cmd.data.is_empty() => {
                *slot = Slot::Receiving(Receiving {
                    sqe,
                    // Filled by the H2CData PDUs; the first one's buffer is taken as is.
                    data: DataBuf::default(),
                    expected: length,
                    failed: None,
                });
                self.send(
                    live,
                    &Pdu::R2t(R2t {
                        cccid: sqe.cid(),
                        ttag: index,
                        offset: 0,
                        length,
                    }),
                );
            }
            DataDirection::HostToController => {
                *slot = Slot::Executing {
                    cid: sqe.cid(),
                    read_len: 0,
                };
                self.events.push_back(Event::Command(Command {
                    tag,
                    sqe,
                    data: cmd.data,
                    read_len: 0,
                }));
            }
            direction => {
                let read_len = if direction == DataDirection::ControllerToHost {
                    length
                } else {
                    0
                };
                *slot = Slot::Executing {
                    cid: sqe.cid(),
                    read_len,
                };
                self.events.push_back(Event::Command(Command {
                    tag,
                    sqe,
                    data: DataBuf::default(),
                    read_len,
                }));
            }
        }
        Ok(())
    }

    fn on_h2c_data(
        &mut self,
        live: Live,
        data: DataPdu,
        digest_error: Option<Status>,
    ) -> Result<(), PduError> {
        let index = usize::from(data.ttag);
        let Some(Slot::Receiving(rx)) = self.slots.get_mut(index) else {
            return Err(PduError::field(HeaderField::Ttag));
        };
        if data.cccid != rx.sqe.cid() {
            return Err(PduError::field(HeaderField::Cccid));
        }
        // Both lengths were bounded when framed (datal <= MAXH2CDATA, received <= expected).
        let length = u32::try_from(data.data.len()).unwrap_or(u32::MAX);
        let received = u32::try_from(rx.data.len()).unwrap_or(u32::MAX);
        let in_range = data.offset == received
            && data
                .offset
                .checked_add(length)
                .is_some_and(|end| end <= rx.expected);
        if !in_range {
            return Err(PduError::DataOutOfRange {
                offset: data.offset,
                length,
            });
        }
        let expected = usize::try_from(rx.expected).unwrap_or(usize::MAX);
        if rx.data.is_empty() && data.data.capacity() >= expected {
            // Usually the only PDU (MAXH2CDATA covers common writes): keep its buffer, no copy.
            rx.data = data.data;
        } else {
            if rx.data.is_empty() {
                // The first of several PDUs: one buffer for the whole transfer.
                rx.data = DataBuf::with_capacity(expected);
            }
            rx.data.extend_from_slice(&data.data);
            self.decoder.recycle(data.data);
        }
        if rx.failed.is_none() {
            rx.failed = digest_error;
        }
        if rx.data.len() < expected {
            return Ok(());
        }
        let cid = rx.sqe.cid();
        if let Some(status) = rx.failed {
            self.slots[index] = Slot::Free;
            self.respond(live, cid, status, 0);
            return Ok(());
        }
        let previous =
            core::mem::replace(&mut self.slots[index], Slot::Executing { cid, read_len: 0 });
        let Slot::Receiving(rx) = previous else {
            return Ok(());
        };
        self.events.push_back(Event::Command(Command {
            tag: CommandTag(data.ttag),
            sqe: rx.sqe,
            data: rx.data,
            read_len: 0,
        }));
        Ok(())
    }

    /// A PDU whose data digest failed: the command it carries data for completes with Transient
    /// Transport Error (the host may retry) and the connection lives on.
    fn on_data_digest_error(&mut self, pdu: Pdu) -> Result<(), PduError> {
        let State::Live(live) = self.state else {
            return Err(PduError::Sequence(SequenceError::ExpectedInitialization(
                pdu.pdu_type(),
            )));
        };
        let status = StatusCode::TransientTransportError.status();
        match pdu {
            Pdu::CapsuleCmd(cmd) => {
                self.take_slot()?;
                self.advance_sq_head(live);
                self.respond(live, cmd.sqe.cid(), status, 0);
                Ok(())
            }
            Pdu::H2cData(data) => self.on_h2c_data(live, data, Some(status)),
            other => self.on_pdu(other),
        }
    }
}

#[cfg(test)]
mod tests;
