//! Golden tests of the on-media format, version 3. The format is only implicit in the code (fixed
//! little-endian headers, postcard encodings of the journal records and checkpoint tables), so
//! these tests pin it through the bytes public operations leave on core's RAM device; nothing
//! here reaches into the crate:
//!
//! - **Superblock** (72 bytes), **checkpoint header** (36 bytes), **journal frame headers** (56
//!   bytes, hard and soft, and the empty hard frame that seals soft ones): field by field from the
//!   layouts documented in `superblock.rs`, `checkpoint.rs` and `journal.rs`, and as literal hex.
//! - **Every `Record` kind**: the payload of the journal frame each operation writes, spelled out
//!   in postcard's terms (LEB128 varints, length-prefixed strings and sequences, enum variant
//!   indices in declaration order, struct fields in declaration order, `Option` as 0 / 1 + value).
//!   Reordering a variant or a field, or changing a type, changes these bytes.
//! - **The checkpoint `Tables`** of a small pool (volumes with a spec, publication, mutable
//!   parameters and map; snapshots, a group, a group snapshot), spelled out the same way.
//! - **A whole pool**: `tests/golden/pool-v3.img` (raw: a 512-byte-block device, mostly zeros,
//!   88 KiB) made by [`golden_pool`] below. This build must write it byte for byte, and must open
//!   the checked-in copy with `Pool::open` and read back its volumes, snapshots, clone, group, group
//!   snapshot and data (`map_read`), with its sealed and unsealed soft frames treated per epoch.
//!
//! A format change without a version bump fails here: pools written by the previous build would
//! no longer open, or would open as something else.
//!
//! # On a deliberate format change
//!
//! 1. Bump `VERSION` in `core/src/superblock.rs` (and the magic of any header whose layout changed).
//! 2. Regenerate the image: `EDGEVOL_REGENERATE_GOLDEN=1 cargo test -p edgevol-core --test pool
//!    golden::this_build_writes` writes `tests/golden/pool-v{VERSION}.img` (then run the whole module: the
//!    other tests read the image). Keep the older images: every later build opens each and reads
//!    it back (or, once it stops reading a version, refuses it with `Error::Unsupported`).
//!
//! Format features (version 4, the superblock's feature words) are pinned in
//! `tests/golden_features.rs`, with their own images.
//! 3. Update the expected bytes in this file by hand, and [`PINNED_VERSION`]: they are the
//!    format's documentation, so a reviewer sees every change in the diff.
// Host-only test code on 64-bit machines: byte counts of test devices fit in usize.
#![allow(clippy::cast_possible_truncation)]

use crate::common;

use std::path::PathBuf;

use common::{read, write};
use edgevol_core::*;

/// The version the bytes below describe.
const PINNED_VERSION: u32 = 3;
const BS: usize = 512;
const CS: u64 = 4096;
const UUID: [u8; 16] = *b"edgevol golden 3";
const EPOCH: Epoch = Epoch(*b"golden-epoch-v3!");
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:golden-host";
const T0: u64 = 1_700_000_000_000_000_000;
const T1: u64 = 1_700_000_000_000_000_001;

// ---- postcard, spelled out ----

/// An unsigned integer (u16/u32/u64/usize: lengths, ids, sizes, enum variant indices) as
/// postcard writes it: LEB128, 7 bits a byte, low bits first.
fn varint(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let low = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(low);
            return out;
        }
        out.push(low | 0x80);
    }
}

/// A string: its byte length as a varint, then the bytes.
fn text(s: &str) -> Vec<u8> {
    [varint(s.len() as u64), s.as_bytes().to_vec()].concat()
}

/// A sequence of `(String, String)` pairs (parameters).
fn pairs(items: &[(&str, &str)]) -> Vec<u8> {
    let mut out = varint(items.len() as u64);
    for (k, v) in items {
        out.extend(text(k));
        out.extend(text(v));
    }
    out
}

/// A `ClusterMap` (`BTreeMap<u64, u64>`): length, then key/value varints in key order.
fn cluster_map(entries: &[(u64, u64)]) -> Vec<u8> {
    let mut out = varint(entries.len() as u64);
    for &(v, p) in entries {
        out.extend(varint(v));
        out.extend(varint(p));
    }
    out
}

fn cat<const N: usize>(parts: [Vec<u8>; N]) -> Vec<u8> {
    parts.concat()
}

/// `Option::None`, and the tag of `Some` (the value follows).
const NONE: u8 = 0;
const SOME: u8 = 1;

/// `Record` variant indices, in declaration order (`core/src/record.rs`).
mod rec {
    pub const CREATE_VOLUME: u64 = 0;
    pub const DELETE_VOLUME: u64 = 1;
    pub const EXPAND_VOLUME: u64 = 2;
    pub const CREATE_SNAPSHOT: u64 = 3;
    pub const DELETE_SNAPSHOT: u64 = 4;
    pub const CREATE_GROUP: u64 = 5;
    pub const DELETE_GROUP: u64 = 6;
    pub const SET_GROUP_MEMBERS: u64 = 7;
    pub const CREATE_GROUP_SNAPSHOT: u64 = 8;
    pub const DELETE_GROUP_SNAPSHOT: u64 = 9;
    pub const PUBLISH: u64 = 10;
    pub const MODIFY_VOLUME: u64 = 11;
    pub const UNPUBLISH: u64 = 12;
    pub const MAP: u64 = 13;
    pub const UNMAP: u64 = 14;
}

