//! Journal frames: one commit writes one or more frames, each starting on a block boundary so an
//! acknowledged frame is never rewritten by a later one.
//!
//! | bytes  | field                                                                  |
//! |--------|------------------------------------------------------------------------|
//! | 0..4   | magic `EVJ3`                                                           |
//! | 4..12  | sequence number (consecutive across the whole pool)                    |
//! | 12..20 | sequence number of the commit's first frame                            |
//! | 20..24 | payload length                                                         |
//! | 24..28 | CRC32C of the payload, seeded with the pool's salt                     |
//! | 28..32 | link: the header CRC (bytes 52..56) of the previous frame of this pass |
//! |        | of the journal, 0 for the first frame after a checkpoint               |
//! | 32..36 | kind: 0 hard, 1 soft (any other value: not a frame)                    |
//! | 36..52 | epoch of a soft frame (zeros in a hard frame)                          |
//! | 52..56 | CRC32C of bytes 0..52, seeded with the pool's salt                     |
//!
//! The header CRC is checked before the length is believed (sled's `read_frame`), and both CRCs
//! are seeded with a salt derived from the pool uuid, so frames left by an earlier pool on the same
//! device, zeroed or erased blocks never validate.
//!
//! # Hard and soft frames
//!
//! A **hard** commit flushes the device (when data was mapped, or soft frames were written, since
//! the last hard commit), writes its frames, and flushes again. A **soft** commit only writes its
//! frames: they reach the OS page cache (or the device's volatile cache) and survive a crash of
//! the process, not a power cut. Each soft frame carries the caller's *epoch* (one value per OS
//! boot), so that replay can tell which of the two happened:
//!
//! - A soft frame followed in the journal by a hard frame is **sealed**: the hard commit flushed
//!   the device before writing, so the soft frame (and the data its records point at) was durable.
//!   Sealed frames are always replayed.
//! - Soft frames after the last hard frame are replayed only while their epoch is the one `open`
//!   is given (the page cache they were written to is the one still in use); from the first frame
//!   of another epoch on, they are a torn tail, and dropped. Without an epoch none is replayed.
//! - A frame is replayed only if it continues the chain: the next sequence number, and a link
//!   equal to the previous frame's header CRC. A frame left past the tail by an earlier history
//!   (torn, or dropped as above, under a discard that does not zero) never continues a later
//!   history, so it cannot come back.
//!
//! Replay stops at the first frame that is damaged or does not continue the chain. That is a torn
//! tail unless an intact *hard* frame of a later commit lies beyond it: a hard commit flushes first,
//! so everything before it was durable and the damage is corruption (`Corruption::JournalGap`).
//! Intact soft frames beyond damage are no such proof: after a power cut, un-flushed blocks survive
//! in any order.

use crate::crc::crc32c_append;

const MAGIC: &[u8; 4] = b"EVJ3";
pub(crate) const HEADER_LEN: usize = 56;
const CRC_AT: usize = 52;

/// How a frame was committed (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Written after a device flush, and flushed.
    Hard,
    /// Written without any flush, in the given epoch.
    Soft([u8; 16]),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    pub(crate) seq: u64,
    pub(crate) commit_start: u64,
    pub(crate) payload_len: u32,
    pub(crate) payload_crc: u32,
    pub(crate) link: u32,
    pub(crate) kind: Kind,
}

impl FrameHeader {
    /// Writes the header into `out[..HEADER_LEN]` and returns its CRC (the next frame's link).
    pub(crate) fn encode(&self, salt: u32, out: &mut [u8]) -> u32 {
        out[0..4].copy_from_slice(MAGIC);
        out[4..12].copy_from_slice(&self.seq.to_le_bytes());
        out[12..20].copy_from_slice(&self.commit_start.to_le_bytes());
        out[20..24].copy_from_slice(&self.payload_len.to_le_bytes());
        out[24..28].copy_from_slice(&self.payload_crc.to_le_bytes());
        out[28..32].copy_from_slice(&self.link.to_le_bytes());
        let (kind, epoch) = match self.kind {
            Kind::Hard => (0u32, [0u8; 16]),
            Kind::Soft(epoch) => (1u32, epoch),
        };
        out[32..36].copy_from_slice(&kind.to_le_bytes());
        out[36..52].copy_from_slice(&epoch);
        let crc = crc32c_append(salt, &out[..CRC_AT]);
        out[CRC_AT..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        crc
    }

    /// A header whose magic, CRC and kind check out, with its CRC; or `None`.
    pub(crate) fn decode(salt: u32, b: &[u8]) -> Option<(Self, u32)> {
        let b = b.get(..HEADER_LEN)?;
        let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let dword = |at: usize| u64::from(word(at)) | u64::from(word(at + 4)) << 32;
        let crc = word(CRC_AT);
        if &b[0..4] != MAGIC || crc != crc32c_append(salt, &b[..CRC_AT]) {
            return None;
        }
        let mut epoch = [0u8; 16];
        epoch.copy_from_slice(&b[36..52]);
        let kind = match word(32) {
            0 if epoch == [0; 16] => Kind::Hard,
            1 => Kind::Soft(epoch),
            _ => return None,
        };
        let header = Self {
            seq: dword(4),
            commit_start: dword(12),
            payload_len: word(20),
            payload_crc: word(24),
            link: word(28),
            kind,
        };
        Some((header, crc))
    }

    pub(crate) fn payload_ok(&self, salt: u32, payload: &[u8]) -> bool {
        crc32c_append(salt, payload) == self.payload_crc
    }
}

/// Blocks a frame with `payload_len` bytes of payload occupies.
pub(crate) fn frame_blocks(payload_len: usize, block_size: usize) -> u64 {
    (HEADER_LEN + payload_len).div_ceil(block_size) as u64
}

/// What a frame says besides its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameMeta {
    pub(crate) seq: u64,
    pub(crate) commit_start: u64,
    pub(crate) link: u32,
    pub(crate) kind: Kind,
}

