//! A sans-I/O NVMe/TCP host for tests and benches (feature `test-initiator`).
//!
//! It does what the Linux host does on one queue (drivers/nvme/host/tcp.c): sends the ICReq and
//! checks the ICResp (PFV, digests echoed, MAXH2CDATA >= 4096 and a multiple of 4), sends
//! commands with in-capsule data when they fit and a transport SGL otherwise, answers each R2T
//! with H2CData PDUs of at most MAXH2CDATA bytes (LAST_PDU on the final one), reassembles
//! C2HData (in order, inside the command's buffer, SUCCESS only with LAST_PDU) and reports
//! completions. It trusts nothing the target sends: every cid, offset and length is checked, and
//! a violation sends an H2CTermReq and closes, like the target does.
//!
//! It is a feature rather than test-only code because the appliance's loopback tests and benches
//! drive the target with it from another crate; production builds leave it out.

use std::collections::{BTreeMap, VecDeque};

use crate::cqe::Cqe;
use crate::decoder::{Decoder, DecoderConfig};
use crate::fabrics_cmd::{ConnectCmd, ConnectData};
use crate::pdu::{
    CapsuleCmd, DataPdu, Digests, Direction, EncodeOptions, IcReq, IcResp, Pdu, R2t, TermReq,
    PFV_1_0,
};
use crate::pdu_error::{PduError, SequenceError};
use crate::queue::MIN_MAXH2CDATA;
use crate::sqe::Sqe;
use crate::status::Status;

/// Host-side settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitiatorConfig {
    /// Digests to ask for in the ICReq.
    pub digests: Digests,
    /// Our data alignment requirement (HPDA), 0's based dwords.
    pub hpda: u8,
    /// Writes up to this size go in the capsule (8192 on an admin queue, IOCCSZ-based on I/O).
    pub in_capsule_limit: u32,
    /// Most data accepted in one C2HData PDU.
    pub max_c2h_data: u32,
}

impl Default for InitiatorConfig {
    fn default() -> Self {
        InitiatorConfig {
            digests: Digests::NONE,
            hpda: 0,
            in_capsule_limit: 8192,
            max_c2h_data: 1024 * 1024,
        }
    }
}

/// Data of a submitted command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Data {
    /// No data.
    None,
    /// Host-to-controller data.
    Write(Vec<u8>),
    /// Controller-to-host data of this length.
    Read(u32),
}

/// A finished command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    /// Command id.
    pub cid: u16,
    /// The CQE (synthesized as success when the target used C2HData SUCCESS).
    pub cqe: Cqe,
    /// Read data received.
    pub data: Vec<u8>,
    /// False if any C2HData of this command failed its data digest.
    pub data_digest_ok: bool,
}

/// Why the connection ended.
#[derive(Debug, PartialEq, Eq)]
pub enum InitiatorClose {
    /// We found a protocol error and queued an H2CTermReq.
    ProtocolError(PduError),
    /// The target sent a C2HTermReq.
    PeerTerminated {
        /// Fatal Error Status.
        fes: u16,
        /// Fatal Error Information.
        fei: u32,
        /// The header the target complained about.
        header: Vec<u8>,
    },
}

/// What the initiator reports.
#[derive(Debug, PartialEq, Eq)]
pub enum InitiatorEvent {
    /// The ICResp arrived and was accepted.
    Initialized {
        /// The target's ICResp.
        resp: IcResp,
    },
    /// A command finished.
    Completed(Completed),
    /// The connection is finished.
    Closed(InitiatorClose),
}

/// Why a command could not be submitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// No ICResp yet, or the connection is closed.
    NotLive,
    /// All 65536 command ids are in flight.
    NoFreeCid,
    /// The data does not fit a 32-bit length.
    TooLarge,
}

impl core::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            SubmitError::NotLive => "connection not initialized or closed",
            SubmitError::NoFreeCid => "no free command id",
            SubmitError::TooLarge => "data longer than 4 GiB",
        })
    }
}

impl std::error::Error for SubmitError {}

#[derive(Debug)]
struct Pending {
    /// Data to send on R2T (empty when sent in the capsule).
    write: Vec<u8>,
    /// Write bytes already sent through H2CData.
    sent: u32,
    read: Vec<u8>,
    read_len: u32,
    data_digest_ok: bool,
}

#[derive(Clone, Copy, Debug)]
enum State {
    AwaitIcResp,
    Live {
        opts: EncodeOptions,
        maxh2cdata: u32,
    },
    Closed,
}

/// One host connection. See the module docs.
#[derive(Debug)]
pub struct Initiator {
    config: InitiatorConfig,
    state: State,
    decoder: Decoder,
    tx: Vec<u8>,
    events: VecDeque<InitiatorEvent>,
    pending: BTreeMap<u16, Pending>,
    next_cid: u16,
}

