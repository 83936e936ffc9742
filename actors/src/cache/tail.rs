//! Tails: a partial last block (a boundary that is not a multiple of the LCM parent block)
//! with its exact token count and hash, and the bounded local TailTable of tail hints.
//!
//! The TailTable only proposes candidate boundaries. It must never establish a hit: the
//! group matcher still requires Full history, the SWA lookback and every State checkpoint
//! at the same boundary. There is no shared tail directory and no scan of every token
//! position; lookups visit one entry per LCM parent boundary of the prompt.

use super::keys::{BuildContentHasher, ContentHash, PromptIndex};
use std::collections::{HashMap, VecDeque};

/// A nonaligned boundary candidate: its exact token count and its identity hash (the LCM
/// parent chain below it extended by the remaining tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TailCandidate {
    pub boundary: u32,
    pub hash: ContentHash,
}

impl TailCandidate {
    /// The tail candidate at `boundary` of an indexed prompt; None when aligned or out of
    /// the index.
    pub fn at(index: &PromptIndex, tokens: &[u32], boundary: u32) -> Option<Self> {
        if boundary == 0 || boundary > index.len() || boundary.is_multiple_of(index.parent_tokens())
        {
            return None;
        }
        let mut scratch = Vec::new();
        Some(Self {
            boundary,
            hash: index.tail_identity(&mut scratch, tokens, boundary),
        })
    }
}

/// One recordable hint: under `parent` (LCM chain at the aligned boundary below the tail),
/// a tail of `extra` tokens with identity `hash`. Carries no prompt, so a reservation can
/// keep it until its GET publishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TailHint {
    parent: ContentHash,
    extra: u32,
    hash: ContentHash,
}

impl TailHint {
    /// The hint of a tail of an indexed prompt; None when the boundary is aligned.
    pub fn of(index: &PromptIndex, tail: TailCandidate) -> Option<Self> {
        let l = index.parent_tokens();
        if tail.boundary.is_multiple_of(l) || tail.boundary > index.len() {
            return None;
        }
        let k = tail.boundary / l;
        Some(Self {
            parent: index.parent_hash(k),
            extra: tail.boundary - k * l,
            hash: tail.hash,
        })
    }
}

/// The bounded local table of tail hints (FIFO: the oldest hint goes first).
#[derive(Clone, Debug)]
pub struct TailTable {
    capacity: usize,
    by_parent: HashMap<ContentHash, Vec<(u32, ContentHash)>, BuildContentHasher>,
    order: VecDeque<TailHint>,
}

impl TailTable {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            by_parent: HashMap::with_hasher(BuildContentHasher),
            order: VecDeque::new(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Records a tail hint of an indexed prompt (after Host data was published under it).
    /// Returns false when the boundary is aligned or the table has no capacity.
    pub fn record(&mut self, index: &PromptIndex, tail: TailCandidate) -> bool {
        match TailHint::of(index, tail) {
            Some(hint) => self.record_hint(hint),
            None => false,
        }
    }

    /// Records a hint; false when the table has no capacity.
    pub fn record_hint(&mut self, hint: TailHint) -> bool {
        if self.capacity == 0 {
            return false;
        }
        let entry = self.by_parent.entry(hint.parent).or_default();
        if entry.contains(&(hint.extra, hint.hash)) {
            return true;
        }
        entry.push((hint.extra, hint.hash));
        self.order.push_back(hint);
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.forget(old);
            }
        }
        true
    }

    fn forget(&mut self, old: TailHint) {
        if let Some(v) = self.by_parent.get_mut(&old.parent) {
            v.retain(|x| *x != (old.extra, old.hash));
            if v.is_empty() {
                self.by_parent.remove(&old.parent);
            }
        }
    }

    /// Tail candidates of this prompt with boundary in (lo, hi], sorted by boundary.
    pub fn candidates(
        &self,
        index: &PromptIndex,
        tokens: &[u32],
        lo: u32,
        hi: u32,
    ) -> Vec<TailCandidate> {
        let mut out = Vec::new();
        if self.order.is_empty() {
            return out;
        }
        let l = index.parent_tokens();
        let hi = hi.min(index.len());
        let mut scratch = Vec::new();
        let mut k = lo / l;
        while k * l < hi {
            if let Some(v) = self.by_parent.get(&index.parent_hash(k)) {
                for &(extra, hash) in v {
                    let b = k * l + extra;
                    if b > lo && b <= hi && index.tail_identity(&mut scratch, tokens, b) == hash {
                        out.push(TailCandidate { boundary: b, hash });
                    }
                }
            }
            k += 1;
        }
        out.sort();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::geometry::{CacheGeometry, GroupSpec};

    fn geo() -> CacheGeometry {
        CacheGeometry::new(vec![GroupSpec::full("a", 8, 1, 8)], 1, 0).unwrap()
    }

    #[test]
    fn hints_match_only_their_prompt_and_range() {
        let g = geo();
        let p: Vec<u32> = (0..64).collect();
        let idx = PromptIndex::new(&g, &p, 64);
        let mut t = TailTable::new(8);
        let tail = TailCandidate::at(&idx, &p, 21).unwrap();
        assert!(
            TailCandidate::at(&idx, &p, 24).is_none(),
            "aligned is not a tail"
        );
        assert!(t.record(&idx, tail));
        assert_eq!(t.candidates(&idx, &p, 0, 64), vec![tail]);
        assert!(t.candidates(&idx, &p, 21, 64).is_empty(), "lo is exclusive");
        assert!(t.candidates(&idx, &p, 0, 20).is_empty());
        // A prompt diverging inside the tail does not match.
        let mut q = p.clone();
        q[20] = 7;
        let iq = PromptIndex::new(&g, &q, 64);
        assert!(t.candidates(&iq, &q, 0, 64).is_empty());
        // A prompt diverging after the tail still matches.
        let mut r = p.clone();
        r[40] = 7;
        let ir = PromptIndex::new(&g, &r, 64);
        assert_eq!(t.candidates(&ir, &r, 0, 64), vec![tail]);
    }

    #[test]
    fn table_is_bounded_fifo() {
        let g = geo();
        let p: Vec<u32> = (0..64).collect();
        let idx = PromptIndex::new(&g, &p, 64);
        let mut t = TailTable::new(2);
        for b in [3u32, 11, 19] {
            t.record(&idx, TailCandidate::at(&idx, &p, b).unwrap());
        }
        assert_eq!(t.len(), 2);
        let got: Vec<u32> = t
            .candidates(&idx, &p, 0, 64)
            .iter()
            .map(|c| c.boundary)
            .collect();
        assert_eq!(got, vec![11, 19], "the oldest hint was dropped");
        // Re-recording a present hint does not grow the table.
        t.record(&idx, TailCandidate::at(&idx, &p, 19).unwrap());
        assert_eq!(t.len(), 2);
        assert!(!TailTable::new(0).record(&idx, TailCandidate::at(&idx, &p, 3).unwrap()));
    }
}
