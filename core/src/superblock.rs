//! Superblocks: two copies (blocks 0 and 1) holding the pool's identity, geometry and format
//! features. Written at format, and again only when a feature is enabled
//! ([`crate::Pool::enable_feature`]); open takes the valid copy with the highest generation.
//!
//! Fixed little-endian layout, so the root of the pool never depends on a serde format. Bytes
//! 0..72 are the same in every version, including the CRC at 68: that is how any build, old or
//! new, tells a superblock of a version it does not read from a damaged one (and refuses it as
//! too new instead of reporting corruption or taking the device for blank).
//!
//! | bytes  | field                          | versions |
//! |--------|--------------------------------|----------|
//! | 0..8   | magic `EDGEVOL1`               | all      |
//! | 8..12  | on-media version               | all      |
//! | 12..28 | pool uuid                      | all      |
//! | 28..36 | generation                     | all      |
//! | 36..40 | block size                     | 3, 4     |
//! | 40..48 | block count                    | 3, 4     |
//! | 48..52 | cluster size                   | 3, 4     |
//! | 52..60 | checkpoint slot size, blocks   | 3, 4     |
//! | 60..68 | journal size, blocks           | 3, 4     |
//! | 68..72 | CRC32C of bytes 0..68          | all      |
//! | 72..80 | compatible features            | 4        |
//! | 80..88 | read-only-compatible features  | 4        |
//! | 88..96 | incompatible features          | 4        |
//! | 96..100| CRC32C of bytes 0..96          | 4        |
//!
//! Version 3 is version 4 with every feature word zero, and is what a superblock without
//! features is written as, so firmware that reads only version 3 keeps reading pools that have
//! none (an A/B rollback to it stays possible until a feature is enabled). The rest of the
//! format (checkpoints, journal, records) is the same in both.

use crate::crc::crc32c;
use crate::error::{Corruption, Error, Field, Problem, Result, Unsupported};
use crate::feature::{FeatureSet, Features};
use crate::limits::{MAX_CLUSTER_SIZE, MIN_CLUSTER_SIZE};

const MAGIC: &[u8; 8] = b"EDGEVOL1";
/// On-media format version of a pool without features: what [`crate::Pool::format`] writes.
pub const VERSION: u32 = 3;
/// Format version of a superblock that carries feature words: the newest this build reads.
pub const VERSION_FEATURES: u32 = 4;
/// The oldest format version this build reads.
pub const OLDEST_VERSION: u32 = 3;
/// Bytes of the prefix every version shares (ends with its CRC).
pub(crate) const PREFIX_LEN: usize = 72;
/// Bytes of the longest superblock this build writes (version 4).
pub(crate) const LEN: usize = 100;

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
    pub(crate) features: Features,
}

/// One superblock copy whose shared prefix validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SbCopy {
    /// A superblock this build reads (its features not checked yet: see [`Superblock::check`]).
    Readable(Superblock),
    /// A superblock this build cannot read: a version it does not know, or a geometry that does
    /// not validate.
    Unreadable {
        /// Its generation, so the newest copy decides even when it is this one.
        generation: u64,
        /// Why.
        error: Error,
    },
}

impl SbCopy {
    pub(crate) fn generation(&self) -> u64 {
        match self {
            SbCopy::Readable(sb) => sb.generation,
            SbCopy::Unreadable { generation, .. } => *generation,
        }
    }
}

/// What a superblock's features allow this build to do with the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    ReadWrite,
    /// Read only: this build lacks the read-only-compatible feature.
    ReadOnly(crate::feature::Feature),
}

fn le<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

impl Superblock {
    /// The version this superblock is written as: 3 without features, 4 with.
    pub(crate) fn version(&self) -> u32 {
        if self.features.is_empty() {
            VERSION
        } else {
            VERSION_FEATURES
        }
    }

    /// Writes the superblock into `out` (at least [`LEN`] bytes): version 3 bytes when it has no
    /// features (then bytes 72..100 are zero, as every version-3 superblock has them), else 4.
    pub(crate) fn encode(&self, out: &mut [u8]) {
        let g = &self.geo;
        out[..LEN].fill(0);
        out[0..8].copy_from_slice(MAGIC);
        out[8..12].copy_from_slice(&self.version().to_le_bytes());
        out[12..28].copy_from_slice(&self.uuid);
        out[28..36].copy_from_slice(&self.generation.to_le_bytes());
        out[36..40].copy_from_slice(&g.block_size.to_le_bytes());
        out[40..48].copy_from_slice(&g.block_count.to_le_bytes());
        out[48..52].copy_from_slice(&g.cluster_size.to_le_bytes());
        out[52..60].copy_from_slice(&g.slot_blocks.to_le_bytes());
        out[60..68].copy_from_slice(&g.journal_blocks.to_le_bytes());
        let crc = crc32c(&out[..68]);
        out[68..72].copy_from_slice(&crc.to_le_bytes());
        if self.version() == VERSION_FEATURES {
            let f = &self.features;
            out[72..80].copy_from_slice(&f.compatible.to_le_bytes());
            out[80..88].copy_from_slice(&f.read_only_compatible.to_le_bytes());
            out[88..96].copy_from_slice(&f.incompatible.to_le_bytes());
            let crc = crc32c(&out[..96]);
            out[96..100].copy_from_slice(&crc.to_le_bytes());
        }
    }

