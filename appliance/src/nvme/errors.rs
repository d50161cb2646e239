//! The Error Information log (Log Identifier 01h), as Linux `nvmet_set_error` and
//! `nvmet_execute_get_log_page_error` keep it: each controller records every command that
//! completes with an error status, on any of its queues, in a ring of its [`SLOTS`] most recent
//! entries; the log page lists them newest first, unused slots zero. Pure state and encoding: the
//! transport records at its completion point, the admin queue reads.

use std::collections::VecDeque;

use edgevol_nvmeof::io_cmd::opcode as io_op;
use edgevol_nvmeof::sqe::Sqe;
use edgevol_nvmeof::status::{Status, StatusCode};

use super::status::TargetStatus;

/// Entries kept per controller (`NVMET_ERROR_LOG_SLOTS`); Identify Controller ELPE is this - 1.
pub const SLOTS: usize = 128;
/// One Error Information Log Entry (`struct nvme_error_slot`).
pub const ENTRY_LEN: usize = 64;
/// The whole log page: every slot.
pub const PAGE_LEN: usize = SLOTS * ENTRY_LEN;
/// Parameter Error Location when no single SQE field is at fault.
pub const NO_LOCATION: u16 = 0xffff;

// ELPE is one byte, 0's based.
const _: () = assert!(SLOTS >= 1 && SLOTS <= 256);

/// The SQE field a failed command's status blames (Parameter Error Location: byte in bits 7:0,
/// bit in bits 10:8), where the status itself names one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// Opcode (byte 0).
    Opcode,
    /// Fabrics command type (byte 4).
    Fctype,
    /// Namespace identifier (bytes 4..8).
    Nsid,
    /// Data pointer: the SGL descriptor (bytes 24..40).
    DataPointer,
    /// Starting LBA of Read, Write and Write Zeroes (cdw10..11, bytes 40..48).
    Slba,
    /// Number of logical blocks (cdw12 bits 15:0, bytes 48..50).
    Length,
    /// Set Features Save (cdw10 bit 31: byte 43, bit 7).
    Save,
}

impl Field {
    /// The Parameter Error Location value.
    pub const fn location(self) -> u16 {
        match self {
            Field::Opcode => 0,
            Field::Fctype | Field::Nsid => 4,
            Field::DataPointer => 24,
            Field::Slba => 40,
            Field::Length => 48,
            Field::Save => 43 | (7 << 8),
        }
    }
}

/// What the log needs of a command, taken from its SQE when it arrives (the SQE itself is gone
/// by the time an I/O completes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// Submission queue it came on (0: admin).
    pub sqid: u16,
    /// Command identifier.
    pub cid: u16,
    /// A Fabrics command (its byte 4 is the fctype, not an nsid).
    pub fabrics: bool,
    /// Namespace identifier from the SQE (0 on Fabrics commands).
    pub nsid: u32,
    /// Starting LBA of a Read, Write or Write Zeroes.
    pub slba: Option<u64>,
}

impl Origin {
    /// The origin of `sqe`, received on submission queue `sqid`.
    pub fn new(sqid: u16, sqe: &Sqe) -> Origin {
        let fabrics = sqe.is_fabrics();
        // Admin opcodes reuse the I/O numbers (02h is Get Log Page there): only I/O queues
        // carry an SLBA.
        let addressed = sqid != 0
            && !fabrics
            && matches!(
                sqe.opcode(),
                io_op::READ | io_op::WRITE | io_op::WRITE_ZEROES
            );
        Origin {
            sqid,
            cid: sqe.cid(),
            fabrics,
            nsid: if fabrics { 0 } else { sqe.nsid() },
            slba: addressed.then(|| u64::from(sqe.cdw(10)) | (u64::from(sqe.cdw(11)) << 32)),
        }
    }

    /// The field `status` blames, for the statuses whose definition names one (Linux sets
    /// `error_loc` for the same ones); `None` for the rest, such as Invalid Field, which the
    /// parser reports without saying which field.
    pub fn blamed(&self, status: Status) -> Option<Field> {
        let is = |s: Status| (s.sct, s.sc) == (status.sct, status.sc);
        if is(StatusCode::InvalidOpcode.status()) {
            Some(if self.fabrics {
                Field::Fctype
            } else {
                Field::Opcode
            })
        } else if is(StatusCode::InvalidNamespace.status())
            || is(TargetStatus::NamespaceWriteProtected.status())
        {
            Some(Field::Nsid)
        } else if is(StatusCode::DataSglLengthInvalid.status())
            || is(StatusCode::SglDescriptorTypeInvalid.status())
            || is(StatusCode::SglOffsetInvalid.status())
        {
            Some(Field::DataPointer)
        } else if is(StatusCode::LbaOutOfRange.status()) {
            self.slba.map(|_| Field::Slba)
        } else if is(TargetStatus::CapacityExceeded.status()) {
            self.slba.map(|_| Field::Length)
        } else if is(TargetStatus::FeatureNotSaveable.status()) && self.sqid == 0 {
            Some(Field::Save)
        } else {
            None
        }
    }
}

