//! Capacity ranges: checked at the edge ([`SizeRange::parse`]), turned into the one size core
//! is asked for on the pool ([`choose`]).

use edgevol_proto::csi::v1::CapacityRange;
use tonic::Status;

use super::error::{Bound, Error};

/// Size of a volume created without capacity_range: 1 GiB.
pub const DEFAULT_VOLUME_BYTES: u64 = 1 << 30;

/// A checked capacity range; 0 leaves a bound unset, as in CSI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeRange {
    /// `required_bytes`.
    pub required: u64,
    /// `limit_bytes`.
    pub limit: u64,
}

fn bytes(field: &str, v: i64) -> Result<u64, Status> {
    u64::try_from(v).map_err(|_| Status::invalid_argument(format!("{field} must not be negative")))
}

impl SizeRange {
    /// Checks a request's range: neither bound negative, the limit not below the requirement.
    pub fn parse(r: &CapacityRange) -> Result<Self, Status> {
        let required = bytes("capacity_range.required_bytes", r.required_bytes)?;
        let limit = bytes("capacity_range.limit_bytes", r.limit_bytes)?;
        if limit != 0 && limit < required {
            return Err(Status::invalid_argument(format!(
                "capacity_range.limit_bytes ({limit}) is below required_bytes ({required})"
            )));
        }
        Ok(SizeRange { required, limit })
    }

    /// Whether a volume of `size` bytes satisfies the range.
    pub fn fits(self, size: u64) -> bool {
        size >= self.required && (self.limit == 0 || size <= self.limit)
    }
}

/// The size to ask core for, given the range (none: any size), the content source's size (0
/// without one), the cluster size, and the size of an existing volume of the requested name.
///
/// An existing volume whose size satisfies the range keeps it: CSI calls a volume compatible
/// when its size lies in the range, not when it equals the size a fresh creation would choose
/// (a retry, or a volume expanded since). Core then decides alone whether that volume answers
/// the request. Otherwise: the range's requirement (else the source's size, else the 1 GiB
/// default within the limit), rounded up to whole clusters, or down when that leaves the range.
pub fn choose(
    range: Option<SizeRange>,
    source: u64,
    cluster: u64,
    existing: Option<u64>,
) -> Result<u64, Error> {
    if let Some(size) = existing.filter(|&s| range.is_none_or(|r| r.fits(s))) {
        return Ok(size);
    }
    let SizeRange { required, limit } = range.unwrap_or(SizeRange {
        required: 0,
        limit: 0,
    });
    for (bound, value) in [(Bound::Limit, limit), (Bound::Required, required)] {
        if value != 0 && value < source {
            return Err(Error::SourceTooLarge {
                source,
                bound,
                value,
            });
        }
    }
    let wanted = match (required, source) {
        (0, 0) if limit != 0 => DEFAULT_VOLUME_BYTES.min(limit),
        (0, 0) => DEFAULT_VOLUME_BYTES,
        (0, s) => s,
        (r, _) => r,
    };
    let rounded = wanted.div_ceil(cluster).saturating_mul(cluster);
    if limit == 0 || rounded <= limit {
        return Ok(rounded);
    }
    // Round down inside the range when rounding up would leave it.
    let down = limit / cluster * cluster;
    if down >= wanted.max(1) && down >= source {
        Ok(down)
    } else {
        Err(Error::NoSizeInRange {
            cluster,
            required,
            limit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn range(required: u64, limit: u64) -> Option<SizeRange> {
        Some(SizeRange { required, limit })
    }

    #[test]
    fn sizes_honour_the_range_and_the_source() {
        assert_eq!(choose(None, 0, MIB, None), Ok(DEFAULT_VOLUME_BYTES));
        assert_eq!(choose(range(1, 0), 0, MIB, None), Ok(MIB));
        assert_eq!(choose(range(0, 5 * MIB), 0, MIB, None), Ok(5 * MIB));
        // Rounding up would leave the range: round down inside it.
        assert_eq!(
            choose(range(MIB + 1, 2 * MIB + 5), 0, MIB, None),
            Ok(2 * MIB)
        );
        assert_eq!(
            choose(range(MIB + 1, MIB + 5), 0, MIB, None),
            Err(Error::NoSizeInRange {
                cluster: MIB,
                required: MIB + 1,
                limit: MIB + 5
            })
        );
        assert_eq!(choose(None, 3 * MIB, MIB, None), Ok(3 * MIB));
        assert_eq!(
            choose(range(MIB, 0), 3 * MIB, MIB, None),
            Err(Error::SourceTooLarge {
                source: 3 * MIB,
                bound: Bound::Required,
                value: MIB
            })
        );
    }

    #[test]
    fn an_existing_volume_in_the_range_keeps_its_size() {
        // Expanded to 3 MiB since: a retry of the original request still names that volume.
        assert_eq!(choose(range(MIB, 0), 0, MIB, Some(3 * MIB)), Ok(3 * MIB));
        assert_eq!(choose(None, 0, MIB, Some(3 * MIB)), Ok(3 * MIB));
        // Outside the range: the size a creation would choose (core then finds the conflict).
        assert_eq!(choose(range(10 * MIB, 0), 0, MIB, Some(MIB)), Ok(10 * MIB));
        assert_eq!(
            choose(range(0, 2 * MIB), 0, MIB, Some(3 * MIB)),
            Ok(2 * MIB)
        );
    }

    #[test]
    fn ranges_are_checked_at_the_edge() {
        let parse = |required, limit| {
            SizeRange::parse(&CapacityRange {
                required_bytes: required,
                limit_bytes: limit,
            })
        };
        assert_eq!(
            parse(5, 0).unwrap(),
            SizeRange {
                required: 5,
                limit: 0
            }
        );
        let e = parse(5, 4).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("below required_bytes"), "{e:?}");
        let e = parse(-1, 0).unwrap_err();
        assert!(e.message().contains("must not be negative"), "{e:?}");
        assert!(SizeRange::parse(&CapacityRange::default()).unwrap().fits(1));
    }
}
