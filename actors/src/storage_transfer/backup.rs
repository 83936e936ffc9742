//! The backup candidate queue: bounded and nonowning. A candidate is (BackupKey, HostRef)
//! with no reference taken; residency is rechecked at PUT dispatch, where residents take
//! source references and evicted candidates are dropped as unavailable. A candidate's key
//! is compact (the Host page it names) until that dispatch makes its object key, so a
//! candidate that is dropped or coalesced never costs a key string. Overflow drops the
//! oldest candidate. A candidate already queued or covered by a pending PUT coalesces (not
//! a loss): the queue also keeps, per key, how many PUTs of the current clear epoch carry
//! it (marked at dispatch, counted down at their completion), in the same record as its
//! queueing. Dropped candidate occurrences are counted by a fixed reason. The queue never
//! pins Host memory, never decides a PUT or its credits and never decides retirement.

use super::HostRef;
use crate::id_map::IdMap;
#[cfg(test)]
use messages::StorageKey;
use std::collections::hash_map::Entry;
use std::collections::VecDeque;

/// A lookup-only table keyed by backup key (never iterated where the order could reach a
/// decision): a page's content hash is already uniform, so it takes the ID tables' hash.
pub type KeyTable<V> = IdMap<BackupKey, V>;

/// A Host page of the cache owner: a block's content hash, its group and the page within
/// it. Within one namespace and rank it names exactly one object key (the cache owner
/// makes that key at PUT dispatch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockPage {
    pub hash: u128,
    pub group: u32,
    pub page: u32,
}

/// One word: the content hash is already uniform, so its two halves (the high one turned
/// half over, so that a hash and the same value shifted into the other half differ) with
/// the group and page folded in name a page as well as the three fields do, for one
/// multiply in the ID tables' hasher instead of four. Equal pages hash alike, as `Eq`
/// requires.
impl std::hash::Hash for BlockPage {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let place = (u64::from(self.group) << 32 | u64::from(self.page)).rotate_left(29);
        state.write_u64(self.hash as u64 ^ ((self.hash >> 64) as u64).rotate_left(32) ^ place);
    }
}

/// What a backup candidate backs up: a Host page of the cache owner.
pub type BackupKey = BlockPage;

/// Test naming: a test offers candidates under readable object keys. The key's page is its
/// xxh3-128 (group 0, page 0), remembered on this thread so that `named_key` gives the key
/// back at PUT dispatch (`plan_backups_keyed`).
#[cfg(test)]
impl From<StorageKey> for BlockPage {
    fn from(k: StorageKey) -> Self {
        let hash = xxhash_rust::xxh3::xxh3_128(k.text().as_bytes());
        NAMED.with(|n| n.borrow_mut().insert(hash, k));
        BlockPage {
            hash,
            group: 0,
            page: 0,
        }
    }
}

#[cfg(test)]
thread_local! {
    static NAMED: std::cell::RefCell<std::collections::HashMap<u128, StorageKey>> = Default::default();
}

/// The object key a test named a page by (None for a page no test key named).
#[cfg(test)]
pub(crate) fn named_key(p: &BlockPage) -> Option<StorageKey> {
    if p.group != 0 || p.page != 0 {
        return None;
    }
    NAMED.with(|n| n.borrow().get(&p.hash).cloned())
}

/// Why a backup candidate was dropped (the fixed `reason` label of the dropped-keys counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// The pressure gate is closed (or closed while it was queued).
    Pressure,
    /// The bounded queue overflowed and dropped its oldest candidate.
    Overflow,
    /// At dispatch the Host entry was no longer resident.
    Unavailable,
    /// Writes are disabled: a permanently zero write budget, or L3 stopped by quarantine.
    Disabled,
    /// A clear / namespace rotation / weight update discarded queued work.
    Cleanup,
}

impl DropReason {
    pub const ALL: [DropReason; 5] = [
        DropReason::Pressure,
        DropReason::Overflow,
        DropReason::Unavailable,
        DropReason::Disabled,
        DropReason::Cleanup,
    ];
    pub fn as_str(&self) -> &'static str {
        match self {
            DropReason::Pressure => "pressure",
            DropReason::Overflow => "overflow",
            DropReason::Unavailable => "unavailable",
            DropReason::Disabled => "disabled",
            DropReason::Cleanup => "cleanup",
        }
    }
    pub fn index(&self) -> usize {
        *self as usize
    }
}

