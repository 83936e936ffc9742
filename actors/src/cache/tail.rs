//! Tails: a partial last block (a boundary that is not a multiple of the LCM parent block)
//! with its exact token count and hash, and the bounded local TailTable of tail hints.
//!
//! The TailTable only proposes candidate boundaries. It must never establish a hit: the
//! group matcher still requires Full history, the SWA lookback and every State checkpoint
//! at the same boundary. There is no shared tail directory and no scan of every token
//! position; lookups visit one entry per LCM parent boundary of the prompt.

use super::keys::{BuildContentHasher, ContentHash, PromptIndex};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

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

/// The hints under one LCM parent: by tail length, the identity hashes recorded. A lookup
/// computes a prompt's tail identity once per recorded length, whatever the number of
/// hints (many prompts behind one system prompt share a parent).
type ParentTails = BTreeMap<u32, HashSet<ContentHash, BuildContentHasher>>;

/// The bounded local table of tail hints (FIFO: the oldest hint goes first). Recording and
/// forgetting a hint cost O(1) set operations, not a scan of its parent's hints.
#[derive(Clone, Debug)]
pub struct TailTable {
    capacity: usize,
    by_parent: HashMap<ContentHash, ParentTails, BuildContentHasher>,
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
        let fresh = self
            .by_parent
            .entry(hint.parent)
            .or_default()
            .entry(hint.extra)
            .or_insert_with(|| HashSet::with_hasher(BuildContentHasher))
            .insert(hint.hash);
        if !fresh {
            return true;
        }
        self.order.push_back(hint);
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.forget(old);
            }
        }
        true
    }

    fn forget(&mut self, old: TailHint) {
        let Some(tails) = self.by_parent.get_mut(&old.parent) else {
            return;
        };
        if let Some(hashes) = tails.get_mut(&old.extra) {
            hashes.remove(&old.hash);
            if hashes.is_empty() {
                tails.remove(&old.extra);
            }
        }
        if tails.is_empty() {
            self.by_parent.remove(&old.parent);
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
        self.candidates_into(&mut out, index, tokens, lo, hi);
        out.sort();
        out.dedup();
        out
    }

    /// `candidates` appended to `out` (neither sorted nor deduplicated: the caller does).
    pub fn candidates_into(
        &self,
        out: &mut Vec<TailCandidate>,
        index: &PromptIndex,
        tokens: &[u32],
        lo: u32,
        hi: u32,
    ) {
        if self.order.is_empty() {
            return;
        }
        let l = index.parent_tokens();
        let hi = hi.min(index.len());
        let mut scratch = Vec::new();
        let mut k = lo / l;
        while k * l < hi {
            if let Some(tails) = self.by_parent.get(&index.parent_hash(k)) {
                for (&extra, hashes) in tails {
                    let b = k * l + extra;
                    if b <= lo || b > hi {
                        continue;
                    }
                    let hash = index.tail_identity(&mut scratch, tokens, b);
                    if hashes.contains(&hash) {
                        out.push(TailCandidate { boundary: b, hash });
                    }
                }
            }
            k += 1;
        }
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

    #[test]
    fn many_tails_under_one_parent_match_only_their_own_prompt_and_leave_in_order() {
        let g = geo();
        // Prompts share their first block (one system prompt) and differ in the tail.
        let prompt = |n: u32| -> Vec<u32> { (0..8).chain([100 + n, 200 + n, 7]).collect() };
        let mut t = TailTable::new(4);
        for n in 0..6u32 {
            let p = prompt(n);
            let idx = PromptIndex::new(&g, &p, 11);
            let len = if n % 2 == 0 { 10 } else { 9 };
            assert!(t.record(&idx, TailCandidate::at(&idx, &p, len).unwrap()));
        }
        assert_eq!(t.len(), 4, "bounded");
        for n in 0..6u32 {
            let p = prompt(n);
            let idx = PromptIndex::new(&g, &p, 11);
            let got: Vec<u32> = t
                .candidates(&idx, &p, 0, 11)
                .iter()
                .map(|c| c.boundary)
                .collect();
            let want: Vec<u32> = match n {
                0 | 1 => vec![], // the two oldest left first
                _ if n % 2 == 0 => vec![10],
                _ => vec![9],
            };
            assert_eq!(got, want, "prompt {n}");
        }
        // A prompt with another tail under the same parent matches nothing.
        let q = prompt(50);
        let iq = PromptIndex::new(&g, &q, 11);
        assert!(t.candidates(&iq, &q, 0, 11).is_empty());
    }

    proptest::proptest! {
        /// The table against the list of its distinct hints, oldest first: a new hint goes
        /// at the back (the oldest leave past the capacity), a recorded one keeps its place,
        /// no capacity records nothing; the lookup maps hold exactly the listed hints, with no
        /// empty set or parent left behind.
        #[test]
        fn the_tail_table_keeps_every_promise_of_its_model(
            capacity in 0usize..4,
            steps in proptest::collection::vec((0u128..3, 1u32..3, 0u128..3), 1..40),
        ) {
            let mut t = TailTable::new(capacity);
            let mut model: VecDeque<(u128, u32, u128)> = VecDeque::new();
            for (parent, extra, hash) in steps {
                let hint = TailHint {
                    parent: ContentHash::from_u128(parent),
                    extra,
                    hash: ContentHash::from_u128(hash),
                };
                let h = (parent, extra, hash);
                let want = capacity > 0;
                if want && !model.contains(&h) {
                    model.push_back(h);
                    while model.len() > capacity {
                        model.pop_front();
                    }
                }
                proptest::prop_assert_eq!(t.record_hint(hint), want);
                proptest::prop_assert_eq!(t.len(), model.len());
                proptest::prop_assert_eq!(t.is_empty(), model.is_empty());
                let order: Vec<_> = t
                    .order
                    .iter()
                    .map(|x| (x.parent.as_u128(), x.extra, x.hash.as_u128()))
                    .collect();
                proptest::prop_assert_eq!(&order, &Vec::from(model.clone()));
                let mut mapped = vec![];
                for (p, tails) in &t.by_parent {
                    proptest::prop_assert!(!tails.is_empty(), "no empty parent");
                    for (e, hashes) in tails {
                        proptest::prop_assert!(!hashes.is_empty(), "no empty length");
                        mapped.extend(hashes.iter().map(|x| (p.as_u128(), *e, x.as_u128())));
                    }
                }
                mapped.sort();
                let mut listed = order.clone();
                listed.sort();
                proptest::prop_assert_eq!(mapped, listed);
            }
        }
    }
}
