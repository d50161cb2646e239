//! Which pools a firmware can read: the range of pool format versions and the format features it
//! supports (core's superblock feature sets). A bundle's manifest carries it, signed; a written
//! slot keeps it in its directory; the manager compares it with the pool in use before an update
//! or a rollback, so the A/B mechanism never boots a slot that cannot read the pool without the
//! operator asking for it.
//!
//! This crate does not depend on core: it compares numbers. The appliance fills them in from
//! core (its own build's [`PoolFormat`], the pool's [`PoolInUse`]).

use std::fmt;

/// The pools a firmware reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolFormat {
    /// Oldest pool format version it reads.
    pub oldest: u32,
    /// Newest pool format version it reads.
    pub newest: u32,
    /// Compatible features it supports (the others it ignores, as their set allows).
    pub compatible: u64,
    /// Read-only-compatible features it supports (without one, it mounts the pool read-only).
    pub read_only_compatible: u64,
    /// Incompatible features it supports (without one, it refuses the pool).
    pub incompatible: u64,
}

impl PoolFormat {
    /// What a firmware from before pools had features reads: format version 3 only, no
    /// feature. The reading of a bundle whose manifest has no pool format (manifest format 1)
    /// and of a slot with no `pool-format` file: it is exactly what such firmware does.
    pub const V3_ONLY: PoolFormat = PoolFormat {
        oldest: 3,
        newest: 3,
        compatible: 0,
        read_only_compatible: 0,
        incompatible: 0,
    };

    /// What this firmware would do with `pool`.
    pub fn reads(&self, pool: &PoolInUse) -> Readability {
        if pool.version > self.newest {
            return Readability::No(Unreadable::VersionTooNew {
                pool: pool.version,
                newest: self.newest,
            });
        }
        if pool.version < self.oldest {
            return Readability::No(Unreadable::VersionTooOld {
                pool: pool.version,
                oldest: self.oldest,
            });
        }
        if let Some(bit) = lowest_bit(pool.incompatible & !self.incompatible) {
            return Readability::No(Unreadable::Incompatible { bit });
        }
        match lowest_bit(pool.read_only_compatible & !self.read_only_compatible) {
            Some(bit) => Readability::ReadOnly { bit },
            None => Readability::ReadWrite,
        }
    }

    /// The text of a slot's `pool-format` file (one line).
    pub fn to_line(&self) -> String {
        format!(
            "edgevol-pool-format 1 versions {}-{} compatible {:#x} read-only-compatible {:#x} incompatible {:#x}\n",
            self.oldest, self.newest, self.compatible, self.read_only_compatible, self.incompatible
        )
    }

    /// Parses [`PoolFormat::to_line`]'s text; `None` for anything else (a torn or foreign file).
    pub fn from_line(text: &str) -> Option<PoolFormat> {
        let line = text.strip_suffix('\n')?;
        let words: Vec<&str> = line.split(' ').collect();
        let ["edgevol-pool-format", "1", "versions", range, "compatible", c, "read-only-compatible", ro, "incompatible", i] =
            words.as_slice()
        else {
            return None;
        };
        let (oldest, newest) = range.split_once('-')?;
        let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
        let format = PoolFormat {
            oldest: oldest.parse().ok()?,
            newest: newest.parse().ok()?,
            compatible: hex(c)?,
            read_only_compatible: hex(ro)?,
            incompatible: hex(i)?,
        };
        (format.oldest <= format.newest && format.to_line() == text).then_some(format)
    }
}

impl fmt::Display for PoolFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.oldest == self.newest {
            write!(f, "pool format version {}", self.oldest)?;
        } else {
            write!(f, "pool format versions {}-{}", self.oldest, self.newest)?;
        }
        for (set, word) in [
            ("incompatible", self.incompatible),
            ("read-only-compatible", self.read_only_compatible),
            ("compatible", self.compatible),
        ] {
            if word != 0 {
                write!(f, ", {set} features {word:#x}")?;
            }
        }
        Ok(())
    }
}

fn lowest_bit(word: u64) -> Option<u8> {
    // trailing_zeros of a non-zero u64 is below 64.
    (word != 0).then(|| u8::try_from(word.trailing_zeros()).unwrap_or(63))
}

/// The pool an appliance runs on: its format version and feature words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolInUse {
    /// Its format version.
    pub version: u32,
    /// Compatible features.
    pub compatible: u64,
    /// Read-only-compatible features.
    pub read_only_compatible: u64,
    /// Incompatible features.
    pub incompatible: u64,
}

