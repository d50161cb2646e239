//! The pool: format, open (recovery), and the commit path every mutation goes through.

use alloc::vec;
use alloc::vec::Vec;

use crate::checkpoint::{self, CheckpointHeader};
use crate::cluster::Capacity;
use crate::crc::crc32c;
use crate::device::{BlockDevice, DeviceError, DeviceErrorKind};
use crate::error::{Corruption, Error, Limit, Result};
use crate::journal::{self, encode_frame, frame_blocks, FrameHeader};
use crate::record::Record;
use crate::state::{State, Tables};
use crate::superblock::{self, Geometry, Superblock};

/// How to lay out a new pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatOptions {
    /// Identity of the pool; must differ from any earlier pool on the device (core has no RNG).
    pub uuid: [u8; 16],
    /// Allocation unit: a power of two from 4 KiB to 64 MiB, at least the block size.
    pub cluster_size: u32,
    /// Bytes per checkpoint slot (two slots); 0 picks 4 MiB + 16 bytes per data cluster.
    pub checkpoint_bytes: u64,
    /// Bytes of journal; 0 picks 8 MiB.
    pub journal_bytes: u64,
}

impl FormatOptions {
    /// Default metadata sizing for `cluster_size`.
    pub fn new(uuid: [u8; 16], cluster_size: u32) -> Self {
        Self {
            uuid,
            cluster_size,
            checkpoint_bytes: 0,
            journal_bytes: 0,
        }
    }

    fn geometry(&self, block_size: u32, block_count: u64) -> Result<Geometry> {
        let bs = u64::from(block_size);
        let clusters = block_count.saturating_mul(bs) / u64::from(self.cluster_size.max(1));
        let pick = |given: u64, default: u64| if given == 0 { default } else { given };
        let ckpt = pick(self.checkpoint_bytes, (4 << 20) + 16 * clusters);
        let journal = pick(self.journal_bytes, 8 << 20);
        let geo = Geometry {
            block_size,
            block_count,
            cluster_size: self.cluster_size,
            slot_blocks: ckpt.div_ceil(bs),
            journal_blocks: journal.div_ceil(bs),
        };
        geo.validate().map(|()| geo)
    }
}

/// A mounted pool on device `D`. All methods are synchronous and do I/O only through `D`.
#[derive(Debug)]
pub struct Pool<D: BlockDevice> {
    pub(crate) dev: D,
    pub(crate) geo: Geometry,
    uuid: [u8; 16],
    salt: u32,
    pub(crate) state: State,
    /// Next journal sequence number.
    seq: u64,
    /// Next free block of the journal, relative to its start.
    journal_pos: u64,
    ckpt_gen: u64,
    /// Bytes the tables may take when next checkpointed (an upper estimate).
    meta_estimate: u64,
    /// Data-path records (allocations, trims) not yet durable.
    pub(crate) pending: Vec<Record>,
    /// Data writes were mapped since the last device flush.
    pub(crate) data_dirty: bool,
    failed: Option<DeviceErrorKind>,
    /// Write tickets not completed yet (`Pool::begin_write`).
    pub(crate) writes_in_flight: u32,
    /// How snapshots wait for detached writes (`Pool::set_quiesce`).
    pub(crate) quiesce: Option<alloc::boxed::Box<dyn crate::map::Quiesce>>,
}

/// Frames of one commit, ready to write.
struct Encoded {
    bytes: Vec<u8>,
    payload: u64,
    next_seq: u64,
}

pub(crate) fn dev_err<E: DeviceError>(e: E) -> Error {
    Error::Device(e.kind())
}