/// One Error Information Log Entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorEntry {
    /// Error Count: unique per entry, from 1.
    pub count: u64,
    /// Submission Queue ID.
    pub sqid: u16,
    /// Command ID.
    pub cid: u16,
    /// The completion status (without the More bit, as in the CQE before it is set).
    pub status: Status,
    /// Parameter Error Location ([`NO_LOCATION`] if none).
    pub location: u16,
    /// First LBA of the failed command (0 if it has none).
    pub lba: u64,
    /// Namespace.
    pub nsid: u32,
}

impl ErrorEntry {
    /// The 64-byte entry (`struct nvme_error_slot`): Vendor Specific Information Available,
    /// Transport Type (the errors recorded are command errors, not transport ones), Command
    /// Specific Information and Transport Type Specific Information stay 0.
    pub fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut b = [0u8; ENTRY_LEN];
        b[0..8].copy_from_slice(&self.count.to_le_bytes());
        b[8..10].copy_from_slice(&self.sqid.to_le_bytes());
        b[10..12].copy_from_slice(&self.cid.to_le_bytes());
        // Status Field: the status in bits 15:1, phase tag (bit 0) 0, as in the CQE word.
        b[12..14].copy_from_slice(&self.status.to_cqe_word().to_le_bytes());
        b[14..16].copy_from_slice(&self.location.to_le_bytes());
        b[16..24].copy_from_slice(&self.lba.to_le_bytes());
        b[24..28].copy_from_slice(&self.nsid.to_le_bytes());
        b
    }
}

/// A controller's error log: the running count and the most recent entries.
#[derive(Debug, Default)]
pub struct ErrorLog {
    count: u64,
    /// Newest at the front; at most [`SLOTS`].
    recent: VecDeque<ErrorEntry>,
}

impl ErrorLog {
    /// Records a command of `origin` that completed with `status`; returns its entry.
    pub fn record(&mut self, origin: &Origin, status: Status) -> ErrorEntry {
        // Error Count starts at 1 and rolls over to 1, never 0 (0 marks an unused entry).
        self.count = self.count.checked_add(1).unwrap_or(1);
        let entry = ErrorEntry {
            count: self.count,
            sqid: origin.sqid,
            cid: origin.cid,
            status: Status {
                more: false,
                ..status
            },
            location: origin.blamed(status).map_or(NO_LOCATION, Field::location),
            lba: origin.slba.unwrap_or(0),
            nsid: origin.nsid,
        };
        if self.recent.len() == SLOTS {
            self.recent.pop_back();
        }
        self.recent.push_front(entry);
        entry
    }

    /// Errors recorded over the controller's life (SMART "Number of Error Information Log
    /// Entries").
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The log page: every slot, newest entry first, unused slots zero.
    pub fn page(&self) -> Vec<u8> {
        let mut page = vec![0u8; PAGE_LEN];
        for (slot, entry) in page.chunks_exact_mut(ENTRY_LEN).zip(&self.recent) {
            slot.copy_from_slice(&entry.encode());
        }
        page
    }
}

#[cfg(test)]
mod tests {
    use edgevol_nvmeof::admin::opcode as admin_op;
    use edgevol_nvmeof::fabrics_cmd::{PropertyGet, PropertySize};

    use super::*;

    fn read_sqe(cid: u16, slba: u64) -> Sqe {
        let mut sqe = Sqe::default();
        sqe.set_opcode(io_op::READ)
            .set_cid(cid)
            .set_nsid(1)
            .set_cdw(10, u32::try_from(slba & 0xffff_ffff).unwrap())
            .set_cdw(11, u32::try_from(slba >> 32).unwrap());
        sqe
    }

    #[test]
    fn entry_fields_at_nvme_error_slot_offsets() {
        let status = StatusCode::LbaOutOfRange.status();
        let b = ErrorEntry {
            count: 0x0102_0304_0506_0708,
            sqid: 3,
            cid: 0xbeef,
            status,
            location: Field::Slba.location(),
            lba: 0x1_0000_0002,
            nsid: 1,
        }
        .encode();
        assert_eq!(&b[0..8], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&b[8..10], &[3, 0]);
        assert_eq!(&b[10..12], &[0xef, 0xbe]);
        // SC 80h, SCT 0, DNR: field 0x4080, shifted past the phase bit.
        assert_eq!(u16::from_le_bytes([b[12], b[13]]), 0x4080 << 1);
        assert_eq!(&b[14..16], &[40, 0]);
        assert_eq!(&b[16..24], &0x1_0000_0002u64.to_le_bytes());
        assert_eq!(&b[24..28], &[1, 0, 0, 0]);
        assert!(b[28..].iter().all(|&x| x == 0), "VS, TRTYPE, CS, TTSI zero");
    }

