//! Golden tests of format features (the `feature` module): the version-4 superblock that carries
//! them, the image of a pool with one enabled, and what a build does with features it lacks.
//!
//! - **The version-4 superblock** (100 bytes): field by field from the layout in
//!   `superblock.rs`, for the checked-in image `tests/golden/pool-v4-test-feature-x.img`: the
//!   version-3 golden image (`tests/pool/golden.rs`) opened in its epoch and given the test-only
//!   incompatible feature `test-feature-x` ([`Pool::enable_feature`]). Only builds with core's
//!   `test-feature-x` cargo feature write or read it; every other build must refuse it by name.
//!   `cargo test -p edgevol-core --features test-feature-x --test golden_features` runs the
//!   other half (regenerate with `EDGEVOL_REGENERATE_GOLDEN=1` added).
//! - **Features this build lacks**, on the version-3 golden image given feature words here by
//!   hand (the layout spelled out, CRCs redone): an incompatible one is refused, a
//!   read-only-compatible one mounts the pool read-only and nothing is written, a compatible one
//!   is ignored.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::path::PathBuf;

use common::{read, write};
use edgevol_core::*;

const BS: usize = 512;
const CS: u64 = 4096;
const EPOCH: Epoch = Epoch(*b"golden-epoch-v3!");
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:golden-host";

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