impl<D: BlockDevice> Pool<D> {
    /// Writes a new, empty pool over the whole device and mounts it. Everything on the device is
    /// lost. Durable when it returns.
    pub fn format(mut dev: D, options: FormatOptions) -> Result<Self> {
        let geo = options.geometry(dev.block_size(), dev.block_count())?;
        let sb = Superblock {
            uuid: options.uuid,
            generation: 1,
            geo,
        };
        let mut block = vec![0u8; geo.block_usize()];
        sb.encode(&mut block);
        // Discarding the metadata area first lets erase-before-write media accept the writes; the
        // salt keeps anything a discard leaves behind from validating.
        dev.discard(0, geo.journal_start() + geo.journal_blocks)
            .map_err(dev_err)?;
        dev.write(0, &block).map_err(dev_err)?;
        dev.write(1, &block).map_err(dev_err)?;
        let state = State::load(Tables::default(), data_clusters(&geo)?, u64::from(geo.cluster_size))
            .ok_or(Error::Corrupt(Corruption::Checkpoint))?;
        let mut pool = Self::mounted(dev, sb, state, 0, 1);
        pool.checkpoint()?;
        Ok(pool)
    }

    /// Mounts a pool: picks a valid superblock, the newest valid checkpoint, and replays the journal
    /// up to its torn tail. Refuses (`Error::Corrupt`) when acknowledged metadata cannot be
    /// recovered; never trusts a byte whose CRC it has not checked.
    pub fn open(mut dev: D) -> Result<Self> {
        let sb = read_superblock(&mut dev, true)?;
        let geo = sb.geo;
        if geo.block_size != dev.block_size() || geo.block_count > dev.block_count() {
            return Err(Error::Corrupt(Corruption::Geometry));
        }
        let salt = crc32c(&sb.uuid);
        let clusters = data_clusters(&geo)?;
        let mut block = vec![0u8; geo.block_usize()];
        let mut headers = Vec::new();
        for slot in 0..2 {
            dev.read(geo.slot_start(slot), &mut block).map_err(dev_err)?;
            match CheckpointHeader::decode(salt, &block) {
                Some(h) if h.generation % 2 == slot => headers.push(h),
                Some(_) => log::warn!("checkpoint slot {slot}: generation in the wrong slot, ignored"),
                None => {}
            }
        }
        headers.sort_by_key(|h| core::cmp::Reverse(h.generation));
        let mut last_err = Error::Corrupt(Corruption::NoCheckpoint);
        for h in headers {
            match read_checkpoint(&mut dev, &geo, salt, &h, clusters) {
                Ok(state) => {
                    let mut pool = Self::mounted(dev, sb, state, h.generation, h.seq + 1);
                    pool.replay()?;
                    pool.discard_journal_tail()?;
                    return Ok(pool);
                }
                Err(e) => {
                    log::warn!(
                        "checkpoint generation {} unusable ({e:?}), trying the other slot",
                        h.generation
                    );
                    last_err = e;
                }
            }
        }
        Err(last_err)
    }

    fn mounted(dev: D, sb: Superblock, state: State, ckpt_gen: u64, seq: u64) -> Self {
        Self {
            dev,
            geo: sb.geo,
            uuid: sb.uuid,
            salt: crc32c(&sb.uuid),
            state,
            seq,
            journal_pos: 0,
            ckpt_gen,
            meta_estimate: 0,
            pending: Vec::new(),
            data_dirty: false,
            failed: None,
            writes_in_flight: 0,
            quiesce: None,
        }
    }

    /// Applies the journal after the checkpoint, frame by frame, until the first frame that does
    /// not validate. That frame must be the torn tail: if a later frame of a later commit is
    /// intact, the bad one was acknowledged and damaged since, and mounting would lose it.
    fn replay(&mut self) -> Result<()> {
        let bs = self.geo.block_usize();
        let mut buf = vec![0u8; bs];
        let mut replayed = 0u64;
        while self.journal_pos < self.geo.journal_blocks {
            let Some(frame) = self.read_frame(self.journal_pos, &mut buf)? else {
                break;
            };
            if frame.seq != self.seq {
                if frame.seq > self.seq {
                    return Err(Error::Corrupt(Corruption::JournalGap(self.seq)));
                }
                break; // a frame from before the checkpoint: the end
            }
            let mut rest = &buf[journal::HEADER_LEN..journal::HEADER_LEN + frame.payload_len as usize];
            while !rest.is_empty() {
                let (rec, tail) = postcard::take_from_bytes::<Record>(rest)
                    .map_err(|_| Error::Corrupt(Corruption::Record(frame.seq)))?;
                self.state
                    .validate(&rec)
                    .map_err(|_| Error::Corrupt(Corruption::Record(frame.seq)))?;
                self.state.apply(rec);
                rest = tail;
            }
            self.state.alloc.release_pending();
            self.journal_pos += frame_blocks(frame.payload_len as usize, bs);
            self.meta_estimate += u64::from(frame.payload_len);
            self.seq += 1;
            replayed += 1;
        }
        // Anything valid past the end must belong to a commit older than the one that ended it.
        let mut pos = self.journal_pos + 1;
        while pos < self.geo.journal_blocks {
            if let Some(h) = self.read_frame(pos, &mut buf)? {
                if h.commit_start > self.seq {
                    log::error!("journal: record {} damaged, later record {} intact", self.seq, h.seq);
                    return Err(Error::Corrupt(Corruption::JournalGap(self.seq)));
                }
            }
            pos += 1;
        }
        if replayed > 0 {
            log::info!("journal: replayed {replayed} frames, next sequence {}", self.seq);
        }
        Ok(())
    }

