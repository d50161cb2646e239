//! Journal frames: one commit writes one or more frames, each starting on a block boundary so an
//! acknowledged frame is never rewritten by a later one.
//!
//! | bytes  | field                                                 |
//! |--------|-------------------------------------------------------|
//! | 0..4   | magic `EVJ1`                                          |
//! | 4..12  | sequence number (consecutive across the whole pool)   |
//! | 12..20 | sequence number of the commit's first frame           |
//! | 20..24 | payload length                                        |
//! | 24..28 | CRC32C of the payload, seeded with the pool's salt    |
//! | 28..32 | CRC32C of bytes 0..28, seeded with the pool's salt    |
//!
//! The header CRC is checked before the length is believed (sled's `read_frame`), and both CRCs
//! are seeded with a salt derived from the pool uuid, so frames left by an earlier pool on the same
//! device, zeroed or erased blocks never validate.

use crate::crc::crc32c_append;

const MAGIC: &[u8; 4] = b"EVJ1";
pub(crate) const HEADER_LEN: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    pub(crate) seq: u64,
    pub(crate) commit_start: u64,
    pub(crate) payload_len: u32,
    pub(crate) payload_crc: u32,
}

impl FrameHeader {
    pub(crate) fn encode(&self, salt: u32, out: &mut [u8]) {
        out[0..4].copy_from_slice(MAGIC);
        out[4..12].copy_from_slice(&self.seq.to_le_bytes());
        out[12..20].copy_from_slice(&self.commit_start.to_le_bytes());
        out[20..24].copy_from_slice(&self.payload_len.to_le_bytes());
        out[24..28].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32c_append(salt, &out[..28]);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
    }

    /// A header whose magic and CRC check out, or `None`.
    pub(crate) fn decode(salt: u32, b: &[u8]) -> Option<Self> {
        let b = b.get(..HEADER_LEN)?;
        let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let dword = |at: usize| u64::from(word(at)) | u64::from(word(at + 4)) << 32;
        if &b[0..4] != MAGIC || word(28) != crc32c_append(salt, &b[..28]) {
            return None;
        }
        Some(Self {
            seq: dword(4),
            commit_start: dword(12),
            payload_len: word(20),
            payload_crc: word(24),
        })
    }

    pub(crate) fn payload_ok(&self, salt: u32, payload: &[u8]) -> bool {
        crc32c_append(salt, payload) == self.payload_crc
    }
}

/// Blocks a frame with `payload_len` bytes of payload occupies.
pub(crate) fn frame_blocks(payload_len: usize, block_size: usize) -> u64 {
    (HEADER_LEN + payload_len).div_ceil(block_size) as u64
}

/// Appends a whole frame (header, payload, zero padding to the block) to `out`.
pub(crate) fn encode_frame(
    out: &mut alloc::vec::Vec<u8>,
    salt: u32,
    seq: u64,
    commit_start: u64,
    payload: &[u8],
    block_size: usize,
) {
    let start = out.len();
    out.resize(start + HEADER_LEN, 0);
    let header = FrameHeader {
        seq,
        commit_start,
        // Frames are bounded by the journal size, checked at format to fit in u32.
        payload_len: u32::try_from(payload.len()).unwrap_or(u32::MAX),
        payload_crc: crc32c_append(salt, payload),
    };
    header.encode(salt, &mut out[start..]);
    out.extend_from_slice(payload);
    let end = start + (HEADER_LEN + payload.len()).next_multiple_of(block_size);
    out.resize(end, 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[test]
    fn frames_validate_only_with_their_salt_and_intact_bytes() {
        let mut buf = Vec::new();
        encode_frame(&mut buf, 11, 5, 4, b"hello", 512);
        assert_eq!(buf.len(), 512);
        let h = FrameHeader::decode(11, &buf).unwrap();
        assert_eq!((h.seq, h.commit_start, h.payload_len), (5, 4, 5));
        assert!(h.payload_ok(11, &buf[HEADER_LEN..HEADER_LEN + 5]));
        assert!(FrameHeader::decode(12, &buf).is_none());
        for i in 0..HEADER_LEN * 8 {
            let mut c = buf.clone();
            c[i / 8] ^= 1 << (i % 8);
            assert!(FrameHeader::decode(11, &c).is_none(), "flip of bit {i} accepted");
        }
        assert!(!h.payload_ok(11, b"hellp"));
        assert!(FrameHeader::decode(11, &[0u8; 512]).is_none());
    }
}
