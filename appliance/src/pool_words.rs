//! Core's pool errors in words for operators: what the daemon prints when the pool cannot be
//! opened, and the messages of CSI statuses about the pool itself (format version, features,
//! damage). Never Rust `Debug` text: an operator reads these on a console or in `kubectl
//! describe`.

use std::sync::OnceLock;

use edgevol_core::{
    Corruption, Error, Feature, FeatureSet, Field, Limit, ObjectRef, Precondition, Problem, Range,
    Unsupported,
};

/// The version messages name as "this firmware": the running firmware's on an appliance image
/// (set once at start), else the crate's.
static FIRMWARE_VERSION: OnceLock<String> = OnceLock::new();

/// Names the running firmware's version in later messages (the first call wins: it never
/// changes while the process runs).
pub fn set_firmware_version(version: &str) {
    let _ = FIRMWARE_VERSION.set(version.to_owned());
}

fn firmware_version() -> &'static str {
    FIRMWARE_VERSION
        .get()
        .map_or(edgevol_driver::identity::VENDOR_VERSION, String::as_str)
}

/// A feature as operators see it: "incompatible feature test-feature-x (bit 63)", or its bit
/// alone when this build has no name for it.
pub fn feature(f: Feature) -> String {
    match f.name() {
        Some(name) => format!("{} feature {name} (bit {})", f.set.name(), f.bit),
        None => format!(
            "{} feature bit {} (unknown to this firmware)",
            f.set.name(),
            f.bit
        ),
    }
}

/// Why this firmware cannot open a pool, and what to do.
pub fn unsupported(u: Unsupported) -> String {
    let v = firmware_version();
    match u {
        Unsupported::VersionTooNew { found, newest } => format!(
            "pool format version {found} is newer than this firmware supports ({newest}); \
             boot the firmware slot that wrote it, or update the firmware (this firmware: version {v})"
        ),
        Unsupported::VersionTooOld { found, oldest } => format!(
            "pool format version {found} is older than this firmware reads ({oldest} and later; \
             this firmware: version {v})"
        ),
        Unsupported::Feature(f) if f.set == FeatureSet::Incompatible => format!(
            "pool uses {}, this firmware (version {v}) does not support it; boot the firmware \
             slot that enabled it, or update the firmware",
            feature(f)
        ),
        Unsupported::Feature(f) => format!(
            "this firmware (version {v}) does not support {}",
            feature(f)
        ),
    }
}

/// Why a pool mounted read-only refuses a change.
pub fn read_only(f: Feature) -> String {
    format!(
        "the pool is read-only: it uses {}, which this firmware (version {}) does not support; \
         boot the firmware slot that enabled it, or update the firmware, to change it",
        feature(f),
        firmware_version()
    )
}

/// Damaged metadata, in words.
pub fn corruption(c: Corruption) -> String {
    match c {
        Corruption::NoSuperblock => {
            "neither superblock is valid (not an edgevol pool, or both copies damaged)".to_owned()
        }
        Corruption::Geometry => "the superblock's geometry does not fit the device".to_owned(),
        Corruption::NoCheckpoint => "neither checkpoint slot holds a valid checkpoint".to_owned(),
        Corruption::Checkpoint => "the newest checkpoint's tables are inconsistent".to_owned(),
        Corruption::JournalGap(seq) => format!(
            "journal record {seq} is damaged while a later committed record is intact \
             (mounting would drop acknowledged work)"
        ),
        Corruption::Record(seq) => {
            format!("journal record {seq} passed its checksum but does not decode or apply")
        }
    }
}

fn object(o: ObjectRef) -> String {
    match o {
        ObjectRef::Volume(id) => format!("volume {}", id.0),
        ObjectRef::Snapshot(id) => format!("snapshot {}", id.0),
        ObjectRef::Group(id) => format!("volume group {}", id.0),
        ObjectRef::GroupSnapshot(id) => format!("group snapshot {}", id.0),
    }
}

/// Any core error, in words: what [`crate::pool::PoolError`] prints. The CSI mapping has its own
/// texts for the errors of operations (naming CSI ids); these name core's ids.
pub fn describe(e: &Error) -> String {
    match *e {
        Error::Unsupported(u) => unsupported(u),
        Error::ReadOnly(f) => read_only(f),
        Error::Corrupt(c) => format!("pool metadata is damaged: {}", corruption(c)),
        Error::Device(kind) => format!("storage device error: {kind}"),
        Error::NotFound(o) => format!("{} does not exist", object(o)),
        Error::AlreadyExists(o) => format!("{} exists with other arguments", object(o)),
        Error::ResourceExhausted(limit) => match limit {
            Limit::Clusters { needed, available } => {
                format!("not enough free space: {needed} clusters needed, {available} available")
            }
            Limit::Metadata => "the pool's metadata area is full".to_owned(),
            _ => "a pool limit was reached".to_owned(),
        },
        Error::OutOfRange(range) => match range {
            Range::PastEnd { size } => format!("range past the end of the volume ({size} bytes)"),
            Range::Shrink { current } => format!("volumes only grow (now {current} bytes)"),
            Range::TooLarge { max } => format!("size exceeds the maximum of {max} bytes"),
            Range::SmallerThanSource { source } => {
                format!("smaller than the source's {source} bytes")
            }
        },
        Error::FailedPrecondition(p) => match p {
            Precondition::VolumeInGroup(_) => "the volume is in a group".to_owned(),
            Precondition::VolumePublished(_) => "the volume is published".to_owned(),
            Precondition::SnapshotInGroupSnapshot(_) => {
                "the snapshot belongs to a group snapshot".to_owned()
            }
            Precondition::PublishedToOtherHost(_) => {
                "the volume is published to another host".to_owned()
            }
        },
        Error::InvalidArgument(Field::FormatOptions, Problem::Unsupported) => {
            "unsupported format options (cluster size, or a device too small for the metadata)"
                .to_owned()
        }
        Error::InvalidArgument(..) => "invalid argument".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_core::feature::TEST_FEATURE_X;

    #[test]
    fn the_words_operators_read() {
        let too_new = unsupported(Unsupported::VersionTooNew {
            found: 5,
            newest: 4,
        });
        assert!(
            too_new.starts_with("pool format version 5 is newer than this firmware supports (4)"),
            "{too_new}"
        );
        let x = unsupported(Unsupported::Feature(TEST_FEATURE_X));
        assert!(
            x.starts_with(
                "pool uses incompatible feature test-feature-x (bit 63), this firmware (version "
            ),
            "{x}"
        );
        assert!(
            x.contains("does not support it; boot the firmware slot that enabled it, or update")
        );
        let unknown = Feature {
            set: FeatureSet::ReadOnlyCompatible,
            bit: 5,
        };
        let ro = read_only(unknown);
        assert!(
            ro.starts_with("the pool is read-only: it uses read-only-compatible feature bit 5"),
            "{ro}"
        );
        for e in [
            Error::Unsupported(Unsupported::VersionTooNew {
                found: 4,
                newest: 3,
            }),
            Error::Corrupt(Corruption::JournalGap(9)),
            Error::ReadOnly(unknown),
        ] {
            let text = describe(&e);
            for debug in [
                "Unsupported(",
                "Corrupt(",
                "ReadOnly(",
                "Feature {",
                "JournalGap(",
            ] {
                assert!(!text.contains(debug), "Debug text in {text:?}");
            }
        }
    }
}