/// `Provisioning` variants.
const THIN: u8 = 0;
const THICK: u8 = 1;
/// `ContentSource` variants.
const FROM_SNAPSHOT: u8 = 0;
const FROM_VOLUME: u8 = 1;
/// `AccessModes` is a newtype of u8 (bit n: CSI mode n), written as the raw byte.
const SINGLE_NODE_WRITER: u8 = 1 << 1;
const MULTI_NODE_READER_ONLY: u8 = 1 << 3;

/// A `VolumeSpec`: name, size, provisioning, parameters, source, access modes, group.
fn spec(
    name: &str,
    size: u64,
    provisioning: u8,
    params: &[(&str, &str)],
    source: Option<(u8, u64)>,
    modes: u8,
    group: Option<u64>,
) -> Vec<u8> {
    let source = match source {
        None => vec![NONE],
        Some((kind, id)) => cat([vec![SOME, kind], varint(id)]),
    };
    let group = match group {
        None => vec![NONE],
        Some(g) => cat([vec![SOME], varint(g)]),
    };
    cat([
        text(name),
        varint(size),
        vec![provisioning],
        pairs(params),
        source,
        vec![modes],
        group,
    ])
}

// ---- the fixed layouts, spelled out ----

fn le32(n: u32) -> Vec<u8> {
    n.to_le_bytes().to_vec()
}

fn le64(n: u64) -> Vec<u8> {
    n.to_le_bytes().to_vec()
}

