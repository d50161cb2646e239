//! Behaviour of the public API, case by case.
// Host-only test code on 64-bit machines: byte counts of test devices fit in usize.
#![allow(clippy::cast_possible_truncation)]

use crate::common;

use common::{check_accounting, ram_pool, read, write, CLUSTER};
use edgevol_core::*;

const CS: u64 = CLUSTER as u64;

fn reopen(pool: Pool<RamDevice>) -> Pool<RamDevice> {
    Pool::open(pool.into_device()).unwrap()
}

#[test]
fn thin_volume_allocates_on_first_write_and_survives_reopen() {
    let mut pool = ram_pool(64);
    let v = pool.create_volume(VolumeSpec::new("pvc-a", 3 * CS - 100)).unwrap();
    assert_eq!(pool.volume(v).unwrap().size(), 3 * CS);
    assert_eq!(pool.capacity().used, 0);
    assert_eq!(read(&mut pool, v, 0, 3 * CS), vec![0; 3 * CS as usize]);
    write(&mut pool, v, CS + 512, &[7; 1024]).unwrap();
    assert_eq!(pool.capacity().used, CS);
    let mut expect = vec![0u8; 3 * CS as usize];
    expect[CS as usize + 512..CS as usize + 1536].fill(7);
    assert_eq!(read(&mut pool, v, 0, 3 * CS), expect);
    pool.flush().unwrap();
    let mut pool = reopen(pool);
    assert_eq!(read(&mut pool, v, 0, 3 * CS), expect);
    check_accounting(&pool);
}

#[test]
fn unflushed_allocations_are_lost_on_crash_flushed_ones_kept() {
    let mut pool = ram_pool(64);
    let v = pool.create_volume(VolumeSpec::new("v", 4 * CS)).unwrap();
    write(&mut pool, v, 0, &[1; 512]).unwrap();
    pool.flush().unwrap();
    write(&mut pool, v, CS, &[2; 512]).unwrap();
    let mut pool = reopen(pool); // no flush: a crash
    assert_eq!(read(&mut pool, v, 0, 512), vec![1; 512]);
    assert_eq!(read(&mut pool, v, CS, 512), vec![0; 512]);
    check_accounting(&pool);
}

#[test]
fn snapshot_freezes_and_copy_on_write_tells_the_copy() {
    let mut pool = ram_pool(64);
    let v = pool.create_volume(VolumeSpec::new("v", 2 * CS)).unwrap();
    write(&mut pool, v, 0, &[1; 4096]).unwrap();
    let s = pool.create_snapshot(v, "snap", 42).unwrap();
    assert_eq!(pool.create_snapshot(v, "snap", 43), Ok(s), "idempotent");
    let mut segs = [WriteSegment::EMPTY; 2];
    let n = pool.map_write(v, 512, 512, &mut segs).unwrap();
    assert_eq!(n, 1);
    let Prepare::Copy { from, to } = segs[0].prepare else {
        panic!("expected a copy: {:?}", segs[0])
    };
    assert_ne!(from, to);
    assert_eq!(segs[0].device_offset, to + 512);
    // Do what the data path does: the copy, then the write.
    let dev = pool.device_mut();
    let mut cluster = vec![0u8; CS as usize];
    dev.read(from / 512, &mut cluster).unwrap();
    dev.write(to / 512, &cluster).unwrap();
    dev.write(segs[0].device_offset / 512, &[9; 512]).unwrap();
    assert_eq!(read(&mut pool, s, 0, 4096), vec![1; 4096]);
    let mut expect = vec![1u8; 4096];
    expect[512..1024].fill(9);
    assert_eq!(read(&mut pool, v, 0, 4096), expect);
    assert!(matches!(pool.map_write(v, 0, 1, &mut segs), Ok(1)));
    assert_eq!(
        segs[0].prepare,
        Prepare::None,
        "second write to an owned cluster is in place"
    );
    // The volume goes, the snapshot stays readable; the last reference frees the cluster.
    pool.delete_volume(v).unwrap();
    assert_eq!(read(&mut pool, s, 0, 4096), vec![1; 4096]);
    let used = pool.capacity().used;
    pool.delete_snapshot(s).unwrap();
    assert_eq!(pool.capacity().used, used - CS);
    assert_eq!(pool.snapshot(s).err(), Some(Error::NotFound(ObjectRef::Snapshot(s))));
    check_accounting(&pool);
}

