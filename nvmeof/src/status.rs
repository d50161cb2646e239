//! NVMe completion status: the 15-bit status field of a CQE (SC, SCT, CRD, More, DNR).
//!
//! Every status the target produces comes from [`StatusCode::status`], the one place that decides
//! the status code type, the code and whether "Do Not Retry" is set (Linux keeps this mapping in
//! `blk_to_nvme_status` and the `NVME_SC_*` table of `include/linux/nvme.h`).

/// Status Code Type (bits 11:9 of the status field).
pub mod sct {
    /// Generic command status.
    pub const GENERIC: u8 = 0;
    /// Command specific status.
    pub const COMMAND_SPECIFIC: u8 = 1;
    /// Media and data integrity errors.
    pub const MEDIA: u8 = 2;
    /// Path related status.
    pub const PATH: u8 = 3;
}

/// A decoded completion status, without the phase tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Status {
    /// Status Code Type (3 bits).
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// More information is available in the Error Information log page.
    pub more: bool,
    /// Do Not Retry: the same command will fail again.
    pub dnr: bool,
}

impl Status {
    /// Successful completion.
    pub const SUCCESS: Status = Status {
        sct: sct::GENERIC,
        sc: 0,
        more: false,
        dnr: false,
    };

    /// True for a successful completion.
    pub const fn is_success(self) -> bool {
        self.sct == sct::GENERIC && self.sc == 0
    }

    /// The 16-bit CQE status word (bit 0 is the phase tag, always 0 on fabrics).
    pub const fn to_cqe_word(self) -> u16 {
        let field = (self.sc as u16)
            | (((self.sct & 0x7) as u16) << 8)
            | if self.more { 1 << 13 } else { 0 }
            | if self.dnr { 1 << 14 } else { 0 };
        field << 1
    }

    /// Decodes a 16-bit CQE status word (the phase tag and CRD are ignored).
    pub const fn from_cqe_word(word: u16) -> Status {
        let field = word >> 1;
        Status {
            sct: ((field >> 8) & 0x7) as u8,
            sc: (field & 0xff) as u8,
            more: field & (1 << 13) != 0,
            dnr: field & (1 << 14) != 0,
        }
    }
}

/// The statuses the transport and the command parsers return, by meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StatusCode {
    /// Successful completion.
    Success,
    /// The opcode is not supported on this queue.
    InvalidOpcode,
    /// A field of the command is invalid.
    InvalidField,
    /// The command id is already in use on this queue.
    CommandIdConflict,
    /// The data could not be transferred (retryable).
    DataTransferError,
    /// An internal error of the controller (retryable).
    InternalError,
    /// The command was aborted because its queue is being deleted.
    AbortSqDeleted,
    /// The namespace id is not valid or not active.
    InvalidNamespace,
    /// The command is not allowed in the current controller state.
    CommandSequenceError,
    /// The SGL data length does not match what the command needs.
    DataSglLengthInvalid,
    /// The SGL descriptor type is not supported by this transport.
    SglDescriptorTypeInvalid,
    /// The in-capsule offset of an SGL is out of range.
    SglOffsetInvalid,
    /// A transport error the host may retry (for example a data digest error).
    TransientTransportError,
    /// The LBA range exceeds the namespace size.
    LbaOutOfRange,
    /// Fabrics Connect: the record format is not one we speak.
    ConnectIncompatibleFormat,
    /// Fabrics Connect: a parameter is invalid (the CQE result says which).
    ConnectInvalidParameters,
    /// Fabrics Connect: the controller is busy (no controller id free, not ready yet); retryable.
    ConnectControllerBusy,
    /// Fabrics Connect: the host is not allowed to reach this subsystem.
    ConnectInvalidHost,
    /// Invalid queue identifier (Create I/O queue, Connect).
    InvalidQueueIdentifier,
    /// The queue must complete DH-HMAC-CHAP authentication before this command
    /// (`NVME_SC_AUTH_REQUIRED`).
    AuthenticationRequired,
    /// Media: write fault.
    WriteFault,
    /// Media: unrecovered read error.
    UnrecoveredReadError,
    /// Media: access denied.
    AccessDenied,
}