/// Every CRC is CRC32C; journal and checkpoint CRCs are seeded with the salt, the CRC32C of the
/// pool uuid (the superblock's is not seeded).
fn salt() -> u32 {
    crc32c(&UUID)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The 72 bytes of a generation-1 superblock.
fn superblock(block_count: u64, slot_blocks: u64, journal_blocks: u64) -> Vec<u8> {
    let mut sb = cat([
        b"EDGEVOL1".to_vec(),
        le32(PINNED_VERSION),
        UUID.to_vec(),
        le64(1),
        le32(BS as u32),
        le64(block_count),
        le32(CS as u32),
        le64(slot_blocks),
        le64(journal_blocks),
    ]);
    sb.extend(le32(crc32c(&sb)));
    sb
}

/// The 36 bytes of a checkpoint header over `payload`.
fn checkpoint_header(generation: u64, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut h = cat([
        b"EVC1".to_vec(),
        le64(generation),
        le64(seq),
        le64(payload.len() as u64),
        le32(crc32c_append(salt(), payload)),
    ]);
    h.extend(le32(crc32c_append(salt(), &h)));
    h
}

/// The 56 bytes of a frame header; `epoch` is `Some` for a soft frame.
fn frame_header(seq: u64, commit_start: u64, payload: &[u8], link: u32, epoch: Option<Epoch>) -> Vec<u8> {
    let (kind, epoch) = match epoch {
        None => (0, [0; 16]),
        Some(e) => (1, e.0),
    };
    let mut h = cat([
        b"EVJ3".to_vec(),
        le64(seq),
        le64(commit_start),
        le32(payload.len() as u32),
        le32(crc32c_append(salt(), payload)),
        le32(link),
        le32(kind),
        epoch.to_vec(),
    ]);
    h.extend(le32(crc32c_append(salt(), &h)));
    h
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Walks the journal frame by frame, checking each against the bytes it should hold.
struct JournalWalk {
    /// First block of the journal.
    start: usize,
    /// Next frame's block, relative to `start`.
    pos: usize,
    seq: u64,
    link: u32,
}

impl JournalWalk {
    /// Checks that the next frame is one commit holding exactly `payload`, hard or (with an
    /// epoch) soft, with its padding zero; returns its header bytes.
    fn expect(&mut self, dev: &[u8], what: &str, payload: &[u8], epoch: Option<Epoch>) -> Vec<u8> {
        let at = (self.start + self.pos) * BS;
        let header = frame_header(self.seq, self.seq, payload, self.link, epoch);
        let got = &dev[at..at + 56];
        assert_eq!(
            hex(&dev[at + 56..at + 56 + payload.len()]),
            hex(payload),
            "{what}: the record bytes changed (payload of frame {}), a format change",
            self.seq
        );
        assert_eq!(hex(got), hex(&header), "{what}: the frame header changed");
        let blocks = (56 + payload.len()).div_ceil(BS);
        assert!(
            dev[at + 56 + payload.len()..at + blocks * BS].iter().all(|&b| b == 0),
            "{what}: frame padding is not zero"
        );
        self.pos += blocks;
        self.seq += 1;
        self.link = u32_at(got, 52);
        got.to_vec()
    }

    /// Checks that no frame follows (the journal past the last frame is as discarded: zeros).
    fn expect_end(&self, dev: &[u8]) {
        let at = (self.start + self.pos) * BS;
        assert!(
            dev[at..at + BS].iter().all(|&b| b == 0),
            "a frame nobody expected at journal block {}",
            self.pos
        );
    }
}

/// CRC32C (Castagnoli) is the checksum of every structure: pinned by its standard check value.
#[test]
fn the_checksum_is_crc32c() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(
        crc32c_append(crc32c(b"1234"), b"56789"),
        0xE306_9283,
        "append continues a CRC"
    );
    assert_eq!(salt(), 0x9151_FEBA, "the salt of UUID");
}

#[test]
fn this_file_describes_the_current_version() {
    assert_eq!(
        VERSION, PINNED_VERSION,
        "VERSION changed: update the pinned bytes of tests/pool/golden.rs and regenerate the image (see its docs)"
    );
}

// ---- superblock, checkpoint header, every record kind, frame headers ----

/// Geometry of the records pool: 32-block checkpoint slots, a 64-block journal (no checkpoint
/// during the test: every commit stays in the journal), 16 data clusters.
const SLOT_BLOCKS: u64 = 32;
const JOURNAL_BLOCKS: u64 = 64;
const RECORDS_POOL_BLOCKS: u64 = 136 + 16 * 8;

fn records_pool() -> Pool<RamDevice> {
    let options = FormatOptions {
        uuid: UUID,
        cluster_size: CS as u32,
        checkpoint_bytes: SLOT_BLOCKS * BS as u64,
        journal_bytes: JOURNAL_BLOCKS * BS as u64,
    };
    Pool::format(RamDevice::new(BS as u32, RECORDS_POOL_BLOCKS), options).unwrap()
}

fn fill(byte: u8, len: u64) -> Vec<u8> {
    vec![byte; len as usize]
}

#[test]
fn a_new_pool_has_these_superblocks_and_this_checkpoint() {
    let mut pool = records_pool();
    let dev = pool.device_mut().as_bytes().to_vec();
    let sb = superblock(RECORDS_POOL_BLOCKS, SLOT_BLOCKS, JOURNAL_BLOCKS);
    assert_eq!(
        hex(&sb),
        "45444745564f4c310300000065646765766f6c20676f6c64656e2033010000000000000000020000080100000000000000\
         100000200000000000000040000000000000005b1be6f5"
            .replace(' ', ""),
        "the expected superblock itself"
    );
    for copy in 0..2 {
        let block = &dev[copy * BS..(copy + 1) * BS];
        assert_eq!(hex(&block[..72]), hex(&sb), "superblock copy {copy}");
        assert!(
            block[72..].iter().all(|&b| b == 0),
            "superblock copy {copy}: bytes past 72"
        );
    }
    // Format checkpoints the empty tables as generation 1 (slot 1: generation parity picks it),
    // including journal sequence 0: next_id 0 and four empty maps.
    let empty_tables = cat([varint(0), varint(0), varint(0), varint(0), varint(0)]);
    let header = checkpoint_header(1, 0, &empty_tables);
    assert_eq!(
        hex(&header),
        "45564331010000000000000000000000000000000500000000000000fc1d7b3af3f831bb"
    );
    let slot1 = (2 + SLOT_BLOCKS as usize) * BS;
    assert_eq!(hex(&dev[slot1..slot1 + 36]), hex(&header), "checkpoint header");
    assert_eq!(
        hex(&dev[slot1 + BS..slot1 + BS + 5]),
        hex(&empty_tables),
        "checkpoint tables"
    );
    let slot0 = 2 * BS;
    assert!(
        dev[slot0..slot1].iter().all(|&b| b == 0),
        "slot 0 is unused until generation 2"
    );
    let journal = (2 + 2 * SLOT_BLOCKS as usize) * BS;
    assert!(dev[journal..].iter().all(|&b| b == 0), "an empty journal and data area");
}

#[test]
fn every_record_kind_has_these_bytes() {
    let mut pool = records_pool();
    let mut j = JournalWalk {
        start: 2 + 2 * SLOT_BLOCKS as usize,
        pos: 0,
        seq: 1,
        link: 0,
    };
    let dev = |pool: &mut Pool<RamDevice>| pool.device_mut().as_bytes().to_vec();

    let g = pool.create_group("grp", vec![("tier".into(), "gold".into())]).unwrap();
    assert_eq!(g, GroupId(0));
    let create_group = cat([
        varint(rec::CREATE_GROUP),
        varint(0),
        text("grp"),
        pairs(&[("tier", "gold")]),
    ]);
    assert_eq!(hex(&create_group), "05000367727001047469657204676f6c64");
    let first = j.expect(&dev(&mut pool), "CreateGroup", &create_group, None);
    assert_eq!(
        hex(&first),
        "45564a3301000000000000000100000000000000110000002add067e000000000000000000000000000000000000000000000000\
         28b6f9fc"
            .replace(' ', ""),
        "a hard frame header"
    );

    let mut a = VolumeSpec::new("vol-a", 2 * CS);
    a.provisioning = Provisioning::Thick;
    a.parameters = vec![("fs".into(), "ext4".into())];
    a.access_modes = AccessModes::EMPTY
        .with(AccessMode::SingleNodeWriter)
        .with(AccessMode::MultiNodeReaderOnly);
    a.group = Some(g);
    let a = pool.create_volume(a).unwrap();
    assert_eq!(a, VolumeId(1));
    let a_spec = spec(
        "vol-a",
        2 * CS,
        THICK,
        &[("fs", "ext4")],
        None,
        SINGLE_NODE_WRITER | MULTI_NODE_READER_ONLY,
        Some(0),
    );
    let create_a = cat([varint(rec::CREATE_VOLUME), varint(1), a_spec]);
    j.expect(
        &dev(&mut pool),
        "CreateVolume (thick, parameters, two access modes, a group)",
        &create_a,
        None,
    );

    // A data write maps cluster 0 of vol-a to data cluster 0; its record waits and goes first in
    // the frame of the next commit, the snapshot's.
    write(&mut pool, a, 0, &fill(0x11, CS)).unwrap();
    let s = pool.create_snapshot(a, "snap-a", T0).unwrap();
    assert_eq!(s, SnapshotId(2));
    let map = cat([varint(rec::MAP), varint(1), varint(0), varint(0)]);
    let create_snapshot = cat([
        varint(rec::CREATE_SNAPSHOT),
        varint(2),
        varint(1),
        text("snap-a"),
        varint(T0),
    ]);
    assert_eq!(hex(&create_snapshot), "03020106736e61702d618080a8b1e39fe7cb17");
    j.expect(
        &dev(&mut pool),
        "Map then CreateSnapshot in one frame",
        &[map, create_snapshot].concat(),
        None,
    );

    let mut c = VolumeSpec::new("clone-a", 2 * CS);
    c.source = Some(ContentSource::Snapshot(s));
    assert_eq!(pool.create_volume(c).unwrap(), VolumeId(3));
    let from_snapshot = spec(
        "clone-a",
        2 * CS,
        THIN,
        &[],
        Some((FROM_SNAPSHOT, 2)),
        SINGLE_NODE_WRITER,
        None,
    );
    j.expect(
        &dev(&mut pool),
        "CreateVolume (from a snapshot)",
        &cat([varint(rec::CREATE_VOLUME), varint(3), from_snapshot]),
        None,
    );

    let mut b = VolumeSpec::new("clone-b", 2 * CS);
    b.source = Some(ContentSource::Volume(a));
    assert_eq!(pool.create_volume(b).unwrap(), VolumeId(4));
    let from_volume = spec(
        "clone-b",
        2 * CS,
        THIN,
        &[],
        Some((FROM_VOLUME, 1)),
        SINGLE_NODE_WRITER,
        None,
    );
    j.expect(
        &dev(&mut pool),
        "CreateVolume (a clone)",
        &cat([varint(rec::CREATE_VOLUME), varint(4), from_volume]),
        None,
    );

    assert_eq!(pool.expand_volume(a, 3 * CS).unwrap(), 3 * CS);
    let expand = cat([varint(rec::EXPAND_VOLUME), varint(1), varint(3 * CS)]);
    assert_eq!(hex(&expand), "02018060");
    j.expect(&dev(&mut pool), "ExpandVolume", &expand, None);

    pool.publish(a, HOST, false).unwrap();
    j.expect(
        &dev(&mut pool),
        "Publish",
        &cat([varint(rec::PUBLISH), varint(1), text(HOST), vec![0]]),
        None,
    );

    pool.modify_volume(a, &[("iops".into(), "100".into())]).unwrap();
    let modify = cat([varint(rec::MODIFY_VOLUME), varint(1), pairs(&[("iops", "100")])]);
    j.expect(&dev(&mut pool), "ModifyVolume", &modify, None);

    pool.unpublish(a, HOST).unwrap();
    j.expect(
        &dev(&mut pool),
        "Unpublish",
        &cat([varint(rec::UNPUBLISH), varint(1), text(HOST)]),
        None,
    );

    pool.set_group_members(g, &[VolumeId(3), a]).unwrap();
    let members = cat([
        varint(rec::SET_GROUP_MEMBERS),
        varint(0),
        varint(2),
        varint(1),
        varint(3),
    ]);
    j.expect(&dev(&mut pool), "SetGroupMembers (sorted)", &members, None);

    let gs = pool.create_group_snapshot(g, "gsnap-a", T1).unwrap();
    assert_eq!(gs, GroupSnapshotId(5));
    assert_eq!(
        pool.group_snapshot(gs).unwrap().snapshots(),
        [SnapshotId(6), SnapshotId(7)]
    );
    let create_gs = cat([
        varint(rec::CREATE_GROUP_SNAPSHOT),
        varint(5),
        varint(0),
        text("gsnap-a"),
        varint(T1),
    ]);
    j.expect(&dev(&mut pool), "CreateGroupSnapshot", &create_gs, None);

    // The data path's soft commit: a frame of the epoch, then the empty hard frame a sync writes
    // to seal it.
    pool.set_epoch(EPOCH).unwrap();
    write(&mut pool, VolumeId(3), CS, &fill(0x22, CS)).unwrap();
    let ticket = pool.persist_ticket();
    pool.persist(ticket).unwrap();
    let soft_map = cat([varint(rec::MAP), varint(3), varint(1), varint(1)]);
    let soft = j.expect(&dev(&mut pool), "Map (soft frame)", &soft_map, Some(EPOCH));
    assert_eq!(
        hex(&soft),
        "45564a330c000000000000000c0000000000000004000000b32d96b1c451307101000000676f6c64656e2d65706f63682d763321\
         fd40e02e"
            .replace(' ', ""),
        "a soft frame header"
    );
    pool.sync().unwrap();
    let seal = j.expect(&dev(&mut pool), "the empty hard frame sealing soft ones", &[], None);
    assert_eq!(u32_at(&seal, 20), 0, "no payload");

    assert_eq!(pool.trim(VolumeId(3), CS, CS).unwrap(), CS);
    pool.flush().unwrap();
    j.expect(
        &dev(&mut pool),
        "Unmap",
        &cat([varint(rec::UNMAP), varint(3), varint(1)]),
        None,
    );

    pool.delete_group_snapshot(gs).unwrap();
    j.expect(
        &dev(&mut pool),
        "DeleteGroupSnapshot",
        &cat([varint(rec::DELETE_GROUP_SNAPSHOT), varint(5)]),
        None,
    );

    pool.delete_snapshot(s).unwrap();
    j.expect(
        &dev(&mut pool),
        "DeleteSnapshot",
        &cat([varint(rec::DELETE_SNAPSHOT), varint(2)]),
        None,
    );

    pool.delete_volume(VolumeId(4)).unwrap();
    j.expect(
        &dev(&mut pool),
        "DeleteVolume",
        &cat([varint(rec::DELETE_VOLUME), varint(4)]),
        None,
    );

    pool.delete_group(g).unwrap();
    j.expect(
        &dev(&mut pool),
        "DeleteGroup",
        &cat([varint(rec::DELETE_GROUP), varint(0)]),
        None,
    );
    j.expect_end(&dev(&mut pool));

    // The bytes mean what they meant: the journal replays to the same pool.
    let reopened = Pool::open(pool.into_device()).unwrap();
    assert_eq!(reopened.volumes(None).count(), 0, "the group took its members along");
    assert_eq!(reopened.snapshots(None).count(), 0);
}

// ---- the checkpoint tables ----

#[test]
fn a_checkpoint_holds_these_tables() {
    // A 2-block journal: a commit that finds it full checkpoints first. A commit of data-path
    // records only then writes no frame at all (the checkpoint holds them): that is how the last
    // write below puts everything in the checkpoint.
    let options = FormatOptions {
        uuid: UUID,
        cluster_size: CS as u32,
        checkpoint_bytes: 16 * BS as u64,
        journal_bytes: 2 * BS as u64,
    };
    let mut pool = Pool::format(RamDevice::new(BS as u32, 40 + 8 * 8), options).unwrap();
    let g = pool.create_group("g", vec![("k".into(), "v".into())]).unwrap(); // frame 1
    let mut spec_a = VolumeSpec::new("a", CS);
    spec_a.provisioning = Provisioning::Thick;
    spec_a.parameters = vec![("fs".into(), "xfs".into())];
    spec_a.group = Some(g);
    let a = pool.create_volume(spec_a).unwrap(); // frame 2
    write(&mut pool, a, 0, &fill(0x33, CS)).unwrap();
    pool.flush().unwrap(); // generation 2 (through frame 2, and the map)
    pool.publish(a, "nqn.h", true).unwrap(); // frame 3
    pool.modify_volume(a, &[("m".into(), "1".into())]).unwrap(); // frame 4
    pool.create_group_snapshot(g, "gs", 42).unwrap(); // generation 3, frame 5
    let s = pool.create_snapshot(a, "s", 43).unwrap(); // frame 6
    let mut spec_c = VolumeSpec::new("c", 2 * CS);
    spec_c.source = Some(ContentSource::Snapshot(s));
    let c = pool.create_volume(spec_c).unwrap(); // generation 4, frame 7
    write(&mut pool, c, 0, &fill(0x44, CS)).unwrap(); // copy-on-write: data cluster 1
    pool.flush().unwrap(); // frame 8
    write(&mut pool, c, CS, &fill(0x55, CS)).unwrap(); // data cluster 2
    pool.flush().unwrap(); // generation 5, through frame 8 and this map

    let tables = cat([
        varint(6), // next_id
        // volumes: BTreeMap<VolumeId, Volume>, in id order
        varint(2),
        varint(1),
        cat([
            varint(1),
            spec("a", CS, THICK, &[("fs", "xfs")], None, SINGLE_NODE_WRITER, Some(0)),
            cat([varint(1), text("nqn.h"), vec![1]]), // published: host, readonly
            pairs(&[("m", "1")]),                     // mutable parameters
            cluster_map(&[(0, 0)]),
        ]),
        varint(5),
        cat([
            varint(5),
            spec(
                "c",
                2 * CS,
                THIN,
                &[],
                Some((FROM_SNAPSHOT, 4)),
                SINGLE_NODE_WRITER,
                None,
            ),
            varint(0),
            pairs(&[]),
            cluster_map(&[(0, 1), (1, 2)]),
        ]),
        // snapshots: id, name (empty for a group snapshot's member), source, size, created_at,
        // group snapshot, map
        varint(2),
        varint(3),
        cat([
            varint(3),
            text(""),
            varint(1),
            varint(CS),
            varint(42),
            cat([vec![SOME], varint(2)]),
            cluster_map(&[(0, 0)]),
        ]),
        varint(4),
        cat([
            varint(4),
            text("s"),
            varint(1),
            varint(CS),
            varint(43),
            vec![NONE],
            cluster_map(&[(0, 0)]),
        ]),
        // groups: id, name, parameters
        varint(1),
        varint(0),
        cat([varint(0), text("g"), pairs(&[("k", "v")])]),
        // group snapshots: id, name, group, created_at, member snapshots
        varint(1),
        varint(2),
        cat([varint(2), text("gs"), varint(0), varint(42), varint(1), varint(3)]),
    ]);
    assert_eq!(
        hex(&tables),
        "06020101016180200101026673037866730002010001056e716e2e680101016d0131010000050501638040000001000402\
         0000000200010102020303000180202a0102010000040401730180202b00010000010000016701016b0176010202026773002a0103"
            .replace(' ', ""),
        "the expected tables themselves"
    );
    let dev = pool.device_mut().as_bytes();
    // Generation 5 is in slot 1 (parity), and slot 0 holds generation 4.
    let slot1 = (2 + 16) * BS;
    assert_eq!(
        hex(&dev[slot1..slot1 + 36]),
        hex(&checkpoint_header(5, 8, &tables)),
        "checkpoint header"
    );
    assert_eq!(
        hex(&dev[slot1 + BS..slot1 + BS + tables.len()]),
        hex(&tables),
        "the checkpoint tables changed: a format change"
    );
    assert!(
        dev[slot1 + BS + tables.len()..slot1 + 2 * BS].iter().all(|&b| b == 0),
        "payload padding"
    );
    assert_eq!(u64_at(&dev[2 * BS..], 4), 4, "generation 4 in slot 0");
    // The journal restarted after the checkpoint: empty.
    assert!(
        dev[34 * BS..36 * BS].iter().all(|&b| b == 0),
        "no frame after generation 5"
    );
    // And the tables mean what they meant.
    let pool = Pool::open(pool.into_device()).unwrap();
    assert_eq!(pool.volume(c).unwrap().mapped_clusters(), 2);
    assert_eq!(pool.volume(a).unwrap().publications().len(), 1);
}

// ---- the golden image ----

/// Geometry of the golden pool: 512-byte blocks, 4 KiB clusters, 16-block checkpoint slots (blocks
/// 2..18 and 18..34), an 8-block journal (34..42: the generator's commits wrap it once, so the image
/// holds a checkpoint with content and a journal after it), 16 data clusters from block 48: 176
/// blocks, 88 KiB.
const GOLDEN_BLOCKS: u64 = 48 + 16 * 8;
const GOLDEN_JOURNAL: std::ops::Range<usize> = 34..42;

fn golden_path(version: u32) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/pool-v{version}.img"))
}