    #[test]
    fn locations_encode_byte_and_bit() {
        assert_eq!(Field::Save.location(), 0x072b);
        assert_eq!(Field::Opcode.location(), 0);
        assert_eq!(Field::Length.location(), 48);
    }

    #[test]
    fn origin_takes_the_slba_of_io_reads_and_writes_only() {
        let o = Origin::new(2, &read_sqe(9, 1 << 33));
        assert_eq!((o.sqid, o.cid, o.nsid, o.slba), (2, 9, 1, Some(1 << 33)));
        // 02h on the admin queue is Get Log Page.
        let mut log = read_sqe(1, 5);
        log.set_opcode(admin_op::GET_LOG_PAGE);
        assert_eq!(Origin::new(0, &log).slba, None);
        let mut flush = read_sqe(1, 5);
        flush.set_opcode(io_op::FLUSH);
        assert_eq!(Origin::new(1, &flush).slba, None);
        // A Fabrics command's byte 4 is its fctype.
        let get = PropertyGet {
            size: PropertySize::Four,
            offset: 0x1c,
        }
        .to_sqe(4);
        let o = Origin::new(0, &get);
        assert!(o.fabrics);
        assert_eq!(o.nsid, 0);
        assert_eq!(
            o.blamed(StatusCode::InvalidOpcode.status()),
            Some(Field::Fctype)
        );
    }

    #[test]
    fn statuses_blame_the_field_they_name() {
        let read = Origin::new(1, &read_sqe(1, 7));
        let blamed = |o: &Origin, s: Status| o.blamed(s).map_or(NO_LOCATION, Field::location);
        assert_eq!(blamed(&read, StatusCode::LbaOutOfRange.status()), 40);
        assert_eq!(blamed(&read, StatusCode::InvalidOpcode.status()), 0);
        assert_eq!(blamed(&read, StatusCode::InvalidNamespace.status()), 4);
        assert_eq!(
            blamed(&read, TargetStatus::NamespaceWriteProtected.status()),
            4
        );
        assert_eq!(blamed(&read, StatusCode::DataSglLengthInvalid.status()), 24);
        assert_eq!(blamed(&read, TargetStatus::CapacityExceeded.status()), 48);
        assert_eq!(
            blamed(&read, StatusCode::InvalidField.status()),
            NO_LOCATION
        );
        assert_eq!(
            blamed(&read, StatusCode::InternalError.status()),
            NO_LOCATION
        );
        let mut set = Sqe::default();
        set.set_opcode(admin_op::SET_FEATURES);
        let set = Origin::new(0, &set);
        assert_eq!(
            blamed(&set, TargetStatus::FeatureNotSaveable.status()),
            0x072b
        );
        // Same SCT/SC on an I/O queue is another command's status: no guess.
        assert_eq!(
            blamed(&read, TargetStatus::FeatureNotSaveable.status()),
            NO_LOCATION
        );
    }

    #[test]
    fn ring_keeps_the_newest_first_and_counts_from_one() {
        let mut log = ErrorLog::default();
        assert_eq!(log.page(), vec![0u8; PAGE_LEN], "no errors: all zero");
        let status = StatusCode::LbaOutOfRange.status();
        for i in 0..(SLOTS as u64 + 5) {
            let e = log.record(
                &Origin::new(1, &read_sqe(u16::try_from(i).unwrap(), i)),
                status,
            );
            assert_eq!(e.count, i + 1);
        }
        assert_eq!(log.count(), SLOTS as u64 + 5);
        let page = log.page();
        for (i, slot) in page.chunks_exact(ENTRY_LEN).enumerate() {
            let count = u64::from_le_bytes(slot[0..8].try_into().unwrap());
            let lba = u64::from_le_bytes(slot[16..24].try_into().unwrap());
            assert_eq!(count, SLOTS as u64 + 5 - i as u64);
            assert_eq!(lba, count - 1);
        }
    }

    #[test]
    fn entries_drop_more_and_the_count_rolls_over_to_one() {
        let mut log = ErrorLog {
            count: u64::MAX - 1,
            ..ErrorLog::default()
        };
        let origin = Origin::new(0, &Sqe::default());
        let more = Status {
            more: true,
            ..StatusCode::InvalidField.status()
        };
        let e = log.record(&origin, more);
        assert_eq!(e.count, u64::MAX);
        assert!(!e.status.more);
        assert_eq!(e.location, NO_LOCATION);
        assert_eq!(log.record(&origin, more).count, 1);
        let page = log.page();
        assert_eq!(&page[0..8], &1u64.to_le_bytes(), "newest first");
        assert_eq!(&page[64..72], &u64::MAX.to_le_bytes());
    }
}