#[test]
fn clones_share_clusters_and_diverge() {
    let mut pool = ram_pool(64);
    let v = pool.create_volume(VolumeSpec::new("v", CS)).unwrap();
    write(&mut pool, v, 0, &[3; 4096]).unwrap();
    let s = pool.create_snapshot(v, "s", 0).unwrap();
    let mut spec = VolumeSpec::new("from-snap", 2 * CS);
    spec.source = Some(ContentSource::Snapshot(s));
    let c1 = pool.create_volume(spec).unwrap();
    let mut spec = VolumeSpec::new("clone", CS);
    spec.source = Some(ContentSource::Volume(v));
    let c2 = pool.create_volume(spec).unwrap();
    assert_eq!(pool.capacity().used, CS, "all share one cluster");
    write(&mut pool, c2, 0, &[4; 512]).unwrap();
    assert_eq!(read(&mut pool, c1, 0, 512), vec![3; 512]);
    assert_eq!(read(&mut pool, c2, 0, 512), vec![4; 512]);
    assert_eq!(read(&mut pool, c1, CS, 512), vec![0; 512]);
    let mut small = VolumeSpec::new("small", CS);
    small.source = Some(ContentSource::Volume(c1));
    assert_eq!(
        pool.create_volume(small),
        Err(Error::OutOfRange(Range::SmallerThanSource { source: 2 * CS }))
    );
    check_accounting(&pool);
}

#[test]
fn thick_reserves_and_expand_only_grows() {
    let mut pool = ram_pool(8);
    let mut spec = VolumeSpec::new("thick", 6 * CS);
    spec.provisioning = Provisioning::Thick;
    let t = pool.create_volume(spec).unwrap();
    assert_eq!(pool.capacity().reserved, 6 * CS);
    let mut spec = VolumeSpec::new("too-big", 3 * CS);
    spec.provisioning = Provisioning::Thick;
    assert_eq!(
        pool.create_volume(spec),
        Err(Error::ResourceExhausted(Limit::Clusters {
            needed: 3,
            available: 2
        }))
    );
    write(&mut pool, t, 0, &[1; 512]).unwrap();
    assert_eq!((pool.capacity().reserved, pool.capacity().used), (5 * CS, CS));
    assert_eq!(
        pool.expand_volume(t, CS),
        Err(Error::OutOfRange(Range::Shrink { current: 6 * CS }))
    );
    assert_eq!(pool.expand_volume(t, 6 * CS), Ok(6 * CS));
    assert_eq!(
        pool.expand_volume(t, 9 * CS),
        Err(Error::ResourceExhausted(Limit::Clusters {
            needed: 3,
            available: 2
        }))
    );
    assert_eq!(pool.expand_volume(t, 8 * CS), Ok(8 * CS));
    assert_eq!(pool.capacity().free, 0);
    let v = pool.create_volume(VolumeSpec::new("thin", CS)).unwrap();
    assert!(matches!(
        write(&mut pool, v, 0, &[1; 512]),
        Err(Error::ResourceExhausted(Limit::Clusters { .. }))
    ));
    assert_eq!(pool.trim(t, 0, 8 * CS), Ok(CS));
    assert_eq!(pool.capacity().reserved, 8 * CS);
    check_accounting(&pool);
    pool.flush().unwrap();
    let pool = reopen(pool);
    check_accounting(&pool);
    assert_eq!(pool.volume(t).unwrap().size(), 8 * CS);
}

#[test]
fn names_parameters_and_idempotency() {
    let mut pool = ram_pool(8);
    let mut spec = VolumeSpec::new("v", CS);
    spec.parameters = vec![("b".into(), "2".into()), ("a".into(), "1".into())];
    let v = pool.create_volume(spec.clone()).unwrap();
    assert_eq!(pool.create_volume(spec.clone()), Ok(v));
    assert_eq!(pool.volume(v).unwrap().parameters()[0].0, "a");
    spec.size = 2 * CS;
    assert_eq!(
        pool.create_volume(spec),
        Err(Error::AlreadyExists(ObjectRef::Volume(v)))
    );
    assert_eq!(
        pool.create_volume(VolumeSpec::new("bad\u{1b}name", CS)),
        Err(Error::InvalidArgument(Field::Name, Problem::ControlCharacter))
    );
    assert_eq!(
        pool.create_volume(VolumeSpec::new("z", 0)),
        Err(Error::InvalidArgument(Field::Size, Problem::Empty))
    );
    assert_eq!(
        pool.create_volume(VolumeSpec::new("huge", limits::MAX_VOLUME_SIZE + 1)),
        Err(Error::OutOfRange(Range::TooLarge {
            max: limits::MAX_VOLUME_SIZE
        }))
    );
    assert_eq!(
        pool.volume(VolumeId(999)).err(),
        Some(Error::NotFound(ObjectRef::Volume(VolumeId(999))))
    );
    assert_eq!(
        pool.map_read(v, CS, 1).err(),
        Some(Error::OutOfRange(Range::PastEnd { size: CS }))
    );
}

