//! NVMe/TCP PDUs: the common header, every PDU type, and encoding into a caller's buffer.
//!
//! Layouts follow `include/linux/nvme-tcp.h`. Every PDU starts with the 8-byte common header
//! (`type`, `flags`, `hlen`, `pdo`, `plen` little-endian). The PDU-specific header follows up to
//! `hlen`; then, if negotiated and flagged (HDGSTF), a 4-byte CRC32C header digest; then padding
//! up to `pdo` (the receiver's alignment: `(pda + 1) * 4` bytes); then data; then, if flagged
//! (DDGSTF), a 4-byte CRC32C data digest. ICReq, ICResp and TermReq never carry digests.
//! Decoding lives in [`crate::decoder`].

use crate::cqe::{Cqe, CQE_LEN};
use crate::data_buf::DataBuf;
use crate::sqe::{Sqe, SQE_LEN};

/// Length of the common header.
pub const COMMON_HEADER_LEN: usize = 8;
/// Length of a header or data digest.
pub const DIGEST_LEN: usize = 4;
/// Largest TermReq data: the offending PDU header (`NVME_TCP_MAX_C2HTERM_PLEN` - 24).
pub const TERM_REQ_MAX_DATA: usize = 128;
/// The only PDU format version (`NVME_TCP_PFV_1_0`).
pub const PFV_1_0: u16 = 0;

/// PDU header flags.
pub mod flags {
    /// A header digest follows the header.
    pub const HDGSTF: u8 = 1 << 0;
    /// A data digest follows the data.
    pub const DDGSTF: u8 = 1 << 1;
    /// Last H2CData/C2HData PDU of a transfer (of an R2T, or of the command's read data).
    pub const LAST_PDU: u8 = 1 << 2;
    /// C2HData only: the command succeeded and no CapsuleResp follows.
    pub const SUCCESS: u8 = 1 << 3;
}

/// PDU type byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PduType {
    /// Initialize Connection Request (host to controller).
    IcReq = 0x0,
    /// Initialize Connection Response (controller to host).
    IcResp = 0x1,
    /// Host to controller Terminate Connection Request.
    H2cTermReq = 0x2,
    /// Controller to host Terminate Connection Request.
    C2hTermReq = 0x3,
    /// Command capsule (host to controller).
    CapsuleCmd = 0x4,
    /// Response capsule (controller to host).
    CapsuleResp = 0x5,
    /// Host to controller data.
    H2cData = 0x6,
    /// Controller to host data.
    C2hData = 0x7,
    /// Ready to transfer (controller to host).
    R2t = 0x9,
}

/// Which side sent a PDU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Sent by the host.
    HostToController,
    /// Sent by the controller.
    ControllerToHost,
}

impl PduType {
    /// Decodes a type byte.
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x0 => PduType::IcReq,
            0x1 => PduType::IcResp,
            0x2 => PduType::H2cTermReq,
            0x3 => PduType::C2hTermReq,
            0x4 => PduType::CapsuleCmd,
            0x5 => PduType::CapsuleResp,
            0x6 => PduType::H2cData,
            0x7 => PduType::C2hData,
            0x9 => PduType::R2t,
            _ => return None,
        })
    }

    /// The fixed header length (`hlen`) of this type.
    pub const fn header_len(self) -> u8 {
        match self {
            PduType::IcReq | PduType::IcResp => 128,
            PduType::CapsuleCmd => 72,
            PduType::H2cTermReq
            | PduType::C2hTermReq
            | PduType::CapsuleResp
            | PduType::H2cData
            | PduType::C2hData
            | PduType::R2t => 24,
        }
    }

    /// Whether header and data digests apply to this type once negotiated.
    pub const fn uses_digests(self) -> bool {
        !matches!(
            self,
            PduType::IcReq | PduType::IcResp | PduType::H2cTermReq | PduType::C2hTermReq
        )
    }

    /// Whether this type may carry data after its header.
    pub const fn may_carry_data(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd
                | PduType::H2cData
                | PduType::C2hData
                | PduType::H2cTermReq
                | PduType::C2hTermReq
        )
    }

    /// Who sends this type.
    pub const fn direction(self) -> Direction {
        match self {
            PduType::IcReq | PduType::H2cTermReq | PduType::CapsuleCmd | PduType::H2cData => {
                Direction::HostToController
            }
            _ => Direction::ControllerToHost,
        }
    }
}

/// Digest options (the `digest` byte of ICReq/ICResp).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Digests {
    /// CRC32C header digest.
    pub header: bool,
    /// CRC32C data digest.
    pub data: bool,
}

