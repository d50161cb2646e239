//! Checkpoint slots: two, used alternately (generation parity picks the slot). A checkpoint is the
//! postcard encoding of the tables plus the journal sequence number it includes.
//!
//! The payload goes in the slot's blocks 1.., is flushed, and only then is the header (block 0)
//! written and flushed: a valid header therefore proves the payload was durable, and a payload
//! that fails its CRC under a valid header is corruption, not a torn write.
//!
//! | bytes  | field                                              |
//! |--------|----------------------------------------------------|
//! | 0..4   | magic `EVC1`                                       |
//! | 4..12  | generation                                         |
//! | 12..20 | last journal sequence number included              |
//! | 20..28 | payload length                                     |
//! | 28..32 | CRC32C of the payload, seeded with the pool salt   |
//! | 32..36 | CRC32C of bytes 0..32, seeded with the pool salt   |

use crate::crc::crc32c_append;

const MAGIC: &[u8; 4] = b"EVC1";
pub(crate) const HEADER_LEN: usize = 36;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CheckpointHeader {
    pub(crate) generation: u64,
    pub(crate) seq: u64,
    pub(crate) payload_len: u64,
    pub(crate) payload_crc: u32,
}

impl CheckpointHeader {
    pub(crate) fn encode(&self, salt: u32, out: &mut [u8]) {
        out[0..4].copy_from_slice(MAGIC);
        out[4..12].copy_from_slice(&self.generation.to_le_bytes());
        out[12..20].copy_from_slice(&self.seq.to_le_bytes());
        out[20..28].copy_from_slice(&self.payload_len.to_le_bytes());
        out[28..32].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32c_append(salt, &out[..32]);
        out[32..36].copy_from_slice(&crc.to_le_bytes());
    }

    pub(crate) fn decode(salt: u32, b: &[u8]) -> Option<Self> {
        let b = b.get(..HEADER_LEN)?;
        let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let dword = |at: usize| u64::from(word(at)) | u64::from(word(at + 4)) << 32;
        if &b[0..4] != MAGIC || word(32) != crc32c_append(salt, &b[..32]) {
            return None;
        }
        Some(Self {
            generation: dword(4),
            seq: dword(12),
            payload_len: dword(20),
            payload_crc: word(28),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_flips() {
        let h = CheckpointHeader {
            generation: 9,
            seq: 77,
            payload_len: 1234,
            payload_crc: 0xDEAD,
        };
        let mut b = [0u8; 512];
        h.encode(3, &mut b);
        assert_eq!(CheckpointHeader::decode(3, &b), Some(h));
        assert_eq!(CheckpointHeader::decode(4, &b), None);
        for i in 0..HEADER_LEN * 8 {
            let mut c = b;
            c[i / 8] ^= 1 << (i % 8);
            assert_eq!(CheckpointHeader::decode(3, &c), None, "flip of bit {i} accepted");
        }
    }
}