    /// Discards the journal past the replayed tail: only torn or superseded frames live there
    /// (`replay` has just checked that no later commit does), and the next commits append there.
    fn discard_journal_tail(&mut self) -> Result<()> {
        let rest = self.geo.journal_blocks - self.journal_pos;
        if rest > 0 {
            let at = self.geo.journal_start() + self.journal_pos;
            self.dev.discard(at, rest).map_err(dev_err)?;
        }
        Ok(())
    }

    /// Reads the frame at journal block `pos` into `buf` if its header and payload validate.
    fn read_frame(&mut self, pos: u64, buf: &mut Vec<u8>) -> Result<Option<FrameHeader>> {
        let bs = self.geo.block_usize();
        let start = self.geo.journal_start();
        buf.resize(bs, 0);
        self.dev.read(start + pos, &mut buf[..bs]).map_err(dev_err)?;
        let Some(h) = FrameHeader::decode(self.salt, buf) else {
            return Ok(None);
        };
        let blocks = frame_blocks(h.payload_len as usize, bs);
        if blocks > self.geo.journal_blocks - pos {
            return Ok(None);
        }
        // Frames are shorter than the journal, whose size `Geometry::validate` bounds to u32.
        let len = usize::try_from(blocks).map_err(|_| Error::Corrupt(Corruption::Geometry))? * bs;
        buf.resize(len, 0);
        if blocks > 1 {
            self.dev.read(start + pos + 1, &mut buf[bs..len]).map_err(dev_err)?;
        }
        let payload = &buf[journal::HEADER_LEN..journal::HEADER_LEN + h.payload_len as usize];
        Ok(h.payload_ok(self.salt, payload).then_some(h))
    }

    /// The device failure that stopped the pool, if any: after it the pool refuses work until it
    /// is reopened (what reached the medium is unknown).
    pub fn failure(&self) -> Option<DeviceErrorKind> {
        self.failed
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        match self.failed {
            Some(kind) => Err(Error::Device(kind)),
            None => Ok(()),
        }
    }

    /// Refuses operations that grow the tables once a checkpoint might no longer fit with room to
    /// spare: deletions must always remain possible.
    pub(crate) fn check_metadata_room(&self, growth: u64) -> Result<()> {
        if self.meta_estimate + growth > self.slot_capacity() / 2 {
            Err(Error::ResourceExhausted(Limit::Metadata))
        } else {
            Ok(())
        }
    }

    fn slot_capacity(&self) -> u64 {
        self.geo.bytes(self.geo.slot_blocks - 1)
    }

    /// Validates `rec`, makes it durable with every pending data-path record, then applies it.
    /// `growth` estimates how much the tables grow beyond the record itself.
    pub(crate) fn run(&mut self, rec: Record, growth: u64) -> Result<()> {
        self.check_usable()?;
        self.state.validate(&rec)?;
        if rec.shares_volume_clusters() {
            self.quiesce_writes();
        }
        self.commit(Some(&rec), growth)?;
        self.state.apply(rec);
        self.state.alloc.release_pending();
        Ok(())
    }

    /// The commit protocol. After a device error the pool refuses further work: what reached the
    /// medium is unknown until reopened.
    pub(crate) fn commit(&mut self, op: Option<&Record>, growth: u64) -> Result<()> {
        let result = self.commit_inner(op, growth);
        if let Err(Error::Device(kind)) = result {
            self.failed = Some(kind);
        }
        result
    }

