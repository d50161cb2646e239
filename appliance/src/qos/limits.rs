//! The QoS limits of a volume, as its mutable parameters (CSI CreateVolume's
//! `mutable_parameters`, ControllerModifyVolume) name them.
//!
//! | key | limit (a positive integer) |
//! |---|---|
//! | `maxIops` | commands per second, reads and writes together |
//! | `maxBandwidthBytes` | bytes per second, reads and writes together |
//! | `maxReadIops`, `maxWriteIops` | commands per second in one direction |
//! | `maxReadBandwidthBytes`, `maxWriteBandwidthBytes` | bytes per second in one direction |
//!
//! Every command counts against the IOPS limits: Flush, Write Zeroes and Deallocate as writes.
//! Only Read and Write move data, so only they count against the bandwidth limits.

use std::fmt;
use std::num::NonZeroU64;

/// The direction of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Read.
    Read,
    /// Write, Write Zeroes, Flush, Deallocate: everything that changes or settles data.
    Write,
}

/// What one command costs: one command, and the bytes it moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// Its direction.
    pub direction: Direction,
    /// Data bytes moved (0 for Flush, Write Zeroes, Deallocate).
    pub bytes: u64,
}

/// One volume's limits; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// `maxIops`.
    pub iops: Option<NonZeroU64>,
    /// `maxBandwidthBytes`.
    pub bandwidth: Option<NonZeroU64>,
    /// `maxReadIops`.
    pub read_iops: Option<NonZeroU64>,
    /// `maxWriteIops`.
    pub write_iops: Option<NonZeroU64>,
    /// `maxReadBandwidthBytes`.
    pub read_bandwidth: Option<NonZeroU64>,
    /// `maxWriteBandwidthBytes`.
    pub write_bandwidth: Option<NonZeroU64>,
}

/// Which limit a bucket enforces: the index into [`Limits::rates`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A command rate.
    Iops,
    /// A byte rate.
    Bandwidth,
}

/// The parameter keys, in [`Limits::rates`] order, with what each limits.
pub const KEYS: [(&str, Kind, Option<Direction>); 6] = [
    ("maxIops", Kind::Iops, None),
    ("maxBandwidthBytes", Kind::Bandwidth, None),
    ("maxReadIops", Kind::Iops, Some(Direction::Read)),
    ("maxWriteIops", Kind::Iops, Some(Direction::Write)),
    (
        "maxReadBandwidthBytes",
        Kind::Bandwidth,
        Some(Direction::Read),
    ),
    (
        "maxWriteBandwidthBytes",
        Kind::Bandwidth,
        Some(Direction::Write),
    ),
];

/// Why a parameter is not a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitError {
    /// Not one of [`KEYS`].
    UnknownKey(String),
    /// Not a positive integer.
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
    },
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::UnknownKey(key) => {
                let known: Vec<&str> = KEYS.iter().map(|k| k.0).collect();
                write!(
                    f,
                    "unknown mutable parameter {key:?} (known: {})",
                    known.join(", ")
                )
            }
            LimitError::BadValue { key, value } => write!(
                f,
                "mutable parameter {key}={value:?}: expected a positive integer"
            ),
        }
    }
}

impl std::error::Error for LimitError {}

/// Whether `key` names a limit.
pub fn is_key(key: &str) -> bool {
    KEYS.iter().any(|k| k.0 == key)
}

/// Reads one limit's value: a positive integer.
pub fn parse_value(key: &str, value: &str) -> Result<NonZeroU64, LimitError> {
    if !is_key(key) {
        return Err(LimitError::UnknownKey(key.to_owned()));
    }
    value
        .parse::<NonZeroU64>()
        .map_err(|_| LimitError::BadValue {
            key: key.to_owned(),
            value: value.to_owned(),
        })
}

impl Limits {
    /// The limits `parameters` (a volume's stored mutable parameters) set.
    pub fn from_parameters<'a>(
        parameters: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, LimitError> {
        let mut limits = Limits::default();
        for (key, value) in parameters {
            let v = parse_value(key, value)?;
            let i = KEYS.iter().position(|k| k.0 == key).unwrap_or_default();
            *limits.slot(i) = Some(v);
        }
        Ok(limits)
    }

    fn slot(&mut self, i: usize) -> &mut Option<NonZeroU64> {
        match i {
            0 => &mut self.iops,
            1 => &mut self.bandwidth,
            2 => &mut self.read_iops,
            3 => &mut self.write_iops,
            4 => &mut self.read_bandwidth,
            _ => &mut self.write_bandwidth,
        }
    }

    /// Every rate, in [`KEYS`] order.
    pub fn rates(&self) -> [Option<NonZeroU64>; 6] {
        [
            self.iops,
            self.bandwidth,
            self.read_iops,
            self.write_iops,
            self.read_bandwidth,
            self.write_bandwidth,
        ]
    }

    /// No limit at all.
    pub fn is_unlimited(&self) -> bool {
        self.rates().iter().all(Option::is_none)
    }
}

/// What `cost` charges to the limit of [`KEYS`] entry `kind`/`direction`: `None` when the
/// limit does not apply to it.
pub fn units(cost: Cost, kind: Kind, direction: Option<Direction>) -> Option<u64> {
    if direction.is_some_and(|d| d != cost.direction) {
        return None;
    }
    match kind {
        Kind::Iops => Some(1),
        Kind::Bandwidth if cost.bytes > 0 => Some(cost.bytes),
        Kind::Bandwidth => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nz(v: u64) -> Option<NonZeroU64> {
        NonZeroU64::new(v)
    }

    #[test]
    fn every_key_sets_its_own_limit() {
        let l = Limits::from_parameters([
            ("maxIops", "500"),
            ("maxBandwidthBytes", "1048576"),
            ("maxReadIops", "300"),
            ("maxWriteIops", "200"),
            ("maxReadBandwidthBytes", "4096"),
            ("maxWriteBandwidthBytes", "8192"),
        ])
        .unwrap();
        assert_eq!(
            l.rates(),
            [nz(500), nz(1048576), nz(300), nz(200), nz(4096), nz(8192)]
        );
        assert!(Limits::from_parameters([]).unwrap().is_unlimited());
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        for (k, v) in [
            ("maxIops", "0"),
            ("maxIops", "-5"),
            ("maxIops", "fast"),
            ("maxIops", ""),
            ("maxIops", "18446744073709551616"),
        ] {
            assert!(
                matches!(
                    Limits::from_parameters([(k, v)]),
                    Err(LimitError::BadValue { .. })
                ),
                "{k}={v}"
            );
        }
        let e = Limits::from_parameters([("iops", "5")]).unwrap_err();
        assert_eq!(e, LimitError::UnknownKey("iops".into()));
        assert!(e.to_string().contains("maxWriteBandwidthBytes"), "{e}");
    }

    #[test]
    fn costs_charge_the_limits_of_their_direction() {
        let read = Cost {
            direction: Direction::Read,
            bytes: 4096,
        };
        let flush = Cost {
            direction: Direction::Write,
            bytes: 0,
        };
        let charged = |c| KEYS.map(|(_, kind, dir)| units(c, kind, dir));
        assert_eq!(
            charged(read),
            [Some(1), Some(4096), Some(1), None, Some(4096), None]
        );
        assert_eq!(charged(flush), [Some(1), None, None, Some(1), None, None]);
    }
}