/// Data written by the generator: `n` names the write.
fn pattern(n: u8, len: u64) -> Vec<u8> {
    (0..len).map(|i| n ^ (i % 251) as u8).collect()
}

/// The generator of `tests/golden/pool-v{VERSION}.img`: a pool with a group of two volumes (one
/// thick and published, with mutable parameters), a snapshot, a clone of it, a group snapshot,
/// data written before and after the snapshot (copy-on-write), a trim, an expansion, a soft frame
/// sealed by a sync and a trailing unsealed soft frame of [`EPOCH`]. Deterministic: core has no
/// clock or RNG, and the uuid and times are fixed.
fn golden_pool() -> RamDevice {
    let options = FormatOptions {
        uuid: UUID,
        cluster_size: CS as u32,
        checkpoint_bytes: 16 * BS as u64,
        journal_bytes: (GOLDEN_JOURNAL.len() * BS) as u64,
    };
    let mut pool = Pool::format(RamDevice::new(BS as u32, GOLDEN_BLOCKS), options).unwrap();
    let g = pool
        .create_group("golden-group", vec![("replication".into(), "none".into())])
        .unwrap();
    let mut spec_a = VolumeSpec::new("vol-a", 4 * CS);
    spec_a.parameters = vec![("fs".into(), "ext4".into())];
    spec_a.group = Some(g);
    let a = pool.create_volume(spec_a).unwrap();
    write(&mut pool, a, 0, &pattern(1, CS)).unwrap();
    write(&mut pool, a, 2 * CS + 3 * BS as u64, &pattern(2, BS as u64)).unwrap();
    pool.flush().unwrap();
    let s = pool.create_snapshot(a, "snap-a", T0).unwrap();
    write(&mut pool, a, 0, &pattern(3, 1024)).unwrap();
    let mut spec_c = VolumeSpec::new("clone-a", 4 * CS);
    spec_c.source = Some(ContentSource::Snapshot(s));
    let c = pool.create_volume(spec_c).unwrap();
    write(&mut pool, c, CS, &pattern(4, CS)).unwrap();
    let mut spec_t = VolumeSpec::new("vol-thick", 2 * CS);
    spec_t.provisioning = Provisioning::Thick;
    let t = pool.create_volume(spec_t).unwrap();
    pool.publish(t, HOST, false).unwrap();
    pool.modify_volume(t, &[("qos".into(), "gold".into())]).unwrap();
    pool.set_group_members(g, &[a, t]).unwrap();
    pool.create_group_snapshot(g, "gsnap-a", T1).unwrap();
    pool.expand_volume(c, 5 * CS).unwrap();
    write(&mut pool, t, CS, &pattern(5, CS)).unwrap();
    pool.trim(c, 0, CS).unwrap();
    pool.set_epoch(EPOCH).unwrap();
    write(&mut pool, a, CS, &pattern(6, CS)).unwrap();
    let ticket = pool.persist_ticket();
    pool.persist(ticket).unwrap();
    pool.sync().unwrap();
    write(&mut pool, c, 2 * CS, &pattern(7, CS)).unwrap();
    let ticket = pool.persist_ticket();
    pool.persist(ticket).unwrap();
    assert!(pool.needs_sync(), "the generator leaves an unsealed soft frame");
    pool.into_device()
}