impl StatusCode {
    /// The one mapping from meaning to SCT, SC and DNR.
    pub const fn status(self) -> Status {
        let (sct, sc, dnr) = match self {
            StatusCode::Success => (sct::GENERIC, 0x00, false),
            StatusCode::InvalidOpcode => (sct::GENERIC, 0x01, true),
            StatusCode::InvalidField => (sct::GENERIC, 0x02, true),
            StatusCode::CommandIdConflict => (sct::GENERIC, 0x03, true),
            StatusCode::DataTransferError => (sct::GENERIC, 0x04, false),
            StatusCode::InternalError => (sct::GENERIC, 0x06, false),
            StatusCode::AbortSqDeleted => (sct::GENERIC, 0x08, false),
            StatusCode::InvalidNamespace => (sct::GENERIC, 0x0b, true),
            StatusCode::CommandSequenceError => (sct::GENERIC, 0x0c, true),
            StatusCode::DataSglLengthInvalid => (sct::GENERIC, 0x0f, true),
            StatusCode::SglDescriptorTypeInvalid => (sct::GENERIC, 0x11, true),
            StatusCode::SglOffsetInvalid => (sct::GENERIC, 0x16, true),
            StatusCode::TransientTransportError => (sct::GENERIC, 0x22, false),
            StatusCode::LbaOutOfRange => (sct::GENERIC, 0x80, true),
            StatusCode::InvalidQueueIdentifier => (sct::COMMAND_SPECIFIC, 0x01, true),
            StatusCode::ConnectIncompatibleFormat => (sct::COMMAND_SPECIFIC, 0x80, true),
            StatusCode::ConnectInvalidParameters => (sct::COMMAND_SPECIFIC, 0x82, true),
            // Busy is transient (no free controller id, pool still opening): the host retries.
            StatusCode::ConnectControllerBusy => (sct::COMMAND_SPECIFIC, 0x81, false),
            StatusCode::ConnectInvalidHost => (sct::COMMAND_SPECIFIC, 0x84, true),
            StatusCode::AuthenticationRequired => (sct::COMMAND_SPECIFIC, 0x91, true),
            StatusCode::WriteFault => (sct::MEDIA, 0x80, false),
            StatusCode::UnrecoveredReadError => (sct::MEDIA, 0x81, false),
            StatusCode::AccessDenied => (sct::MEDIA, 0x86, true),
        };
        Status {
            sct,
            sc,
            more: false,
            dnr,
        }
    }
}

impl From<StatusCode> for Status {
    fn from(code: StatusCode) -> Self {
        code.status()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cqe_word_matches_linux_encoding() {
        // Linux: NVME_SC_INVALID_FIELD | NVME_SC_DNR = 0x4002, shifted left by one on the wire.
        assert_eq!(StatusCode::InvalidField.status().to_cqe_word(), 0x4002 << 1);
        // NVME_SC_CONNECT_INVALID_PARAM = 0x182 with DNR.
        assert_eq!(
            StatusCode::ConnectInvalidParameters.status().to_cqe_word(),
            (0x182 | 0x4000) << 1
        );
        assert_eq!(Status::SUCCESS.to_cqe_word(), 0);
    }

    #[test]
    fn cqe_word_round_trips() {
        for code in [
            StatusCode::InvalidOpcode,
            StatusCode::TransientTransportError,
            StatusCode::AccessDenied,
            StatusCode::ConnectInvalidHost,
            StatusCode::AuthenticationRequired,
        ] {
            let s = code.status();
            assert_eq!(Status::from_cqe_word(s.to_cqe_word()), s);
        }
        let more = Status {
            more: true,
            ..StatusCode::WriteFault.status()
        };
        assert_eq!(Status::from_cqe_word(more.to_cqe_word()), more);
    }

    #[test]
    fn retryable_codes_have_no_dnr() {
        assert!(!StatusCode::TransientTransportError.status().dnr);
        assert!(!StatusCode::InternalError.status().dnr);
        assert!(!StatusCode::ConnectControllerBusy.status().dnr);
        assert!(StatusCode::InvalidOpcode.status().dnr);
    }
}
