//! The pool: format, open (recovery), and the commit path every mutation goes through.

use alloc::vec;
use alloc::vec::Vec;

use crate::checkpoint::{self, CheckpointHeader};
use crate::cluster::Capacity;
use crate::crc::crc32c;
use crate::device::{BlockDevice, DeviceError, DeviceErrorKind};
use crate::error::{Corruption, Error, Limit, Result, Unsupported};
use crate::feature::{Feature, Features};
use crate::journal::{self, encode_frame, frame_blocks, FrameHeader, FrameMeta, Kind};
use crate::record::Record;
use crate::state::{State, Tables};
use crate::superblock::{self, Access, Geometry, SbCopy, Superblock};

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

/// An opaque value naming the current OS boot, e.g. Linux's `/proc/sys/kernel/random/boot_id`
/// as 16 bytes: it must differ after every power cycle, and stay the same across restarts of the
/// process within one boot. Soft journal frames carry it so that [`Pool::open_with`] can tell a
/// process crash (same epoch: everything the process wrote is still in the OS page cache) from a
/// power cut (another epoch: un-flushed writes may be lost or torn).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Epoch(pub [u8; 16]);

/// How to mount a pool ([`Pool::open_with`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// The current epoch. `None` (what [`Pool::open`] uses): unknown, so no unsealed soft frame is
    /// trusted, and [`Pool::persist`] commits hard until [`Pool::set_epoch`] is called.
    pub epoch: Option<Epoch>,
}

/// Covers the data-path records (allocations, trims) made up to some point: see
/// [`Pool::persist`]. Tickets are ordered; a later one covers everything an earlier one does.
/// A ticket belongs to the mounted pool that issued it (counting restarts at every open).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PersistTicket(pub(crate) u64);

/// A mounted pool on device `D`. All methods are synchronous and do I/O only through `D`.
#[derive(Debug)]
pub struct Pool<D: BlockDevice> {
    pub(crate) dev: D,
    pub(crate) geo: Geometry,
    uuid: [u8; 16],
    salt: u32,
    /// The superblock's generation and features (what [`Pool::enable_feature`] rewrites).
    sb_generation: u64,
    features: Features,
    /// Mounted read-only: the pool has this read-only-compatible feature, which this build lacks.
    read_only: Option<Feature>,
    pub(crate) state: State,
    /// Next journal sequence number.
    seq: u64,
    /// Next free block of the journal, relative to its start.
    journal_pos: u64,
    ckpt_gen: u64,
    /// Bytes the tables may take when next checkpointed (an upper estimate).
    pub(crate) meta_estimate: u64,
    /// Data-path records (allocations, trims) not in the journal yet.
    pub(crate) pending: Vec<Record>,
    /// Data-path records made since mount: `recorded - pending.len()` of them are in the journal.
    recorded: u64,
    /// Soft frames were written since the last hard commit: the next one must seal them.
    unsealed: bool,
    /// Header CRC of the last frame of this pass of the journal (0 at its start): the link of
    /// the next frame.
    link: u32,
    /// The epoch soft frames are written in; `None`: soft commits are hard.
    epoch: Option<Epoch>,
    /// Data writes were mapped since the last device flush.
    pub(crate) data_dirty: bool,
    failed: Option<DeviceErrorKind>,
    /// Write tickets not completed yet (`Pool::begin_write`).
    pub(crate) writes_in_flight: u32,
    /// How snapshots wait for detached writes (`Pool::set_quiesce`).
    pub(crate) quiesce: Option<alloc::boxed::Box<dyn crate::map::Quiesce>>,
    /// Control operations stage their records instead of committing (`Pool::set_group_commit`).
    pub(crate) group_commit: bool,
    /// Control records staged since mount (applied, in `pending` until journaled).
    pub(crate) staged: u64,
    /// How many of the staged control records a hard commit has made durable.
    pub(crate) hardened: u64,
    /// Buffers of the last commit's encoding, reused by the next (a soft commit per allocating
    /// write would otherwise allocate its frames and payload every time).
    scratch: Scratch,
}