impl Digests {
    /// No digests.
    pub const NONE: Digests = Digests {
        header: false,
        data: false,
    };
    /// Both digests.
    pub const BOTH: Digests = Digests {
        header: true,
        data: true,
    };

    /// Decodes the ICReq/ICResp digest byte (reserved bits ignored).
    pub const fn from_bits(b: u8) -> Self {
        Digests {
            header: b & 1 != 0,
            data: b & 2 != 0,
        }
    }
    /// Encodes the ICReq/ICResp digest byte.
    pub const fn bits(self) -> u8 {
        (self.header as u8) | ((self.data as u8) << 1)
    }
}

/// CRC32C as NVMe/TCP digests use it (stored little-endian on the wire).
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Initialize Connection Request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcReq {
    /// PDU format version (0).
    pub pfv: u16,
    /// Host PDU data alignment, 0's based dwords (0..=31).
    pub hpda: u8,
    /// Digests the host asks for.
    pub digests: Digests,
    /// Maximum outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
}

/// Initialize Connection Response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcResp {
    /// PDU format version (0).
    pub pfv: u16,
    /// Controller PDU data alignment, 0's based dwords.
    pub cpda: u8,
    /// Digests enabled on the connection.
    pub digests: Digests,
    /// Maximum data bytes in one H2CData PDU (MAXH2CDATA).
    pub maxh2cdata: u32,
}

/// H2C or C2H Terminate Connection Request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TermReq {
    /// Fatal Error Status (see [`crate::pdu_error::Fes`]).
    pub fes: u16,
    /// Fatal Error Information.
    pub fei: u32,
    /// The header of the PDU in error (at most [`TERM_REQ_MAX_DATA`] bytes).
    pub header: Vec<u8>,
}

/// Command capsule: an SQE and its in-capsule data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapsuleCmd {
    /// The submission queue entry.
    pub sqe: Sqe,
    /// In-capsule data (empty if none), page-aligned.
    pub data: DataBuf,
}

/// Response capsule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapsuleResp {
    /// The completion queue entry.
    pub cqe: Cqe,
}

/// H2CData or C2HData.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataPdu {
    /// Command capsule CID the data belongs to.
    pub cccid: u16,
    /// Transfer tag from the R2T (H2CData; reserved in C2HData).
    pub ttag: u16,
    /// Offset of `data` in the command's data buffer.
    pub offset: u32,
    /// LAST_PDU flag.
    pub last: bool,
    /// SUCCESS flag (C2HData only).
    pub success: bool,
    /// The data (`datal` is its length), page-aligned.
    pub data: DataBuf,
}

/// Ready to Transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct R2t {
    /// Command capsule CID.
    pub cccid: u16,
    /// Transfer tag the host echoes in H2CData.
    pub ttag: u16,
    /// Offset of the requested range in the command's data.
    pub offset: u32,
    /// Length of the requested range.
    pub length: u32,
}

/// Any PDU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pdu {
    /// ICReq.
    IcReq(IcReq),
    /// ICResp.
    IcResp(IcResp),
    /// H2CTermReq.
    H2cTermReq(TermReq),
    /// C2HTermReq.
    C2hTermReq(TermReq),
    /// CapsuleCmd.
    CapsuleCmd(CapsuleCmd),
    /// CapsuleResp.
    CapsuleResp(CapsuleResp),
    /// H2CData.
    H2cData(DataPdu),
    /// C2HData.
    C2hData(DataPdu),
    /// R2T.
    R2t(R2t),
}

/// How to frame an outgoing PDU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Digests negotiated on the connection.
    pub digests: Digests,
    /// The receiver's data alignment, 0's based dwords (the peer's HPDA or CPDA).
    pub pda: u8,
}

/// Why a PDU could not be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The data does not fit a 32-bit `plen`.
    TooLarge,
    /// TermReq data longer than [`TERM_REQ_MAX_DATA`].
    TermReqDataTooLong,
    /// PDA above 31.
    BadAlignment,
}

impl core::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EncodeError::TooLarge => f.write_str("PDU longer than 4 GiB"),
            EncodeError::TermReqDataTooLong => f.write_str("TermReq data over 128 bytes"),
            EncodeError::BadAlignment => f.write_str("PDU data alignment above 31 dwords"),
        }
    }
}

impl std::error::Error for EncodeError {}

/// The data offset of a PDU whose header (and header digest) ends at `header_end`, for a receiver
/// that wants data aligned to `(pda + 1) * 4` bytes.
pub const fn data_offset(header_end: usize, pda: u8) -> usize {
    let align = (pda as usize + 1) * 4;
    header_end.div_ceil(align) * align
}