/// The checked-in image of this version, or a failure saying how to make it.
fn checked_in_image() -> RamDevice {
    let path = golden_path(VERSION);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}. A new VERSION needs its golden image: EDGEVOL_REGENERATE_GOLDEN=1 cargo test -p edgevol-core --test pool golden::this_build_writes",
            path.display()
        )
    });
    assert_eq!(bytes.len() % BS, 0, "{}: not whole blocks", path.display());
    let mut dev = RamDevice::new(BS as u32, (bytes.len() / BS) as u64);
    dev.as_bytes_mut().copy_from_slice(&bytes);
    dev
}

#[test]
fn this_build_writes_the_golden_image_byte_for_byte() {
    let image = golden_pool();
    let path = golden_path(VERSION);
    if std::env::var("EDGEVOL_REGENERATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, image.as_bytes()).unwrap();
        println!("regenerated {}", path.display());
    }
    let golden = checked_in_image();
    if golden.as_bytes() == image.as_bytes() {
        return;
    }
    // Say where: superblocks, checkpoint slots, journal or data.
    let regions = [
        ("superblocks", 0, 2),
        ("checkpoint slot 0", 2, 18),
        ("checkpoint slot 1", 18, 34),
        ("journal", GOLDEN_JOURNAL.start, GOLDEN_JOURNAL.end),
        ("data", GOLDEN_JOURNAL.end, GOLDEN_BLOCKS as usize),
    ];
    let mut report = Vec::new();
    for (name, from, to) in regions {
        let (a, b) = (
            &golden.as_bytes()[from * BS..to * BS],
            &image.as_bytes()[from * BS..(to * BS).min(image.as_bytes().len())],
        );
        if let Some(i) = a.iter().zip(b).position(|(x, y)| x != y) {
            report.push(format!("{name}: first difference at device byte {}", from * BS + i));
        }
    }
    panic!(
        "this build writes another on-media format than {} ({} vs {} bytes): {report:?}.\n\
         Unintended: find what changed the encoding. Deliberate: bump VERSION and regenerate (tests/pool/golden.rs docs).",
        path.display(),
        image.as_bytes().len(),
        golden.as_bytes().len()
    );
}

