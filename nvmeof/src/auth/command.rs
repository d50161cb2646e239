//! The commands around authentication: the Fabrics Authentication Send / Receive SQEs
//! (`struct nvmf_auth_send_command` / `nvmf_auth_receive_command`), the Connect response bits
//! that ask a host to authenticate (`NVME_CONNECT_AUTHREQ_*`, Linux `nvmet_connect_result`),
//! and which commands a queue takes before it has authenticated (Linux
//! `nvmet_check_auth_status`).
//!
//! SQE layout (both commands): fctype @4, SGL @24, spsp0 @41, spsp1 @42, secp @43, tl (Send) or
//! al (Receive) @44, little-endian.

use crate::fabrics_cmd::fctype;
use crate::sqe::{Sqe, FABRICS_OPCODE};
use crate::status::{Status, StatusCode};

/// Security protocol of DH-HMAC-CHAP (`NVME_AUTH_DHCHAP_PROTOCOL_IDENTIFIER`).
pub const SECP_DHCHAP: u8 = 0xe9;
/// SPSP0 and SPSP1 the target takes (Linux checks both against 01h).
pub const SPSP: u8 = 0x01;

/// Connect response dword 0, bit 17: Authentication Transaction Required.
pub const CONNECT_AUTHREQ_ATR: u32 = 1 << 17;
/// Connect response dword 0, bit 18: authentication and secure channel required (secure channel
/// concatenation; edgevol never sets it).
pub const CONNECT_AUTHREQ_ASCR: u32 = 1 << 18;

/// The Connect completion result (CQE dword 0): the controller id, with ATR when the queue must
/// authenticate before it is used (Linux `nvmet_connect_result`). For the admin queue and for
/// every I/O queue of a controller that authenticates.
pub const fn connect_result(cntlid: u16, authenticate: bool) -> u64 {
    let atr = if authenticate { CONNECT_AUTHREQ_ATR } else { 0 };
    (cntlid as u64) | atr as u64
}

/// The status of a command refused because its queue has not authenticated yet:
/// Authentication Required (SCT 1h, SC 91h, `NVME_SC_AUTH_REQUIRED` 0x191), with DNR.
pub const fn authentication_required() -> Status {
    StatusCode::AuthenticationRequired.status()
}

/// True for AUTH_Send and AUTH_Receive.
pub fn is_auth_command(sqe: &Sqe) -> bool {
    sqe.is_fabrics() && matches!(sqe.fctype(), fctype::AUTH_SEND | fctype::AUTH_RECEIVE)
}

/// Whether a command may run on a queue that must authenticate and has not yet: every Fabrics
/// command (Connect, Property Get/Set, AUTH_Send/Receive, Disconnect) passes, as in Linux, where
/// `nvmet_parse_fabrics_admin_cmd` / `nvmet_parse_fabrics_io_cmd` run before the
/// `nvmet_check_auth_status` of admin and I/O commands. Any other command is answered with
/// [`authentication_required`].
pub fn allowed_before_authentication(sqe: &Sqe) -> bool {
    sqe.opcode() == FABRICS_OPCODE
}

/// Which of the two commands, with its transfer length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthCommand {
    /// Authentication Send: the host's message, `tl` bytes of host-to-controller data.
    Send {
        /// Transfer length.
        tl: u32,
    },
    /// Authentication Receive: the controller's message, `al` bytes of controller-to-host
    /// data.
    Receive {
        /// Allocation length.
        al: u32,
    },
}

/// SQE offsets, for the error location of an Invalid Field completion.
pub mod offset {
    /// spsp0.
    pub const SPSP0: u16 = 41;
    /// spsp1.
    pub const SPSP1: u16 = 42;
    /// secp.
    pub const SECP: u16 = 43;
    /// tl / al.
    pub const LENGTH: u16 = 44;
}

