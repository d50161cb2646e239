//! Typed PDU errors and the Fatal Error Status (FES) each one puts into a TermReq.

use crate::pdu::{Pdu, PduType};

/// Fatal Error Status of an H2C/C2H TermReq (NVMe/TCP transport spec; `nvme_tcp_fatal_error_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Fes {
    /// Invalid PDU Header Field: FEI is the byte offset of the field in error.
    InvalidHeaderField = 0x01,
    /// PDU Sequence Error: a valid PDU arrived when it is not allowed.
    PduSequenceError = 0x02,
    /// Header Digest Error.
    HeaderDigestError = 0x03,
    /// Data Transfer Out of Range (H2CData/C2HData outside what was asked for).
    DataOutOfRange = 0x04,
    /// Data Transfer Limit Exceeded (more data in one PDU than negotiated).
    DataLimitExceeded = 0x05,
    /// Unsupported parameter (for example an ICReq PFV we do not speak).
    UnsupportedParameter = 0x06,
}

impl Fes {
    /// Decodes a FES value from a received TermReq.
    pub fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0x01 => Fes::InvalidHeaderField,
            0x02 => Fes::PduSequenceError,
            0x03 => Fes::HeaderDigestError,
            0x04 => Fes::DataOutOfRange,
            0x05 => Fes::DataLimitExceeded,
            0x06 => Fes::UnsupportedParameter,
            _ => return None,
        })
    }
}

/// A header field that failed validation; its byte offset in the PDU header becomes the FEI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HeaderField {
    /// `type` (offset 0): unknown, or not allowed in this direction.
    Type,
    /// `flags` (offset 1): digest flags that disagree with what was negotiated.
    Flags,
    /// `hlen` (offset 2): not the fixed header length of the type.
    Hlen,
    /// `pdo` (offset 3): data offset not where the alignment rules put it.
    Pdo,
    /// `plen` (offset 4): total length inconsistent with the header.
    Plen,
    /// ICReq `hpda` (offset 10): above the maximum of 31.
    Hpda,
    /// `cccid` of H2CData/C2HData/R2T (offset 8): not the command the transfer belongs to.
    Cccid,
    /// `ttag` of H2CData/R2T (offset 10): no transfer with this tag is outstanding.
    Ttag,
    /// `datal` / `r2tl` (offset 16): zero or not matching `plen`.
    DataLength,
}

impl HeaderField {
    /// Byte offset of the field from the start of the PDU.
    pub const fn offset(self) -> u32 {
        match self {
            HeaderField::Type => 0,
            HeaderField::Flags => 1,
            HeaderField::Hlen => 2,
            HeaderField::Pdo => 3,
            HeaderField::Plen => 4,
            HeaderField::Cccid => 8,
            HeaderField::Hpda | HeaderField::Ttag => 10,
            HeaderField::DataLength => 16,
        }
    }
}

/// Why a valid PDU was out of sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SequenceError {
    /// The first PDU of a connection was not an ICReq (or ICResp on the host side).
    ExpectedInitialization(PduType),
    /// A second ICReq/ICResp on an initialized connection.
    RepeatedInitialization,
    /// More commands outstanding than the queue has slots for.
    QueueFull,
    /// A PDU type that has no place in the current state.
    UnexpectedPdu(PduType),
    /// A data, R2T or response PDU for a command id that is not outstanding (host side).
    UnknownCommand(u16),
}

/// A PDU that could not be accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum PduError {
    /// A header field is invalid.
    InvalidHeaderField {
        /// Which field.
        field: HeaderField,
    },
    /// A valid PDU arrived out of sequence.
    Sequence(SequenceError),
    /// The header digest does not match.
    HeaderDigest {
        /// CRC32C computed over the received header.
        expected: u32,
        /// Digest carried by the PDU.
        received: u32,
    },
    /// H2CData/C2HData outside the range that was requested.
    DataOutOfRange {
        /// Offset carried by the PDU.
        offset: u32,
        /// Length carried by the PDU.
        length: u32,
    },
    /// More data in one PDU than the negotiated limit.
    DataLimitExceeded {
        /// Data bytes in the PDU.
        length: u32,
        /// The limit in force.
        max: u32,
    },
    /// An ICReq/ICResp parameter we cannot honour.
    UnsupportedParameter {
        /// Byte offset of the parameter.
        offset: u32,
    },
    /// The data digest does not match. Not fatal: framing is intact, so the command that carried
    /// the data fails with Transient Transport Error and the connection lives on.
    DataDigest {
        /// CRC32C computed over the received data.
        expected: u32,
        /// Digest carried by the PDU.
        received: u32,
        /// The PDU whose data is suspect (so the receiver knows which command it belonged to).
        pdu: Box<Pdu>,
    },
}

impl PduError {
    /// Shorthand for an invalid header field.
    pub const fn field(field: HeaderField) -> Self {
        PduError::InvalidHeaderField { field }
    }

    /// True when the connection must be terminated.
    pub fn is_fatal(&self) -> bool {
        !matches!(self, PduError::DataDigest { .. })
    }

    /// The FES of the TermReq that reports this error (data digest errors are not reported with
    /// a TermReq; they map to the nearest code for completeness).
    pub fn fes(&self) -> Fes {
        match self {
            PduError::InvalidHeaderField { .. } => Fes::InvalidHeaderField,
            PduError::Sequence(_) => Fes::PduSequenceError,
            PduError::HeaderDigest { .. } => Fes::HeaderDigestError,
            PduError::DataOutOfRange { .. } => Fes::DataOutOfRange,
            PduError::DataLimitExceeded { .. } => Fes::DataLimitExceeded,
            PduError::UnsupportedParameter { .. } => Fes::UnsupportedParameter,
            PduError::DataDigest { .. } => Fes::PduSequenceError,
        }
    }

    /// The Fatal Error Information: the field offset where the spec defines one, else 0.
    pub fn fei(&self) -> u32 {
        match self {
            PduError::InvalidHeaderField { field } => field.offset(),
            PduError::UnsupportedParameter { offset } => *offset,
            _ => 0,
        }
    }
}

impl core::fmt::Display for PduError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PduError::InvalidHeaderField { field } => {
                write!(
                    f,
                    "invalid PDU header field {field:?} at offset {}",
                    field.offset()
                )
            }
            PduError::Sequence(e) => write!(f, "PDU sequence error: {e:?}"),
            PduError::HeaderDigest { expected, received } => {
                write!(
                    f,
                    "header digest {received:#010x}, expected {expected:#010x}"
                )
            }
            PduError::DataOutOfRange { offset, length } => {
                write!(
                    f,
                    "data transfer out of range: offset {offset} length {length}"
                )
            }
            PduError::DataLimitExceeded { length, max } => {
                write!(f, "{length} data bytes in one PDU, limit {max}")
            }
            PduError::UnsupportedParameter { offset } => {
                write!(f, "unsupported parameter at offset {offset}")
            }
            PduError::DataDigest {
                expected, received, ..
            } => write!(f, "data digest {received:#010x}, expected {expected:#010x}"),
        }
    }
}

impl std::error::Error for PduError {}