/// What a firmware would do with a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readability {
    /// Open it as usual.
    ReadWrite,
    /// Open it read-only: it lacks this read-only-compatible feature bit.
    ReadOnly {
        /// The feature's bit.
        bit: u8,
    },
    /// Refuse it.
    No(Unreadable),
}

/// Why a firmware cannot read a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// The pool's format version is newer than it reads.
    VersionTooNew {
        /// The pool's.
        pool: u32,
        /// The newest it reads.
        newest: u32,
    },
    /// The pool's format version is older than it reads.
    VersionTooOld {
        /// The pool's.
        pool: u32,
        /// The oldest it reads.
        oldest: u32,
    },
    /// The pool has an incompatible feature it lacks.
    Incompatible {
        /// The feature's bit.
        bit: u8,
    },
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unreadable::VersionTooNew { pool, newest } => write!(
                f,
                "the pool's format version {pool} is newer than it supports ({newest})"
            ),
            Unreadable::VersionTooOld { pool, oldest } => write!(
                f,
                "the pool's format version {pool} is older than it reads ({oldest} and later)"
            ),
            Unreadable::Incompatible { bit } => write!(
                f,
                "the pool uses incompatible feature bit {bit}{}, which it does not support",
                feature_name(*bit)
            ),
        }
    }
}

/// The name of the incompatible features the firmware tests use, for messages (the full table
/// is core's; this crate does not depend on it).
fn feature_name(bit: u8) -> &'static str {
    match bit {
        63 => " (test-feature-x)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: PoolFormat = PoolFormat {
        oldest: 3,
        newest: 4,
        compatible: 0,
        read_only_compatible: 1 << 2,
        incompatible: 1 << 63,
    };

    fn pool(version: u32, read_only_compatible: u64, incompatible: u64) -> PoolInUse {
        PoolInUse {
            version,
            compatible: 1 << 9,
            read_only_compatible,
            incompatible,
        }
    }

    #[test]
    fn what_a_firmware_does_with_a_pool() {
        let v3 = PoolFormat::V3_ONLY;
        assert_eq!(v3.reads(&pool(3, 0, 0)), Readability::ReadWrite);
        assert_eq!(
            v3.reads(&pool(4, 0, 1 << 63)),
            Readability::No(Unreadable::VersionTooNew { pool: 4, newest: 3 })
        );
        assert_eq!(V4.reads(&pool(4, 0, 1 << 63)), Readability::ReadWrite);
        assert_eq!(V4.reads(&pool(3, 0, 0)), Readability::ReadWrite);
        assert_eq!(
            V4.reads(&pool(4, 0, 1 << 5 | 1 << 63)),
            Readability::No(Unreadable::Incompatible { bit: 5 })
        );
        assert_eq!(
            V4.reads(&pool(4, 1 << 2 | 1 << 7, 0)),
            Readability::ReadOnly { bit: 7 }
        );
        assert_eq!(
            V4.reads(&pool(2, 0, 0)),
            Readability::No(Unreadable::VersionTooOld { pool: 2, oldest: 3 })
        );
        assert_eq!(
            Unreadable::Incompatible { bit: 63 }.to_string(),
            "the pool uses incompatible feature bit 63 (test-feature-x), which it does not support"
        );
    }

    #[test]
    fn the_slot_file_round_trips_and_refuses_anything_else() {
        for f in [PoolFormat::V3_ONLY, V4] {
            assert_eq!(PoolFormat::from_line(&f.to_line()), Some(f));
        }
        assert_eq!(
            V4.to_line(),
            "edgevol-pool-format 1 versions 3-4 compatible 0x0 read-only-compatible 0x4 incompatible 0x8000000000000000\n"
        );
        let line = V4.to_line();
        for bad in [
            &line[..line.len() - 1],
            &line[..20],
            "",
            "edgevol-pool-format 1 versions 4-3 compatible 0x0 read-only-compatible 0x0 incompatible 0x0\n",
            "edgevol-pool-format 1 versions 3-4 compatible 0x00 read-only-compatible 0x0 incompatible 0x0\n",
        ] {
            assert_eq!(PoolFormat::from_line(bad), None, "{bad:?}");
        }
        assert_eq!(V4.to_string(), "pool format versions 3-4, incompatible features 0x8000000000000000, read-only-compatible features 0x4");
    }
}
