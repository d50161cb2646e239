//! Superblocks: two identical copies (blocks 0 and 1) holding the pool's identity and geometry.
//! Written only at format; open takes the valid copy with the highest generation.
//!
//! Fixed little-endian layout, so the root of the pool never depends on a serde format:
//!
//! | bytes  | field                          |
//! |--------|--------------------------------|
//! | 0..8   | magic `EDGEVOL1`               |
//! | 8..12  | on-media version               |
//! | 12..28 | pool uuid                      |
//! | 28..36 | generation                     |
//! | 36..40 | block size                     |
//! | 40..48 | block count                    |
//! | 48..52 | cluster size                   |
//! | 52..60 | checkpoint slot size, blocks   |
//! | 60..68 | journal size, blocks           |
//! | 68..72 | CRC32C of bytes 0..68          |

use crate::crc::crc32c;
use crate::error::{Corruption, Error, Field, Problem, Result};
use crate::limits::{MAX_CLUSTER_SIZE, MIN_CLUSTER_SIZE};

const MAGIC: &[u8; 8] = b"EDGEVOL1";
/// On-media format version this crate writes and reads.
pub const VERSION: u32 = 3;
pub(crate) const LEN: usize = 72;

/// Where everything is, in blocks. Derived from the few numbers the superblock stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) block_size: u32,
    pub(crate) block_count: u64,
    pub(crate) cluster_size: u32,
    pub(crate) slot_blocks: u64,
    pub(crate) journal_blocks: u64,
}

impl Geometry {
    /// Checks that the layout fits and leaves at least one data cluster.
    pub(crate) fn validate(&self) -> Result<()> {
        let bad = Err(Error::InvalidArgument(Field::FormatOptions, Problem::Unsupported));
        let cs = self.cluster_size;
        if !self.block_size.is_power_of_two()
            || self.block_size < 512
            || usize::try_from(self.block_size).is_err()
            || !cs.is_power_of_two()
            || !(MIN_CLUSTER_SIZE..=MAX_CLUSTER_SIZE).contains(&cs)
            || cs < self.block_size
            || self.slot_blocks < 2
            || self.journal_blocks < 2
            // Frame lengths are u32 on media.
            || self.journal_blocks.saturating_mul(u64::from(self.block_size)) > u64::from(u32::MAX)
        {
            return bad;
        }
        match self.data_clusters() {
            Some(n) if n > 0 && usize::try_from(n).is_ok() => Ok(()),
            _ => bad,
        }
    }

    pub(crate) fn slot_start(&self, slot: u64) -> u64 {
        2 + slot * self.slot_blocks
    }

    pub(crate) fn journal_start(&self) -> u64 {
        2 + 2 * self.slot_blocks
    }

    pub(crate) fn blocks_per_cluster(&self) -> u64 {
        u64::from(self.cluster_size / self.block_size)
    }

    /// First data block: after the metadata area, aligned to a cluster.
    pub(crate) fn data_start(&self) -> Option<u64> {
        self.journal_start()
            .checked_add(self.journal_blocks)?
            .checked_next_multiple_of(self.blocks_per_cluster())
    }

    pub(crate) fn data_clusters(&self) -> Option<u64> {
        Some(self.block_count.checked_sub(self.data_start()?)? / self.blocks_per_cluster())
    }

    pub(crate) fn bytes(&self, blocks: u64) -> u64 {
        blocks * u64::from(self.block_size)
    }

    pub(crate) fn block_usize(&self) -> usize {
        self.block_size as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub(crate) uuid: [u8; 16],
    pub(crate) generation: u64,
    pub(crate) geo: Geometry,
}

fn le<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

impl Superblock {
    pub(crate) fn encode(&self, out: &mut [u8]) {
        let g = &self.geo;
        out[..LEN].fill(0);
        out[0..8].copy_from_slice(MAGIC);
        out[8..12].copy_from_slice(&VERSION.to_le_bytes());
        out[12..28].copy_from_slice(&self.uuid);
        out[28..36].copy_from_slice(&self.generation.to_le_bytes());
        out[36..40].copy_from_slice(&g.block_size.to_le_bytes());
        out[40..48].copy_from_slice(&g.block_count.to_le_bytes());
        out[48..52].copy_from_slice(&g.cluster_size.to_le_bytes());
        out[52..60].copy_from_slice(&g.slot_blocks.to_le_bytes());
        out[60..68].copy_from_slice(&g.journal_blocks.to_le_bytes());
        let crc = crc32c(&out[..68]);
        out[68..72].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes and validates one copy. `Ok(None)`: not a superblock (bad magic or CRC).
    pub(crate) fn decode(b: &[u8]) -> Result<Option<Self>> {
        if b.len() < LEN || &b[0..8] != MAGIC || u32::from_le_bytes(le(b, 68)) != crc32c(&b[..68]) {
            return Ok(None);
        }
        let version = u32::from_le_bytes(le(b, 8));
        if version != VERSION {
            return Err(Error::Corrupt(Corruption::Version(version)));
        }
        let geo = Geometry {
            block_size: u32::from_le_bytes(le(b, 36)),
            block_count: u64::from_le_bytes(le(b, 40)),
            cluster_size: u32::from_le_bytes(le(b, 48)),
            slot_blocks: u64::from_le_bytes(le(b, 52)),
            journal_blocks: u64::from_le_bytes(le(b, 60)),
        };
        geo.validate().map_err(|_| Error::Corrupt(Corruption::Geometry))?;
        Ok(Some(Self {
            uuid: le(b, 12),
            generation: u64::from_le_bytes(le(b, 28)),
            geo,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        let geo = Geometry {
            block_size: 512,
            block_count: 10_000,
            cluster_size: 4096,
            slot_blocks: 64,
            journal_blocks: 128,
        };
        Superblock {
            uuid: [7; 16],
            generation: 3,
            geo,
        }
    }

    #[test]
    fn round_trip_and_every_flip_is_caught() {
        let mut b = [0u8; 512];
        sample().encode(&mut b);
        assert_eq!(Superblock::decode(&b), Ok(Some(sample())));
        for i in 0..LEN * 8 {
            let mut c = b;
            c[i / 8] ^= 1 << (i % 8);
            assert_eq!(Superblock::decode(&c), Ok(None), "flip of bit {i} accepted");
        }
        assert_eq!(Superblock::decode(&[0u8; 512]), Ok(None));
    }

    #[test]
    fn layout_is_cluster_aligned() {
        let g = sample().geo;
        assert_eq!(g.journal_start(), 130);
        assert_eq!(g.data_start(), Some(264));
        assert_eq!(g.data_clusters(), Some((10_000 - 264) / 8));
    }
}
