//! Pool format features, in the ext4/ZFS manner: three sets of 64 bits in the superblock.
//!
//! - **Compatible**: a build that lacks one still opens the pool read-write (the feature only
//!   adds information an older build may ignore).
//! - **Read-only-compatible**: a build that lacks one may read the pool but must not write it (it
//!   would leave structures the feature maintains stale); the pool opens read-only.
//! - **Incompatible**: a build that lacks one cannot even read the pool; it refuses to open it.
//!
//! Format version 3 has no feature words: its pools have every set empty. A superblock with any
//! feature set is written as version 4 (the layout with the feature words, see the `superblock`
//! module), which version-3 builds refuse by its version, as ext2's revision 0 kernels refuse a
//! revision 1 superblock. A feature is only ever set by an explicit [`crate::Pool::enable_feature`]
//! and never cleared.
//!
//! [`KNOWN`] names every feature bit this source tree knows; whether this build *supports* one is
//! separate ([`Feature::supported`]), so a build can name a feature it refuses.

/// One of the three feature sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FeatureSet {
    /// Ignored by a build that lacks it.
    Compatible,
    /// A build that lacks it opens the pool read-only.
    ReadOnlyCompatible,
    /// A build that lacks it refuses the pool.
    Incompatible,
}

impl FeatureSet {
    /// The set's name as operators see it ("incompatible").
    pub fn name(self) -> &'static str {
        match self {
            FeatureSet::Compatible => "compatible",
            FeatureSet::ReadOnlyCompatible => "read-only-compatible",
            FeatureSet::Incompatible => "incompatible",
        }
    }
}

/// A feature: a bit (0..64) of one set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Feature {
    /// Its set.
    pub set: FeatureSet,
    /// Its bit in the set's 64-bit word, 0..64.
    pub bit: u8,
}

/// A feature this source tree knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownFeature {
    /// Stable name, as written in firmware manifests and messages.
    pub name: &'static str,
    /// Its set and bit.
    pub feature: Feature,
    /// Whether this build reads and writes pools that have it.
    pub supported: bool,
}

/// A test-only incompatible feature: it changes nothing on media, and only builds with the
/// `test-feature-x` cargo feature support it. The firmware tests use it to exercise an update
/// that enables an incompatible feature and a rollback across it. Bit 63, far from real ones.
pub const TEST_FEATURE_X: Feature = Feature {
    set: FeatureSet::Incompatible,
    bit: 63,
};

/// Every named feature. None is part of the current format: a pool formatted by this build has
/// no feature set (version 3).
pub const KNOWN: &[KnownFeature] = &[KnownFeature {
    name: "test-feature-x",
    feature: TEST_FEATURE_X,
    supported: cfg!(feature = "test-feature-x"),
}];

impl Feature {
    /// Its entry in [`KNOWN`], if it has one.
    pub fn known(self) -> Option<&'static KnownFeature> {
        KNOWN.iter().find(|k| k.feature == self)
    }

    /// Its name, if this source tree knows it.
    pub fn name(self) -> Option<&'static str> {
        self.known().map(|k| k.name)
    }

    /// The feature of that name.
    pub fn by_name(name: &str) -> Option<Feature> {
        KNOWN.iter().find(|k| k.name == name).map(|k| k.feature)
    }

    /// Whether this build supports it (reads and writes pools that have it).
    pub fn supported(self) -> bool {
        self.known().is_some_and(|k| k.supported)
    }

    fn mask(self) -> u64 {
        1u64 << (self.bit & 63)
    }
}

/// The three feature words of a superblock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Features {
    /// Compatible features.
    pub compatible: u64,
    /// Read-only-compatible features.
    pub read_only_compatible: u64,
    /// Incompatible features.
    pub incompatible: u64,
}

impl Features {
    /// No feature: a version-3 pool.
    pub const NONE: Features = Features {
        compatible: 0,
        read_only_compatible: 0,
        incompatible: 0,
    };

    fn word(&self, set: FeatureSet) -> u64 {
        match set {
            FeatureSet::Compatible => self.compatible,
            FeatureSet::ReadOnlyCompatible => self.read_only_compatible,
            FeatureSet::Incompatible => self.incompatible,
        }
    }

    /// Whether `feature` is set.
    pub fn contains(&self, feature: Feature) -> bool {
        self.word(feature.set) & feature.mask() != 0
    }

    /// These features and `feature`.
    #[must_use]
    pub fn with(mut self, feature: Feature) -> Features {
        let word = match feature.set {
            FeatureSet::Compatible => &mut self.compatible,
            FeatureSet::ReadOnlyCompatible => &mut self.read_only_compatible,
            FeatureSet::Incompatible => &mut self.incompatible,
        };
        *word |= feature.mask();
        self
    }

    /// Whether no feature is set.
    pub fn is_empty(&self) -> bool {
        *self == Features::NONE
    }

    /// Every feature set, compatible first, lowest bit first.
    pub fn iter(&self) -> impl Iterator<Item = Feature> + '_ {
        [
            FeatureSet::Compatible,
            FeatureSet::ReadOnlyCompatible,
            FeatureSet::Incompatible,
        ]
        .into_iter()
        .flat_map(move |set| {
            (0..64u8)
                .map(move |bit| Feature { set, bit })
                .filter(|f| self.contains(*f))
        })
    }

    /// The first feature of `set` this build does not support.
    pub fn first_unsupported(&self, set: FeatureSet) -> Option<Feature> {
        self.iter().find(|f| f.set == set && !f.supported())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_bits_and_names() {
        let f = Features::NONE.with(TEST_FEATURE_X);
        assert_eq!(f.incompatible, 1 << 63);
        assert!(f.contains(TEST_FEATURE_X));
        assert_eq!(f.iter().collect::<alloc::vec::Vec<_>>(), [TEST_FEATURE_X]);
        assert_eq!(Feature::by_name("test-feature-x"), Some(TEST_FEATURE_X));
        assert_eq!(TEST_FEATURE_X.name(), Some("test-feature-x"));
        let unknown = Feature {
            set: FeatureSet::ReadOnlyCompatible,
            bit: 5,
        };
        assert_eq!(unknown.name(), None);
        assert!(!unknown.supported());
        let f = f.with(unknown);
        assert_eq!(f.first_unsupported(FeatureSet::ReadOnlyCompatible), Some(unknown));
        assert_eq!(f.first_unsupported(FeatureSet::Compatible), None);
        assert_eq!(
            f.first_unsupported(FeatureSet::Incompatible),
            (!TEST_FEATURE_X.supported()).then_some(TEST_FEATURE_X)
        );
    }

    #[test]
    fn names_are_unique() {
        for (i, a) in KNOWN.iter().enumerate() {
            for b in &KNOWN[i + 1..] {
                assert!(a.name != b.name && a.feature != b.feature, "{a:?} / {b:?}");
            }
        }
    }
}