impl Initiator {
    /// A new connection; the ICReq is queued for transmission at once.
    pub fn new(config: InitiatorConfig) -> Self {
        let mut tx = Vec::new();
        let ic = Pdu::IcReq(IcReq {
            pfv: PFV_1_0,
            hpda: config.hpda,
            digests: config.digests,
            maxr2t: 0,
        });
        // An ICReq has no data and no digests: it always encodes.
        let encoded = ic.encode(&EncodeOptions::default(), &mut tx);
        debug_assert!(encoded.is_ok());
        Initiator {
            config,
            state: State::AwaitIcResp,
            decoder: Decoder::new(DecoderConfig {
                receiver: Direction::HostToController,
                digests: Digests::NONE,
                pda: config.hpda,
                max_data_pdu: config.max_c2h_data,
                max_in_capsule: 0,
            }),
            tx,
            events: VecDeque::new(),
            pending: BTreeMap::new(),
            next_cid: 0,
        }
    }

    /// True once the ICResp was accepted and the connection is not closed.
    pub fn is_live(&self) -> bool {
        matches!(self.state, State::Live { .. })
    }

    /// True once the connection is finished.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Commands in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Appends bytes to send to `out`; returns true if it appended anything.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) -> bool {
        if self.tx.is_empty() {
            return false;
        }
        out.append(&mut self.tx);
        true
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<InitiatorEvent> {
        self.events.pop_front()
    }

    /// Submits a Fabrics Connect (admin queue when `cmd.qid == 0`).
    pub fn connect(&mut self, cmd: ConnectCmd, data: &ConnectData) -> Result<u16, SubmitError> {
        self.submit(cmd.to_sqe(0), Data::Write(data.to_bytes()))
    }

