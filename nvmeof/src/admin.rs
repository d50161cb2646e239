//! Admin command parsing (Linux `nvmet_parse_admin_cmd`): the opcodes the appliance's controller
//! serves, with their fields checked; anything else is Invalid Opcode with DNR.

use crate::sqe::Sqe;
use crate::status::{Status, StatusCode};

/// Admin opcodes.
pub mod opcode {
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0a;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// Size of every Identify data structure.
pub const IDENTIFY_LEN: u32 = 4096;

/// Identify CNS values served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identify {
    /// CNS 00h: Identify Namespace `nsid`.
    Namespace {
        /// Namespace id.
        nsid: u32,
    },
    /// CNS 01h: Identify Controller.
    Controller,
    /// CNS 02h: active namespace ids greater than `after`.
    ActiveNamespaces {
        /// Start after this namespace id.
        after: u32,
    },
    /// CNS 03h: namespace identification descriptors of `nsid` (NGUID, UUID, CSI).
    NamespaceDescriptors {
        /// Namespace id.
        nsid: u32,
    },
    /// CNS 05h, CSI 00h: the NVM command set's namespace structure of `nsid`.
    NvmNamespace {
        /// Namespace id.
        nsid: u32,
    },
    /// CNS 06h, CSI 00h: the NVM command set's controller structure (size limits of Verify,
    /// Write Zeroes, Write Uncorrectable and Dataset Management). Linux asks for it at connect.
    NvmController,
}

/// Command Set Identifier of the NVM command set (CDW11 bits 31:24 of Identify).
const CSI_NVM: u32 = 0;

/// A parsed admin command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminCommand {
    /// Identify.
    Identify(Identify),
    /// Get Log Page: `len` bytes of log `lid` from byte `offset`.
    GetLogPage {
        /// Log page identifier.
        lid: u8,
        /// Namespace id (0xffffffff: controller-wide).
        nsid: u32,
        /// Byte offset into the log.
        offset: u64,
        /// Bytes requested.
        len: u32,
        /// Retain Asynchronous Event (do not clear the event).
        rae: bool,
    },
    /// Set Features.
    SetFeatures {
        /// Feature identifier.
        fid: u8,
        /// Save across resets.
        save: bool,
        /// Command dword 11 (the value of most features).
        cdw11: u32,
    },
    /// Get Features.
    GetFeatures {
        /// Feature identifier.
        fid: u8,
        /// Select (current, default, saved, supported capabilities).
        sel: u8,
    },
    /// Asynchronous Event Request.
    AsyncEventRequest,
    /// Keep Alive.
    KeepAlive,
}

fn expect_len(sqe: &Sqe, len: u32) -> Result<(), Status> {
    if sqe.data_pointer().length() == len {
        Ok(())
    } else {
        Err(StatusCode::DataSglLengthInvalid.status())
    }
}

