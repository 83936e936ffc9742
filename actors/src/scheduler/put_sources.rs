//! The Host references the scheduler hands to the StorageTransferManager for backup PUTs,
//! and what each names. A backup candidate's reference names the Host slot its block was
//! published in (nonowning: it holds nothing, so dispatch rechecks that the slot still
//! carries the block); a dispatched PUT's source reference names a slot of this table,
//! which keeps the source's held block from dispatch until the PUT settles. Both are found
//! from the reference itself, without a hash probe.
//!
//! It owns only the held PUT sources; it never takes or releases a pool reference itself
//! (the scheduler does, with the handles it stores here) and never decides a PUT.

use crate::cache::pool::{HeldBlock, Host};
use crate::storage_transfer::HostRef;

/// A PUT source reference: this bit, the slot's generation above `SLOT_BITS`, the slot
/// below (GET rows use the top bit).
const PUT_SOURCE: u64 = 1 << 62;
/// A backup candidate's reference: this bit and the Host slot its block was published in.
const CANDIDATE: u64 = 1 << 61;
const SLOT_BITS: u32 = 32;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
/// Generations wrap below the tag bits.
const GENERATION_MASK: u64 = (1 << (61 - SLOT_BITS)) - 1;

/// A backup candidate's reference for a block published in Host slot `slot`.
pub(super) fn candidate_ref(slot: u32) -> HostRef {
    HostRef(CANDIDATE | u64::from(slot))
}

/// The Host slot a backup candidate's reference names (None: another kind of reference,
/// e.g. a re-offered candidate carrying its settled PUT's source reference).
pub(super) fn candidate_slot(h: HostRef) -> Option<u32> {
    (h.0 & (CANDIDATE | PUT_SOURCE | 1 << 63) == CANDIDATE).then_some((h.0 & SLOT_MASK) as u32)
}

/// The held sources of dispatched PUTs, by slot. A slot's generation changes each time it
/// is taken, so a stale or repeated reference finds nothing.
#[derive(Debug, Default)]
pub(super) struct PutSources {
    slots: Vec<(u64, Option<HeldBlock<Host>>)>,
    free: Vec<u32>,
}

impl PutSources {
    /// Keeps a PUT source; returns the reference that names it.
    pub(super) fn hold(&mut self, source: HeldBlock<Host>) -> HostRef {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push((0, None));
                (self.slots.len() - 1) as u32
            }
        };
        let entry = &mut self.slots[slot as usize];
        debug_assert!(entry.1.is_none(), "a free slot holds nothing");
        entry.0 = (entry.0 + 1) & GENERATION_MASK;
        entry.1 = Some(source);
        HostRef(PUT_SOURCE | entry.0 << SLOT_BITS | u64::from(slot))
    }

    /// The entry `h` names, if it is a live PUT source reference.
    fn entry(&self, h: HostRef) -> Option<usize> {
        if h.0 & (PUT_SOURCE | 1 << 63) != PUT_SOURCE {
            return None;
        }
        let slot = (h.0 & SLOT_MASK) as usize;
        let generation = (h.0 >> SLOT_BITS) & GENERATION_MASK;
        match self.slots.get(slot) {
            Some((g, Some(_))) if *g == generation => Some(slot),
            _ => None,
        }
    }

    /// Gives back the source `h` names (None: no live PUT source reference).
    pub(super) fn take(&mut self, h: HostRef) -> Option<HeldBlock<Host>> {
        let slot = self.entry(h)?;
        let source = self.slots[slot].1.take();
        self.free.push(slot as u32);
        source
    }

    /// The source `h` names, left in place.
    #[cfg(test)]
    pub(super) fn get(&self, h: HostRef) -> Option<&HeldBlock<Host>> {
        self.entry(h).and_then(|s| self.slots[s].1.as_ref())
    }

    /// Whether `h` names a live PUT source.
    #[cfg(test)]
    pub(super) fn contains(&self, h: HostRef) -> bool {
        self.entry(h).is_some()
    }

    /// Sources held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::keys::{BlockAddr, ContentHash};
    use crate::cache::pool::BlockPool;

    /// A Host pool holding `n` published blocks, one reference taken on each.
    fn held_blocks(n: u64) -> (BlockPool<Host>, Vec<HeldBlock<Host>>) {
        let mut pool = BlockPool::<Host>::new(&[16], &[64]);
        let mut held = vec![];
        for i in 1..=n {
            let a = BlockAddr::new(0, ContentHash::from_u128(u128::from(i)));
            pool.insert_published(a, &mut vec![]).unwrap();
            held.push(pool.acquire_published(a).unwrap().0);
        }
        (pool, held)
    }

    /// A source is found by its reference once; a reused slot's new reference differs, so
    /// the old one (stale, or released twice) finds nothing; other kinds of reference are
    /// never taken for one.
    #[test]
    fn a_put_source_reference_names_its_source_once() {
        let (mut pool, mut held) = held_blocks(3);
        let mut s = PutSources::default();
        let c = held.pop().unwrap();
        let b = held.pop().unwrap();
        let a = held.pop().unwrap();
        let (addr_a, addr_b) = (a.addr(), b.addr());
        let ra = s.hold(a);
        let rb = s.hold(b);
        assert_ne!(ra, rb);
        assert_eq!(s.len(), 2);
        assert_eq!(s.get(ra).map(|h| h.addr()), Some(addr_a));
        let taken = s.take(ra).unwrap();
        assert_eq!(taken.addr(), addr_a);
        assert!(s.take(ra).is_none(), "a second release finds nothing");
        pool.release_held(taken).unwrap();
        // The freed slot is reused under a new generation: the old reference stays dead.
        let rc = s.hold(c);
        assert_ne!(rc, ra);
        assert!(!s.contains(ra) && s.contains(rc) && s.contains(rb));
        assert!(s.take(ra).is_none());
        // References of other kinds name no source.
        assert!(s.take(candidate_ref(0)).is_none());
        assert!(s.take(HostRef(1 << 63 | (rb.0 & SLOT_MASK))).is_none());
        assert!(s.take(HostRef(7)).is_none());
        assert_eq!(s.take(rb).map(|h| h.addr()), Some(addr_b));
        assert_eq!(s.len(), 1);
        pool.release_held(s.take(rc).unwrap()).unwrap();
        assert!(s.is_empty());
    }

    #[test]
    fn a_candidate_reference_names_its_slot_and_nothing_else_does() {
        assert_eq!(candidate_slot(candidate_ref(0)), Some(0));
        assert_eq!(candidate_slot(candidate_ref(u32::MAX)), Some(u32::MAX));
        let (_pool, mut held) = held_blocks(1);
        let mut s = PutSources::default();
        let r = s.hold(held.pop().unwrap());
        assert_eq!(candidate_slot(r), None, "a PUT source");
        assert_eq!(candidate_slot(HostRef(1 << 63 | 5)), None, "a GET row");
        assert_eq!(candidate_slot(HostRef(5)), None, "an untagged reference");
    }
}