impl Pdu {
    /// The PDU type.
    pub fn pdu_type(&self) -> PduType {
        match self {
            Pdu::IcReq(_) => PduType::IcReq,
            Pdu::IcResp(_) => PduType::IcResp,
            Pdu::H2cTermReq(_) => PduType::H2cTermReq,
            Pdu::C2hTermReq(_) => PduType::C2hTermReq,
            Pdu::CapsuleCmd(_) => PduType::CapsuleCmd,
            Pdu::CapsuleResp(_) => PduType::CapsuleResp,
            Pdu::H2cData(_) => PduType::H2cData,
            Pdu::C2hData(_) => PduType::C2hData,
            Pdu::R2t(_) => PduType::R2t,
        }
    }

    fn data(&self) -> &[u8] {
        match self {
            Pdu::H2cTermReq(t) | Pdu::C2hTermReq(t) => &t.header,
            Pdu::CapsuleCmd(c) => &c.data,
            Pdu::H2cData(d) | Pdu::C2hData(d) => &d.data,
            _ => &[],
        }
    }

    /// Writes the PDU-specific header bytes (after the common header) into `h`.
    fn write_specific(&self, h: &mut [u8]) -> Result<(), EncodeError> {
        match self {
            Pdu::IcReq(r) => {
                h[8..10].copy_from_slice(&r.pfv.to_le_bytes());
                h[10] = r.hpda;
                h[11] = r.digests.bits();
                h[12..16].copy_from_slice(&r.maxr2t.to_le_bytes());
            }
            Pdu::IcResp(r) => {
                h[8..10].copy_from_slice(&r.pfv.to_le_bytes());
                h[10] = r.cpda;
                h[11] = r.digests.bits();
                h[12..16].copy_from_slice(&r.maxh2cdata.to_le_bytes());
            }
            Pdu::H2cTermReq(t) | Pdu::C2hTermReq(t) => {
                h[8..10].copy_from_slice(&t.fes.to_le_bytes());
                h[10..14].copy_from_slice(&t.fei.to_le_bytes());
            }
            Pdu::CapsuleCmd(c) => h[8..8 + SQE_LEN].copy_from_slice(&c.sqe.0),
            Pdu::CapsuleResp(r) => h[8..8 + CQE_LEN].copy_from_slice(&r.cqe.to_bytes()),
            Pdu::H2cData(d) | Pdu::C2hData(d) => {
                let datal = u32::try_from(d.data.len()).map_err(|_| EncodeError::TooLarge)?;
                h[8..10].copy_from_slice(&d.cccid.to_le_bytes());
                h[10..12].copy_from_slice(&d.ttag.to_le_bytes());
                h[12..16].copy_from_slice(&d.offset.to_le_bytes());
                h[16..20].copy_from_slice(&datal.to_le_bytes());
            }
            Pdu::R2t(r) => {
                h[8..10].copy_from_slice(&r.cccid.to_le_bytes());
                h[10..12].copy_from_slice(&r.ttag.to_le_bytes());
                h[12..16].copy_from_slice(&r.offset.to_le_bytes());
                h[16..20].copy_from_slice(&r.length.to_le_bytes());
            }
        }
        Ok(())
    }

    fn type_flags(&self) -> u8 {
        match self {
            Pdu::H2cData(d) | Pdu::C2hData(d) => {
                (if d.last { flags::LAST_PDU } else { 0 })
                    | (if d.success { flags::SUCCESS } else { 0 })
            }
            _ => 0,
        }
    }

    /// Number of bytes [`Pdu::encode`] appends with these options.
    pub fn encoded_len(&self, opts: &EncodeOptions) -> usize {
        let ty = self.pdu_type();
        let hlen = usize::from(ty.header_len());
        let data = self.data().len();
        if !ty.uses_digests() {
            return hlen + data;
        }
        let header_end = hlen + if opts.digests.header { DIGEST_LEN } else { 0 };
        if data == 0 {
            header_end
        } else {
            data_offset(header_end, opts.pda)
                + data
                + if opts.digests.data { DIGEST_LEN } else { 0 }
        }
    }

    /// Appends the PDU to `out`, with digests and padding as `opts` say.
    pub fn encode(&self, opts: &EncodeOptions, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let mut specific = [0u8; 128];
        self.write_specific(&mut specific)?;
        encode_raw(
            self.pdu_type(),
            self.type_flags(),
            &specific,
            self.data(),
            opts,
            out,
            true,
        )
        .map(drop)
    }
}