    /// Submits a command; its cid and data pointer are filled in here. Returns the cid.
    pub fn submit(&mut self, mut sqe: Sqe, data: Data) -> Result<u16, SubmitError> {
        let State::Live { opts, .. } = self.state else {
            return Err(SubmitError::NotLive);
        };
        let cid = self.free_cid()?;
        sqe.set_cid(cid);
        let mut pending = Pending {
            write: Vec::new(),
            sent: 0,
            read: Vec::new(),
            read_len: 0,
            data_digest_ok: true,
        };
        let mut capsule = Vec::new();
        match data {
            Data::None => {
                sqe.set_transport_data(0);
            }
            Data::Write(bytes) => {
                let len = u32::try_from(bytes.len()).map_err(|_| SubmitError::TooLarge)?;
                if len <= self.config.in_capsule_limit {
                    sqe.set_in_capsule(len);
                    capsule = bytes;
                } else {
                    sqe.set_transport_data(len);
                    pending.write = bytes;
                }
            }
            Data::Read(len) => {
                sqe.set_transport_data(len);
                pending.read_len = len;
            }
        }
        let pdu = Pdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data: capsule.into(),
        });
        pdu.encode(&opts, &mut self.tx)
            .map_err(|_| SubmitError::TooLarge)?;
        self.pending.insert(cid, pending);
        Ok(cid)
    }

    /// Queues raw bytes (for tests that inject malformed PDUs).
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.tx.extend_from_slice(bytes);
    }

    /// The encoding options in force (digests, target's CPDA), for building raw PDUs.
    pub fn encode_options(&self) -> EncodeOptions {
        match self.state {
            State::Live { opts, .. } => opts,
            _ => EncodeOptions::default(),
        }
    }

    fn free_cid(&mut self) -> Result<u16, SubmitError> {
        for _ in 0..=u16::MAX {
            let cid = self.next_cid;
            self.next_cid = self.next_cid.wrapping_add(1);
            if !self.pending.contains_key(&cid) {
                return Ok(cid);
            }
        }
        Err(SubmitError::NoFreeCid)
    }

    /// Feeds bytes received from the target; returns how many were consumed.
    pub fn handle_input(&mut self, input: &[u8]) -> usize {
        let mut consumed = 0;
        while consumed < input.len() && !self.is_closed() {
            let d = self.decoder.decode(&input[consumed..]);
            consumed += d.consumed;
            let Some(result) = d.result else { break };
            let outcome = match result {
                Ok(pdu) => self.on_pdu(pdu, true),
                Err(PduError::DataDigest { pdu, .. }) => self.on_pdu(*pdu, false),
                Err(e) => Err(e),
            };
            if let Err(e) = outcome {
                self.fail(e);
            }
        }
        consumed
    }

    fn fail(&mut self, error: PduError) {
        let term = Pdu::H2cTermReq(TermReq {
            fes: error.fes() as u16,
            fei: error.fei(),
            header: self.decoder.offending_header().to_vec(),
        });
        let encoded = term.encode(&EncodeOptions::default(), &mut self.tx);
        debug_assert!(encoded.is_ok());
        self.state = State::Closed;
        self.events
            .push_back(InitiatorEvent::Closed(InitiatorClose::ProtocolError(error)));
    }

    fn on_pdu(&mut self, pdu: Pdu, digest_ok: bool) -> Result<(), PduError> {
        match (self.state, pdu) {
            (State::AwaitIcResp, Pdu::IcResp(resp)) => self.on_ic_resp(resp),
            (State::AwaitIcResp, other) => Err(PduError::Sequence(
                SequenceError::ExpectedInitialization(other.pdu_type()),
            )),
            (_, Pdu::C2hTermReq(t)) => {
                self.state = State::Closed;
                self.events
                    .push_back(InitiatorEvent::Closed(InitiatorClose::PeerTerminated {
                        fes: t.fes,
                        fei: t.fei,
                        header: t.header,
                    }));
                Ok(())
            }
            (State::Live { .. }, Pdu::IcResp(_)) => {
                Err(PduError::Sequence(SequenceError::RepeatedInitialization))
            }
            (State::Live { .. }, Pdu::CapsuleResp(r)) => {
                let p = self
                    .pending
                    .remove(&r.cqe.cid)
                    .ok_or(PduError::Sequence(SequenceError::UnknownCommand(r.cqe.cid)))?;
                self.events.push_back(InitiatorEvent::Completed(Completed {
                    cid: r.cqe.cid,
                    cqe: r.cqe,
                    data: p.read,
                    data_digest_ok: p.data_digest_ok,
                }));
                Ok(())
            }
            (State::Live { .. }, Pdu::C2hData(d)) => self.on_c2h_data(d, digest_ok),
            (State::Live { opts, maxh2cdata }, Pdu::R2t(r)) => self.on_r2t(r, opts, maxh2cdata),
            (_, other) => Err(PduError::Sequence(SequenceError::UnexpectedPdu(
                other.pdu_type(),
            ))),
        }
    }

    fn on_ic_resp(&mut self, resp: IcResp) -> Result<(), PduError> {
        if resp.pfv != PFV_1_0 {
            return Err(PduError::UnsupportedParameter { offset: 8 });
        }
        if resp.digests != self.config.digests {
            return Err(PduError::UnsupportedParameter { offset: 11 });
        }
        if resp.maxh2cdata < MIN_MAXH2CDATA || !resp.maxh2cdata.is_multiple_of(4) {
            return Err(PduError::UnsupportedParameter { offset: 12 });
        }
        let mut cfg = *self.decoder.config();
        cfg.digests = resp.digests;
        self.decoder.set_config(cfg);
        self.state = State::Live {
            opts: EncodeOptions {
                digests: resp.digests,
                pda: resp.cpda,
            },
            maxh2cdata: resp.maxh2cdata,
        };
        self.events.push_back(InitiatorEvent::Initialized { resp });
        Ok(())
    }

    fn on_c2h_data(&mut self, d: DataPdu, digest_ok: bool) -> Result<(), PduError> {
        let p = self
            .pending
            .get_mut(&d.cccid)
            .ok_or(PduError::Sequence(SequenceError::UnknownCommand(d.cccid)))?;
        let length = u32::try_from(d.data.len()).unwrap_or(u32::MAX);
        let received = u32::try_from(p.read.len()).unwrap_or(u32::MAX);
        let fits = d.offset == received
            && d.offset
                .checked_add(length)
                .is_some_and(|end| end <= p.read_len);
        if !fits {
            return Err(PduError::DataOutOfRange {
                offset: d.offset,
                length,
            });
        }
        p.read.extend_from_slice(&d.data);
        p.data_digest_ok &= digest_ok;
        // Copied out: the PDU's buffer receives the next one.
        self.decoder.recycle(d.data);
        if d.success {
            if p.read.len() != usize::try_from(p.read_len).unwrap_or(usize::MAX) {
                return Err(PduError::DataOutOfRange {
                    offset: d.offset,
                    length,
                });
            }
            if let Some(p) = self.pending.remove(&d.cccid) {
                self.events.push_back(InitiatorEvent::Completed(Completed {
                    cid: d.cccid,
                    cqe: Cqe::new(d.cccid, Status::SUCCESS, 0),
                    data: p.read,
                    data_digest_ok: p.data_digest_ok,
                }));
            }
        }
        Ok(())
    }

    fn on_r2t(&mut self, r: R2t, opts: EncodeOptions, maxh2cdata: u32) -> Result<(), PduError> {
        let p = self
            .pending
            .get_mut(&r.cccid)
            .ok_or(PduError::Sequence(SequenceError::UnknownCommand(r.cccid)))?;
        let total = u32::try_from(p.write.len()).unwrap_or(u32::MAX);
        let valid = r.offset == p.sent
            && r.offset
                .checked_add(r.length)
                .is_some_and(|end| end <= total);
        if !valid {
            return Err(PduError::DataOutOfRange {
                offset: r.offset,
                length: r.length,
            });
        }
        let start = usize::try_from(r.offset).unwrap_or(usize::MAX);
        let end = start + usize::try_from(r.length).unwrap_or(0);
        let chunk = usize::try_from(maxh2cdata).unwrap_or(usize::MAX);
        let mut offset = start;
        for part in p.write[start..end].chunks(chunk) {
            let next = offset + part.len();
            let pdu = Pdu::H2cData(DataPdu {
                cccid: r.cccid,
                ttag: r.ttag,
                offset: u32::try_from(offset).unwrap_or(u32::MAX),
                last: next == end,
                success: false,
                data: part.into(),
            });
            // Bounded by maxh2cdata: always encodes.
            let encoded = pdu.encode(&opts, &mut self.tx);
            debug_assert!(encoded.is_ok());
            offset = next;
        }
        p.sent = r.offset + r.length;
        Ok(())
    }
}