    /// Decodes one copy. `None`: not a superblock (bad magic or CRC, of the shared prefix or of
    /// the version-4 feature words).
    pub(crate) fn decode(b: &[u8]) -> Option<SbCopy> {
        if b.len() < PREFIX_LEN || &b[0..8] != MAGIC || u32::from_le_bytes(le(b, 68)) != crc32c(&b[..68]) {
            return None;
        }
        let version = u32::from_le_bytes(le(b, 8));
        let generation = u64::from_le_bytes(le(b, 28));
        let unreadable = |error| Some(SbCopy::Unreadable { generation, error });
        if version > VERSION_FEATURES {
            return unreadable(Error::Unsupported(Unsupported::VersionTooNew {
                found: version,
                newest: VERSION_FEATURES,
            }));
        }
        if version < OLDEST_VERSION {
            return unreadable(Error::Unsupported(Unsupported::VersionTooOld {
                found: version,
                oldest: OLDEST_VERSION,
            }));
        }
        let features = if version == VERSION_FEATURES {
            if b.len() < LEN || u32::from_le_bytes(le(b, 96)) != crc32c(&b[..96]) {
                return None;
            }
            Features {
                compatible: u64::from_le_bytes(le(b, 72)),
                read_only_compatible: u64::from_le_bytes(le(b, 80)),
                incompatible: u64::from_le_bytes(le(b, 88)),
            }
        } else {
            Features::NONE
        };
        let geo = Geometry {
            block_size: u32::from_le_bytes(le(b, 36)),
            block_count: u64::from_le_bytes(le(b, 40)),
            cluster_size: u32::from_le_bytes(le(b, 48)),
            slot_blocks: u64::from_le_bytes(le(b, 52)),
            journal_blocks: u64::from_le_bytes(le(b, 60)),
        };
        if geo.validate().is_err() {
            return unreadable(Error::Corrupt(Corruption::Geometry));
        }
        Some(SbCopy::Readable(Self {
            uuid: le(b, 12),
            generation,
            geo,
            features,
        }))
    }

    /// What this build may do with a pool of these features: refuses an unknown incompatible
    /// one, opens read-only for an unknown read-only-compatible one, ignores unknown compatible
    /// ones.
    pub(crate) fn check(&self) -> Result<Access> {
        if let Some(f) = self.features.first_unsupported(FeatureSet::Incompatible) {
            return Err(Error::Unsupported(Unsupported::Feature(f)));
        }
        Ok(match self.features.first_unsupported(FeatureSet::ReadOnlyCompatible) {
            Some(f) => Access::ReadOnly(f),
            None => Access::ReadWrite,
        })
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
            features: Features::NONE,
        }
    }

    #[test]
    fn round_trip_and_every_flip_is_caught() {
        let mut b = [0u8; 512];
        sample().encode(&mut b);
        assert_eq!(Superblock::decode(&b), Some(SbCopy::Readable(sample())));
        assert!(b[PREFIX_LEN..].iter().all(|&x| x == 0), "version 3 ends at 72");
        for i in 0..PREFIX_LEN * 8 {
            let mut c = b;
            c[i / 8] ^= 1 << (i % 8);
            assert_eq!(Superblock::decode(&c), None, "flip of bit {i} accepted");
        }
        assert_eq!(Superblock::decode(&[0u8; 512]), None);
    }

    #[test]
    fn features_make_it_version_4_and_every_flip_is_caught() {
        let mut sb = sample();
        sb.features = Features {
            compatible: 1,
            read_only_compatible: 1 << 9,
            incompatible: 1 << 63,
        };
        let mut b = [0u8; 512];
        sb.encode(&mut b);
        assert_eq!(u32::from_le_bytes(le(&b, 8)), VERSION_FEATURES);
        assert_eq!(Superblock::decode(&b), Some(SbCopy::Readable(sb)));
        for i in 0..LEN * 8 {
            let mut c = b;
            c[i / 8] ^= 1 << (i % 8);
            assert_eq!(Superblock::decode(&c), None, "flip of bit {i} accepted");
        }
    }

    #[test]
    fn versions_outside_the_range_are_unreadable_not_damaged() {
        for (version, error) in [
            (
                5,
                Unsupported::VersionTooNew {
                    found: 5,
                    newest: VERSION_FEATURES,
                },
            ),
            (
                2,
                Unsupported::VersionTooOld {
                    found: 2,
                    oldest: OLDEST_VERSION,
                },
            ),
        ] {
            let mut b = [0u8; 512];
            sample().encode(&mut b);
            b[8..12].copy_from_slice(&u32::to_le_bytes(version));
            let crc = crc32c(&b[..68]);
            b[68..72].copy_from_slice(&crc.to_le_bytes());
            assert_eq!(
                Superblock::decode(&b),
                Some(SbCopy::Unreadable {
                    generation: 3,
                    error: Error::Unsupported(error)
                })
            );
        }
    }

    #[test]
    fn unknown_features_decide_access() {
        let mut sb = sample();
        assert_eq!(sb.check(), Ok(Access::ReadWrite));
        sb.features.compatible = 1 << 40;
        assert_eq!(sb.check(), Ok(Access::ReadWrite), "unknown compatible: ignored");
        sb.features.read_only_compatible = 1 << 2;
        let ro = crate::feature::Feature {
            set: FeatureSet::ReadOnlyCompatible,
            bit: 2,
        };
        assert_eq!(sb.check(), Ok(Access::ReadOnly(ro)));
        sb.features.incompatible = 1 << 7;
        let incompat = crate::feature::Feature {
            set: FeatureSet::Incompatible,
            bit: 7,
        };
        assert_eq!(sb.check(), Err(Error::Unsupported(Unsupported::Feature(incompat))));
    }

    #[test]
    fn layout_is_cluster_aligned() {
        let g = sample().geo;
        assert_eq!(g.journal_start(), 130);
        assert_eq!(g.data_start(), Some(264));
        assert_eq!(g.data_clusters(), Some((10_000 - 264) / 8));
    }
}