/// Memory kept between commits for encoding frames.
#[derive(Debug, Default)]
struct Scratch {
    frames: Vec<u8>,
    payload: Vec<u8>,
}

/// Scratch capacity kept after a commit; a larger (rare) commit's buffers are freed.
const SCRATCH_KEEP: usize = 256 << 10;

impl Encoded {
    /// The frames to write.
    fn frames(&self) -> &[u8] {
        &self.bytes[self.start..]
    }

    /// Whole blocks of frames.
    fn blocks(&self, bs: usize) -> u64 {
        (self.frames().len() / bs) as u64
    }
}

/// Bytes from `bytes`' first element to the next address aligned to `align`.
fn pad_to_align(bytes: &[u8], align: usize) -> usize {
    bytes.as_ptr().addr().wrapping_neg() % align
}

/// Moves the frames (`bytes[*start..]`) to an address aligned to `align` (the block size): a
/// device that needs aligned memory (`O_DIRECT`) then writes them as they are, where it would
/// otherwise allocate a bounce buffer per commit. Moves nothing when they are aligned already
/// (the scratch kept its allocation, and so its padding).
fn align_frames(bytes: &mut Vec<u8>, start: &mut usize, align: usize) {
    if pad_to_align(bytes, align) == *start {
        return;
    }
    let len = bytes.len() - *start;
    // Room for any padding, so that the moves below do not reallocate (and misalign) it.
    bytes.reserve(align);
    let pad = pad_to_align(bytes, align);
    if pad > *start {
        bytes.resize(pad + len, 0);
        bytes.copy_within(*start..*start + len, pad);
    } else if pad < *start {
        bytes.copy_within(*start..*start + len, pad);
        bytes.truncate(pad + len);
    }
    *start = pad;
}

/// Frames of one commit, ready to write: `bytes[start..]`.
struct Encoded {
    bytes: Vec<u8>,
    /// Where the frames begin: at an address aligned to the block size (see [`align_frames`]).
    start: usize,
    payload: u64,
    next_seq: u64,
    /// Header CRC of the last frame (the next link).
    link: u32,
}

/// Which commit protocol (see the `journal` module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commit {
    /// Flush, frames, flush: durable across a power cut.
    Hard,
    /// Frames only: durable across a crash of the process.
    Soft,
}

/// How far replay may trust the journal (the first pass of [`Pool::replay`]).
struct Scan {
    /// Frames to replay.
    trusted: u64,
    /// Sequence number and block of the first frame that does not continue the chain.
    chain_end: (u64, u64),
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
            features: Features::NONE,
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

    /// Mounts a pool in an unknown epoch: [`Pool::open_with`] with default options. Trailing soft
    /// frames (writes persisted but not synced before a crash) are dropped, as after a power cut.
    pub fn open(dev: D) -> Result<Self> {
        Self::open_with(dev, OpenOptions::default())
    }

