//! A volume's or snapshot's cluster map: virtual cluster -> physical cluster, absent entries
//! reading as zeros.
//!
//! Kept in spans of [`SPAN`] consecutive virtual clusters, each a fixed array allocated the first
//! time one of its clusters is mapped and freed when its last one is unmapped. A first write of a
//! cluster therefore allocates only when it opens a span (once per `SPAN` clusters written in
//! order), where a B-tree of single entries grew a node every few clusters; a lookup is one
//! B-tree step over the spans and an array index. A densely written map takes 8 bytes per
//! cluster; the price is sparse writes, up to a span (2 KiB) per mapped cluster, which at the
//! usual 1 MiB clusters is 0.2 % of the data it maps.
//!
//! On media (checkpoints) it is the postcard encoding of a map of `u64` pairs in key order, the
//! same bytes a `BTreeMap<u64, u64>` gives, so pools written before it read unchanged.

use alloc::boxed::Box;
use alloc::collections::btree_map::{self, BTreeMap};
use core::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Virtual clusters per span.
const SPAN: usize = 256;
const SPAN_U64: u64 = SPAN as u64;

/// One span: physical cluster + 1 per slot, 0 for a hole.
type Slots = Box<[u64; SPAN]>;

/// Virtual cluster -> physical cluster.
#[derive(Clone, Default)]
pub(crate) struct ClusterMap {
    /// Span index (virtual cluster / `SPAN`) -> its slots and how many of them are mapped.
    spans: BTreeMap<u64, (u16, Slots)>,
    len: u64,
}

impl ClusterMap {
    /// An empty map.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Mapped clusters.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Where `vc` lives, if mapped.
    pub(crate) fn get(&self, vc: u64) -> Option<u64> {
        let (_, slots) = self.spans.get(&(vc / SPAN_U64))?;
        slots[slot(vc)].checked_sub(1)
    }

    /// Whether `vc` is mapped.
    pub(crate) fn contains(&self, vc: u64) -> bool {
        self.get(vc).is_some()
    }

    /// Maps `vc` to `pc`; returns the previous mapping. `pc` must be below `u64::MAX` (a pool's
    /// cluster index always is).
    pub(crate) fn insert(&mut self, vc: u64, pc: u64) -> Option<u64> {
        debug_assert!(pc < u64::MAX);
        let (used, slots) = self
            .spans
            .entry(vc / SPAN_U64)
            .or_insert_with(|| (0, Box::new([0; SPAN])));
        let old = core::mem::replace(&mut slots[slot(vc)], pc + 1).checked_sub(1);
        if old.is_none() {
            *used += 1;
            self.len += 1;
        }
        old
    }

    /// Unmaps `vc`; returns what it was mapped to. Frees the span when it held the last mapping.
    pub(crate) fn remove(&mut self, vc: u64) -> Option<u64> {
        let btree_map::Entry::Occupied(mut span) = self.spans.entry(vc / SPAN_U64) else {
            return None;
        };
        let (used, slots) = span.get_mut();
        let old = core::mem::take(&mut slots[slot(vc)]).checked_sub(1)?;
        *used -= 1;
        self.len -= 1;
        if *used == 0 {
            span.remove();
        }
        Some(old)
    }

    /// The mappings from virtual cluster `from` on, in order. Allocation-free.
    pub(crate) fn entries(&self, from: u64) -> Entries<'_> {
        Entries {
            spans: self.spans.range(from / SPAN_U64..),
            span: None,
            from,
        }
    }

    /// Every physical cluster mapped (in virtual order).
    pub(crate) fn values(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries(0).map(|(_, pc)| pc)
    }

    /// The highest mapped virtual cluster.
    pub(crate) fn last(&self) -> Option<u64> {
        let (&span, (_, slots)) = self.spans.last_key_value()?;
        let at = slots.iter().rposition(|&s| s != 0)?;
        Some(span * SPAN_U64 + at as u64)
    }
}

fn slot(vc: u64) -> usize {
    // The remainder is below SPAN, which fits usize.
    (vc % SPAN_U64) as usize
}

/// [`ClusterMap::entries`]: `(virtual, physical)` pairs in virtual order.
#[derive(Debug, Clone)]
pub(crate) struct Entries<'a> {
    spans: btree_map::Range<'a, u64, (u16, Slots)>,
    /// The span being walked: its first virtual cluster, slots, and the next slot to look at.
    span: Option<(u64, &'a [u64; SPAN], usize)>,
    /// Skip clusters below this one (in the first span).
    from: u64,
}

