//! Incremental PDU decoder: feed it byte chunks of any size, get whole validated PDUs.
//!
//! The decoder buffers one PDU at a time and never more than the limits allow: the common header
//! is validated (type, direction, `hlen`, digest flags, `pdo`, `plen` against the data limits)
//! before a single byte beyond it is buffered, so a hostile `plen` cannot make it allocate. The
//! header digest is checked before any type-specific field is trusted. One call returns at most
//! one PDU, so the caller can change the negotiated digests (after ICReq/ICResp) before the next
//! PDU is framed. After a fatal error the decoder stays failed and consumes nothing.

use crate::cqe::{Cqe, CQE_LEN};
use crate::data_buf::{DataBuf, DATA_ALIGN};
use crate::pdu::{
    crc32c, data_offset, flags, CapsuleCmd, CapsuleResp, DataPdu, Digests, Direction, IcReq,
    IcResp, Pdu, PduType, R2t, TermReq, COMMON_HEADER_LEN, DIGEST_LEN, TERM_REQ_MAX_DATA,
};
use crate::pdu_error::{HeaderField, PduError};
use crate::sqe::{Sqe, SQE_LEN};

/// Limits and negotiated parameters the decoder enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecoderConfig {
    /// The side that receives: a target accepts host-to-controller PDUs only, and vice versa.
    pub receiver: Direction,
    /// Digests negotiated on the connection (ignored for ICReq/ICResp/TermReq).
    pub digests: Digests,
    /// Alignment the receiver asked the sender for, 0's based dwords (our CPDA or HPDA).
    pub pda: u8,
    /// Largest data in one H2CData/C2HData PDU (our MAXH2CDATA on a target).
    pub max_data_pdu: u32,
    /// Largest in-capsule data in one CapsuleCmd.
    pub max_in_capsule: u32,
}

#[derive(Clone, Copy, Debug)]
struct Framing {
    ty: PduType,
    hlen: usize,
    /// Header digest present.
    hdgst: bool,
    /// Data digest present.
    ddgst: bool,
    /// Where data starts (0 if none).
    data_start: usize,
    plen: usize,
}

impl Framing {
    fn trailer(&self) -> usize {
        if self.ddgst {
            DIGEST_LEN
        } else {
            0
        }
    }

    /// Bytes of data (0 when there are none).
    fn data_len(&self) -> usize {
        if self.data_start == 0 {
            0
        } else {
            self.plen - self.data_start - self.trailer()
        }
    }
}

/// The incremental decoder. See the module docs.
#[derive(Debug)]
pub struct Decoder {
    config: DecoderConfig,
    buf: Vec<u8>,
    framing: Option<Framing>,
    header_checked: bool,
    failed: bool,
    /// Header of the last complete PDU, for a TermReq about a PDU that decoded but was refused.
    last_header: [u8; TERM_REQ_MAX_DATA],
    last_header_len: usize,
    /// Data buffers handed back by the consumer ([`Decoder::recycle`]), for the next PDUs' data.
    spare: Vec<DataBuf>,
    /// Bytes the spare buffers have allocated.
    spare_bytes: usize,
    /// The data of the PDU being decoded: copied from the input straight into the buffer the
    /// PDU will own (the header, padding and digest gather in `buf`), page-aligned so that a
    /// write's data can go to an `O_DIRECT` device as it is.
    data: DataBuf,
}

/// Bytes of spare data buffers kept, counting their alignment slack (a full queue of 4 KiB
/// writes, or 15 of 128 KiB), and the largest allocation kept (one H2CData PDU at the default
/// MAXH2CDATA, with its slack).
const SPARE_BYTES: usize = 2 << 20;
const SPARE_MAX: usize = 128 * 1024 + DATA_ALIGN;

/// What one [`Decoder::decode`] call produced.
#[derive(Debug)]
pub struct Decoded {
    /// Bytes of the input consumed.
    pub consumed: usize,
    /// A complete PDU or an error, if one finished in this call.
    pub result: Option<Result<Pdu, PduError>>,
}

/// The buffers input is moved into.
trait Fill {
    fn len(&self) -> usize;
    fn extend_from_slice(&mut self, s: &[u8]);
}

impl Fill for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn extend_from_slice(&mut self, s: &[u8]) {
        Vec::extend_from_slice(self, s);
    }
}

impl Fill for DataBuf {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn extend_from_slice(&mut self, s: &[u8]) {
        DataBuf::extend_from_slice(self, s);
    }
}