    /// Mounts a pool: picks a valid superblock, the newest valid checkpoint, and replays the journal
    /// up to its torn tail (see the `journal` module docs for which soft frames count, given
    /// `options.epoch`). Refuses (`Error::Corrupt`) when acknowledged metadata cannot be
    /// recovered; never trusts a byte whose CRC it has not checked.
    ///
    /// Before it returns, everything replayed is made durable: the journal past the tail is
    /// discarded and the device flushed, and soft frames it trusted are sealed by a hard commit, so
    /// a power cut right after a crash-and-reopen loses nothing the reopened pool has shown.
    ///
    /// Format features (the `feature` module): a pool of a format version this build does not
    /// read, or with an incompatible feature it lacks, is refused with `Error::Unsupported`
    /// before anything past the superblocks is read. A read-only-compatible feature it lacks
    /// mounts the pool read-only ([`Pool::read_only`]): replayed in memory, nothing written, not
    /// even the seal of the journal's tail, and every change refused with `Error::ReadOnly`.
    pub fn open_with(mut dev: D, options: OpenOptions) -> Result<Self> {
        let sb = read_superblock(&mut dev, true)?;
        let access = sb.check()?;
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
                    pool.epoch = options.epoch;
                    pool.replay()?;
                    if let Access::ReadOnly(feature) = access {
                        log::warn!(
                            "pool mounted read-only: it has {} feature bit {}, which this build does not support",
                            feature.set.name(),
                            feature.bit
                        );
                        pool.read_only = Some(feature);
                        return Ok(pool);
                    }
                    pool.discard_journal_tail()?;
                    pool.seal_after_open()?;
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
            sb_generation: sb.generation,
            features: sb.features,
            read_only: None,
            state,
            seq,
            journal_pos: 0,
            ckpt_gen,
            meta_estimate: 0,
            pending: Vec::new(),
            recorded: 0,
            unsealed: false,
            link: 0,
            epoch: None,
            data_dirty: false,
            failed: None,
            writes_in_flight: 0,
            quiesce: None,
            group_commit: false,
            staged: 0,
            hardened: 0,
            scratch: Scratch::default(),
        }
    }

    /// Applies the journal after the checkpoint: the frames that continue the chain of sequence
    /// numbers and links, up to the last hard frame, and the soft frames after it that were
    /// written in the current epoch (the rules are in the `journal` module docs). An intact hard
    /// frame of a later commit past the end proves the end was damaged after being acknowledged:
    /// mounting would lose it.
    fn replay(&mut self) -> Result<()> {
        let bs = self.geo.block_usize();
        let mut buf = vec![0u8; bs];
        let scan = self.scan_journal(&mut buf)?;
        let (chain_seq, chain_pos) = scan.chain_end;
        for pos in chain_pos..self.geo.journal_blocks {
            if let Some((h, _)) = self.read_frame(pos, &mut buf)? {
                if h.kind == Kind::Hard && h.commit_start > chain_seq {
                    log::error!("journal: record {chain_seq} damaged, later record {} intact", h.seq);
                    return Err(Error::Corrupt(Corruption::JournalGap(chain_seq)));
                }
            }
        }
        for _ in 0..scan.trusted {
            // Reads are stable (device contract): the frame the scan validated.
            let Some((frame, crc)) = self.read_frame(self.journal_pos, &mut buf)? else {
                return Err(Error::Corrupt(Corruption::Record(self.seq)));
            };
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
            // Frees become allocatable: every replayed frame is durable, or sealed by `open`
            // before anything is allocated.
            self.state.alloc.release_pending();
            self.journal_pos += frame_blocks(frame.payload_len as usize, bs);
            self.meta_estimate += u64::from(frame.payload_len);
            self.seq += 1;
            self.link = crc;
            self.unsealed = matches!(frame.kind, Kind::Soft(_));
        }
        if scan.trusted > 0 {
            log::info!("journal: replayed {} frames, next sequence {}", scan.trusted, self.seq);
        }
        if chain_seq > self.seq {
            log::warn!(
                "journal: dropped {} soft frames of another epoch (writes not synced before a power cut)",
                chain_seq - self.seq
            );
        }
        Ok(())
    }

    /// First pass of replay: follows the chain of frames from the start of the journal and counts
    /// how many to trust. Reads headers and checks CRCs only; applies nothing.
    fn scan_journal(&mut self, buf: &mut Vec<u8>) -> Result<Scan> {
        let bs = self.geo.block_usize();
        let (mut pos, mut seq, mut link) = (0u64, self.seq, 0u32);
        let (mut chained, mut trusted, mut same_epoch) = (0u64, 0u64, true);
        while pos < self.geo.journal_blocks {
            let Some((h, crc)) = self.read_frame(pos, buf)? else {
                break;
            };
            if h.seq != seq || h.link != link {
                break; // older than the checkpoint, or left past the tail by another history
            }
            chained += 1;
            match h.kind {
                // Seals every soft frame before it: the hard commit flushed first.
                Kind::Hard => (trusted, same_epoch) = (chained, true),
                Kind::Soft(epoch) => {
                    same_epoch &= self.epoch == Some(Epoch(epoch));
                    if same_epoch {
                        trusted = chained;
                    }
                }
            }
            pos += frame_blocks(h.payload_len as usize, bs);
            seq += 1;
            link = crc;
        }
        Ok(Scan {
            trusted,
            chain_end: (seq, pos),
        })
    }

    /// The end of `open`: what was replayed becomes durable, and a trusted soft tail is sealed.
    fn seal_after_open(&mut self) -> Result<()> {
        if self.unsealed {
            self.commit(None, 0, Commit::Hard)
        } else {
            self.dev.flush().map_err(dev_err)
        }
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

    /// Reads the frame at journal block `pos` into `buf` if its header and payload validate; with
    /// its header CRC.
    fn read_frame(&mut self, pos: u64, buf: &mut Vec<u8>) -> Result<Option<(FrameHeader, u32)>> {
        let bs = self.geo.block_usize();
        let start = self.geo.journal_start();
        buf.resize(bs, 0);
        self.dev.read(start + pos, &mut buf[..bs]).map_err(dev_err)?;
        let Some((h, crc)) = FrameHeader::decode(self.salt, buf) else {
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
        Ok(h.payload_ok(self.salt, payload).then_some((h, crc)))
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

    /// As `check_usable`, and refuses every change to a pool mounted read-only.
    pub(crate) fn check_writable(&self) -> Result<()> {
        self.check_usable()?;
        match self.read_only {
            Some(feature) => Err(Error::ReadOnly(feature)),
            None => Ok(()),
        }
    }

    /// `Some(feature)` when the pool is mounted read-only because it has that
    /// read-only-compatible feature, which this build lacks: every change is refused with
    /// `Error::ReadOnly`, reads work.
    pub fn read_only(&self) -> Option<Feature> {
        self.read_only
    }

    /// The pool's format features (all empty: a version-3 pool).
    pub fn features(&self) -> Features {
        self.features
    }

    /// The on-media format version of the pool's superblock: 3 without features, 4 with.
    pub fn format_version(&self) -> u32 {
        self.sb().version()
    }

    fn sb(&self) -> Superblock {
        Superblock {
            uuid: self.uuid,
            generation: self.sb_generation,
            geo: self.geo,
            features: self.features,
        }
    }

    /// Sets `feature` on the pool, for good: `Ok(false)` if it was set already. From now on
    /// only builds that support it open the pool (read-write for a compatible one; an
    /// incompatible one makes builds without it refuse the pool, a read-only-compatible one
    /// makes them mount it read-only). Firmware that reads only format version 3 refuses the
    /// pool after any feature is set: the caller decides when that is allowed (the appliance
    /// does it only on a committed firmware slot, and logs it). Refused for a feature this
    /// build does not support (`Error::Unsupported`).
    ///
    /// Rewrites both superblocks with the next generation, one at a time (erase, write, flush):
    /// a power cut leaves either copy valid, and open takes the newer, so the pool has the
    /// feature or does not, never half. Nothing that depends on the feature is written before
    /// this returns.
    pub fn enable_feature(&mut self, feature: Feature) -> Result<bool> {
        self.check_writable()?;
        if !feature.supported() {
            return Err(Error::Unsupported(Unsupported::Feature(feature)));
        }
        if self.features.contains(feature) {
            return Ok(false);
        }
        let mut sb = self.sb();
        sb.generation += 1;
        sb.features = sb.features.with(feature);
        let mut block = vec![0u8; self.geo.block_usize()];
        sb.encode(&mut block);
        let result = (0..2).try_for_each(|copy| {
            self.dev.discard(copy, 1).map_err(dev_err)?;
            self.dev.write(copy, &block).map_err(dev_err)?;
            self.dev.flush().map_err(dev_err)
        });
        if let Err(Error::Device(kind)) = result {
            // Which copy reached the medium is unknown until reopened.
            self.failed = Some(kind);
        }
        result?;
        self.sb_generation = sb.generation;
        self.features = sb.features;
        log::info!(
            "pool {} feature bit {} enabled (superblock generation {})",
            feature.set.name(),
            feature.bit,
            sb.generation
        );
        Ok(true)
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
    /// In group-commit mode the record is staged instead (`group_commit` module).
    pub(crate) fn run(&mut self, rec: Record, growth: u64) -> Result<()> {
        self.check_writable()?;
        self.state.validate(&rec)?;
        if rec.shares_volume_clusters() {
            self.quiesce_writes();
        }
        if self.group_commit {
            self.stage(rec, growth);
            return Ok(());
        }
        self.commit(Some(&rec), growth, Commit::Hard)?;
        self.state.apply(rec);
        self.state.alloc.release_pending();
        Ok(())
    }

    /// Appends a data-path record (an allocation or a trim, already applied) to those waiting for
    /// the journal.
    pub(crate) fn record_pending(&mut self, rec: Record) {
        self.pending.push(rec);
        self.recorded += 1;
    }

    /// The ticket covering every data-path record made so far.
    pub(crate) fn ticket(&self) -> PersistTicket {
        PersistTicket(self.recorded)
    }

    /// Whether every record `ticket` covers is in the journal (soft or hard).
    pub(crate) fn journaled(&self, ticket: PersistTicket) -> bool {
        ticket.0 <= self.recorded - self.pending.len() as u64
    }

    pub(crate) fn epoch(&self) -> Option<Epoch> {
        self.epoch
    }

    pub(crate) fn set_epoch_inner(&mut self, epoch: Epoch) -> Result<()> {
        // A read-only mount writes nothing: replayed soft frames stay as found.
        if self.unsealed && self.epoch != Some(epoch) && self.read_only.is_none() {
            // Frames of the old epoch would be dropped after a crash in the new one.
            self.commit(None, 0, Commit::Hard)?;
            self.state.alloc.release_pending();
        }
        self.epoch = Some(epoch);
        Ok(())
    }

    /// Soft frames were written that no hard commit has sealed yet.
    pub(crate) fn unsealed(&self) -> bool {
        self.unsealed
    }

    /// The commit protocol. After a device error the pool refuses further work: what reached the
    /// medium is unknown until reopened. After a hard commit the caller releases pending clusters
    /// (once it has applied its op); a soft commit that turns hard does so itself.
    pub(crate) fn commit(&mut self, op: Option<&Record>, growth: u64, kind: Commit) -> Result<()> {
        // Every write of a mounted pool goes through here: a read-only one never reaches it.
        self.check_writable()?;
        let result = match kind {
            Commit::Hard => self.commit_hard(op, growth),
            Commit::Soft => self.commit_soft(),
        };
        if let Err(Error::Device(kind)) = result {
            self.failed = Some(kind);
        }
        result
    }

    /// Hard commit: flush (data, and soft frames to seal), frames, flush. With nothing to write
    /// but unsealed soft frames, writes an empty hard frame: replay needs a hard frame after soft
    /// ones to know they were flushed.
    fn commit_hard(&mut self, op: Option<&Record>, growth: u64) -> Result<()> {
        self.write_hard(op, growth)?;
        // Every pending record is in a flushed frame or the checkpoint, soft frames are sealed.
        self.hardened = self.staged;
        Ok(())
    }

    fn write_hard(&mut self, op: Option<&Record>, growth: u64) -> Result<()> {
        if self.data_dirty || self.unsealed {
            // Data first: a mapping must never become durable before the data it points at.
            self.dev.flush().map_err(dev_err)?;
            self.data_dirty = false;
        }
        if op.is_none() && self.pending.is_empty() && !self.unsealed {
            return Ok(());
        }
        let bs = self.geo.block_usize();
        let mut enc = self.encode_frames(op, Kind::Hard)?;
        if enc.blocks(bs) > self.geo.journal_blocks - self.journal_pos {
            self.keep_scratch(enc.bytes);
            self.checkpoint()?;
            enc = self.encode_frames(op, Kind::Hard)?;
            if enc.blocks(bs) > self.geo.journal_blocks {
                return Err(Error::ResourceExhausted(Limit::Metadata));
            }
            if enc.frames().is_empty() {
                return Ok(()); // the checkpoint holds everything, durably
            }
        }
        self.append(&enc, growth)?;
        self.keep_scratch(enc.bytes);
        self.dev.flush().map_err(dev_err)?;
        self.unsealed = false;
        Ok(())
    }

    /// Soft commit: the frames of every pending record, without any flush, tagged with the epoch.
    /// Turns hard without an epoch, or when the frames do not fit in the rest of the journal (a
    /// checkpoint is due, and it flushes anyway).
    fn commit_soft(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let bs = self.geo.block_usize();
        let room = self.geo.journal_blocks - self.journal_pos;
        let enc = match self.epoch {
            Some(epoch) => Some(self.encode_frames(None, Kind::Soft(epoch.0))?),
            None => None,
        };
        let enc = match enc {
            Some(enc) if enc.blocks(bs) <= room => enc,
            unfit => {
                if let Some(enc) = unfit {
                    self.keep_scratch(enc.bytes);
                }
                self.commit_hard(None, 0)?;
                self.state.alloc.release_pending();
                return Ok(());
            }
        };
        self.append(&enc, 0)?;
        self.keep_scratch(enc.bytes);
        self.unsealed = true;
        Ok(())
    }

    /// Keeps a commit's frame buffer for the next one, unless it grew past [`SCRATCH_KEEP`].
    fn keep_scratch(&mut self, frames: Vec<u8>) {
        if frames.capacity() <= SCRATCH_KEEP {
            self.scratch.frames = frames;
        }
    }

    /// Writes encoded frames at the journal's end and accounts for them (they are in the journal,
    /// durable or not: the pending records they hold leave `pending`).
    fn append(&mut self, enc: &Encoded, growth: u64) -> Result<()> {
        // The blocks ahead of `journal_pos` were discarded when this pass of the journal began
        // (after a checkpoint, or past the tail at open): appends never rewrite a block in
        // place, and a commit costs one write (and, if hard, two flushes at most).
        let bs = self.geo.block_usize();
        let at = self.geo.journal_start() + self.journal_pos;
        self.dev.write(at, enc.frames()).map_err(dev_err)?;
        self.journal_pos += enc.blocks(bs);
        self.seq = enc.next_seq;
        self.link = enc.link;
        self.meta_estimate += enc.payload + growth;
        self.pending.clear();
        Ok(())
    }

    /// Encodes pending records then `op` into frames of `kind` numbered from `self.seq`, the op
    /// always in the last frame so an operation is never split; a hard commit with no record but
    /// unsealed soft frames gets one empty frame. Pure: nothing counts as written yet.
    /// Encodes into the scratch buffers (taken here; [`Pool::keep_scratch`] gives the frames
    /// back).
    fn encode_frames(&mut self, op: Option<&Record>, kind: Kind) -> Result<Encoded> {
        let mut bytes = core::mem::take(&mut self.scratch.frames);
        bytes.clear();
        // Start at the alignment the kept allocation had last time (zero padding before it).
        let start = pad_to_align(&bytes, self.geo.block_usize());
        bytes.resize(start, 0);
        let mut payload = core::mem::take(&mut self.scratch.payload);
        payload.clear();
        let (enc, payload) = self.encode_frames_into(op, kind, bytes, start, payload);
        if payload.capacity() <= SCRATCH_KEEP {
            self.scratch.payload = payload;
        }
        let mut enc = enc?;
        align_frames(&mut enc.bytes, &mut enc.start, self.geo.block_usize());
        Ok(enc)
    }

    fn encode_frames_into(
        &self,
        op: Option<&Record>,
        kind: Kind,
        bytes: Vec<u8>,
        start: usize,
        mut payload: Vec<u8>,
    ) -> (Result<Encoded>, Vec<u8>) {
        let bs = self.geo.block_usize();
        let max_payload = payload_len(self.geo.bytes(self.geo.journal_blocks) / 4);
        let too_big = Error::ResourceExhausted(Limit::Metadata);
        let mut enc = Encoded {
            bytes,
            start,
            payload: 0,
            next_seq: self.seq,
            link: self.link,
        };
        let emit = |enc: &mut Encoded, payload: &[u8]| {
            let meta = FrameMeta {
                seq: enc.next_seq,
                commit_start: self.seq,
                link: enc.link,
                kind,
            };
            enc.link = encode_frame(&mut enc.bytes, self.salt, meta, payload, bs);
            enc.next_seq += 1;
            enc.payload += payload.len() as u64;
        };
        for rec in self.pending.iter().chain(op) {
            let before = payload.len();
            payload = match postcard::to_extend(rec, payload) {
                Ok(p) => p,
                // The serializer consumed the buffer: the next commit starts a new one.
                Err(_) => return (Err(too_big), Vec::new()),
            };
            if payload.len() > max_payload && before > 0 {
                emit(&mut enc, &payload[..before]);
                payload.drain(..before);
            }
            if payload.len() > max_payload {
                return (Err(too_big), payload);
            }
        }
        if !payload.is_empty() || (kind == Kind::Hard && self.unsealed) {
            emit(&mut enc, &payload);
        }
        (Ok(enc), payload)
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
        self.link = 0;
        self.meta_estimate = len;
        self.pending.clear();
        // Soft frames are in the tables now (and were flushed before the header).
        self.unsealed = false;
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
    /// data-path allocations across a power cut ([`Pool::persist`]ed ones survive a reopen in the
    /// same epoch).
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
///
/// The newest copy decides even when this build cannot read it (a newer format version): an
/// older copy is what the pool was before the newer one was written, so mounting it would
/// misread the pool.
pub(crate) fn read_superblock<D: BlockDevice>(dev: &mut D, warn: bool) -> Result<Superblock> {
    let bs = usize::try_from(dev.block_size()).map_err(|_| Error::Corrupt(Corruption::Geometry))?;
    if bs < superblock::LEN || dev.block_count() < 2 {
        return Err(Error::Corrupt(Corruption::NoSuperblock));
    }
    let mut block = vec![0u8; bs];
    let mut best: Option<SbCopy> = None;
    for copy in 0..2 {
        dev.read(copy, &mut block).map_err(dev_err)?;
        match Superblock::decode(&block) {
            Some(sb) if best.is_none_or(|b| sb.generation() > b.generation()) => best = Some(sb),
            Some(_) => {}
            None if warn => log::warn!("superblock copy {copy} invalid"),
            None => {}
        }
    }
    match best {
        Some(SbCopy::Readable(sb)) => Ok(sb),
        Some(SbCopy::Unreadable { error, .. }) => Err(error),
        None => Err(Error::Corrupt(Corruption::NoSuperblock)),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_move_to_an_aligned_address_intact_and_stay_there_when_reused() {
        for align in [512, 4096] {
            for start in [0, 1, 7, 600] {
                let mut bytes = vec![0xEEu8; start];
                let frames: Vec<u8> = (0..3000u32).map(|i| i.to_le_bytes()[0]).collect();
                bytes.extend_from_slice(&frames);
                let mut at = start;
                align_frames(&mut bytes, &mut at, align);
                assert_eq!(bytes[at..].as_ptr().addr() % align, 0, "start {start}");
                assert_eq!(&bytes[at..], &frames[..], "start {start}");
                // Reused as encode_frames does: the same padding is aligned again, no move.
                let (ptr, pad) = (bytes.as_ptr(), pad_to_align(&bytes, align));
                assert_eq!(pad, at);
                bytes.truncate(pad);
                bytes.extend_from_slice(&frames);
                align_frames(&mut bytes, &mut at, align);
                assert_eq!((bytes.as_ptr(), at), (ptr, pad));
            }
        }
    }
}
