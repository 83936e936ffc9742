//! Backups, the write transaction's local half: `d2h_done` publishes this round's D2H
//! blocks in Host L2, releases the H2D sources and turns the new blocks' pages into backup
//! candidates; `dispatch_backups` rechecks the candidates' Host residency and pins the
//! resident pages for the PUTs the StorageTransferManager decides.
//!
//! It never decides what to admit or read, never decides a PUT or its credits itself (the
//! manager does, asked directly) and never performs I/O.

use super::put_sources::{candidate_ref, candidate_slot};
use super::Scheduler;
use crate::cache::keys::{page_key, BlockAddr, ContentHash};
use crate::storage_transfer::{
    BackupCandidate, BackupKey, BlockPage, HostRef, StorageTransferManager,
};

impl Scheduler {
    /// The engine executed this round's copies and forwards: the D2H copies completed on
    /// every rank (the engine waits for their fence), so Host L2 publishes now and the new
    /// blocks become backup candidates (returned, for the StorageTransferManager); the H2D
    /// sources are released.
    pub fn d2h_done(&mut self) -> Vec<BackupCandidate> {
        let mut candidates = Vec::new();
        self.d2h_done_into(&mut candidates);
        candidates
    }

    /// `d2h_done` with the candidates appended to `candidates` (a caller that keeps one
    /// list makes none per round); the round's block lists keep their buffers too.
    pub fn d2h_done_into(&mut self, candidates: &mut Vec<BackupCandidate>) {
        if self.l3_enabled() {
            candidates.reserve(self.d2h_blocks.len());
        }
        self.d2h_done_each(|c| candidates.push(c));
    }

    /// D2H blocks waiting for `d2h_done` (each makes one candidate per page).
    pub fn d2h_pending_blocks(&self) -> usize {
        self.d2h_blocks.len()
    }

    /// `d2h_done` handing each candidate to `each` as it is made (the pipeline offers it
    /// to the manager at once: no list between them); `each` is never called with L3
    /// disabled.
    pub fn d2h_done_each(&mut self, mut each: impl FnMut(BackupCandidate)) {
        let l3 = self.l3_enabled();
        let Self {
            cache,
            h2d_host_refs,
            d2h_blocks,
            ..
        } = self;
        for source in h2d_host_refs.drain(..) {
            let _ = cache.host_mut().release_held(source);
        }
        for a in d2h_blocks.drain(..) {
            let Ok(slot) = cache.host_mut().publish(a) else {
                continue;
            };
            let _ = cache.host_mut().release(a);
            if l3 {
                let pages = cache.geometry().group(a.group as usize).pages_per_block;
                // The object key is made only at PUT dispatch (a dropped or coalesced
                // candidate never costs one); the reference names the slot the block was
                // published in (it holds nothing: dispatch rechecks the slot).
                let host = candidate_ref(slot);
                for page in 0..pages {
                    let key = BlockPage {
                        hash: a.hash.as_u128(),
                        group: a.group,
                        page,
                    };
                    each(BackupCandidate { key, host });
                }
            }
        }
    }