/// Appends a whole frame (header, payload, zero padding to the block) to `out`; returns its header
/// CRC, the link of the frame after it.
pub(crate) fn encode_frame(
    out: &mut alloc::vec::Vec<u8>,
    salt: u32,
    meta: FrameMeta,
    payload: &[u8],
    block_size: usize,
) -> u32 {
    let start = out.len();
    out.resize(start + HEADER_LEN, 0);
    let header = FrameHeader {
        seq: meta.seq,
        commit_start: meta.commit_start,
        // Frames are bounded by the journal size, checked at format to fit in u32.
        payload_len: u32::try_from(payload.len()).unwrap_or(u32::MAX),
        payload_crc: crc32c_append(salt, payload),
        link: meta.link,
        kind: meta.kind,
    };
    let crc = header.encode(salt, &mut out[start..]);
    out.extend_from_slice(payload);
    let end = start + (HEADER_LEN + payload.len()).next_multiple_of(block_size);
    out.resize(end, 0);
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    fn meta(kind: Kind) -> FrameMeta {
        FrameMeta {
            seq: 5,
            commit_start: 4,
            link: 0xABCD_0123,
            kind,
        }
    }

    #[test]
    fn frames_validate_only_with_their_salt_and_intact_bytes() {
        for kind in [Kind::Hard, Kind::Soft([9; 16])] {
            let mut buf = Vec::new();
            let crc = encode_frame(&mut buf, 11, meta(kind), b"hello", 512);
            assert_eq!(buf.len(), 512);
            let (h, got_crc) = FrameHeader::decode(11, &buf).unwrap();
            assert_eq!(got_crc, crc);
            assert_eq!(
                (h.seq, h.commit_start, h.payload_len, h.link, h.kind),
                (5, 4, 5, 0xABCD_0123, kind)
            );
            assert!(h.payload_ok(11, &buf[HEADER_LEN..HEADER_LEN + 5]));
            assert!(FrameHeader::decode(12, &buf).is_none());
            for i in 0..HEADER_LEN * 8 {
                let mut c = buf.clone();
                c[i / 8] ^= 1 << (i % 8);
                assert!(FrameHeader::decode(11, &c).is_none(), "flip of bit {i} accepted");
            }
            assert!(!h.payload_ok(11, b"hellp"));
        }
        assert!(FrameHeader::decode(11, &[0u8; 512]).is_none());
    }

    #[test]
    fn a_header_with_an_unknown_kind_or_an_epoch_on_a_hard_frame_is_refused() {
        let mut buf = Vec::new();
        encode_frame(&mut buf, 3, meta(Kind::Hard), b"x", 512);
        let reseal = |b: &mut Vec<u8>| {
            let crc = crc32c_append(3, &b[..CRC_AT]);
            b[CRC_AT..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        };
        let mut unknown = buf.clone();
        unknown[32] = 2;
        reseal(&mut unknown);
        assert!(FrameHeader::decode(3, &unknown).is_none());
        let mut hard_with_epoch = buf.clone();
        hard_with_epoch[40] = 1;
        reseal(&mut hard_with_epoch);
        assert!(FrameHeader::decode(3, &hard_with_epoch).is_none());
        // The resealing itself is right: the untouched frame still decodes after it.
        reseal(&mut buf);
        assert!(FrameHeader::decode(3, &buf).is_some());
    }

    #[test]
    fn the_link_is_the_previous_header_crc() {
        let mut buf = Vec::new();
        let first = encode_frame(&mut buf, 1, meta(Kind::Soft([1; 16])), b"a", 512);
        let second_meta = FrameMeta {
            seq: 6,
            link: first,
            ..meta(Kind::Hard)
        };
        encode_frame(&mut buf, 1, second_meta, b"b", 512);
        let (h, _) = FrameHeader::decode(1, &buf[512..]).unwrap();
        assert_eq!(h.link, FrameHeader::decode(1, &buf).unwrap().1);
    }
}
