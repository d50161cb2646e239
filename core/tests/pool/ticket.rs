//! I/O tickets hold their pins inline: requests larger than a ticket's runs are mapped across
//! repeated `begin_read` / `begin_write` calls, and `complete` releases every pin exactly once.
// Host-only test code on 64-bit machines: byte counts of test devices fit in usize.
#![allow(clippy::cast_possible_truncation)]

use crate::common;

use common::{ram_pool, read, write, CLUSTER};
use edgevol_core::*;

const CS: u64 = CLUSTER as u64;
/// More clusters than a ticket's inline runs (8) and a write call's segments (4), and more data
/// clusters (every fifth is a hole: 39) than the runs too.
const SPAN: u64 = 48;

/// A pool with volume `a` whose clusters `0..SPAN` are written (but every fifth, a hole) and
/// physically scattered: `b`'s clusters are allocated between them, so no two of `a`'s data
/// clusters merge into one run.
fn scattered() -> (Pool<RamDevice>, VolumeId) {
    let mut pool = ram_pool(2 * SPAN + SPAN + 8);
    let a = pool.create_volume(VolumeSpec::new("a", SPAN * CS)).unwrap();
    let b = pool.create_volume(VolumeSpec::new("b", SPAN * CS)).unwrap();
    for vc in 0..SPAN {
        if vc % 5 != 4 {
            write(&mut pool, a, vc * CS, &vec![vc as u8 + 1; CS as usize]).unwrap();
        }
        write(&mut pool, b, vc * CS, &vec![0xb0; CS as usize]).unwrap();
    }
    pool.flush().unwrap();
    (pool, a)
}

fn expected_a(offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len)
        .map(|o| {
            let vc = o / CS;
            if vc % 5 == 4 {
                0
            } else {
                vc as u8 + 1
            }
        })
        .collect()
}

/// Every device offset a read segment touches, one per cluster.
fn read_clusters(seg: &ReadSegment) -> Vec<u64> {
    match *seg {
        ReadSegment::Data { device_offset, len } => {
            let first = device_offset / CS;
            let last = (device_offset + len - 1) / CS;
            (first..=last).map(|c| c * CS).collect()
        }
        ReadSegment::Zero { .. } => Vec::new(),
    }
}

/// Every device offset a write segment pins: its target and its copy-on-write source.
fn write_clusters(seg: &WriteSegment) -> Vec<u64> {
    let mut v = vec![seg.device_offset / CS * CS];
    if let Prepare::Copy { from, .. } = seg.prepare {
        v.push(from);
    }
    v
}

#[test]
fn a_read_beyond_a_tickets_runs_maps_the_whole_range_across_calls_and_unpins_all() {
    let (mut pool, a) = scattered();
    let (offset, len) = (512, SPAN * CS - 1024);
    let mut out = [ReadSegment::Zero { len: 0 }; 64];
    let (mut segments, mut tickets, mut calls) = (Vec::new(), Vec::new(), 0);
    let mut done = 0;
    while done < len {
        let (n, ticket) = pool.begin_read(a, offset + done, len - done, &mut out).unwrap();
        assert!(n >= 1, "a non-empty range always maps a segment");
        let data = out[..n]
            .iter()
            .filter(|s| matches!(s, ReadSegment::Data { .. }))
            .count();
        assert!(data <= 8, "a call pins at most 8 runs");
        assert!(ticket.detachable());
        calls += 1;
        done += out[..n].iter().map(ReadSegment::len).sum::<u64>();
        segments.extend_from_slice(&out[..n]);
        tickets.push(ticket);
    }
    assert_eq!(done, len);
    // 39 data clusters scattered (plus holes) do not fit one ticket's runs.
    let data_segments = segments
        .iter()
        .filter(|s| matches!(s, ReadSegment::Data { .. }))
        .count();
    assert_eq!(data_segments, 39);
    assert_eq!(calls, 5, "the read was cut short at the ticket's runs");

    let pinned: Vec<u64> = segments.iter().flat_map(read_clusters).collect();
    assert_eq!(pinned.len(), 39);
    for &c in &pinned {
        assert_eq!(pool.pins_at(c), 1, "cluster at {c} pinned once");
    }
    // The segments read what was written.
    let mut got = Vec::new();
    for seg in &segments {
        match *seg {
            ReadSegment::Data { device_offset, len } => {
                let mut buf = vec![0; len as usize];
                let block = u64::from(common::BLOCK);
                assert_eq!(device_offset % block, 0);
                pool.device_mut().read(device_offset / block, &mut buf).unwrap();
                got.extend_from_slice(&buf);
            }
            ReadSegment::Zero { len } => got.extend(std::iter::repeat_n(0, len as usize)),
        }
    }
    assert_eq!(got, expected_a(offset, len));

    for t in tickets {
        pool.complete(t);
    }
    for &c in &pinned {
        assert_eq!(pool.pins_at(c), 0, "cluster at {c} unpinned");
    }
}

