//! The slot state on the boot partition, crash-safe: two copies, each a fixed-size record with a
//! sequence number and a CRC. A save overwrites the *older* copy only, so a power cut at any
//! byte of a save leaves the newer copy intact and the state reads back as it was before the
//! save (or, once the save returned, as after it).
//!
//! ```text
//! 0   4  magic "EVSL"       4  1  format (1)     5  8  sequence (u64 LE)
//! 13  2  payload length P   15 P  payload        15+P 4 CRC-32C of bytes [0, 15+P)
//! then zeros up to RECORD_LEN
//! ```
//!
//! A copy that fails its magic or CRC is a torn write (or never written) and is ignored while the
//! other copy is valid; if both exist and neither is valid, the state is corrupt and reported,
//! never silently replaced by a factory state.
//!
//! The frame (magic, format, sequence, payload length, CRC over all before it, in one
//! [`RECORD_LEN`] record) is the same in every format; only the payload's layout changes with
//! the format byte. That is how this firmware tells a record of a newer format, written by newer
//! firmware, from a torn one: its frame is whole. Such a record in either copy refuses the open
//! with [`StoreError::TooNew`], and without a [`Store`] nothing can be saved: this firmware never
//! reads around a record it cannot read, nor writes over it. A format that needs another frame
//! must change the magic.

use std::fmt;

use crate::slots::{Reason, Rollback, Slot, SlotId, Slots, Status};

/// Size of one copy: one sector.
pub const RECORD_LEN: usize = 512;
const MAGIC: [u8; 4] = *b"EVSL";
const FORMAT: u8 = 1;
const HEADER_LEN: usize = 15;
const CRC_LEN: usize = 4;
/// Bound on the text of a health-check failure, so every state fits one record.
pub const MAX_REASON_LEN: usize = 200;

/// Where the two copies live. `write` replaces one copy in place; when it returns `Ok` the copy
/// is durable (synced). A cut during `write` may leave that copy with any mix of old and new
/// bytes, and never touches the other copy.
pub trait Media {
    /// The media's error.
    type Error: fmt::Debug + fmt::Display;
    /// Copy 0 or 1; `None` if it was never written.
    fn read(&mut self, copy: usize) -> Result<Option<Vec<u8>>, Self::Error>;
    /// Replaces copy 0 or 1 with `data` ([`RECORD_LEN`] bytes) and syncs it.
    fn write(&mut self, copy: usize, data: &[u8]) -> Result<(), Self::Error>;
}

/// Why the state could not be read or saved.
#[derive(Debug)]
pub enum StoreError<E> {
    /// The media failed.
    Media(E),
    /// Both copies exist and neither is valid.
    Corrupt,
    /// The state does not fit a record (a health-check text too long).
    TooLarge,
    /// A copy holds a whole record of a format newer than this firmware reads: newer firmware
    /// wrote it. Nothing was read from it or written over it.
    TooNew {
        /// The copy (0 or 1; with both newer, the one of the newest format).
        copy: usize,
        /// Its format.
        found: u8,
        /// The newest format this firmware reads.
        supported: u8,
    },
}

impl<E: fmt::Display> fmt::Display for StoreError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Media(e) => write!(f, "firmware state: {e}"),
            StoreError::Corrupt => {
                f.write_str("firmware state: both copies are corrupt (not a torn write)")
            }
            StoreError::TooLarge => f.write_str("firmware state does not fit its record"),
            StoreError::TooNew {
                copy,
                found,
                supported,
            } => write!(
                f,
                "firmware state record copy {copy} has format {found}, newer than this firmware \
                 reads ({supported}): boot the slot that wrote it, or update; nothing was \
                 written over it"
            ),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for StoreError<E> {}

/// An opened store and the state it holds (`None`: never saved).
pub type Opened<M> = (Store<M>, Option<Slots>);

