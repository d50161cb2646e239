//! The pool's format features and the firmware slots: which pools this build reads (declared to
//! the firmware manager for the running slot), the pool in use (what updates and rollbacks are
//! checked against), and enabling the features this build writes, an explicit, logged step
//! taken only once the running slot is committed, never on a trial boot: a trial that fails
//! must roll back to a slot that still reads the pool.

use edgevol_core::feature::KNOWN;
use edgevol_core::{Feature, FeatureSet, Pool};
use edgevol_firmware::pool_format::{PoolFormat, PoolInUse};

use crate::firmware::Shared;
use crate::pool::PoolDevice;
use crate::state::State;

/// The pools this build reads: format versions 3 to 4 and the features it supports.
pub fn this_build_reads() -> PoolFormat {
    let mut reads = PoolFormat {
        oldest: edgevol_core::OLDEST_VERSION,
        newest: edgevol_core::VERSION_FEATURES,
        compatible: 0,
        read_only_compatible: 0,
        incompatible: 0,
    };
    for known in KNOWN.iter().filter(|k| k.supported) {
        let bit = 1u64 << known.feature.bit;
        match known.feature.set {
            FeatureSet::Compatible => reads.compatible |= bit,
            FeatureSet::ReadOnlyCompatible => reads.read_only_compatible |= bit,
            FeatureSet::Incompatible => reads.incompatible |= bit,
        }
    }
    reads
}

/// The features this build enables on its pool: every one it supports (only the test-only
/// test-feature-x exists, in builds with core's `test-feature-x` cargo feature).
pub fn wanted() -> Vec<Feature> {
    KNOWN
        .iter()
        .filter(|k| k.supported)
        .map(|k| k.feature)
        .collect()
}

/// The pool's format, as the firmware manager compares it.
pub fn in_use(pool: &Pool<PoolDevice>) -> PoolInUse {
    let f = pool.features();
    PoolInUse {
        version: pool.format_version(),
        compatible: f.compatible,
        read_only_compatible: f.read_only_compatible,
        incompatible: f.incompatible,
    }
}

/// Once the pool is open, before it is installed (so the firmware service never sees a ready
/// appliance without the pool in use): tells the firmware manager (if any) which pools the
/// running slot reads and which pool is in use, and enables the wanted features if that is
/// allowed now.
pub fn after_open(pool: &mut Pool<PoolDevice>, firmware: Option<&Shared>) {
    if let Some(fw) = firmware {
        let mut fw = fw.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = fw.describe_running_slot(&this_build_reads()) {
            tracing::warn!(error = %e, "firmware: could not record which pools this slot reads");
        }
    }
    enable_on(pool, firmware);
}

/// [`enable_on`] the installed pool: after the running slot was committed.
pub fn enable_wanted(state: &State, firmware: Option<&Shared>) -> Vec<Feature> {
    match state.lock_pool() {
        Ok(mut pool) => enable_on(&mut pool, firmware),
        Err(_) => Vec::new(),
    }
}