/// Writes `len` bytes at `offset` through `begin_write` with a 64-segment array, holding every
/// ticket until the end; checks each call's segments and pins, then completes them all.
fn write_across_calls(pool: &mut Pool<RamDevice>, a: VolumeId, offset: u64, len: u64) -> (Vec<WriteSegment>, bool) {
    let mut out = [WriteSegment::EMPTY; 64];
    let (mut segments, mut tickets) = (Vec::new(), Vec::new());
    let mut done = 0;
    let mut detachable = true;
    while done < len {
        let (n, ticket) = pool.begin_write(a, offset + done, len - done, &mut out).unwrap();
        let left = (offset + len - 1) / CS - (offset + done) / CS + 1;
        assert_eq!(n as u64, left.min(4), "4 segments a call at most");
        detachable &= ticket.detachable();
        done += out[..n].iter().map(|s| s.len).sum::<u64>();
        segments.extend_from_slice(&out[..n]);
        tickets.push(ticket);
    }
    assert_eq!(done, len);
    let clusters = (offset + len - 1) / CS - offset / CS + 1;
    assert_eq!(tickets.len() as u64, clusters.div_ceil(4));
    let pinned: Vec<u64> = segments.iter().flat_map(write_clusters).collect();
    for &c in &pinned {
        assert_eq!(pool.pins_at(c), 1, "cluster at {c} pinned once");
    }
    for t in tickets {
        pool.complete(t);
    }
    for &c in &pinned {
        assert_eq!(pool.pins_at(c), 0, "cluster at {c} unpinned");
    }
    assert_eq!(pool.writes_in_flight(), 0);
    (segments, detachable)
}

#[test]
fn a_write_beyond_a_tickets_runs_maps_the_whole_range_across_calls_and_unpins_all() {
    let (mut pool, a) = scattered();
    let s = pool.create_snapshot(a, "s", 0).unwrap();
    // Clusters 0..=46: both partial ends (0 and 46) are written clusters, shared with `s`.
    let (offset, len) = (512, (SPAN - 1) * CS - 1024);

    // Copy-on-write (and first writes into the holes): partial ends copy their shared source.
    let (segments, detachable) = write_across_calls(&mut pool, a, offset, len);
    assert!(!detachable);
    let copies = segments
        .iter()
        .filter(|s| matches!(s.prepare, Prepare::Copy { .. }))
        .count();
    assert_eq!(copies, 2, "both partial ends copy");
    pool.flush().unwrap();

    // In place now: every call detachable.
    let (segments, detachable) = write_across_calls(&mut pool, a, offset, len);
    assert!(detachable);
    assert!(segments.iter().all(|s| s.prepare == Prepare::None));

    // The snapshot kept the old clusters, which the copy-on-write tickets pinned as sources.
    assert_eq!(read(&mut pool, s, 0, SPAN * CS), expected_a(0, SPAN * CS));
}