    /// PUT dispatch of this round's candidates: rechecks Host residency and takes a source
    /// reference on each resident page; evicted candidates are forgotten (unavailable).
    pub(super) fn dispatch_backups(&mut self, stm: &mut StorageTransferManager) {
        let cache = &mut self.cache;
        let sources = &mut self.put_sources;
        let mut residency = |key: &BackupKey, h: HostRef| {
            // The candidate's key names its page (`d2h_done` made it from the block).
            let addr = BlockAddr {
                group: key.group,
                hash: ContentHash::from_u128(key.hash),
            };
            let page = key.page;
            let page_bytes = cache.geometry().group(addr.group as usize).page_bytes;
            // Resident (published) pages take their source reference here: in the slot the
            // candidate names, checked to still carry the block; otherwise (the block left
            // that slot and may be resident in another, or a re-offered candidate names no
            // slot) found by the index. The source is kept until the PUT settles.
            let host = cache.host_mut();
            let taken = match candidate_slot(h) {
                Some(slot) => host
                    .acquire_published_page_at(addr, slot, page, page_bytes)
                    .or_else(|_| host.acquire_published_page(addr, page, page_bytes)),
                None => host.acquire_published_page(addr, page, page_bytes),
            };
            let (source, range) = taken.ok()?;
            Some((
                page_key(cache.namespace(), cache.geometry(), addr, page),
                range,
                sources.hold(source),
            ))
        };
        stm.plan_backups(&mut residency);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::super::Plan;
    use crate::storage_transfer::BlockPage;
    use messages::{StorageDone, StorageOp};

    /// A storage rig's request admitted after its QUERY missed everywhere.
    fn admit_after_a_miss(rig: &mut Rig, id: u64, p: &[u32]) -> Plan<StorageOp> {
        let plan = rig.arrive(&[(id, p, 4)]);
        let [StorageOp::Query(q)] = &plan.storage[..] else {
            panic!("{:?}", plan.storage);
        };
        let exists = vec![false; q.keys.len()];
        rig.round(super::super::AgreedInputs {
            completions: vec![StorageDone::query(q.op, exists, true)],
            ..Default::default()
        })
    }

    /// A request of prompt `seed` computed after a miss and its D2H blocks offered (seven
    /// full ones and the prompt end's tail, returned); the next round's plan dispatches
    /// them.
    fn offered(rig: &mut Rig, seed: u32) -> Vec<crate::cache::keys::BlockAddr> {
        admit_after_a_miss(rig, 1, &prompt(30, seed));
        let blocks = rig.s.d2h_blocks.clone();
        assert_eq!(rig.d2h_done(), 8);
        blocks
    }

    /// The operations of a plan's PUTs.
    fn put_ops(plan: &Plan<StorageOp>) -> Vec<messages::OperationId> {
        puts(plan).iter().map(|p| p.op).collect()
    }

    /// The PUTs of a plan.
    fn puts(plan: &Plan<StorageOp>) -> Vec<&messages::StoragePutOp> {
        plan.storage
            .iter()
            .filter_map(|o| match o {
                StorageOp::Put(p) => Some(p),
                _ => None,
            })
            .collect()
    }

    /// The source references of PUT `op` (its ticket's).
    fn put_sources(rig: &Rig, op: messages::OperationId) -> Vec<crate::storage_transfer::HostRef> {
        rig.stm.as_ref().unwrap().ticket(op).unwrap().refs.clone()
    }

    #[test]
    fn d2h_done_yields_candidates_only_for_computed_blocks() {
        let mut rig = rig(true);
        let p = prompt(30, 1);
        let plan = admit_after_a_miss(&mut rig, 1, &p);
        assert_eq!(
            plan.d2h.len(),
            8,
            "seven full blocks and the prompt end's tail"
        );
        let blocks = rig.s.d2h_blocks.clone();
        let candidates = rig.s.d2h_done();
        assert_eq!(candidates.len(), 8, "one page per tiny block");
        assert!(
            rig.s.put_sources.is_empty(),
            "a candidate holds nothing until its PUT's dispatch"
        );
        let c = rig.s.cache();
        for (cand, a) in candidates.iter().zip(&blocks) {
            assert_eq!(
                cand.key,
                BlockPage {
                    hash: a.hash.as_u128(),
                    group: a.group,
                    page: 0
                }
            );
            assert!(
                super::super::put_sources::candidate_slot(cand.host).is_some(),
                "a candidate's reference names the Host slot of its block"
            );
            assert!(c.host().contains(*a), "published in Host L2");
        }
        // The same prompt hits the Device: nothing new is computed into a full block.
        let plan = rig.arrive(&[(2, &p, 4)]);
        assert!(plan.d2h.is_empty());
        assert!(rig.s.d2h_done().is_empty());
    }

    /// A PUT rejected for capacity gives its sources back when it settles, and its
    /// re-offered candidates take new source references at their next dispatch.
    #[test]
    fn a_capacity_rejected_put_gives_its_sources_back_and_retakes_them_at_redispatch() {
        let mut rig = rig(true);
        let blocks = offered(&mut rig, 4);
        let first = put_ops(&rig.round(Default::default()));
        assert_eq!(first.len(), 1);
        let sources = put_sources(&rig, first[0]);
        let plan = rig.round(super::super::AgreedInputs {
            completions: vec![StorageDone::put(
                first[0],
                vec![false; 8],
                vec![0; 8],
                vec![true; 8],
                true,
            )],
            ..Default::default()
        });
        let mut again = put_ops(&plan);
        assert!(
            again.is_empty(),
            "the capacity backoff holds the re-offered candidates"
        );
        assert!(sources.iter().all(|h| !rig.s.put_sources.contains(*h)));
        assert!(blocks.iter().all(|b| rig.s.cache().host().refs(*b) == 0));
        // The capacity backoff passes; the candidates go out again.
        for _ in 0..200 {
            if !again.is_empty() {
                break;
            }
            again = put_ops(&rig.round(Default::default()));
        }
        assert_eq!(again.len(), 1, "re-dispatched");
        let resent = put_sources(&rig, again[0]);
        assert_eq!(resent.len(), 8);
        for h in &resent {
            assert!(
                rig.s
                    .put_sources
                    .get(*h)
                    .is_some_and(|held| blocks.contains(&held.addr())),
                "{h:?}"
            );
            assert!(!sources.contains(h), "a new reference for a new source");
        }
        assert!(blocks.iter().all(|b| rig.s.cache().host().refs(*b) == 1));
    }

    /// A candidate whose block left the Host slot it was published in and came back in
    /// another (evicted, then stored again) is still dispatched, found by the index; a
    /// block evicted for good is dropped as unavailable.
    #[test]
    fn a_candidate_whose_block_moved_to_another_slot_is_still_dispatched() {
        use crate::cache::keys::{BlockAddr, ContentHash};
        let mut rig = rig(true);
        let blocks = offered(&mut rig, 5);
        let (moved, gone) = (blocks[0], blocks[1]);
        let host = rig.s.cache.host_mut();
        let was = host.host_range(moved).unwrap();
        assert!(host.evict(gone) && host.evict(moved));
        // Another block takes `moved`'s slot; `moved` comes back in another, `gone` does not.
        let other = BlockAddr::new(moved.group as usize, ContentHash::from_u128(0xdead));
        host.insert_published(other, &mut vec![]).unwrap();
        host.insert_published(moved, &mut vec![]).unwrap();
        assert_eq!(
            host.host_range(other).unwrap(),
            was,
            "the old slot holds another block"
        );
        assert_ne!(host.host_range(moved).unwrap(), was);
        let plan = rig.round(Default::default());
        let puts = puts(&plan);
        assert_eq!(puts.len(), 1, "{:?}", plan.storage);
        assert_eq!(puts[0].keys.len(), 7, "every page but the evicted block's");
        let host = rig.s.cache().host();
        assert_eq!(host.refs(moved), 1, "its source is held where it is now");
        assert_eq!(
            host.refs(other),
            0,
            "the slot's new block is not taken for it"
        );
        assert!(blocks[2..].iter().all(|b| host.refs(*b) == 1));
    }

    #[test]
    fn without_storage_d2h_done_publishes_host_but_offers_nothing() {
        let mut rig = rig(false);
        let p = prompt(30, 2);
        rig.arrive(&[(1, &p, 4)]);
        let blocks = rig.s.d2h_blocks.clone();
        assert_eq!(blocks.len(), 8);
        assert!(blocks.iter().all(|a| !rig.s.cache().host().contains(*a)));
        assert!(rig.s.d2h_done().is_empty());
        assert!(blocks.iter().all(|a| rig.s.cache().host().contains(*a)));
        assert!(rig.s.put_sources.is_empty());
        assert!(rig.s.d2h_blocks.is_empty());
    }

    #[test]
    fn offered_candidates_are_dispatched_as_one_put_of_resident_pages() {
        let mut rig = rig(true);
        let blocks = offered(&mut rig, 3);
        let plan = rig.round(Default::default());
        let puts = puts(&plan);
        assert_eq!(puts.len(), 1, "{:?}", plan.storage);
        assert_eq!(puts[0].keys.len(), 8);
        assert_eq!(puts[0].sources.len(), 8);
        // Each source's reference holds its page's block from dispatch until the PUT
        // settles.
        let put = puts[0].op;
        let sources = put_sources(&rig, put);
        for h in &sources {
            match rig.s.put_sources.get(*h) {
                Some(held) => assert!(blocks.contains(&held.addr())),
                None => panic!("source {h:?} holds nothing"),
            }
        }
        assert!(blocks.iter().all(|b| rig.s.cache().host().refs(*b) == 1));
        rig.round(super::super::AgreedInputs {
            completions: vec![StorageDone::put(
                put,
                vec![true; 8],
                vec![16; 8],
                vec![false; 8],
                true,
            )],
            ..Default::default()
        });
        assert!(sources.iter().all(|h| !rig.s.put_sources.contains(*h)));
        assert!(rig.s.put_sources.is_empty());
        assert!(blocks.iter().all(|b| rig.s.cache().host().refs(*b) == 0));
    }
}