/// Enables every wanted feature the pool lacks, if the running slot is committed (or there are
/// no firmware slots: a development or package install), and tells the firmware manager the
/// pool in use. Returns the features enabled now.
pub fn enable_on(pool: &mut Pool<PoolDevice>, firmware: Option<&Shared>) -> Vec<Feature> {
    let committed = firmware.is_none_or(|fw| {
        fw.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .may_enable_pool_features()
    });
    let missing: Vec<Feature> = wanted()
        .into_iter()
        .filter(|f| !pool.features().contains(*f))
        .collect();
    let mut enabled = Vec::new();
    if !missing.is_empty() && !committed {
        tracing::info!(
            "pool features not enabled on a trial boot: they are, once this firmware is committed"
        );
    } else if pool.read_only().is_none() {
        for feature in missing {
            let name = crate::pool_words::feature(feature);
            match pool.enable_feature(feature) {
                Ok(_) => {
                    tracing::warn!(
                        "pool {name} enabled: firmware that does not support it can no longer open this pool"
                    );
                    enabled.push(feature);
                }
                Err(e) => tracing::error!(
                    "pool {name} not enabled: {}",
                    crate::pool_words::describe(&e)
                ),
            }
        }
    }
    if let Some(fw) = firmware {
        fw.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .set_pool_in_use(Some(in_use(pool)));
    }
    enabled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_build_reads_versions_3_and_4_and_what_it_supports() {
        let reads = this_build_reads();
        assert_eq!((reads.oldest, reads.newest), (3, 4));
        let x = edgevol_core::feature::TEST_FEATURE_X;
        assert_eq!(reads.incompatible & (1 << x.bit) != 0, x.supported());
        assert_eq!(wanted().contains(&x), x.supported());
    }

    #[test]
    fn without_firmware_slots_the_pool_in_use_is_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let state = State::new("box".into(), Default::default());
        state.set_pool(crate::pool::open(&[dir.path().join("pool.img")], true).unwrap());
        let enabled = enable_wanted(&state, None);
        assert_eq!(enabled, wanted(), "no slots to protect: enabled at once");
        let pool = state.lock_pool().unwrap();
        let in_use = in_use(&pool);
        let expect = if wanted().is_empty() { 3 } else { 4 };
        assert_eq!(in_use.version, expect);
        assert_eq!(
            this_build_reads().reads(&in_use),
            edgevol_firmware::pool_format::Readability::ReadWrite
        );
    }

    /// The firmware manager of a box whose boot partition is `dir` (laid out as image/build.sh
    /// lays it out), booted on whatever the loader picks.
    #[cfg(feature = "test-feature-x")]
    fn boot_box(dir: &std::path::Path, key: &edgevol_firmware::key::SigningKey) -> Shared {
        use edgevol_firmware::bootenv;
        use edgevol_firmware::manager::{Firmware, Identity};
        use edgevol_firmware::slots::{BootEnv, SlotId};
        if !dir.join("grubenv").exists() {
            let env = BootEnv {
                primary: SlotId::A,
                trial: None,
            };
            std::fs::write(dir.join("grubenv"), bootenv::grubenv(&env)).unwrap();
            std::fs::write(dir.join("syslinux.cfg"), bootenv::syslinux_cfg(SlotId::A)).unwrap();
            let mut ldlinux = vec![0x90u8; 4096];
            ldlinux.extend_from_slice(&bootenv::adv(None));
            std::fs::write(dir.join("ldlinux.sys"), ldlinux).unwrap();
        }
        let boot = edgevol_firmware::boot_dir::BootDir::new(dir);
        let mut env = boot.read_env().grub.unwrap();
        let running = env.trial.take().unwrap_or(env.primary);
        std::fs::write(dir.join("grubenv"), bootenv::grubenv(&env)).unwrap();
        let fw = Firmware::start(
            edgevol_firmware::dir_media::DirMedia::new(dir),
            boot,
            Identity {
                key: key.verifying_key(),
                arch: std::env::consts::ARCH.into(),
                running,
                version: format!("slot-{running}"),
            },
        )
        .unwrap();
        std::sync::Arc::new(std::sync::Mutex::new(fw))
    }

    /// The unit form of the firmware suite's check: an update that supports test-feature-x
    /// does not enable it on its trial boot, and does once committed; then a rollback to the
    /// version-3-only slot is refused.
    #[cfg(feature = "test-feature-x")]
    #[test]
    fn a_feature_is_enabled_only_once_the_slot_is_committed() {
        use edgevol_firmware::slots::SlotId;
        let x = edgevol_core::feature::TEST_FEATURE_X;
        let dir = tempfile::tempdir().unwrap();
        let boot = dir.path().join("boot");
        std::fs::create_dir_all(&boot).unwrap();
        let (key, _) = edgevol_firmware::key::SigningKey::generate().unwrap();
        let pool_path = dir.path().join("pool.img");
        // Slot A: version-3-only firmware (its slot has no pool-format record), on the pool.
        let fw = boot_box(&boot, &key);
        let pool = crate::pool::open(std::slice::from_ref(&pool_path), true).unwrap();
        fw.lock().unwrap().set_pool_in_use(Some(in_use(&pool)));
        let bundle = edgevol_firmware::bundle::build_declaring(
            &key,
            std::env::consts::ARCH,
            "2.0",
            this_build_reads(),
            b"k",
            b"i",
        )
        .unwrap();
        fw.lock().unwrap().update(&bundle).unwrap();
        drop((fw, pool));
        // The trial boot of slot B (this build): the pool stays version 3.
        let fw = boot_box(&boot, &key);
        assert!(fw.lock().unwrap().on_trial());
        let mut pool = crate::pool::open(std::slice::from_ref(&pool_path), false).unwrap();
        after_open(&mut pool, Some(&fw));
        assert_eq!(
            (pool.format_version(), pool.features().contains(x)),
            (3, false)
        );
        assert_eq!(
            fw.lock().unwrap().rollback(false).unwrap(),
            SlotId::A,
            "A still reads it"
        );
        drop((fw, pool));
        // Rolled back to A, updated again, trial again, and this time committed.
        let fw = boot_box(&boot, &key);
        let pool = crate::pool::open(std::slice::from_ref(&pool_path), false).unwrap();
        fw.lock().unwrap().set_pool_in_use(Some(in_use(&pool)));
        fw.lock().unwrap().update(&bundle).unwrap();
        drop((fw, pool));
        let fw = boot_box(&boot, &key);
        let mut pool = crate::pool::open(std::slice::from_ref(&pool_path), false).unwrap();
        after_open(&mut pool, Some(&fw));
        assert!(!pool.features().contains(x));
        fw.lock().unwrap().confirm().unwrap();
        assert_eq!(enable_on(&mut pool, Some(&fw)), [x]);
        assert_eq!(pool.format_version(), 4);
        assert_eq!(fw.lock().unwrap().pool_in_use(), Some(in_use(&pool)));
        let e = fw.lock().unwrap().rollback(false).unwrap_err();
        assert!(
            e.to_string().starts_with("slot A (version slot-A) cannot use the pool in use (the pool's format version 4 is newer than it supports (3)"),
            "{e}"
        );
        assert_eq!(enable_on(&mut pool, Some(&fw)), [], "once");
    }
}