/// Parses an admin (qid 0) command that is not a Fabrics command.
pub fn parse_admin(sqe: &Sqe) -> Result<AdminCommand, Status> {
    match sqe.opcode() {
        opcode::IDENTIFY => {
            expect_len(sqe, IDENTIFY_LEN)?;
            let nsid = sqe.nsid();
            let id = match sqe.cdw(10) & 0xff {
                0x00 => Identify::Namespace { nsid },
                0x01 => Identify::Controller,
                0x02 if nsid < 0xffff_fffe => Identify::ActiveNamespaces { after: nsid },
                0x03 => Identify::NamespaceDescriptors { nsid },
                0x05 if sqe.cdw(11) >> 24 == CSI_NVM => Identify::NvmNamespace { nsid },
                0x06 if sqe.cdw(11) >> 24 == CSI_NVM => Identify::NvmController,
                _ => return Err(StatusCode::InvalidField.status()),
            };
            Ok(AdminCommand::Identify(id))
        }
        opcode::GET_LOG_PAGE => {
            let cdw10 = sqe.cdw(10);
            // NUMD is 0's based dwords: NUMDL in cdw10[31:16], NUMDU in cdw11[15:0].
            let numd = u64::from(cdw10 >> 16) | (u64::from(sqe.cdw(11) & 0xffff) << 16);
            let len =
                u32::try_from((numd + 1) * 4).map_err(|_| StatusCode::InvalidField.status())?;
            expect_len(sqe, len)?;
            let offset = u64::from(sqe.cdw(12)) | (u64::from(sqe.cdw(13)) << 32);
            if !offset.is_multiple_of(4) {
                return Err(StatusCode::InvalidField.status());
            }
            Ok(AdminCommand::GetLogPage {
                lid: u8::try_from(cdw10 & 0xff).unwrap_or(0),
                nsid: sqe.nsid(),
                offset,
                len,
                rae: cdw10 & (1 << 15) != 0,
            })
        }
        opcode::SET_FEATURES => Ok(AdminCommand::SetFeatures {
            fid: u8::try_from(sqe.cdw(10) & 0xff).unwrap_or(0),
            save: sqe.cdw(10) & (1 << 31) != 0,
            cdw11: sqe.cdw(11),
        }),
        opcode::GET_FEATURES => Ok(AdminCommand::GetFeatures {
            fid: u8::try_from(sqe.cdw(10) & 0xff).unwrap_or(0),
            sel: u8::try_from((sqe.cdw(10) >> 8) & 0x7).unwrap_or(0),
        }),
        opcode::ASYNC_EVENT_REQUEST => Ok(AdminCommand::AsyncEventRequest),
        opcode::KEEP_ALIVE => Ok(AdminCommand::KeepAlive),
        _ => Err(StatusCode::InvalidOpcode.status()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identify_cns_and_length() {
        let mut sqe = Sqe::default();
        sqe.set_opcode(opcode::IDENTIFY)
            .set_cdw(10, 1)
            .set_transport_data(4096);
        assert_eq!(
            parse_admin(&sqe),
            Ok(AdminCommand::Identify(Identify::Controller))
        );
        sqe.set_nsid(1).set_cdw(10, 3);
        assert_eq!(
            parse_admin(&sqe),
            Ok(AdminCommand::Identify(Identify::NamespaceDescriptors {
                nsid: 1
            }))
        );
        sqe.set_cdw(10, 6);
        assert_eq!(
            parse_admin(&sqe),
            Ok(AdminCommand::Identify(Identify::NvmController))
        );
        sqe.set_cdw(10, 5);
        assert_eq!(
            parse_admin(&sqe),
            Ok(AdminCommand::Identify(Identify::NvmNamespace { nsid: 1 }))
        );
        // Another command set (ZNS is 02h) is not served.
        sqe.set_cdw(11, 2 << 24);
        assert_eq!(parse_admin(&sqe), Err(StatusCode::InvalidField.status()));
        sqe.set_cdw(11, 0).set_cdw(10, 0x10);
        assert_eq!(parse_admin(&sqe), Err(StatusCode::InvalidField.status()));
        sqe.set_cdw(10, 0).set_transport_data(512);
        assert_eq!(
            parse_admin(&sqe),
            Err(StatusCode::DataSglLengthInvalid.status())
        );
    }

    #[test]
    fn get_log_page_numd_and_offset() {
        let mut sqe = Sqe::default();
        // Changed namespace list (04h), 4096 bytes: NUMD = 1023.
        sqe.set_opcode(opcode::GET_LOG_PAGE)
            .set_nsid(0xffff_ffff)
            .set_cdw(10, (1023 << 16) | 0x04)
            .set_cdw(12, 8)
            .set_transport_data(4096);
        assert_eq!(
            parse_admin(&sqe),
            Ok(AdminCommand::GetLogPage {
                lid: 4,
                nsid: 0xffff_ffff,
                offset: 8,
                len: 4096,
                rae: false
            })
        );
        sqe.set_cdw(12, 6);
        assert_eq!(parse_admin(&sqe), Err(StatusCode::InvalidField.status()));
    }

    #[test]
    fn features_keep_alive_and_unknown_opcodes() {
        let mut sqe = Sqe::default();
        sqe.set_opcode(opcode::SET_FEATURES)
            .set_cdw(10, 0x07)
            .set_cdw(11, 0x0003_0003);
        assert_eq!(
            parse_admin(&sqe),
            Ok(AdminCommand::SetFeatures {
                fid: 7,
                save: false,
                cdw11: 0x0003_0003
            })
        );
        sqe.set_opcode(opcode::KEEP_ALIVE);
        assert_eq!(parse_admin(&sqe), Ok(AdminCommand::KeepAlive));
        sqe.set_opcode(0x80);
        let e = parse_admin(&sqe).unwrap_err();
        assert_eq!(e, StatusCode::InvalidOpcode.status());
        assert!(e.dnr);
    }
}