/// Moves bytes of `input` from `consumed` on into `dst` until it holds `need`; whether it does.
fn move_into(dst: &mut impl Fill, input: &[u8], consumed: &mut usize, need: usize) -> bool {
    if dst.len() < need {
        let take = (need - dst.len()).min(input.len() - *consumed);
        dst.extend_from_slice(&input[*consumed..*consumed + take]);
        *consumed += take;
    }
    dst.len() >= need
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Decoder {
    /// A decoder with `config`.
    pub fn new(config: DecoderConfig) -> Self {
        Decoder {
            config,
            buf: Vec::new(),
            framing: None,
            header_checked: false,
            failed: false,
            last_header: [0; TERM_REQ_MAX_DATA],
            last_header_len: 0,
            spare: Vec::new(),
            spare_bytes: 0,
            data: DataBuf::default(),
        }
    }

    /// Takes back a PDU's data buffer once its consumer is done with it: the next PDU with data
    /// reuses it instead of allocating.
    pub fn recycle(&mut self, mut buf: DataBuf) {
        let size = buf.allocated();
        if size > 0 && size <= SPARE_MAX && self.spare_bytes + size <= SPARE_BYTES {
            buf.clear();
            self.spare_bytes += size;
            self.spare.push(buf);
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// Changes the configuration; takes effect from the next PDU (call between PDUs).
    pub fn set_config(&mut self, config: DecoderConfig) {
        self.config = config;
    }

    /// True after a fatal error.
    pub fn is_failed(&self) -> bool {
        self.failed
    }

    /// Capacity of the header buffer (tests: data does not pass through it).
    #[cfg(test)]
    pub(crate) fn header_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// True when no partial PDU is buffered.
    pub fn is_idle(&self) -> bool {
        self.buf.is_empty()
    }

    /// The rest of the data of the PDU being decoded, when its header has been checked and the
    /// input ran out in its data: the buffer the PDU will own and how many bytes it still
    /// lacks. The caller may receive up to that many bytes straight into its
    /// [`DataBuf::spare_mut`] (no copy through its input buffer) and [`DataBuf::commit`] them,
    /// then calls [`Decoder::decode`] again, with no input if it has none: the PDU may be
    /// complete.
    pub fn data_sink(&mut self) -> Option<(&mut DataBuf, usize)> {
        let f = self.framing?;
        let in_data = !self.failed
            && self.header_checked
            && f.data_start > 0
            && self.buf.len() == f.data_start
            && self.data.capacity() > 0;
        let lacking = f.data_len().checked_sub(self.data.len())?;
        (in_data && lacking > 0).then_some((&mut self.data, lacking))
    }

    /// The header (at most 128 bytes) of the PDU in error, for the TermReq: the partial PDU if one
    /// is buffered, else the last complete one.
    pub fn offending_header(&self) -> &[u8] {
        if self.buf.is_empty() {
            return &self.last_header[..self.last_header_len];
        }
        let hlen = self.framing.map_or(COMMON_HEADER_LEN, |f| f.hlen);
        &self.buf[..self.buf.len().min(hlen).min(TERM_REQ_MAX_DATA)]
    }

    /// Consumes bytes from `input` until one PDU is complete, an error is found, or the input is
    /// exhausted.
    pub fn decode(&mut self, input: &[u8]) -> Decoded {
        let mut consumed = 0;
        if self.failed {
            return Decoded {
                consumed,
                result: None,
            };
        }
        loop {
            let ready = match self.framing {
                None => self.fill(input, &mut consumed, COMMON_HEADER_LEN),
                Some(f) if !self.header_checked => {
                    let need = f.hlen + if f.hdgst { DIGEST_LEN } else { 0 };
                    self.fill(input, &mut consumed, need)
                }
                Some(f) if f.data_start == 0 => self.fill(input, &mut consumed, f.plen),
                // Header and padding, then the data into its own buffer, then the digest.
                Some(f) => {
                    self.fill(input, &mut consumed, f.data_start)
                        && self.fill_data(input, &mut consumed, f.data_len())
                        && self.fill(input, &mut consumed, f.data_start + f.trailer())
                }
            };
            if !ready {
                return Decoded {
                    consumed,
                    result: None,
                };
            }
            let step = match self.framing {
                None => self.frame().map(|f| {
                    let buffered = if f.data_start == 0 {
                        f.plen
                    } else {
                        f.data_start + f.trailer()
                    };
                    self.buf.reserve_exact(buffered - self.buf.len());
                    self.framing = Some(f);
                    None
                }),
                Some(f) if !self.header_checked => self.check_header(f).map(|()| {
                    self.header_checked = true;
                    None
                }),
                Some(f) => self.finish(f).map(Some),
            };
            match step {
                Ok(None) => continue,
                Ok(Some(result)) => {
                    self.reset();
                    return Decoded {
                        consumed,
                        result: Some(result),
                    };
                }
                Err(e) => {
                    self.failed = true;
                    return Decoded {
                        consumed,
                        result: Some(Err(e)),
                    };
                }
            }
        }
    }

    /// Moves input into `buf` until it holds `need` bytes; whether it does.
    fn fill(&mut self, input: &[u8], consumed: &mut usize, need: usize) -> bool {
        move_into(&mut self.buf, input, consumed, need)
    }

    /// Moves input into the PDU's data buffer until it holds `len` bytes; whether it does.
    fn fill_data(&mut self, input: &[u8], consumed: &mut usize, len: usize) -> bool {
        if self.data.capacity() == 0 {
            // The PDU's own buffer: a recycled one that holds it when there is one.
            self.data = match self.spare.iter().rposition(|b| b.capacity() >= len) {
                Some(i) => {
                    let b = self.spare.swap_remove(i);
                    self.spare_bytes -= b.allocated();
                    b
                }
                None => DataBuf::with_capacity(len),
            };
        }
        move_into(&mut self.data, input, consumed, len)
    }

    fn reset(&mut self) {
        let n = self
            .framing
            .map_or(0, |f| f.hlen)
            .min(self.buf.len())
            .min(TERM_REQ_MAX_DATA);
        self.last_header[..n].copy_from_slice(&self.buf[..n]);
        self.last_header_len = n;
        self.buf.clear();
        // Keep the buffer for the next PDU unless a large one inflated it.
        if self.buf.capacity() > 64 * 1024 {
            self.buf = Vec::new();
        }
        self.framing = None;
        self.header_checked = false;
    }

    /// Validates the common header and works out where everything is.
    fn frame(&self) -> Result<Framing, PduError> {
        let b = &self.buf;
        let ty = PduType::from_u8(b[0]).ok_or(PduError::field(HeaderField::Type))?;
        if ty.direction() == self.config.receiver {
            return Err(PduError::field(HeaderField::Type));
        }
        let hlen = usize::from(b[2]);
        if hlen != usize::from(ty.header_len()) {
            return Err(PduError::field(HeaderField::Hlen));
        }
        let fl = b[1];
        let pdo = usize::from(b[3]);
        let plen = usize::try_from(le32(b, 4)).map_err(|_| PduError::field(HeaderField::Plen))?;

        if !ty.uses_digests() {
            if fl & (flags::HDGSTF | flags::DDGSTF) != 0 {
                return Err(PduError::field(HeaderField::Flags));
            }
            let max = match ty {
                PduType::IcReq | PduType::IcResp => hlen,
                _ => hlen + TERM_REQ_MAX_DATA,
            };
            if plen < hlen || plen > max {
                return Err(PduError::field(HeaderField::Plen));
            }
            return Ok(Framing {
                ty,
                hlen,
                hdgst: false,
                ddgst: false,
                data_start: if plen > hlen { hlen } else { 0 },
                plen,
            });
        }

        let digests = self.config.digests;
        let hdgst = fl & flags::HDGSTF != 0;
        let ddgst = fl & flags::DDGSTF != 0;
        if hdgst != digests.header || (ddgst && !digests.data) {
            return Err(PduError::field(HeaderField::Flags));
        }
        let header_end = hlen + if hdgst { DIGEST_LEN } else { 0 };
        if plen < header_end {
            return Err(PduError::field(HeaderField::Plen));
        }
        if plen == header_end {
            // No data: no data digest, PDO 0 (Linux) or pointing at the (empty) data.
            if ddgst {
                return Err(PduError::field(HeaderField::Flags));
            }
            if pdo != 0 && pdo != data_offset(header_end, self.config.pda) {
                return Err(PduError::field(HeaderField::Pdo));
            }
            if matches!(ty, PduType::H2cData | PduType::C2hData) {
                return Err(PduError::field(HeaderField::Plen));
            }
            return Ok(Framing {
                ty,
                hlen,
                hdgst,
                ddgst,
                data_start: 0,
                plen,
            });
        }
        if !ty.may_carry_data() {
            return Err(PduError::field(HeaderField::Plen));
        }
        if digests.data && !ddgst {
            return Err(PduError::field(HeaderField::Flags));
        }
        if pdo != data_offset(header_end, self.config.pda) {
            return Err(PduError::field(HeaderField::Pdo));
        }
        let trailer = if ddgst { DIGEST_LEN } else { 0 };
        let data_len = plen
            .checked_sub(pdo + trailer)
            .filter(|&n| n > 0)
            .ok_or(PduError::field(HeaderField::Plen))?;
        let max = if ty == PduType::CapsuleCmd {
            self.config.max_in_capsule
        } else {
            self.config.max_data_pdu
        };
        if data_len > usize::try_from(max).unwrap_or(usize::MAX) {
            return Err(PduError::DataLimitExceeded {
                length: u32::try_from(data_len).unwrap_or(u32::MAX),
                max,
            });
        }
        Ok(Framing {
            ty,
            hlen,
            hdgst,
            ddgst,
            data_start: pdo,
            plen,
        })
    }

    /// Verifies the header digest and the type-specific header fields.
    fn check_header(&self, f: Framing) -> Result<(), PduError> {
        let b = &self.buf;
        if f.hdgst {
            let expected = crc32c(&b[..f.hlen]);
            let received = le32(b, f.hlen);
            if expected != received {
                return Err(PduError::HeaderDigest { expected, received });
            }
        }
        match f.ty {
            PduType::H2cData | PduType::C2hData => {
                let datal = usize::try_from(le32(b, 16)).unwrap_or(usize::MAX);
                if datal != f.plen - f.data_start - if f.ddgst { DIGEST_LEN } else { 0 } {
                    return Err(PduError::field(HeaderField::DataLength));
                }
                let fl = b[1];
                if f.ty == PduType::H2cData && fl & flags::SUCCESS != 0 {
                    return Err(PduError::field(HeaderField::Flags));
                }
                if fl & flags::SUCCESS != 0 && fl & flags::LAST_PDU == 0 {
                    return Err(PduError::field(HeaderField::Flags));
                }
            }
            PduType::R2t if le32(b, 16) == 0 => {
                return Err(PduError::field(HeaderField::DataLength));
            }
            PduType::IcReq if b[10] > 31 => {
                return Err(PduError::field(HeaderField::Hpda));
            }
            PduType::IcResp if b[10] > 31 => {
                return Err(PduError::field(HeaderField::Hpda));
            }
            _ => {}
        }
        Ok(())
    }

    /// Checks the data digest and builds the PDU.
    fn finish(&mut self, f: Framing) -> Result<Result<Pdu, PduError>, PduError> {
        let b = &self.buf;
        let data = std::mem::take(&mut self.data);
        let expected = f.ddgst.then(|| crc32c(&data));
        let pdu = build(f.ty, b, data);
        if let Some(expected) = expected {
            // The digest follows the header and padding in `buf` (the data went to its own).
            let received = le32(b, f.data_start);
            if expected != received {
                return Ok(Err(PduError::DataDigest {
                    expected,
                    received,
                    pdu: Box::new(pdu),
                }));
            }
        }
        Ok(Ok(pdu))
    }
}

fn build(ty: PduType, b: &[u8], data: DataBuf) -> Pdu {
    let fl = b[1];
    match ty {
        PduType::IcReq => Pdu::IcReq(IcReq {
            pfv: le16(b, 8),
            hpda: b[10],
            digests: Digests::from_bits(b[11]),
            maxr2t: le32(b, 12),
        }),
        PduType::IcResp => Pdu::IcResp(IcResp {
            pfv: le16(b, 8),
            cpda: b[10],
            digests: Digests::from_bits(b[11]),
            maxh2cdata: le32(b, 12),
        }),
        PduType::H2cTermReq | PduType::C2hTermReq => {
            let t = TermReq {
                fes: le16(b, 8),
                fei: le32(b, 10),
                // At most 128 bytes, once per connection: a copy costs nothing.
                header: data.to_vec(),
            };
            if ty == PduType::H2cTermReq {
                Pdu::H2cTermReq(t)
            } else {
                Pdu::C2hTermReq(t)
            }
        }
        PduType::CapsuleCmd => {
            let mut sqe = [0u8; SQE_LEN];
            sqe.copy_from_slice(&b[8..8 + SQE_LEN]);
            Pdu::CapsuleCmd(CapsuleCmd {
                sqe: Sqe(sqe),
                data,
            })
        }
        PduType::CapsuleResp => {
            let mut cqe = [0u8; CQE_LEN];
            cqe.copy_from_slice(&b[8..8 + CQE_LEN]);
            Pdu::CapsuleResp(CapsuleResp {
                cqe: Cqe::from_bytes(&cqe),
            })
        }
        PduType::H2cData | PduType::C2hData => {
            let d = DataPdu {
                cccid: le16(b, 8),
                ttag: le16(b, 10),
                offset: le32(b, 12),
                last: fl & flags::LAST_PDU != 0,
                success: fl & flags::SUCCESS != 0,
                data,
            };
            if ty == PduType::H2cData {
                Pdu::H2cData(d)
            } else {
                Pdu::C2hData(d)
            }
        }
        PduType::R2t => Pdu::R2t(R2t {
            cccid: le16(b, 8),
            ttag: le16(b, 10),
            offset: le32(b, 12),
            length: le32(b, 16),
        }),
    }
}