fn image(name: &str) -> RamDevice {
    let bytes = std::fs::read(golden(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut dev = RamDevice::new(BS as u32, (bytes.len() / BS) as u64);
    dev.as_bytes_mut().copy_from_slice(&bytes);
    dev
}

const V3: &str = "pool-v3.img";
const V4_TEST_FEATURE_X: &str = "pool-v4-test-feature-x.img";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Gives both superblocks of `dev` these feature words, as version 4 (generation kept): the
/// layout of `superblock.rs`, spelled out.
fn with_features(mut dev: RamDevice, features: Features) -> RamDevice {
    for copy in 0..2 {
        let sb = &mut dev.as_bytes_mut()[copy * BS..copy * BS + 100];
        sb[8..12].copy_from_slice(&4u32.to_le_bytes());
        let crc = crc32c(&sb[..68]);
        sb[68..72].copy_from_slice(&crc.to_le_bytes());
        sb[72..80].copy_from_slice(&features.compatible.to_le_bytes());
        sb[80..88].copy_from_slice(&features.read_only_compatible.to_le_bytes());
        sb[88..96].copy_from_slice(&features.incompatible.to_le_bytes());
        let crc = crc32c(&sb[..96]);
        sb[96..100].copy_from_slice(&crc.to_le_bytes());
    }
    dev
}

fn unknown(set: FeatureSet) -> Feature {
    Feature { set, bit: 5 }
}

/// Everything a pool holds, as comparable text: volumes (with their content), snapshots (with
/// theirs), groups, group snapshots.
fn contents<D: BlockDevice>(pool: &mut Pool<D>) -> Vec<String> {
    let mut out = Vec::new();
    let volumes: Vec<Volume> = pool.volumes(None).cloned().collect();
    for v in volumes {
        let data = read(pool, v.id(), 0, v.size());
        out.push(format!(
            "volume {} {:?} {} {:?} {:?} {:?} {:?} {:?} crc {:08x}",
            v.name(),
            v.id(),
            v.size(),
            v.provisioning(),
            v.parameters(),
            v.publications(),
            v.mutable_parameters(),
            v.group(),
            crc32c(&data)
        ));
    }
    let snapshots: Vec<Snapshot> = pool.snapshots(None).cloned().collect();
    for s in snapshots {
        let data = read(pool, s.id(), 0, s.size());
        out.push(format!(
            "snapshot {:?} {:?} {:?} {} crc {:08x}",
            s.name(),
            s.id(),
            s.source_volume(),
            s.created_at(),
            crc32c(&data)
        ));
    }
    out.extend(
        pool.groups(None)
            .map(|g| format!("group {} {:?}", g.name(), g.parameters())),
    );
    out.extend(
        pool.group_snapshots(None)
            .map(|g| format!("group snapshot {} {:?}", g.name(), g.snapshots())),
    );
    assert!(out.len() >= 8, "the golden pool's objects: {out:?}");
    out
}

/// What the version-3 image holds, read in its epoch (its soft tail included).
fn v3_contents() -> Vec<String> {
    let mut pool = Pool::open_with(image(V3), OpenOptions { epoch: Some(EPOCH) }).unwrap();
    contents(&mut pool)
}

#[test]
fn the_feature_superblock_has_these_bytes() {
    let dev = image(V4_TEST_FEATURE_X);
    let v3 = image(V3);
    // The shared prefix as version 3 had it, with version 4, generation 2 (one rewrite since
    // format), its CRC; then the three words: compatible, read-only-compatible, incompatible
    // (bit 63: test-feature-x), and the CRC of bytes 0..96.
    let mut sb = v3.as_bytes()[..68].to_vec();
    sb[8..12].copy_from_slice(&4u32.to_le_bytes());
    sb[28..36].copy_from_slice(&2u64.to_le_bytes());
    sb.extend(crc32c(&sb).to_le_bytes());
    sb.extend(0u64.to_le_bytes());
    sb.extend(0u64.to_le_bytes());
    sb.extend((1u64 << 63).to_le_bytes());
    sb.extend(crc32c(&sb).to_le_bytes());
    assert_eq!(
        hex(&sb),
        "45444745564f4c310400000065646765766f6c20676f6c64656e2033020000000000000000020000b00000000000000000\
         1000001000000000000000080000000000000095fb21c4000000000000000000000000000000000000000000000080\
         11fc3f75"
            .replace(' ', ""),
        "the expected superblock itself"
    );
    for copy in 0..2 {
        let block = &dev.as_bytes()[copy * BS..(copy + 1) * BS];
        assert_eq!(hex(&block[..100]), hex(&sb), "superblock copy {copy}");
        assert!(block[100..].iter().all(|&b| b == 0), "copy {copy}: bytes past 100");
    }
    assert_eq!(TEST_FEATURE_X_NAME, feature::TEST_FEATURE_X.name().unwrap());
}

const TEST_FEATURE_X_NAME: &str = "test-feature-x";

#[test]
fn an_unknown_incompatible_feature_is_refused_by_its_bit() {
    let f = unknown(FeatureSet::Incompatible);
    let mut dev = with_features(image(V3), Features::NONE.with(f));
    let refused = Some(Error::Unsupported(Unsupported::Feature(f)));
    assert_eq!(Pool::probe(&mut dev).err(), refused);
    refused_untouched(&mut dev, refused);
}

/// `Pool::open` of `dev` fails with `refused`, and leaves every byte as it was.
fn refused_untouched(dev: &mut RamDevice, refused: Option<Error>) {
    let before = dev.as_bytes().to_vec();
    assert_eq!(Pool::open(&mut *dev).err(), refused);
    assert!(dev.as_bytes() == before.as_slice(), "a refused pool is never written");
}

#[test]
fn an_unknown_read_only_compatible_feature_mounts_read_only_and_writes_nothing() {
    let f = unknown(FeatureSet::ReadOnlyCompatible);
    let dev = with_features(image(V3), Features::NONE.with(f));
    let before = dev.as_bytes().to_vec();
    let mut pool = Pool::open_with(dev, OpenOptions { epoch: Some(EPOCH) }).unwrap();
    assert_eq!(pool.read_only(), Some(f));
    assert_eq!(pool.features(), Features::NONE.with(f));
    assert_eq!(pool.format_version(), 4);
    assert_eq!(contents(&mut pool), v3_contents(), "reads what the pool holds");
    let ro = Err(Error::ReadOnly(f));
    let a = pool.volume_by_name("vol-a").unwrap().id();
    let t = pool.volume_by_name("vol-thick").unwrap().id();
    let s = pool.snapshot_by_name("snap-a").unwrap().id();
    let g = pool.group_by_name("golden-group").unwrap().id();
    assert_eq!(pool.create_volume(VolumeSpec::new("new", CS)).map(|_| ()), ro);
    assert_eq!(pool.delete_volume(a), ro);
    assert_eq!(pool.expand_volume(a, 8 * CS).map(|_| ()), ro);
    assert_eq!(pool.publish(a, HOST, true), ro);
    assert_eq!(pool.unpublish(t, HOST), ro);
    assert_eq!(pool.modify_volume(t, &[("qos".into(), "x".into())]), ro);
    assert_eq!(pool.create_snapshot(a, "s2", 1).map(|_| ()), ro);
    assert_eq!(pool.delete_snapshot(s), ro);
    assert_eq!(pool.create_group("g2", vec![]).map(|_| ()), ro);
    assert_eq!(pool.set_group_members(g, &[a]), ro);
    assert_eq!(write(&mut pool, a, 0, &[1; BS]), ro);
    assert_eq!(pool.trim(a, 0, CS).map(|_| ()), ro);
    let mut segs = [WriteSegment::EMPTY; 4];
    assert_eq!(pool.begin_write(t, 0, CS, &mut segs).map(|_| ()), ro);
    assert_eq!(pool.enable_feature(feature::TEST_FEATURE_X).map(|_| ()), ro);
    // Nothing of this mount's is pending: flush and the periodic sync succeed and write nothing.
    assert!(!pool.needs_sync());
    pool.sync().unwrap();
    pool.flush().unwrap();
    let ticket = pool.persist_ticket();
    pool.persist(ticket).unwrap();
    assert_eq!(contents(&mut pool), v3_contents(), "unchanged");
    assert!(
        pool.into_device().as_bytes() == before.as_slice(),
        "a read-only mount writes nothing (not even the seal of the soft tail)"
    );
}

#[test]
fn an_unknown_compatible_feature_is_ignored_and_kept() {
    let f = unknown(FeatureSet::Compatible);
    let dev = with_features(image(V3), Features::NONE.with(f));
    let mut pool = Pool::open_with(dev, OpenOptions { epoch: Some(EPOCH) }).unwrap();
    assert_eq!(pool.read_only(), None);
    assert_eq!(contents(&mut pool), v3_contents());
    let a = pool.volume_by_name("vol-a").unwrap().id();
    write(&mut pool, a, 0, &[9; BS]).unwrap();
    pool.create_snapshot(a, "after", 5).unwrap();
    pool.flush().unwrap();
    let mut pool = Pool::open(pool.into_device()).unwrap();
    assert_eq!(pool.features(), Features::NONE.with(f), "the word is kept");
    assert_eq!(read(&mut pool, a, 0, BS as u64), vec![9; BS]);
}

#[cfg(not(feature = "test-feature-x"))]
#[test]
fn a_build_without_test_feature_x_refuses_its_image_by_name() {
    let refused = Some(Error::Unsupported(Unsupported::Feature(feature::TEST_FEATURE_X)));
    let mut dev = image(V4_TEST_FEATURE_X);
    assert_eq!(Pool::probe(&mut dev).err(), refused);
    refused_untouched(&mut dev, refused);
    assert_eq!(
        feature::TEST_FEATURE_X.name(),
        Some(TEST_FEATURE_X_NAME),
        "named, though refused"
    );
    // Nor may it enable the feature on a pool.
    let mut pool = Pool::open(image(V3)).unwrap();
    assert_eq!(
        pool.enable_feature(feature::TEST_FEATURE_X),
        Err(Error::Unsupported(Unsupported::Feature(feature::TEST_FEATURE_X)))
    );
    assert_eq!((pool.format_version(), pool.features()), (3, Features::NONE));
}

/// The generator of [`V4_TEST_FEATURE_X`]: the version-3 golden image opened in its epoch, then
/// given test-feature-x.
#[cfg(feature = "test-feature-x")]
fn v4_image() -> RamDevice {
    let mut pool = Pool::open_with(image(V3), OpenOptions { epoch: Some(EPOCH) }).unwrap();
    assert_eq!(pool.enable_feature(feature::TEST_FEATURE_X), Ok(true));
    assert_eq!(pool.enable_feature(feature::TEST_FEATURE_X), Ok(false), "once");
    pool.into_device()
}

#[cfg(feature = "test-feature-x")]
#[test]
fn this_build_writes_the_test_feature_x_image_and_reads_it_back() {
    let written = v4_image();
    if std::env::var("EDGEVOL_REGENERATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::write(golden(V4_TEST_FEATURE_X), written.as_bytes()).unwrap();
    }
    assert!(
        written.as_bytes() == image(V4_TEST_FEATURE_X).as_bytes(),
        "this build enables test-feature-x differently from the checked-in image"
    );
    let mut pool = Pool::open(image(V4_TEST_FEATURE_X)).unwrap();
    assert_eq!(pool.features(), Features::NONE.with(feature::TEST_FEATURE_X));
    assert_eq!((pool.format_version(), pool.read_only()), (4, None));
    assert_eq!(contents(&mut pool), v3_contents());
    common::check_accounting(&pool);
    let a = pool.volume_by_name("vol-a").unwrap().id();
    write(&mut pool, a, 0, &[7; BS]).unwrap();
    pool.flush().unwrap();
    let mut pool = Pool::open(pool.into_device()).unwrap();
    assert_eq!(read(&mut pool, a, 0, BS as u64), vec![7; BS]);
}

#[cfg(feature = "test-feature-x")]
#[test]
fn enabling_a_feature_survives_a_cut_between_the_two_copies() {
    let old = image(V3);
    let new = v4_image();
    // Copy 0 is rewritten first: a cut after it leaves copy 1 at the old generation; one during
    // it leaves copy 0 unreadable. Either way open sees one whole superblock, old or new.
    let mut cut_after_copy_0 = new.as_bytes().to_vec();
    cut_after_copy_0[BS..2 * BS].copy_from_slice(&old.as_bytes()[BS..2 * BS]);
    let mut cut_during_copy_0 = old.as_bytes().to_vec();
    cut_during_copy_0[..BS].fill(0);
    for (bytes, enabled) in [(cut_after_copy_0, true), (cut_during_copy_0, false)] {
        let mut dev = RamDevice::new(BS as u32, (bytes.len() / BS) as u64);
        dev.as_bytes_mut().copy_from_slice(&bytes);
        let pool = Pool::open(dev).unwrap();
        assert_eq!(pool.features().contains(feature::TEST_FEATURE_X), enabled);
    }
}
