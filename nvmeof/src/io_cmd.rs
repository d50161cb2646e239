//! I/O command parsing (Linux `nvmet_bdev_parse_io_cmd`): Read, Write, Flush, Write Zeroes and
//! Dataset Management, with the data length checked against the LBA count. Execution is the
//! appliance's.

use crate::sqe::Sqe;
use crate::status::{Status, StatusCode};

/// I/O opcodes.
pub mod opcode {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u8 = 0x09;
}

/// Size of one Dataset Management range.
pub const DSM_RANGE_LEN: u32 = 16;
/// The most ranges one Dataset Management command carries.
pub const DSM_MAX_RANGES: u32 = 256;

/// A parsed I/O command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoCommand {
    /// Read `blocks` logical blocks from `slba`.
    Read {
        /// Namespace id.
        nsid: u32,
        /// Starting LBA.
        slba: u64,
        /// Number of blocks (already 1-based).
        blocks: u32,
    },
    /// Write `blocks` logical blocks at `slba`.
    Write {
        /// Namespace id.
        nsid: u32,
        /// Starting LBA.
        slba: u64,
        /// Number of blocks (already 1-based).
        blocks: u32,
        /// Force Unit Access: durable before completion.
        fua: bool,
    },
    /// Flush the volatile write cache (makes allocations durable).
    Flush {
        /// Namespace id (0xffffffff: all).
        nsid: u32,
    },
    /// Write zeroes to `blocks` logical blocks at `slba`.
    WriteZeroes {
        /// Namespace id.
        nsid: u32,
        /// Starting LBA.
        slba: u64,
        /// Number of blocks (already 1-based).
        blocks: u32,
        /// Deallocate the range if possible.
        deallocate: bool,
    },
    /// Dataset Management with `ranges` 16-byte ranges in the data.
    DatasetManagement {
        /// Namespace id.
        nsid: u32,
        /// Number of ranges (already 1-based).
        ranges: u32,
        /// Attribute Deallocate.
        deallocate: bool,
    },
}

fn slba(sqe: &Sqe) -> u64 {
    u64::from(sqe.cdw(10)) | (u64::from(sqe.cdw(11)) << 32)
}

fn blocks(sqe: &Sqe) -> u32 {
    (sqe.cdw(12) & 0xffff) + 1
}

/// Parses an I/O command for a namespace whose logical block is `1 << lba_shift` bytes; the data
/// length must match the block count (Linux `nvmet_check_transfer_len`).
pub fn parse_io(sqe: &Sqe, lba_shift: u8) -> Result<IoCommand, Status> {
    let nsid = sqe.nsid();
    let len = u64::from(sqe.data_pointer().length());
    let data_len = |blocks: u32| u64::from(blocks) << lba_shift.min(31);
    let check = |want: u64| {
        if len == want {
            Ok(())
        } else {
            Err(StatusCode::DataSglLengthInvalid.status())
        }
    };
    match sqe.opcode() {
        opcode::READ => {
            let blocks = blocks(sqe);
            check(data_len(blocks))?;
            Ok(IoCommand::Read {
                nsid,
                slba: slba(sqe),
                blocks,
            })
        }
        opcode::WRITE => {
            let blocks = blocks(sqe);
            check(data_len(blocks))?;
            Ok(IoCommand::Write {
                nsid,
                slba: slba(sqe),
                blocks,
                fua: sqe.cdw(12) & (1 << 30) != 0,
            })
        }
        opcode::FLUSH => {
            check(0)?;
            Ok(IoCommand::Flush { nsid })
        }
        opcode::WRITE_ZEROES => {
            check(0)?;
            Ok(IoCommand::WriteZeroes {
                nsid,
                slba: slba(sqe),
                blocks: blocks(sqe),
                deallocate: sqe.cdw(12) & (1 << 25) != 0,
            })
        }
        opcode::DATASET_MANAGEMENT => {
            let ranges = (sqe.cdw(10) & 0xff) + 1;
            // Linux hosts always transfer a buffer for the maximum 256 ranges (some devices DMA
            // that much whatever NR says), so the data may be longer than NR ranges, never
            // shorter and never beyond 256 ranges (Linux nvmet checks "less than or equal" too).
            let needed = u64::from(ranges * DSM_RANGE_LEN);
            if len < needed || len > u64::from(DSM_MAX_RANGES * DSM_RANGE_LEN) {
                return Err(StatusCode::DataSglLengthInvalid.status());
            }
            Ok(IoCommand::DatasetManagement {
                nsid,
                ranges,
                deallocate: sqe.cdw(11) & (1 << 2) != 0,
            })
        }
        _ => Err(StatusCode::InvalidOpcode.status()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_lengths_follow_the_block_count() {
        let mut sqe = Sqe::default();
        sqe.set_opcode(opcode::WRITE)
            .set_nsid(1)
            .set_cdw(10, 8)
            .set_cdw(12, 7 | (1 << 30))
            .set_transport_data(8 * 512);
        assert_eq!(
            parse_io(&sqe, 9),
            Ok(IoCommand::Write {
                nsid: 1,
                slba: 8,
                blocks: 8,
                fua: true
            })
        );
        assert_eq!(
            parse_io(&sqe, 12),
            Err(StatusCode::DataSglLengthInvalid.status())
        );
        sqe.set_opcode(opcode::READ)
            .set_cdw(12, 0)
            .set_transport_data(4096);
        assert_eq!(
            parse_io(&sqe, 12),
            Ok(IoCommand::Read {
                nsid: 1,
                slba: 8,
                blocks: 1
            })
        );
    }

    #[test]
    fn flush_zeroes_dsm_and_unknown() {
        let mut sqe = Sqe::default();
        sqe.set_opcode(opcode::FLUSH)
            .set_nsid(0xffff_ffff)
            .set_transport_data(0);
        assert_eq!(
            parse_io(&sqe, 9),
            Ok(IoCommand::Flush { nsid: 0xffff_ffff })
        );
        sqe.set_opcode(opcode::DATASET_MANAGEMENT)
            .set_nsid(1)
            .set_cdw(10, 1)
            .set_cdw(11, 4)
            .set_transport_data(32);
        assert_eq!(
            parse_io(&sqe, 9),
            Ok(IoCommand::DatasetManagement {
                nsid: 1,
                ranges: 2,
                deallocate: true
            })
        );
        // Linux sends a 256-range buffer whatever NR says: accepted; shorter or longer is not.
        sqe.set_transport_data(4096);
        assert!(parse_io(&sqe, 9).is_ok());
        for bad in [16, 4112] {
            sqe.set_transport_data(bad);
            assert_eq!(
                parse_io(&sqe, 9),
                Err(StatusCode::DataSglLengthInvalid.status()),
                "{bad}"
            );
        }
        sqe.set_opcode(opcode::WRITE_ZEROES)
            .set_cdw(12, 1 << 25)
            .set_transport_data(0);
        assert!(matches!(
            parse_io(&sqe, 9),
            Ok(IoCommand::WriteZeroes {
                deallocate: true,
                blocks: 1,
                ..
            })
        ));
        sqe.set_opcode(0x05);
        assert_eq!(parse_io(&sqe, 9), Err(StatusCode::InvalidOpcode.status()));
    }
}