/// A nonowning backup candidate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BackupCandidate {
    pub key: BackupKey,
    pub host: HostRef,
}

/// What happened to an offered candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OfferOutcome {
    Queued,
    /// Queued; the oldest candidate was dropped (overflow).
    QueuedDroppedOldest,
    /// Already queued or covered by a pending PUT: not a loss.
    Coalesced,
    /// Dropped at once for this reason.
    Dropped(DropReason),
}

/// What the queue knows of one backup key: whether a candidate of it is queued (at most
/// one is) and how many PUTs of which clear epoch carry it (an older epoch's PUTs cover
/// nothing new).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct KeyRecord {
    queued: bool,
    pending_epoch: u64,
    pending: u32,
}

impl KeyRecord {
    fn pending_in(&self, epoch: u64) -> bool {
        self.pending > 0 && self.pending_epoch == epoch
    }
    /// Nothing left to remember: neither queued nor carried by a PUT.
    fn idle(&self) -> bool {
        !self.queued && self.pending == 0
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupQueue {
    capacity: usize,
    queue: VecDeque<BackupCandidate>,
    /// Per key, queued and pending PUTs in one record (lookups only; the queue keeps the
    /// order), so an offer, a dispatch and a PUT's completion each find a key once.
    keys: KeyTable<KeyRecord>,
    dropped: [u64; 5],
    coalesced: u64,
    /// References of candidates that left the queue without a PUT (dropped or coalesced):
    /// the cache owner may forget them (`drain_forgotten_into`). Candidates are nonowning, so
    /// forgetting unpins nothing.
    forgotten: Vec<HostRef>,
}

impl BackupQueue {
    pub fn new(capacity: u32) -> Self {
        Self {
            capacity: capacity.max(1) as usize,
            queue: VecDeque::new(),
            keys: KeyTable::default(),
            dropped: [0; 5],
            coalesced: 0,
            forgotten: Vec::new(),
        }
    }

    /// Queue a candidate unless its key is already queued or a PUT of clear epoch `epoch`
    /// in flight covers it.
    pub fn offer(&mut self, candidate: BackupCandidate, epoch: u64) -> OfferOutcome {
        let rec = self.keys.entry(candidate.key).or_default();
        if rec.queued || rec.pending_in(epoch) {
            self.coalesced += 1;
            self.forgotten.push(candidate.host);
            return OfferOutcome::Coalesced;
        }
        rec.queued = true;
        let mut outcome = OfferOutcome::Queued;
        if self.queue.len() >= self.capacity {
            if let Some(oldest) = self.pop_front() {
                self.count_drop(DropReason::Overflow, 1);
                self.forgotten.push(oldest.host);
                outcome = OfferOutcome::QueuedDroppedOldest;
            }
        }
        self.queue.push_back(candidate);
        outcome
    }

    /// Room for `n` more offers: the key table's and the queue's, at most the capacity.
    pub fn reserve(&mut self, n: usize) {
        self.keys.reserve(n.min(self.capacity));
        self.queue
            .reserve(n.min(self.capacity.saturating_sub(self.queue.len())));
    }

    /// Take the oldest candidate (its key no longer queued).
    pub fn pop_front(&mut self) -> Option<BackupCandidate> {
        let c = self.queue.pop_front()?;
        self.unqueue(&c.key);
        Some(c)
    }

    fn unqueue(&mut self, key: &BackupKey) {
        if let Entry::Occupied(mut e) = self.keys.entry(*key) {
            e.get_mut().queued = false;
            if e.get().idle() {
                e.remove();
            }
        }
    }

    /// PUT dispatch of the oldest candidate: `take` rechecks it (Some: a PUT of clear
    /// epoch `epoch` carries it from now on, until `unpend`). Returns the candidate and what
    /// `take` gave; None when the queue is empty. One lookup of the key.
    pub fn dispatch_front<T>(
        &mut self,
        epoch: u64,
        take: impl FnOnce(&BackupCandidate) -> Option<T>,
    ) -> Option<(BackupCandidate, Option<T>)> {
        let c = self.queue.pop_front()?;
        let taken = take(&c);
        match self.keys.entry(c.key) {
            Entry::Occupied(mut e) => {
                let rec = e.get_mut();
                // The queue holds each key once and none a pending PUT covers.
                debug_assert!(rec.queued && !rec.pending_in(epoch));
                rec.queued = false;
                if taken.is_some() {
                    rec.pending = if rec.pending_epoch == epoch {
                        rec.pending + 1
                    } else {
                        1
                    };
                    rec.pending_epoch = epoch;
                } else if rec.idle() {
                    e.remove();
                }
            }
            Entry::Vacant(_) => debug_assert!(false, "a queued candidate's key has a record"),
        }
        Some((c, taken))
    }

    /// A PUT of clear epoch `epoch` that carried `key` completed: one PUT fewer covers it
    /// (a newer epoch's PUTs are not this one's to count down).
    pub fn unpend(&mut self, key: &BackupKey, epoch: u64) {
        if let Entry::Occupied(mut e) = self.keys.entry(*key) {
            let rec = e.get_mut();
            if rec.pending_in(epoch) {
                rec.pending -= 1;
                if rec.idle() {
                    e.remove();
                }
            }
        }
    }

    /// A PUT of clear epoch `epoch` in flight covers `key`.
    pub fn put_pending(&self, key: &BackupKey, epoch: u64) -> bool {
        self.keys.get(key).is_some_and(|r| r.pending_in(epoch))
    }

    /// Drop every queued candidate for `reason`; returns how many.
    pub fn drop_all(&mut self, reason: DropReason) -> u64 {
        let n = self.queue.len() as u64;
        self.forgotten.extend(self.queue.iter().map(|c| c.host));
        // Keys that PUTs still carry keep their records; the rest are forgotten.
        self.keys.retain(|_, r| {
            r.queued = false;
            !r.idle()
        });
        self.queue.clear();
        self.count_drop(reason, n);
        n
    }

    /// A candidate that left without a PUT for a reason counted elsewhere.
    pub fn forget(&mut self, host: HostRef) {
        self.forgotten.push(host);
    }

    /// References of candidates that left the queue without a PUT since the last call,
    /// moved to the end of `to` (the queue keeps its buffer).
    pub fn drain_forgotten_into(&mut self, to: &mut Vec<HostRef>) {
        to.append(&mut self.forgotten);
    }

    pub fn count_drop(&mut self, reason: DropReason, n: u64) {
        self.dropped[reason.index()] += n;
    }

    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped[reason.index()]
    }
    pub fn dropped_all(&self) -> [u64; 5] {
        self.dropped
    }
    pub fn coalesced(&self) -> u64 {
        self.coalesced
    }
    pub fn len(&self) -> usize {
        self.queue.len()
    }
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
    /// Whether a candidate of `key` is queued.
    pub fn contains_key(&self, key: &BackupKey) -> bool {
        self.keys.get(key).is_some_and(|r| r.queued)
    }
    /// The queued candidates, oldest first (tests).
    #[cfg(test)]
    pub fn candidates(&self) -> Vec<BackupCandidate> {
        self.queue.iter().cloned().collect()
    }
}

#[cfg(test)]
#[path = "backup_model.rs"]
mod model;

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(k: &str, h: u64) -> BackupCandidate {
        BackupCandidate {
            key: StorageKey::new(k).into(),
            host: HostRef(h),
        }
    }