#[test]
fn publish_is_persistent_idempotent_and_single_node_enforced() {
    let mut pool = ram_pool(8);
    let v = pool.create_volume(VolumeSpec::new("v", CS)).unwrap();
    let host = "nqn.2014-08.org.nvmexpress:uuid:1";
    pool.publish(v, host, false).unwrap();
    pool.publish(v, host, false).unwrap();
    assert_eq!(
        pool.publish(v, host, true),
        Err(Error::AlreadyExists(ObjectRef::Volume(v)))
    );
    assert_eq!(
        pool.publish(v, "nqn.other", false),
        Err(Error::FailedPrecondition(Precondition::PublishedToOtherHost(v)))
    );
    assert_eq!(
        pool.delete_volume(v),
        Err(Error::FailedPrecondition(Precondition::VolumePublished(v)))
    );
    let mut pool = reopen(pool);
    assert_eq!(
        pool.volume(v).unwrap().publications(),
        [Publication {
            host: host.into(),
            readonly: false
        }]
    );
    pool.unpublish(v, host).unwrap();
    pool.unpublish(v, host).unwrap();
    pool.delete_volume(v).unwrap();
    let mut spec = VolumeSpec::new("multi", CS);
    spec.access_modes = AccessModes::EMPTY.with(AccessMode::MultiNodeMultiWriter);
    let m = pool.create_volume(spec).unwrap();
    for i in 0..limits::MAX_PUBLISHED_HOSTS {
        pool.publish(m, &format!("nqn.host{i}"), false).unwrap();
    }
    assert_eq!(
        pool.publish(m, "nqn.one-more", true),
        Err(Error::ResourceExhausted(Limit::PublishedHosts))
    );
    // Many readers, one writer: without MULTI_NODE_MULTI_WRITER a second writer is refused.
    let mut spec = VolumeSpec::new("readers", CS);
    spec.access_modes = AccessModes::EMPTY.with(AccessMode::MultiNodeSingleWriter);
    let r = pool.create_volume(spec).unwrap();
    pool.publish(r, "nqn.reader1", true).unwrap();
    pool.publish(r, "nqn.writer", false).unwrap();
    pool.publish(r, "nqn.reader2", true).unwrap();
    assert_eq!(
        pool.publish(r, "nqn.writer2", false),
        Err(Error::FailedPrecondition(Precondition::PublishedToOtherHost(r)))
    );
    let mut pool = reopen(pool);
    let hosts: Vec<(&str, bool)> = pool
        .volume(r)
        .unwrap()
        .publications()
        .iter()
        .map(|p| (p.host.as_str(), p.readonly))
        .collect();
    assert_eq!(
        hosts,
        [("nqn.reader1", true), ("nqn.writer", false), ("nqn.reader2", true)]
    );
    pool.unpublish(r, "nqn.writer").unwrap();
    pool.publish(r, "nqn.writer2", false).unwrap();
}