impl Iterator for Entries<'_> {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        loop {
            if let Some((base, slots, at)) = &mut self.span {
                if let Some(i) = slots[*at..].iter().position(|&s| s != 0) {
                    let i = *at + i;
                    *at = i + 1;
                    return Some((*base + i as u64, slots[i] - 1));
                }
            }
            let (&span, (_, slots)) = self.spans.next()?;
            let base = span * SPAN_U64;
            let at = if self.from > base { slot(self.from) } else { 0 };
            self.span = Some((base, slots, at));
        }
    }
}

impl PartialEq for ClusterMap {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.entries(0).eq(other.entries(0))
    }
}

impl Eq for ClusterMap {}

impl fmt::Debug for ClusterMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.entries(0)).finish()
    }
}

impl FromIterator<(u64, u64)> for ClusterMap {
    fn from_iter<I: IntoIterator<Item = (u64, u64)>>(pairs: I) -> Self {
        let mut map = Self::new();
        for (vc, pc) in pairs {
            map.insert(vc, pc);
        }
        map
    }
}

impl Serialize for ClusterMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let len = usize::try_from(self.len).ok();
        let mut map = s.serialize_map(len)?;
        for (vc, pc) in self.entries(0) {
            map.serialize_entry(&vc, &pc)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for ClusterMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(MapVisitor)
    }
}

struct MapVisitor;

impl<'de> Visitor<'de> for MapVisitor {
    type Value = ClusterMap;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of virtual to physical clusters")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut pairs: A) -> Result<ClusterMap, A::Error> {
        let mut map = ClusterMap::new();
        while let Some((vc, pc)) = pairs.next_entry::<u64, u64>()? {
            if pc == u64::MAX {
                return Err(serde::de::Error::custom("physical cluster out of range"));
            }
            // As a BTreeMap's decoding: a repeated key keeps its last value.
            map.insert(vc, pc);
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;
    use alloc::vec::Vec;

    /// A pseudo-random walk of inserts and removes, checked against a `BTreeMap` after each step.
    #[test]
    fn behaves_as_a_sorted_map() {
        let mut map = ClusterMap::new();
        let mut model = BTreeMap::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for step in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let vc = x % (4 * SPAN_U64) + if x & 1 == 0 { 0 } else { 1 << 40 };
            if x.is_multiple_of(3) {
                assert_eq!(map.remove(vc), model.remove(&vc), "remove {vc} at step {step}");
            } else {
                assert_eq!(
                    map.insert(vc, step),
                    model.insert(vc, step),
                    "insert {vc} at step {step}"
                );
            }
            assert_eq!(map.get(vc), model.get(&vc).copied());
            assert_eq!(map.len(), model.len() as u64);
        }
        assert_eq!(
            map.entries(0).collect::<Vec<_>>(),
            model.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>()
        );
        for from in [
            0,
            1,
            SPAN_U64 - 1,
            SPAN_U64,
            3 * SPAN_U64 + 7,
            1 << 40,
            (1 << 40) + 5,
            u64::MAX,
        ] {
            let want: Vec<_> = model.range(from..).map(|(&k, &v)| (k, v)).collect();
            assert_eq!(map.entries(from).collect::<Vec<_>>(), want, "entries from {from}");
        }
        assert_eq!(map.last(), model.last_key_value().map(|(&k, _)| k));
    }

    #[test]
    fn a_span_is_freed_with_its_last_mapping() {
        let mut map = ClusterMap::new();
        map.insert(5, 1);
        map.insert(SPAN_U64 + 5, 2);
        assert_eq!(map.spans.len(), 2);
        assert_eq!(map.remove(5), Some(1));
        assert_eq!(map.remove(5), None);
        assert_eq!(map.spans.len(), 1);
        assert_eq!(map.last(), Some(SPAN_U64 + 5));
        assert_eq!(map.remove(SPAN_U64 + 5), Some(2));
        assert!(map.spans.is_empty());
        assert_eq!((map.len(), map.last()), (0, None));
    }

    #[test]
    fn encodes_as_a_btree_map_of_the_same_pairs() {
        let pairs = [(0u64, 7u64), (3, 1), (SPAN_U64, 2), (1 << 33, 9)];
        let map: ClusterMap = pairs.into_iter().collect();
        let model: BTreeMap<u64, u64> = pairs.into_iter().collect();
        let bytes = postcard::to_allocvec(&map).unwrap();
        assert_eq!(bytes, postcard::to_allocvec(&model).unwrap());
        assert_eq!(postcard::from_bytes::<ClusterMap>(&bytes).unwrap(), map);
        // A physical cluster that cannot be stored is refused, not wrapped into a hole.
        let bad: BTreeMap<u64, u64> = [(1, u64::MAX)].into_iter().collect();
        assert!(postcard::from_bytes::<ClusterMap>(&postcard::to_allocvec(&bad).unwrap()).is_err());
    }
}