    #[test]
    fn overflow_drops_oldest_and_counts() {
        let mut q = BackupQueue::new(2);
        assert_eq!(q.offer(cand("a", 1), 0), OfferOutcome::Queued);
        assert_eq!(q.offer(cand("b", 2), 0), OfferOutcome::Queued);
        assert_eq!(q.offer(cand("c", 3), 0), OfferOutcome::QueuedDroppedOldest);
        assert_eq!(q.dropped(DropReason::Overflow), 1);
        assert!(!q.contains_key(&StorageKey::new("a").into()));
        assert_eq!(q.pop_front(), Some(cand("b", 2)));
        assert_eq!(q.pop_front(), Some(cand("c", 3)));
        assert_eq!(q.pop_front(), None);
    }

    #[test]
    fn page_keys_hash_apart_and_equal_pages_hash_alike() {
        use std::hash::BuildHasher;
        let h = |k: &BackupKey| crate::id_map::BuildIdHasher.hash_one(k);
        let p = |hash: u128, group: u32, page: u32| BlockPage { hash, group, page };
        assert_eq!(h(&p(7, 1, 2)), h(&p(7, 1, 2)));
        let distinct = [
            p(7, 1, 2),
            p(7, 2, 1),
            p(7, 1, 3),
            p(8, 1, 2),
            p(7 << 64, 1, 2),
            // Only the group differs from the first; only the high half from the next.
            p(7, 2, 2),
            p(0, 1, 2),
        ];
        for (i, a) in distinct.iter().enumerate() {
            for b in &distinct[i + 1..] {
                assert_ne!(h(a), h(b), "{a:?} {b:?}");
            }
        }
        assert_ne!(
            h(&StorageKey::new("a").into()),
            h(&StorageKey::new("b").into())
        );
    }