    fn commit_inner(&mut self, op: Option<&Record>, growth: u64) -> Result<()> {
        if self.data_dirty {
            // Data first: a mapping must never become durable before the data it points at.
            self.dev.flush().map_err(dev_err)?;
            self.data_dirty = false;
        }
        if op.is_none() && self.pending.is_empty() {
            return Ok(());
        }
        let bs = self.geo.block_usize();
        let mut enc = self.encode_frames(op)?;
        if (enc.bytes.len() / bs) as u64 > self.geo.journal_blocks - self.journal_pos {
            self.checkpoint()?;
            enc = self.encode_frames(op)?;
            if (enc.bytes.len() / bs) as u64 > self.geo.journal_blocks {
                return Err(Error::ResourceExhausted(Limit::Metadata));
            }
        }
        // The blocks ahead of `journal_pos` were discarded when this pass of the journal began
        // (after a checkpoint, or past the tail at open): appends never rewrite a block in
        // place, and a commit costs one write and one flush.
        let at = self.geo.journal_start() + self.journal_pos;
        let blocks = (enc.bytes.len() / bs) as u64;
        self.dev.write(at, &enc.bytes).map_err(dev_err)?;
        self.dev.flush().map_err(dev_err)?;
        self.journal_pos += blocks;
        self.seq = enc.next_seq;
        self.meta_estimate += enc.payload + growth;
        self.pending.clear();
        Ok(())
    }

    /// Encodes pending records then `op` into frames numbered from `self.seq`, the op always in
    /// the last frame so an operation is never split. Pure: nothing counts as written yet.
    fn encode_frames(&self, op: Option<&Record>) -> Result<Encoded> {
        let bs = self.geo.block_usize();
        let max_payload = payload_len(self.geo.bytes(self.geo.journal_blocks) / 4);
        let too_big = Error::ResourceExhausted(Limit::Metadata);
        let mut enc = Encoded {
            bytes: Vec::new(),
            payload: 0,
            next_seq: self.seq,
        };
        let mut payload = Vec::new();
        let emit = |enc: &mut Encoded, payload: &[u8]| {
            encode_frame(&mut enc.bytes, self.salt, enc.next_seq, self.seq, payload, bs);
            enc.next_seq += 1;
            enc.payload += payload.len() as u64;
        };
        for rec in self.pending.iter().chain(op) {
            let before = payload.len();
            payload = postcard::to_extend(rec, payload).map_err(|_| too_big)?;
            if payload.len() > max_payload && before > 0 {
                emit(&mut enc, &payload[..before]);
                payload.drain(..before);
            }
            if payload.len() > max_payload {
                return Err(too_big);
            }
        }
        if !payload.is_empty() {
            emit(&mut enc, &payload);
        }
        Ok(enc)
    }

    /// Writes the tables to the inactive slot (payload, flush, header, flush) and restarts the
    /// journal. Pending data-path records are part of the tables, so they are dropped.
    fn checkpoint(&mut self) -> Result<()> {
        let payload = postcard::to_allocvec(&self.state.t).map_err(|_| Error::ResourceExhausted(Limit::Metadata))?;
        let len = payload.len() as u64;
        if len > self.slot_capacity() {
            return Err(Error::ResourceExhausted(Limit::Metadata));
        }
        let generation = self.ckpt_gen + 1;
        let start = self.geo.slot_start(generation % 2);
        let bs = self.geo.block_usize();
        let mut buf = payload;
        buf.resize(buf.len().next_multiple_of(bs), 0);
        let header = CheckpointHeader {
            generation,
            seq: self.seq - 1,
            payload_len: len,
            payload_crc: crate::crc::crc32c_append(self.salt, &buf[..payload_len(len)]),
        };
        self.dev.discard(start, self.geo.slot_blocks).map_err(dev_err)?;
        if !buf.is_empty() {
            self.dev.write(start + 1, &buf).map_err(dev_err)?;
        }
        self.dev.flush().map_err(dev_err)?;
        let mut block = vec![0u8; bs];
        header.encode(self.salt, &mut block);
        self.dev.write(start, &block).map_err(dev_err)?;
        self.dev.flush().map_err(dev_err)?;
        self.ckpt_gen = generation;
        self.journal_pos = 0;
        self.meta_estimate = len;
        self.pending.clear();
        // A new pass of the journal starts: everything in it is older than the checkpoint now
        // durable (replay tells it apart by sequence number whatever a discard leaves behind).
        // One discard per pass instead of one per commit; erase-before-write media need it.
        self.dev
            .discard(self.geo.journal_start(), self.geo.journal_blocks)
            .map_err(dev_err)?;
        Ok(())
    }