#[test]
fn the_golden_image_has_a_checkpoint_with_content_and_a_journal_after_it() {
    let golden = checked_in_image();
    let dev = golden.as_bytes();
    let slot = |i: usize| &dev[(2 + 16 * i) * BS..(2 + 16 * i) * BS + 36];
    let generations: Vec<u64> = (0..2).map(|i| u64_at(slot(i), 4)).collect();
    assert_eq!(generations, [2, 1], "one checkpoint since format's");
    let newest = slot(usize::from(generations[1] > generations[0]));
    assert!(
        u64_at(newest, 20) > 5,
        "the newest checkpoint holds tables with content"
    );
    let journal = &dev[GOLDEN_JOURNAL.start * BS..GOLDEN_JOURNAL.end * BS];
    assert_eq!(&journal[..4], b"EVJ3", "a frame right after the checkpoint");
    let kinds: Vec<u32> = journal
        .chunks(BS)
        .filter(|b| &b[..4] == b"EVJ3")
        .map(|b| u32_at(b, 32))
        .collect();
    assert!(
        kinds.contains(&0) && kinds.contains(&1),
        "hard and soft frames: {kinds:?}"
    );
    assert_eq!(kinds.last(), Some(&1), "an unsealed soft tail");
}

/// Reads the whole image (volume or snapshot) through `map_read`.
fn content<D: BlockDevice>(pool: &mut Pool<D>, image: impl Into<ImageId> + Copy, size: u64) -> Vec<u8> {
    read(pool, image, 0, size)
}