impl AuthCommand {
    /// Parses an AUTH_Send or AUTH_Receive SQE the way `nvmet_execute_auth_send` /
    /// `nvmet_execute_auth_receive` check it: SECP E9h, SPSP0 and SPSP1 01h, a non-zero length
    /// (else Invalid Field, DNR), and an SGL that moves exactly that many bytes (else Data SGL
    /// Length Invalid, DNR). Any other command: Invalid Opcode.
    pub fn parse(sqe: &Sqe) -> Result<AuthCommand, Status> {
        if !is_auth_command(sqe) {
            return Err(StatusCode::InvalidOpcode.status());
        }
        let b = &sqe.0;
        let len = u32::from_le_bytes([b[44], b[45], b[46], b[47]]);
        if b[43] != SECP_DHCHAP || b[41] != SPSP || b[42] != SPSP || len == 0 {
            return Err(StatusCode::InvalidField.status());
        }
        if sqe.data_pointer().length() != len {
            return Err(StatusCode::DataSglLengthInvalid.status());
        }
        Ok(if sqe.fctype() == fctype::AUTH_SEND {
            AuthCommand::Send { tl: len }
        } else {
            AuthCommand::Receive { al: len }
        })
    }

    /// Builds the SQE (for initiators): in-capsule data for a Send, a transport SGL for a
    /// Receive.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut sqe = Sqe::default();
        sqe.set_opcode(FABRICS_OPCODE).set_cid(cid);
        let len = match *self {
            AuthCommand::Send { tl } => {
                sqe.set_fctype(fctype::AUTH_SEND).set_in_capsule(tl);
                tl
            }
            AuthCommand::Receive { al } => {
                sqe.set_fctype(fctype::AUTH_RECEIVE).set_transport_data(al);
                al
            }
        };
        sqe.0[41] = SPSP;
        sqe.0[42] = SPSP;
        sqe.0[43] = SECP_DHCHAP;
        sqe.0[44..48].copy_from_slice(&len.to_le_bytes());
        sqe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_round_trips_at_linux_offsets() {
        let send = AuthCommand::Send { tl: 72 };
        let sqe = send.to_sqe(4);
        assert_eq!((sqe.opcode(), sqe.fctype(), sqe.cid()), (0x7f, 0x05, 4));
        assert_eq!(&sqe.0[40..48], &[0, 1, 1, 0xe9, 72, 0, 0, 0]);
        assert_eq!(AuthCommand::parse(&sqe), Ok(send));
        let recv = AuthCommand::Receive { al: 4096 };
        let sqe = recv.to_sqe(5);
        assert_eq!(sqe.fctype(), 0x06);
        assert_eq!(&sqe.0[44..48], &[0, 0x10, 0, 0]);
        assert_eq!(AuthCommand::parse(&sqe), Ok(recv));
    }

    #[test]
    fn invalid_fields_are_refused_as_linux_does() {
        let good = AuthCommand::Send { tl: 8 }.to_sqe(1);
        for (at, v) in [(43usize, 0xeau8), (41, 0), (42, 2)] {
            let mut sqe = good;
            sqe.0[at] = v;
            assert_eq!(
                AuthCommand::parse(&sqe),
                Err(StatusCode::InvalidField.status())
            );
        }
        let zero = AuthCommand::Receive { al: 0 }.to_sqe(1);
        assert_eq!(
            AuthCommand::parse(&zero),
            Err(StatusCode::InvalidField.status())
        );
        let mut short = good;
        short.set_in_capsule(4);
        assert_eq!(
            AuthCommand::parse(&short),
            Err(StatusCode::DataSglLengthInvalid.status())
        );
        let mut other = good;
        other.set_fctype(fctype::PROPERTY_GET);
        assert_eq!(
            AuthCommand::parse(&other),
            Err(StatusCode::InvalidOpcode.status())
        );
        assert!(!is_auth_command(&other));
    }

    #[test]
    fn connect_result_and_gate() {
        assert_eq!(connect_result(7, false), 7);
        assert_eq!(connect_result(7, true), 0x2_0007);
        // NVME_SC_AUTH_REQUIRED | NVME_STATUS_DNR on the wire.
        assert_eq!(
            authentication_required().to_cqe_word(),
            (0x191 | 0x4000) << 1
        );
        assert!(allowed_before_authentication(&good_send()));
        let mut read = Sqe::default();
        read.set_opcode(0x02);
        assert!(!allowed_before_authentication(&read));
    }

    fn good_send() -> Sqe {
        AuthCommand::Send { tl: 8 }.to_sqe(1)
    }
}
