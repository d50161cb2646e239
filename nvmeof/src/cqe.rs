//! The 16-byte completion queue entry carried by a CapsuleResp PDU.
//!
//! Layout from `struct nvme_completion`: command-specific result (u64) at 0, SQ head at 8, SQ id
//! at 10, command id at 12, status word (phase tag in bit 0) at 14. Little-endian.

use crate::status::Status;

/// Size of a CQE on the wire.
pub const CQE_LEN: usize = 16;

/// A completion queue entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    /// Command specific result (dword 0 in the low half, dword 1 in the high half).
    pub result: u64,
    /// Submission queue head pointer.
    pub sq_head: u16,
    /// Submission queue identifier.
    pub sq_id: u16,
    /// Identifier of the command this completes.
    pub cid: u16,
    /// Raw status word as on the wire (see [`Status::from_cqe_word`]).
    pub status_word: u16,
}

impl Cqe {
    /// A completion for `cid` with `status` and `result`.
    pub fn new(cid: u16, status: Status, result: u64) -> Self {
        Cqe {
            result,
            sq_head: 0,
            sq_id: 0,
            cid,
            status_word: status.to_cqe_word(),
        }
    }

    /// The decoded status.
    pub fn status(&self) -> Status {
        Status::from_cqe_word(self.status_word)
    }

    /// Encodes the CQE.
    pub fn to_bytes(&self) -> [u8; CQE_LEN] {
        let mut b = [0u8; CQE_LEN];
        b[0..8].copy_from_slice(&self.result.to_le_bytes());
        b[8..10].copy_from_slice(&self.sq_head.to_le_bytes());
        b[10..12].copy_from_slice(&self.sq_id.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&self.status_word.to_le_bytes());
        b
    }

    /// Decodes a CQE.
    pub fn from_bytes(b: &[u8; CQE_LEN]) -> Self {
        let mut result = [0u8; 8];
        result.copy_from_slice(&b[0..8]);
        Cqe {
            result: u64::from_le_bytes(result),
            sq_head: u16::from_le_bytes([b[8], b[9]]),
            sq_id: u16::from_le_bytes([b[10], b[11]]),
            cid: u16::from_le_bytes([b[12], b[13]]),
            status_word: u16::from_le_bytes([b[14], b[15]]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::StatusCode;

    #[test]
    fn round_trip_and_field_offsets() {
        let mut cqe = Cqe::new(0x1234, StatusCode::InvalidField.status(), 0xaabb_ccdd);
        cqe.sq_head = 5;
        cqe.sq_id = 2;
        let b = cqe.to_bytes();
        assert_eq!(&b[12..14], &[0x34, 0x12]);
        assert_eq!(&b[0..4], &[0xdd, 0xcc, 0xbb, 0xaa]);
        assert_eq!(b[8], 5);
        assert_eq!(Cqe::from_bytes(&b), cqe);
        assert_eq!(cqe.status(), StatusCode::InvalidField.status());
    }
}