    #[test]
    fn coalescing_is_not_a_loss() {
        let mut q = BackupQueue::new(4);
        q.offer(cand("b", 2), 0);
        let (b, put) = q.dispatch_front(0, |_| Some(())).unwrap();
        assert_eq!((b, put), (cand("b", 2), Some(())));
        q.offer(cand("a", 1), 0);
        assert_eq!(q.offer(cand("a", 1), 0), OfferOutcome::Coalesced);
        assert_eq!(
            q.offer(cand("b", 2), 0),
            OfferOutcome::Coalesced,
            "a PUT carries b"
        );
        assert_eq!(q.coalesced(), 2);
        assert_eq!(q.dropped_all(), [0; 5]);
        assert_eq!(q.len(), 1);
        assert_eq!(q.drop_all(DropReason::Cleanup), 1);
        assert_eq!(q.dropped(DropReason::Cleanup), 1);
        assert!(q.is_empty());
        assert!(
            q.put_pending(&cand("b", 2).key, 0),
            "a drop keeps what PUTs carry"
        );
    }

    /// One record per key follows it through offer, dispatch and completion: a key a PUT
    /// carries coalesces until that PUT completes (only PUTs of the current clear epoch
    /// count), a candidate that was not taken leaves nothing pending, and a key's record
    /// goes once nothing is queued or pending.
    #[test]
    fn a_key_is_pending_from_dispatch_until_its_puts_complete() {
        let mut q = BackupQueue::new(8);
        let (a, b) = (cand("a", 1), cand("b", 2));
        q.offer(a.clone(), 0);
        q.offer(b.clone(), 0);
        // a is taken by a PUT, b was no longer resident.
        assert_eq!(q.dispatch_front(0, |_| Some(7)), Some((a.clone(), Some(7))));
        assert_eq!(
            q.dispatch_front(0, |_| None::<u32>),
            Some((b.clone(), None))
        );
        assert!(q.put_pending(&a.key, 0) && !q.contains_key(&a.key));
        assert!(!q.put_pending(&b.key, 0) && !q.contains_key(&b.key));
        assert_eq!(q.keys.len(), 1, "b's record went with its candidate");
        assert_eq!(q.offer(a.clone(), 0), OfferOutcome::Coalesced);
        assert_eq!(q.offer(b.clone(), 0), OfferOutcome::Queued);
        // A newer clear epoch: the old PUT covers nothing, so a is queued again and a
        // second PUT (of the new epoch) carries it.
        assert!(!q.put_pending(&a.key, 1));
        assert_eq!(q.offer(a.clone(), 1), OfferOutcome::Queued);
        assert_eq!(q.pop_front(), Some(b.clone()));
        assert_eq!(
            q.dispatch_front(1, |_| Some(())),
            Some((a.clone(), Some(())))
        );
        // The old epoch's completion is not the new PUT's to count down.
        q.unpend(&a.key, 0);
        assert!(q.put_pending(&a.key, 1));
        q.unpend(&a.key, 1);
        assert!(!q.put_pending(&a.key, 1));
        assert!(
            q.keys.is_empty(),
            "no record outlives its key's queueing and PUTs"
        );
    }
}