    /// Capacity in bytes: `free + used + reserved == total`.
    pub fn capacity(&self) -> Capacity {
        self.state.alloc.capacity(u64::from(self.geo.cluster_size))
    }

    /// Cluster size in bytes.
    pub fn cluster_size(&self) -> u32 {
        self.geo.cluster_size
    }

    /// The pool's uuid.
    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// Byte offset of data cluster 0 on the device.
    pub fn data_offset(&self) -> u64 {
        self.geo.bytes(self.geo.data_start().unwrap_or(0))
    }

    /// The device, for the data path's reads and writes at the offsets the mapping API returns.
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.dev
    }

    /// Unmounts without flushing and returns the device. Call [`Pool::flush`] first to keep
    /// data-path allocations.
    pub fn into_device(self) -> D {
        self.dev
    }
}

fn payload_len(len: u64) -> usize {
    usize::try_from(len).unwrap_or(usize::MAX)
}

fn data_clusters(geo: &Geometry) -> Result<usize> {
    geo.data_clusters()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or(Error::Corrupt(Corruption::Geometry))
}

/// The valid superblock copy with the highest generation. `warn`: log each invalid copy (on
/// open a damaged copy is news; on a probe of a device that may be blank it is noise).
pub(crate) fn read_superblock<D: BlockDevice>(dev: &mut D, warn: bool) -> Result<Superblock> {
    let bs = usize::try_from(dev.block_size()).map_err(|_| Error::Corrupt(Corruption::Geometry))?;
    if bs < superblock::LEN || dev.block_count() < 2 {
        return Err(Error::Corrupt(Corruption::NoSuperblock));
    }
    let mut block = vec![0u8; bs];
    let mut best: Option<Superblock> = None;
    let mut version_err = None;
    for copy in 0..2 {
        dev.read(copy, &mut block).map_err(dev_err)?;
        match Superblock::decode(&block) {
            Ok(Some(sb)) if best.is_none_or(|b| sb.generation > b.generation) => best = Some(sb),
            Ok(Some(_)) => {}
            Ok(None) if warn => log::warn!("superblock copy {copy} invalid"),
            Ok(None) => {}
            Err(e) => version_err = Some(e),
        }
    }
    best.ok_or(version_err.unwrap_or(Error::Corrupt(Corruption::NoSuperblock)))
}

fn read_checkpoint<D: BlockDevice>(
    dev: &mut D,
    geo: &Geometry,
    salt: u32,
    h: &CheckpointHeader,
    clusters: usize,
) -> Result<State> {
    let bad = Error::Corrupt(Corruption::Checkpoint);
    let cap = geo.bytes(geo.slot_blocks - 1);
    if h.payload_len > cap {
        return Err(bad);
    }
    let len = payload_len(h.payload_len);
    let mut buf = vec![0u8; len.next_multiple_of(geo.block_usize())];
    if !buf.is_empty() {
        dev.read(geo.slot_start(h.generation % 2) + 1, &mut buf)
            .map_err(dev_err)?;
    }
    if crate::crc::crc32c_append(salt, &buf[..len]) != h.payload_crc {
        return Err(bad);
    }
    let tables: Tables = postcard::from_bytes(&buf[..len]).map_err(|_| bad)?;
    State::load(tables, clusters, u64::from(geo.cluster_size)).ok_or(bad)
}

// Headers live in one block, and blocks are at least 512 bytes.
const _: () = assert!(checkpoint::HEADER_LEN <= 512 && journal::HEADER_LEN <= 512);