/// Expected content of `clusters` clusters: the given (offset, bytes) pieces over zeros.
fn expected(clusters: u64, pieces: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut out = vec![0; (clusters * CS) as usize];
    for (at, bytes) in pieces {
        out[*at as usize..*at as usize + bytes.len()].copy_from_slice(bytes);
    }
    out
}

#[test]
fn the_golden_image_opens_and_reads_back_what_was_written() {
    let mut pool = Pool::open(checked_in_image()).expect("the golden image of this version opens");
    let vol =
        |pool: &Pool<RamDevice>, name: &str| pool.volume_by_name(name).unwrap_or_else(|| panic!("{name}")).clone();
    let a = vol(&pool, "vol-a");
    let c = vol(&pool, "clone-a");
    let t = vol(&pool, "vol-thick");
    assert_eq!(pool.volume_count(), 3);
    assert_eq!(
        (a.size(), a.provisioning(), a.parameters()),
        (
            4 * CS,
            Provisioning::Thin,
            &[("fs".to_string(), "ext4".to_string())][..]
        )
    );
    assert_eq!((t.size(), t.provisioning()), (2 * CS, Provisioning::Thick));
    assert_eq!(
        t.publications(),
        [Publication {
            host: HOST.into(),
            readonly: false
        }]
    );
    assert_eq!(t.mutable_parameters(), [("qos".to_string(), "gold".to_string())]);
    assert_eq!(t.access_modes(), AccessModes::EMPTY.with(AccessMode::SingleNodeWriter));
    let g = pool.group_by_name("golden-group").unwrap().clone();
    assert_eq!(g.parameters(), [("replication".to_string(), "none".to_string())]);
    assert_eq!((a.group(), t.group(), c.group()), (Some(g.id()), Some(g.id()), None));
    assert_eq!(
        pool.group_members(g.id()).unwrap().collect::<Vec<_>>(),
        [a.id(), t.id()]
    );
    let s = pool.snapshot_by_name("snap-a").unwrap().clone();
    assert_eq!(
        (s.source_volume(), s.size(), s.created_at(), s.group_snapshot()),
        (a.id(), 4 * CS, T0, None)
    );
    assert_eq!((c.size(), c.source()), (5 * CS, Some(ContentSource::Snapshot(s.id()))));
    let gs = pool.group_snapshot_by_name("gsnap-a").unwrap().clone();
    assert_eq!((gs.group(), gs.created_at(), gs.snapshots().len()), (g.id(), T1, 2));
    let members: Vec<Snapshot> = gs
        .snapshots()
        .iter()
        .map(|&id| pool.snapshot(id).unwrap().clone())
        .collect();
    assert_eq!(
        members.iter().map(Snapshot::source_volume).collect::<Vec<_>>(),
        [a.id(), t.id()]
    );
    assert!(members
        .iter()
        .all(|m| m.name().is_empty() && m.group_snapshot() == Some(gs.id())));
    assert_eq!(pool.snapshots(None).count(), 3);

    let a_at_snapshot = expected(
        4,
        &[(0, pattern(1, CS)), (2 * CS + 3 * BS as u64, pattern(2, BS as u64))],
    );
    let a_before_soft = expected(
        4,
        &[
            (0, pattern(1, CS)),
            (0, pattern(3, 1024)),
            (2 * CS + 3 * BS as u64, pattern(2, BS as u64)),
        ],
    );
    let mut a_now = a_before_soft.clone();
    a_now[CS as usize..2 * CS as usize].copy_from_slice(&pattern(6, CS));
    assert!(
        content(&mut pool, s.id(), 4 * CS) == a_at_snapshot,
        "snap-a: the data before the copy-on-write"
    );
    assert!(
        content(&mut pool, members[0].id(), 4 * CS) == a_before_soft,
        "the group snapshot of vol-a"
    );
    assert!(
        content(&mut pool, members[1].id(), 2 * CS) == expected(2, &[]),
        "the group snapshot of vol-thick"
    );
    assert!(
        content(&mut pool, a.id(), 4 * CS) == a_now,
        "vol-a, with its sealed soft write"
    );
    assert!(
        content(&mut pool, t.id(), 2 * CS) == expected(2, &[(CS, pattern(5, CS))]),
        "vol-thick"
    );
    let mut clone = expected(
        5,
        &[(2 * CS + 3 * BS as u64, pattern(2, BS as u64)), (CS, pattern(4, CS))],
    );
    assert!(
        content(&mut pool, c.id(), 5 * CS) == clone,
        "clone-a: trimmed, written, expanded; no unsealed write"
    );
    common::check_accounting(&pool);

    // In the epoch that wrote it, the unsealed soft frame is replayed too.
    let mut pool = Pool::open_with(checked_in_image(), OpenOptions { epoch: Some(EPOCH) }).unwrap();
    clone[2 * CS as usize..3 * CS as usize].copy_from_slice(&pattern(7, CS));
    assert!(
        content(&mut pool, c.id(), 5 * CS) == clone,
        "clone-a with the process-crash tail"
    );
    common::check_accounting(&pool);
}