/// The two-copy store.
#[derive(Debug)]
pub struct Store<M> {
    media: M,
    /// Sequence of the newest valid copy (0: none yet).
    seq: u64,
    /// The copy holding it; the next save writes the other one.
    newest: usize,
}

impl<M: Media> Store<M> {
    /// Reads both copies: the newest valid state, or `None` if neither copy was ever written
    /// (or only a torn first save exists). A copy holding a whole record of a newer format
    /// refuses the open ([`StoreError::TooNew`]), whatever the other copy holds.
    pub fn open(mut media: M) -> Result<Opened<M>, StoreError<M::Error>> {
        let mut best: Option<(u64, usize, Slots)> = None;
        let mut newer: Option<(usize, u8)> = None;
        let mut present = 0;
        for copy in 0..2 {
            let Some(bytes) = media.read(copy).map_err(StoreError::Media)? else {
                continue;
            };
            present += 1;
            let Some(frame) = Frame::read(&bytes) else {
                continue;
            };
            if frame.format > FORMAT {
                if newer.is_none_or(|(_, f)| frame.format > f) {
                    newer = Some((copy, frame.format));
                }
            } else if let Some((seq, slots)) = frame.state() {
                if best.as_ref().is_none_or(|(s, _, _)| seq > *s) {
                    best = Some((seq, copy, slots));
                }
            }
        }
        if let Some((copy, found)) = newer {
            return Err(StoreError::TooNew {
                copy,
                found,
                supported: FORMAT,
            });
        }
        match best {
            Some((seq, newest, slots)) => Ok((Store { media, seq, newest }, Some(slots))),
            // Two copies exist only after two saves, the second of which cannot have torn the
            // first: both invalid is corruption, not a cut.
            None if present == 2 => Err(StoreError::Corrupt),
            None => Ok((
                Store {
                    media,
                    seq: 0,
                    newest: 1,
                },
                None,
            )),
        }
    }

    /// Saves `slots` over the older copy.
    pub fn save(&mut self, slots: &Slots) -> Result<(), StoreError<M::Error>> {
        let seq = self.seq + 1;
        let record = encode(seq, slots).ok_or(StoreError::TooLarge)?;
        let target = 1 - self.newest;
        self.media
            .write(target, &record)
            .map_err(StoreError::Media)?;
        self.seq = seq;
        self.newest = target;
        Ok(())
    }

    /// The media, e.g. to inspect it in a test.
    pub fn media(&self) -> &M {
        &self.media
    }
}

/// The record of `slots` with sequence `seq`; `None` if it does not fit.
pub fn encode(seq: u64, slots: &Slots) -> Option<Vec<u8>> {
    let mut payload = Vec::with_capacity(RECORD_LEN);
    payload.push(slot_byte(slots.primary));
    for slot in &slots.slots {
        payload.push(status_byte(slot.status));
        payload.extend_from_slice(&slot.boots.to_le_bytes());
        put_text(&mut payload, &slot.version, u8::MAX.into())?;
    }
    match &slots.last_rollback {
        None => payload.push(0),
        Some(rb) => {
            payload.push(1);
            payload.push(slot_byte(rb.slot));
            put_text(&mut payload, &rb.version, u8::MAX.into())?;
            match &rb.reason {
                Reason::TrialNotConfirmed => payload.push(0),
                Reason::DaemonExited(code) => {
                    payload.push(1);
                    payload.push(u8::from(code.is_some()));
                    payload.extend_from_slice(&code.unwrap_or(0).to_le_bytes());
                }
                Reason::HealthCheckFailed(what) => {
                    payload.push(2);
                    put_text(&mut payload, what, MAX_REASON_LEN)?;
                }
                Reason::Requested => payload.push(3),
            }
        }
    }
    let payload_len = u16::try_from(payload.len()).ok()?;
    if HEADER_LEN + payload.len() + CRC_LEN > RECORD_LEN {
        return None;
    }
    let mut out = Vec::with_capacity(RECORD_LEN);
    out.extend_from_slice(&MAGIC);
    out.push(FORMAT);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&payload_len.to_le_bytes());
    out.extend_from_slice(&payload);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out.resize(RECORD_LEN, 0);
    Some(out)
}