/// A C2HData PDU whose data is borrowed: a read's completion encodes its data straight from
/// the buffer it was read into (no owned [`DataPdu`] in between).
#[derive(Clone, Copy, Debug)]
pub struct C2hDataRef<'a> {
    /// Command capsule CID the data belongs to.
    pub cccid: u16,
    /// Offset of `data` in the command's data buffer.
    pub offset: u32,
    /// LAST_PDU flag.
    pub last: bool,
    /// The data.
    pub data: &'a [u8],
}

impl C2hDataRef<'_> {
    /// Appends the PDU to `out`, exactly as [`Pdu::encode`] of the same `C2hData` would.
    pub fn encode(&self, opts: &EncodeOptions, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        self.encode_with(opts, out, true).map(drop)
    }

    /// Appends the PDU to `out` without its data: everything [`C2hDataRef::encode`] appends,
    /// less the data bytes, which the caller sends from its own buffer at the offset returned
    /// (in `out`). Digests are computed over `data` as usual.
    pub fn encode_around(
        &self,
        opts: &EncodeOptions,
        out: &mut Vec<u8>,
    ) -> Result<usize, EncodeError> {
        self.encode_with(opts, out, false)
    }

    fn encode_with(
        &self,
        opts: &EncodeOptions,
        out: &mut Vec<u8>,
        with_bytes: bool,
    ) -> Result<usize, EncodeError> {
        let datal = u32::try_from(self.data.len()).map_err(|_| EncodeError::TooLarge)?;
        let mut h = [0u8; 128];
        h[8..10].copy_from_slice(&self.cccid.to_le_bytes());
        h[12..16].copy_from_slice(&self.offset.to_le_bytes());
        h[16..20].copy_from_slice(&datal.to_le_bytes());
        let flags = if self.last { flags::LAST_PDU } else { 0 };
        encode_raw(
            PduType::C2hData,
            flags,
            &h,
            self.data,
            opts,
            out,
            with_bytes,
        )
    }
}

/// Appends a PDU of type `ty`: `specific` holds its header bytes after the common header (the
/// common header itself is written here), `data` its data (left out unless `with_bytes`).
/// Returns where the data starts in `out`.
fn encode_raw(
    ty: PduType,
    type_flags: u8,
    specific: &[u8; 128],
    data: &[u8],
    opts: &EncodeOptions,
    out: &mut Vec<u8>,
    with_bytes: bool,
) -> Result<usize, EncodeError> {
    if opts.pda > 31 {
        return Err(EncodeError::BadAlignment);
    }
    if matches!(ty, PduType::H2cTermReq | PduType::C2hTermReq) && data.len() > TERM_REQ_MAX_DATA {
        return Err(EncodeError::TermReqDataTooLong);
    }
    let hlen = usize::from(ty.header_len());
    let digests = if ty.uses_digests() {
        opts.digests
    } else {
        Digests::NONE
    };
    let header_end = hlen + if digests.header { DIGEST_LEN } else { 0 };
    let with_data = !data.is_empty();
    let (pdo, data_start) = if !with_data {
        (0, header_end)
    } else if ty.uses_digests() {
        let pdo = data_offset(header_end, opts.pda);
        (pdo, pdo)
    } else {
        // TermReq: data follows the header directly; PDO is not used.
        (0, hlen)
    };
    let ddgst = with_data && digests.data;
    let plen = data_start + data.len() + if ddgst { DIGEST_LEN } else { 0 };
    let plen_field = u32::try_from(plen).map_err(|_| EncodeError::TooLarge)?;
    let pdo_field = u8::try_from(pdo).map_err(|_| EncodeError::BadAlignment)?;

    let mut h = *specific;
    h[0] = ty as u8;
    h[1] = type_flags
        | if digests.header { flags::HDGSTF } else { 0 }
        | if ddgst { flags::DDGSTF } else { 0 };
    h[2] = ty.header_len();
    h[3] = pdo_field;
    h[4..8].copy_from_slice(&plen_field.to_le_bytes());

    out.reserve(if with_bytes { plen } else { plen - data.len() });
    out.extend_from_slice(&h[..hlen]);
    if digests.header {
        out.extend_from_slice(&crc32c(&h[..hlen]).to_le_bytes());
    }
    out.resize(out.len() + (data_start - header_end.min(data_start)), 0);
    let at = out.len();
    if with_bytes {
        out.extend_from_slice(data);
    }
    if ddgst {
        out.extend_from_slice(&crc32c(data).to_le_bytes());
    }
    Ok(at)
}

#[cfg(test)]
mod tests;