#[test]
fn pools_of_versions_this_build_does_not_read_are_refused_as_such() {
    // The golden image stamped with a version below and above the range this build reads (both
    // superblock copies, CRC redone): refused as unsupported, never misread and never called
    // corrupt. (Bytes 0..72 keep their layout in every version, CRC included: see
    // `superblock.rs`.)
    let cases = [
        (
            OLDEST_VERSION - 1,
            Unsupported::VersionTooOld {
                found: OLDEST_VERSION - 1,
                oldest: OLDEST_VERSION,
            },
        ),
        (
            VERSION_FEATURES + 1,
            Unsupported::VersionTooNew {
                found: VERSION_FEATURES + 1,
                newest: VERSION_FEATURES,
            },
        ),
    ];
    for (version, unsupported) in cases {
        let mut dev = checked_in_image();
        for copy in 0..2 {
            let sb = &mut dev.as_bytes_mut()[copy * BS..copy * BS + 72];
            sb[8..12].copy_from_slice(&version.to_le_bytes());
            let crc = crc32c(&sb[..68]);
            sb[68..72].copy_from_slice(&crc.to_le_bytes());
        }
        assert_eq!(
            Pool::probe(&mut dev).err(),
            Some(Error::Unsupported(unsupported)),
            "version {version}"
        );
        assert_eq!(
            Pool::open(dev).err(),
            Some(Error::Unsupported(unsupported)),
            "version {version}"
        );
    }
    // Every golden image kept beside this one's is opened by `tests/golden_features.rs`
    // (version 4) and the tests above (version 3).
}