/// The sequence and state of a record; `None` if it is torn, foreign, malformed or of another
/// format ([`Store::open`] tells a newer one apart).
pub fn decode(bytes: &[u8]) -> Option<(u64, Slots)> {
    Frame::read(bytes)?.state()
}

/// A whole frame: the parts every format shares.
struct Frame<'a> {
    format: u8,
    seq: u64,
    payload: &'a [u8],
}

impl<'a> Frame<'a> {
    fn read(bytes: &'a [u8]) -> Option<Frame<'a>> {
        if bytes.get(..4)? != MAGIC {
            return None;
        }
        let format = *bytes.get(4)?;
        let seq = u64::from_le_bytes(bytes.get(5..13)?.try_into().ok()?);
        let payload_len = usize::from(u16::from_le_bytes(bytes.get(13..15)?.try_into().ok()?));
        let crc_at = HEADER_LEN + payload_len;
        let crc = u32::from_le_bytes(bytes.get(crc_at..crc_at + CRC_LEN)?.try_into().ok()?);
        if crc32c::crc32c(&bytes[..crc_at]) != crc {
            return None;
        }
        Some(Frame {
            format,
            seq,
            payload: &bytes[HEADER_LEN..crc_at],
        })
    }

    /// The state of a format-[`FORMAT`] frame. Format 0 was never written: `None`, as damage.
    fn state(&self) -> Option<(u64, Slots)> {
        if self.format != FORMAT {
            return None;
        }
        Some((self.seq, decode_payload(self.payload)?))
    }
}

fn decode_payload(payload: &[u8]) -> Option<Slots> {
    let mut r = Reader(payload);
    let primary = slot_of(r.byte()?)?;
    let mut slot = || -> Option<Slot> {
        Some(Slot {
            status: status_of(r.byte()?)?,
            boots: u32::from_le_bytes(r.array()?),
            version: r.text()?,
        })
    };
    let slots = [slot()?, slot()?];
    let last_rollback = match r.byte()? {
        0 => None,
        1 => Some(Rollback {
            slot: slot_of(r.byte()?)?,
            version: r.text()?,
            reason: match r.byte()? {
                0 => Reason::TrialNotConfirmed,
                1 => {
                    let has_code = r.byte()? == 1;
                    let code = i32::from_le_bytes(r.array()?);
                    Reason::DaemonExited(has_code.then_some(code))
                }
                2 => Reason::HealthCheckFailed(r.text()?),
                3 => Reason::Requested,
                _ => return None,
            },
        }),
        _ => return None,
    };
    if !r.0.is_empty() {
        return None;
    }
    Some(Slots {
        primary,
        slots,
        last_rollback,
    })
}

fn put_text(out: &mut Vec<u8>, text: &str, max: usize) -> Option<()> {
    if text.len() > max {
        return None;
    }
    out.push(u8::try_from(text.len()).ok()?);
    out.extend_from_slice(text.as_bytes());
    Some(())
}

fn slot_byte(id: SlotId) -> u8 {
    match id {
        SlotId::A => 0,
        SlotId::B => 1,
    }
}

fn slot_of(b: u8) -> Option<SlotId> {
    match b {
        0 => Some(SlotId::A),
        1 => Some(SlotId::B),
        _ => None,
    }
}

fn status_byte(s: Status) -> u8 {
    match s {
        Status::Empty => 0,
        Status::Writing => 1,
        Status::TryOnce { booted: false } => 2,
        Status::TryOnce { booted: true } => 3,
        Status::Good => 4,
        Status::Bad => 5,
    }
}

fn status_of(b: u8) -> Option<Status> {
    Some(match b {
        0 => Status::Empty,
        1 => Status::Writing,
        2 => Status::TryOnce { booted: false },
        3 => Status::TryOnce { booted: true },
        4 => Status::Good,
        5 => Status::Bad,
        _ => return None,
    })
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn text(&mut self) -> Option<String> {
        let len = usize::from(self.byte()?);
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two in-memory copies and a power cut after `budget` bytes of writes: the byte that hits
    /// the budget and all after it are lost (the torn part keeps the old bytes, or random bytes
    /// when `scramble` is set, as a sector mid-program may read back), and the media is dead
    /// until the "reboot" that reopens it.
    #[derive(Debug, Default, Clone)]
    struct CutMedia {
        copies: [Option<Vec<u8>>; 2],
        budget: Option<usize>,
        scramble: Option<u64>,
        dead: bool,
        writes: usize,
    }

    #[derive(Debug, PartialEq, Eq)]
    struct PowerCut;

    impl fmt::Display for PowerCut {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("power cut")
        }
    }

    impl Media for CutMedia {
        type Error = PowerCut;

        fn read(&mut self, copy: usize) -> Result<Option<Vec<u8>>, PowerCut> {
            if self.dead {
                return Err(PowerCut);
            }
            Ok(self.copies[copy].clone())
        }

        fn write(&mut self, copy: usize, data: &[u8]) -> Result<(), PowerCut> {
            if self.dead {
                return Err(PowerCut);
            }
            self.writes += 1;
            let old = self.copies[copy].take().unwrap_or_default();
            let mut new = old.clone();
            new.resize(data.len(), 0);
            match self.budget {
                Some(left) if left < data.len() => {
                    new[..left].copy_from_slice(&data[..left]);
                    if let Some(seed) = self.scramble {
                        let mut x = seed | 1;
                        for b in &mut new[left..] {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            *b = x.to_le_bytes()[0];
                        }
                    }
                    // A cut at byte 0 of a never-written file still leaves the file created.
                    self.copies[copy] = Some(new);
                    self.dead = true;
                    self.budget = Some(0);
                    Err(PowerCut)
                }
                _ => {
                    if let Some(left) = &mut self.budget {
                        *left -= data.len();
                    }
                    self.copies[copy] = Some(data.to_vec());
                    Ok(())
                }
            }
        }
    }

    fn reboot(media: &CutMedia) -> Option<Slots> {
        let mut media = media.clone();
        media.dead = false;
        media.budget = None;
        Store::open(media).unwrap().1
    }

    /// A run of states through a whole update and a rollback: each step is one save.
    fn history() -> Vec<Slots> {
        let mut s = Slots::factory("1.0").unwrap();
        let mut out = vec![s.clone()];
        s.reconcile(SlotId::A).unwrap();
        out.push(s.clone());
        s.begin_write(SlotId::A).unwrap();
        out.push(s.clone());
        s.finish_write(SlotId::B, "2.0").unwrap();
        out.push(s.clone());
        s.reconcile(SlotId::B).unwrap();
        out.push(s.clone());
        s.fail_trial(
            SlotId::B,
            Reason::HealthCheckFailed("pool not open after 60 s".into()),
        )
        .unwrap();
        out.push(s.clone());
        s.reconcile(SlotId::A).unwrap();
        out.push(s.clone());
        s.begin_write(SlotId::A).unwrap();
        out.push(s.clone());
        s.finish_write(SlotId::B, "2.1").unwrap();
        out.push(s.clone());
        s.reconcile(SlotId::B).unwrap();
        out.push(s.clone());
        s.confirm(SlotId::B).unwrap();
        out.push(s.clone());
        s.rollback(SlotId::B).unwrap();
        out.push(s.clone());
        s.reconcile(SlotId::A).unwrap();
        out.push(s.clone());
        out
    }

    #[test]
    fn every_state_round_trips() {
        for (seq, state) in history().iter().enumerate() {
            let record = encode(seq as u64, state).unwrap();
            assert_eq!(record.len(), RECORD_LEN);
            assert_eq!(decode(&record), Some((seq as u64, state.clone())));
        }
        let exited = Slots {
            last_rollback: Some(Rollback {
                slot: SlotId::B,
                version: "9".into(),
                reason: Reason::DaemonExited(None),
            }),
            ..Slots::factory("1").unwrap()
        };
        assert_eq!(decode(&encode(7, &exited).unwrap()), Some((7, exited)));
    }

    #[test]
    fn saves_alternate_copies_and_the_newest_wins() {
        let states = history();
        let mut store = Store::open(CutMedia::default()).unwrap().0;
        for (i, state) in states.iter().enumerate() {
            store.save(state).unwrap();
            assert_eq!(store.media().writes, i + 1);
            assert_eq!(reboot(store.media()).as_ref(), Some(state));
        }
        let copies = &store.media().copies;
        let seqs: Vec<u64> = copies
            .iter()
            .map(|c| decode(c.as_ref().unwrap()).unwrap().0)
            .collect();
        assert_eq!(seqs.iter().max(), Some(&(states.len() as u64)));
        assert_eq!(seqs[0].abs_diff(seqs[1]), 1);
    }

    fn used_len(state: &Slots) -> usize {
        let record = encode(0, state).unwrap();
        HEADER_LEN + usize::from(u16::from_le_bytes([record[13], record[14]])) + CRC_LEN
    }

    /// Power cut at every byte of every save of a whole update history: the state read back
    /// after the cut is the one before the interrupted save (or after it, once every used byte
    /// was written), never a mix and never an error.
    #[test]
    fn a_cut_at_any_byte_of_any_save_leaves_the_previous_state() {
        let states = history();
        for scramble in [None, Some(0x9e37_79b9_7f4a_7c15)] {
            for (step, state) in states.iter().enumerate() {
                for cut in 0..RECORD_LEN {
                    let mut store = Store::open(CutMedia::default()).unwrap().0;
                    for before in &states[..step] {
                        store.save(before).unwrap();
                    }
                    let mut media = store.media().clone();
                    media.budget = Some(cut);
                    media.scramble = scramble;
                    let (mut store, _) = Store::open(media).unwrap();
                    assert!(matches!(
                        store.save(state),
                        Err(StoreError::Media(PowerCut))
                    ));
                    // Once the record's used bytes are down, only padding remains: the save
                    // has happened. Before that, it has not.
                    let expected = if cut >= used_len(state) {
                        Some(state.clone())
                    } else {
                        step.checked_sub(1).map(|i| states[i].clone())
                    };
                    assert_eq!(
                        reboot(store.media()),
                        expected,
                        "step {step}, cut at byte {cut}, scramble {scramble:?}"
                    );
                    // And the store keeps working after the reboot.
                    let mut media = store.media().clone();
                    media.dead = false;
                    media.budget = None;
                    let (mut store, _) = Store::open(media).unwrap();
                    store.save(state).unwrap();
                    assert_eq!(reboot(store.media()).as_ref(), Some(state));
                }
            }
        }
    }

    /// The media after the first two states of [`history`] were saved: one in each copy.
    fn first_two_saved() -> CutMedia {
        let states = history();
        let mut store = Store::open(CutMedia::default()).unwrap().0;
        store.save(&states[0]).unwrap();
        store.save(&states[1]).unwrap();
        store.media().clone()
    }

    #[test]
    fn two_invalid_copies_are_corruption_not_a_fresh_start() {
        let mut media = first_two_saved();
        for copy in media.copies.iter_mut().flatten() {
            copy[20] ^= 0xff;
        }
        assert!(matches!(Store::open(media), Err(StoreError::Corrupt)));
    }

    #[test]
    fn one_flipped_bit_invalidates_a_copy() {
        let record = encode(3, &history()[5]).unwrap();
        for byte in 0..used_len(&history()[5]) {
            let mut bad = record.clone();
            bad[byte] ^= 0x10;
            assert_eq!(decode(&bad), None, "byte {byte}");
        }
        assert_eq!(decode(&[0u8; RECORD_LEN]), None);
        assert_eq!(decode(&record[..20]), None);
    }

    /// `record` in another format, its frame whole: what firmware of that format would write.
    fn reframed(record: &[u8], format: u8) -> Vec<u8> {
        let mut out = record.to_vec();
        out[4] = format;
        let crc_at = HEADER_LEN + usize::from(u16::from_le_bytes([out[13], out[14]]));
        let crc = crc32c::crc32c(&out[..crc_at]);
        out[crc_at..crc_at + CRC_LEN].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Newer firmware's record, in either copy (the newest or the older one) or as the only
    /// copy: the open is refused in words, so there is no store to save over it with (the
    /// files left as found: `tests/golden_record.rs`).
    #[test]
    fn a_record_of_a_newer_format_refuses_the_open_and_is_never_written_over() {
        let two = first_two_saved();
        let mut one = CutMedia::default();
        one.copies[0] = two.copies[0].clone();
        for (media, copy) in [(&two, 0), (&two, 1), (&one, 0)] {
            let mut media = media.clone();
            let newer = reframed(media.copies[copy].as_ref().unwrap(), 2);
            media.copies[copy] = Some(newer.clone());
            let e = Store::open(media).unwrap_err();
            assert!(
                matches!(
                    e,
                    StoreError::TooNew {
                        copy: c,
                        found: 2,
                        supported: 1
                    } if c == copy
                ),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "firmware state record copy {copy} has format 2, newer than this firmware \
                     reads (1): boot the slot that wrote it, or update; nothing was written over it"
                )
            );
            assert!(!e.to_string().contains("corrupt"), "{e}");
        }
        // Both newer: the newest format is named.
        let mut media = two.clone();
        media.copies[0] = Some(reframed(two.copies[0].as_ref().unwrap(), 3));
        media.copies[1] = Some(reframed(two.copies[1].as_ref().unwrap(), 2));
        assert!(matches!(
            Store::open(media),
            Err(StoreError::TooNew {
                copy: 0,
                found: 3,
                ..
            })
        ));
    }

    /// A newer format byte is believed only behind a whole frame: torn over (the CRC fails), it
    /// is a torn write like any other; format 0 was never written, so it is damage.
    #[test]
    fn a_newer_format_byte_in_a_broken_frame_is_a_torn_write_and_format_0_is_damage() {
        let states = history();
        let newest = first_two_saved();
        let older = usize::from(decode(newest.copies[0].as_ref().unwrap()).unwrap().0 == 2);
        let mut torn = newest.clone();
        torn.copies[1 - older].as_mut().unwrap()[4] = 2;
        assert_eq!(reboot(&torn), Some(states[0].clone()), "the older copy");
        let mut zero = newest.clone();
        let copy = reframed(zero.copies[1 - older].as_ref().unwrap(), 0);
        assert_eq!(decode(&copy), None);
        zero.copies[1 - older] = Some(copy);
        assert_eq!(reboot(&zero), Some(states[0].clone()));
        let other = reframed(zero.copies[older].as_ref().unwrap(), 0);
        zero.copies[older] = Some(other);
        assert!(matches!(Store::open(zero), Err(StoreError::Corrupt)));
    }

    #[test]
    fn an_oversized_reason_is_refused_before_writing() {
        let mut s = Slots::factory("1.0").unwrap();
        s.last_rollback = Some(Rollback {
            slot: SlotId::B,
            version: "2".into(),
            reason: Reason::HealthCheckFailed("x".repeat(MAX_REASON_LEN + 1)),
        });
        let mut store = Store::open(CutMedia::default()).unwrap().0;
        assert!(matches!(store.save(&s), Err(StoreError::TooLarge)));
        assert_eq!(store.media().writes, 0);
    }
}