#[test]
fn groups_follow_the_volume_group_proposal() {
    let mut pool = ram_pool(64);
    let g = pool.create_group("g", vec![]).unwrap();
    assert_eq!(pool.create_group("g", vec![]), Ok(g));
    let mut spec = VolumeSpec::new("a", CS);
    spec.group = Some(g);
    let a = pool.create_volume(spec).unwrap();
    let b = pool.create_volume(VolumeSpec::new("b", CS)).unwrap();
    let c = pool.create_volume(VolumeSpec::new("c", CS)).unwrap();
    pool.set_group_members(g, &[a, b]).unwrap();
    assert_eq!(
        pool.delete_volume(a),
        Err(Error::FailedPrecondition(Precondition::VolumeInGroup(g)))
    );
    let g2 = pool.create_group("g2", vec![]).unwrap();
    assert_eq!(
        pool.set_group_members(g2, &[a]),
        Err(Error::InvalidArgument(Field::Members, Problem::InOtherGroup(g)))
    );
    write(&mut pool, a, 0, &[1; 512]).unwrap();
    write(&mut pool, b, 0, &[2; 512]).unwrap();
    let gs = pool.create_group_snapshot(g, "gs", 5).unwrap();
    let snaps = pool.group_snapshot(gs).unwrap().snapshots().to_vec();
    assert_eq!(snaps.len(), 2);
    assert_eq!(
        pool.delete_snapshot(snaps[0]),
        Err(Error::FailedPrecondition(Precondition::SnapshotInGroupSnapshot(gs)))
    );
    assert_eq!(
        pool.create_group_snapshot(g2, "empty", 0),
        Err(Error::InvalidArgument(Field::Members, Problem::Empty))
    );
    // Membership change: b leaves, c joins.
    pool.set_group_members(g, &[a, c]).unwrap();
    assert_eq!(pool.volume(b).unwrap().group(), None);
    let mut pool = reopen(pool);
    assert_eq!(pool.group_members(g).unwrap().collect::<Vec<_>>(), [a, c]);
    assert_eq!(read(&mut pool, snaps[1], 0, 512), vec![2; 512]);
    // Deleting the group deletes its members, not former members or snapshots.
    pool.delete_group(g).unwrap();
    assert!(pool.volume(a).is_err() && pool.volume(c).is_err() && pool.volume(b).is_ok());
    assert_eq!(read(&mut pool, snaps[0], 0, 512), vec![1; 512]);
    pool.delete_group_snapshot(gs).unwrap();
    assert!(pool.snapshot(snaps[0]).is_err());
    check_accounting(&pool);
}

#[test]
fn listing_is_ordered_and_paginates_by_id() {
    let mut pool = ram_pool(8);
    let ids: Vec<VolumeId> = (0..5)
        .map(|i| pool.create_volume(VolumeSpec::new(format!("v{i}"), CS)).unwrap())
        .collect();
    let page: Vec<VolumeId> = pool.volumes(None).take(2).map(Volume::id).collect();
    assert_eq!(page, ids[..2]);
    let rest: Vec<VolumeId> = pool.volumes(Some(page[1])).map(Volume::id).collect();
    assert_eq!(rest, ids[2..]);
}

#[test]
fn reads_merge_contiguous_clusters_without_allocating() {
    let mut pool = ram_pool(16);
    let v = pool.create_volume(VolumeSpec::new("v", 4 * CS)).unwrap();
    write(&mut pool, v, 0, &vec![5; 2 * CS as usize]).unwrap();
    let segs: Vec<ReadSegment> = pool.map_read(v, 0, 4 * CS).unwrap().collect();
    assert_eq!(segs.len(), 2, "{segs:?}");
    assert!(matches!(segs[0], ReadSegment::Data { len, .. } if len == 2 * CS));
    assert_eq!(segs[1], ReadSegment::Zero { len: 2 * CS });
}

#[test]
fn mutable_parameters_merge_persist_and_are_checked() {
    let mut pool = ram_pool(8);
    let v = pool.create_volume(VolumeSpec::new("qos", CS)).unwrap();
    let kv = |k: &str, val: &str| (k.to_string(), val.to_string());
    pool.modify_volume(v, &[kv("maxIops", "100"), kv("maxBandwidthBytes", "1000")])
        .unwrap();
    pool.modify_volume(v, &[kv("maxIops", "200")]).unwrap();
    let mut pool = reopen(pool);
    assert_eq!(
        pool.volume(v).unwrap().mutable_parameters(),
        [kv("maxBandwidthBytes", "1000"), kv("maxIops", "200")]
    );
    // The empty value removes a key (and removing an absent one changes nothing).
    pool.modify_volume(v, &[kv("maxIops", ""), kv("maxReadIops", "")])
        .unwrap();
    let mut pool = reopen(pool);
    assert_eq!(
        pool.volume(v).unwrap().mutable_parameters(),
        [kv("maxBandwidthBytes", "1000")]
    );
    pool.modify_volume(v, &[kv("maxIops", "200")]).unwrap();
    assert_eq!(
        pool.modify_volume(v, &[kv("k", &"x".repeat(5000))]),
        Err(Error::InvalidArgument(
            Field::Parameters,
            Problem::TooLong { max: 4096 }
        ))
    );
    assert_eq!(
        pool.modify_volume(VolumeId(999), &[]),
        Err(Error::NotFound(ObjectRef::Volume(VolumeId(999))))
    );
    assert_eq!(
        pool.volume(v).unwrap().mutable_parameters().len(),
        2,
        "a refused change changes nothing"
    );
}
