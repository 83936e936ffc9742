//! DFS → MEMORY promotion (seed 003, notes/dfs-promotion.md): admission with per-key
//! dedup across every trigger, attempt records with a global monotonic `attempt_id`, the
//! bounded worker pipeline (read the source into staging, revalidate its identity, only
//! then issue a MEMORY target, write through the fence, verify exact bytes and checksum,
//! commit), exactly-once settlement (compare-and-set on attempt id + state), expiry on an
//! injected clock, and cancellation of one waiter.
//!
//! It must never publish a partially written or unverified target, never let a stale
//! attempt commit, never return a target's bytes to the budget before its writer drained
//! (expiry only fences), never settle an attempt twice, and never revoke a committed
//! replica because a waiter went away.
//!
//! Lost executors and notifications (seed 003): this store retains conservatively. A
//! worker that never returns keeps its target's bytes charged to the MEMORY budget and
//! its staging reserved for the life of the process; expiry fences and unlinks the target
//! and answers the waiters, but no elapsed-time reaper frees anything a worker can still
//! touch. A killed process loses only its own MEMORY tier (the OS reclaims it); on the
//! shared DFS it can leave an invisible `.tmp-*` file, never a visible partial object.

use super::hooks::{PromotionHooks, PromotionStage};
use super::memory_tier::{MemoryTarget, MemoryTier};
use super::staging::{StagingBudget, StagingReservation};
use super::stats::{FailReason, PromotionStats};
use crate::clock::SharedClock;
use crate::l3::store::dfs::{split_key, DfsStore, ObjectIdentity, ReadError};
use crate::l3::store::{CapacityReason, PromotionFailure, PromotionResult};
use messages::{Namespace, StorageKey};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Attempt ids: global to the process, monotonic, never reused (a stale notification can
/// never name a newer attempt).
static NEXT_ATTEMPT_ID: AtomicU64 = AtomicU64::new(1);

/// Bytes copied into a target between fence checks.
pub const PROMOTION_CHUNK: usize = 256 * 1024;
/// How often a blocked waiter wakes to run the expiry reaper.
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// The life of one attempt. Terminal states absorb.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptState {
    /// Admitted, waiting for a worker.
    Queued,
    /// A worker is reading the source into staging.
    Reading,
    /// A MEMORY target was issued; the writer is copying into it.
    Staged,
    /// The target holds the exact bytes and checksum; commit pending.
    Verified,
    Committed,
    Failed(FailReason),
    Expired,
    Cancelled,
}

impl AttemptState {
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            AttemptState::Committed
                | AttemptState::Failed(_)
                | AttemptState::Expired
                | AttemptState::Cancelled
        )
    }
    fn result(&self) -> PromotionResult {
        match self {
            AttemptState::Committed => PromotionResult::Committed,
            AttemptState::Failed(FailReason::Failure(f)) => PromotionResult::Failed(*f),
            AttemptState::Failed(FailReason::Capacity(c)) => PromotionResult::Capacity(*c),
            AttemptState::Expired => PromotionResult::Failed(PromotionFailure::Expired),
            // Seen only by a waiter racing its own cancellation: not readable.
            _ => PromotionResult::Failed(PromotionFailure::Busy),
        }
    }
}

#[derive(Debug)]
struct AttemptSt {
    state: AttemptState,
    waiters: u32,
    target: Option<Arc<MemoryTarget>>,
    /// Settlement finished (stats and the live map are updated): waiters may observe.
    done: bool,
}

/// One promotion attempt of one key: the only live one for that key.
#[derive(Debug)]
pub struct Attempt {
    pub id: u64,
    pub key: StorageKey,
    /// The source identity observed at admission.
    pub source: ObjectIdentity,
    pub deadline_us: u64,
    st: Mutex<AttemptSt>,
    cv: Condvar,
}

impl Attempt {
    pub fn state(&self) -> AttemptState {
        self.st.lock().state
    }
    fn transition(&self, from: AttemptState, to: AttemptState) -> bool {
        let mut st = self.st.lock();
        if st.state != from {
            return false;
        }
        st.state = to;
        true
    }
}

/// Sources pinned by promotions reading them: not removable through this store.
#[derive(Debug, Default)]
pub struct PinTable {
    pins: Mutex<HashMap<StorageKey, u32>>,
}

/// One pin; released on drop.
#[derive(Debug)]
pub struct SourcePin {
    table: Arc<PinTable>,
    key: StorageKey,
}

impl PinTable {
    pub fn pin(self: &Arc<Self>, key: &StorageKey) -> SourcePin {
        *self.pins.lock().entry(key.clone()).or_insert(0) += 1;
        SourcePin {
            table: self.clone(),
            key: key.clone(),
        }
    }
    pub fn is_pinned(&self, key: &StorageKey) -> bool {
        self.pins.lock().contains_key(key)
    }
}

impl Drop for SourcePin {
    fn drop(&mut self) {
        let mut pins = self.table.pins.lock();
        if let Some(n) = pins.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&self.key);
            }
        }
    }
}

/// Work handed to a promotion worker: the attempt and the owners it keeps alive.
#[derive(Debug)]
pub struct Task {
    attempt: Arc<Attempt>,
    staging: StagingReservation,
    pin: SourcePin,
}

/// Limits of the promotion machinery.
#[derive(Clone, Copy, Debug)]
pub struct PromotionLimits {
    pub max_in_flight: u64,
    pub ttl_us: u64,
}

/// The shared promotion machinery of one local store.
#[derive(Debug)]
pub struct PromotionEngine {
    pub(crate) dfs: Arc<DfsStore>,
    pub(crate) tier: Arc<MemoryTier>,
    pub(crate) staging: Arc<StagingBudget>,
    pub(crate) pins: Arc<PinTable>,
    clock: SharedClock,
    limits: PromotionLimits,
    live: Mutex<HashMap<StorageKey, Arc<Attempt>>>,
    pub stats: PromotionStats,
    pub hooks: PromotionHooks,
    /// Tasks whose worker returned (every owner it held is dropped).
    drained: Mutex<u64>,
    drained_cv: Condvar,
}

/// Counts a worker's return on every path, after its owners dropped.
struct DrainGuard<'a>(&'a PromotionEngine);

impl Drop for DrainGuard<'_> {
    fn drop(&mut self) {
        let mut n = self.0.drained.lock();
        *n += 1;
        self.0.drained_cv.notify_all();
    }
}

enum Slot {
    Done(PromotionResult),
    Handle(usize),
}

/// The local future of one trigger: one result per submitted key, in input order.
/// Dropping it unconsumed cancels this trigger's interest only.
pub struct PromotionTicket {
    engine: Arc<PromotionEngine>,
    slots: Vec<Slot>,
    handles: Vec<Option<Arc<Attempt>>>,
}

impl PromotionTicket {
    /// The attempt each input key waits on (None: answered at admission).
    pub fn attempt_ids(&self) -> Vec<Option<u64>> {
        self.slots
            .iter()
            .map(|s| match s {
                Slot::Done(_) => None,
                Slot::Handle(i) => self.handles[*i].as_ref().map(|a| a.id),
            })
            .collect()
    }

    /// Blocks until every attempted promotion of this trigger settled.
    pub fn wait(mut self) -> Vec<PromotionResult> {
        let mut by_handle = Vec::with_capacity(self.handles.len());
        for i in 0..self.handles.len() {
            let r = match self.handles[i].take() {
                Some(a) => {
                    let r = self.engine.wait_attempt(&a);
                    self.engine.release_waiter(&a);
                    r
                }
                None => PromotionResult::Failed(PromotionFailure::Busy),
            };
            by_handle.push(r);
        }
        self.slots
            .iter()
            .map(|s| match s {
                Slot::Done(r) => *r,
                Slot::Handle(i) => by_handle[*i],
            })
            .collect()
    }
}

impl Drop for PromotionTicket {
    fn drop(&mut self) {
        for a in self.handles.iter_mut().filter_map(Option::take) {
            self.engine.release_waiter(&a);
        }
    }
}

enum Admission {
    Done(PromotionResult),
    Wait(Arc<Attempt>),
}

impl PromotionEngine {
    pub fn new(
        dfs: Arc<DfsStore>,
        tier: Arc<MemoryTier>,
        staging: Arc<StagingBudget>,
        clock: SharedClock,
        limits: PromotionLimits,
    ) -> Self {
        Self {
            dfs,
            tier,
            staging,
            pins: Arc::new(PinTable::default()),
            clock,
            limits,
            live: Mutex::new(HashMap::new()),
            stats: PromotionStats::default(),
            hooks: PromotionHooks::default(),
            drained: Mutex::new(0),
            drained_cv: Condvar::new(),
        }
    }

    /// Blocks until `n` tasks in total have left their worker (their writers drained).
    pub fn wait_drained(&self, n: u64) {
        let mut d = self.drained.lock();
        while *d < n {
            self.drained_cv.wait(&mut d);
        }
    }

    pub fn drained(&self) -> u64 {
        *self.drained.lock()
    }

    /// Starts `n` workers that run tasks until the sender side is dropped.
    pub fn spawn_workers(
        self: &Arc<Self>,
        n: u32,
        rx: flume::Receiver<Task>,
    ) -> Result<Vec<JoinHandle<()>>, std::io::Error> {
        (0..n.max(1))
            .map(|i| {
                let engine = self.clone();
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("tsl3-promote-{i}"))
                    .spawn(move || {
                        while let Ok(task) = rx.recv() {
                            let guard = DrainGuard(&engine);
                            engine.run(task);
                            drop(guard);
                        }
                    })
            })
            .collect()
    }

    /// The live attempt of a key, if any.
    pub fn live_attempt(&self, key: &StorageKey) -> Option<Arc<Attempt>> {
        self.live.lock().get(key).cloned()
    }

    /// Admits every distinct key (duplicates share one attempt) and returns the ticket.
    pub fn submit(
        self: &Arc<Self>,
        keys: &[StorageKey],
        tx: &flume::Sender<Task>,
    ) -> PromotionTicket {
        self.expire_stale();
        let mut first: HashMap<&StorageKey, usize> = HashMap::new();
        let mut slots = Vec::with_capacity(keys.len());
        let mut handles = Vec::new();
        let mut decided: Vec<Slot> = Vec::new();
        for key in keys {
            if let Some(&i) = first.get(key) {
                slots.push(match &decided[i] {
                    Slot::Done(r) => Slot::Done(*r),
                    Slot::Handle(h) => Slot::Handle(*h),
                });
                continue;
            }
            let slot = match self.admit(key, tx) {
                Admission::Done(r) => Slot::Done(r),
                Admission::Wait(a) => {
                    handles.push(Some(a));
                    Slot::Handle(handles.len() - 1)
                }
            };
            first.insert(key, decided.len());
            decided.push(match &slot {
                Slot::Done(r) => Slot::Done(*r),
                Slot::Handle(h) => Slot::Handle(*h),
            });
            slots.push(slot);
        }
        PromotionTicket {
            engine: self.clone(),
            slots,
            handles,
        }
    }

    fn join(&self, a: &Arc<Attempt>) -> bool {
        let mut st = a.st.lock();
        if st.state.is_terminal() {
            return false;
        }
        st.waiters += 1;
        self.stats.joined.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn admit(&self, key: &StorageKey, tx: &flume::Sender<Task>) -> Admission {
        use PromotionResult as R;
        if split_key(key).is_none() {
            self.stats.missing_source.fetch_add(1, Ordering::Relaxed);
            return Admission::Done(R::MissingSource);
        }
        if self.tier.contains(key) {
            self.stats.already_in_memory.fetch_add(1, Ordering::Relaxed);
            return Admission::Done(R::AlreadyInMemory);
        }
        if let Some(a) = self.live_attempt(key) {
            if self.join(&a) {
                return Admission::Wait(a);
            }
        }
        let source = match self.dfs.stat(key) {
            Ok(id) => id,
            Err(ReadError::Missing) => {
                self.stats.missing_source.fetch_add(1, Ordering::Relaxed);
                return Admission::Done(R::MissingSource);
            }
            Err(ReadError::Invalid(_)) => {
                return Admission::Done(R::Failed(PromotionFailure::Checksum))
            }
            Err(ReadError::Io(_)) => return Admission::Done(R::Failed(PromotionFailure::Io)),
        };
        let reject = |c: CapacityReason| {
            self.stats.record_rejected(c);
            Admission::Done(R::Capacity(c))
        };
        if source.len > self.tier.budget().capacity() {
            return reject(CapacityReason::Allocation);
        }
        if !self.tier.admits(source.len) {
            return reject(CapacityReason::Watermark);
        }
        let staging =
            match self
                .stats
                .admit_resources(self.limits.max_in_flight, &self.staging, source.len)
            {
                Ok(s) => s,
                Err(c) => return reject(c),
            };
        let attempt = {
            let mut live = self.live.lock();
            if let Some(a) = live.get(key).cloned() {
                if self.join(&a) {
                    self.stats.in_flight.fetch_sub(1, Ordering::AcqRel);
                    return Admission::Wait(a);
                }
            }
            if self.tier.contains(key) {
                self.stats.in_flight.fetch_sub(1, Ordering::AcqRel);
                self.stats.already_in_memory.fetch_add(1, Ordering::Relaxed);
                return Admission::Done(R::AlreadyInMemory);
            }
            let a = Arc::new(Attempt {
                id: NEXT_ATTEMPT_ID.fetch_add(1, Ordering::Relaxed),
                key: key.clone(),
                source,
                deadline_us: self.clock.now_us().saturating_add(self.limits.ttl_us),
                st: Mutex::new(AttemptSt {
                    state: AttemptState::Queued,
                    waiters: 1,
                    target: None,
                    done: false,
                }),
                cv: Condvar::new(),
            });
            live.insert(key.clone(), a.clone());
            self.stats.attempted.fetch_add(1, Ordering::SeqCst);
            a
        };
        let pin = self.pins.pin(key);
        let task = Task {
            attempt: attempt.clone(),
            staging,
            pin,
        };
        if tx.send(task).is_err() {
            self.settle(
                &attempt,
                AttemptState::Failed(FailReason::Failure(PromotionFailure::Busy)),
                false,
            );
        }
        Admission::Wait(attempt)
    }

    /// Settles a non-terminal attempt into a terminal failure state exactly once: fences
    /// and unlinks its target (the bytes return when the writer drops its Arc). With
    /// `only_queued`, settles only an attempt no worker has picked up.
    fn settle(&self, a: &Attempt, to: AttemptState, only_queued: bool) -> bool {
        let target = {
            let mut st = a.st.lock();
            if st.state.is_terminal() || (only_queued && st.state != AttemptState::Queued) {
                return false;
            }
            st.state = to;
            st.target.take()
        };
        if let Some(t) = target {
            t.fence();
        }
        match to {
            AttemptState::Failed(r) => self.stats.record_failed(r),
            AttemptState::Expired => {
                self.stats.expired.fetch_add(1, Ordering::SeqCst);
            }
            AttemptState::Cancelled => {
                self.stats.cancelled.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
        self.finish(a);
        true
    }

    /// The common tail of settlement: leave the live map, free the in-flight slot, and let
    /// waiters observe.
    fn finish(&self, a: &Attempt) {
        {
            let mut live = self.live.lock();
            if live.get(&a.key).is_some_and(|x| x.id == a.id) {
                live.remove(&a.key);
            }
        }
        self.stats.in_flight.fetch_sub(1, Ordering::SeqCst);
        let mut st = a.st.lock();
        st.done = true;
        a.cv.notify_all();
    }

    /// Commits a verified attempt: the same attempt id, state Verified, target unfenced.
    /// Anything else (a stale id, an unwritten target, an expired attempt) is refused.
    fn commit(&self, a: &Attempt, attempt_id: u64) -> bool {
        {
            let mut st = a.st.lock();
            let ok = a.id == attempt_id
                && st.state == AttemptState::Verified
                && st.target.as_ref().is_some_and(|t| !t.is_fenced());
            if !ok {
                drop(st);
                self.stats
                    .stale_commits_rejected
                    .fetch_add(1, Ordering::Relaxed);
                return false;
            }
            if let Some(t) = st.target.take() {
                // A replica already resident (a write-through PUT won) stays: MEMORY is
                // readable either way, and this target is dropped.
                self.tier.publish(t);
            }
            st.state = AttemptState::Committed;
        }
        self.stats.committed.fetch_add(1, Ordering::SeqCst);
        self.finish(a);
        true
    }

    /// Commit by key and attempt id (the notification path): refused unless `attempt_id`
    /// is the key's live, verified attempt.
    pub fn try_commit(&self, key: &StorageKey, attempt_id: u64) -> bool {
        match self.live_attempt(key) {
            Some(a) => self.commit(&a, attempt_id),
            None => {
                self.stats
                    .stale_commits_rejected
                    .fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Expires every live attempt past its deadline: fence and unlink, never free.
    pub fn expire_stale(&self) -> u64 {
        let now = self.clock.now_us();
        let stale: Vec<Arc<Attempt>> = self
            .live
            .lock()
            .values()
            .filter(|a| a.deadline_us <= now)
            .cloned()
            .collect();
        stale
            .iter()
            .filter(|a| self.settle(a, AttemptState::Expired, false))
            .count() as u64
    }

    /// Fails every live attempt of a namespace being purged.
    pub fn fence_namespace(&self, ns: &Namespace) -> u64 {
        let victims: Vec<Arc<Attempt>> = self
            .live
            .lock()
            .values()
            .filter(|a| ns.owns(&a.key))
            .cloned()
            .collect();
        let fenced = AttemptState::Failed(FailReason::Failure(PromotionFailure::Fenced));
        victims
            .iter()
            .filter(|a| self.settle(a, fenced, false))
            .count() as u64
    }

    /// Fails the live attempt of one key being removed (its replica would be stale).
    pub fn fence_key(&self, key: &StorageKey) -> bool {
        let fenced = AttemptState::Failed(FailReason::Failure(PromotionFailure::Fenced));
        match self.live_attempt(key) {
            Some(a) => self.settle(&a, fenced, false),
            None => false,
        }
    }

    fn wait_attempt(&self, a: &Attempt) -> PromotionResult {
        loop {
            {
                let mut st = a.st.lock();
                if st.done {
                    return st.state.result();
                }
                a.cv.wait_for(&mut st, WAIT_SLICE);
                if st.done {
                    return st.state.result();
                }
            }
            self.expire_stale();
        }
    }

    /// One waiter stops consuming. A queued attempt nobody waits for is cancelled; a
    /// running one runs to its end; a committed replica is never revoked.
    fn release_waiter(&self, a: &Attempt) {
        let cancel = {
            let mut st = a.st.lock();
            st.waiters = st.waiters.saturating_sub(1);
            st.waiters == 0 && st.state == AttemptState::Queued
        };
        if cancel {
            self.settle(a, AttemptState::Cancelled, true);
        }
    }

    fn fail(&self, a: &Attempt, f: PromotionFailure) {
        self.settle(a, AttemptState::Failed(FailReason::Failure(f)), false);
    }

    /// The worker pipeline of one attempt. Every owner (staging, pin, target Arc) lives in
    /// this frame until the last access: a late resume after expiry touches only memory it
    /// still owns, and a fenced target refuses its writes.
    fn run(&self, task: Task) {
        let Task {
            attempt: a,
            staging,
            pin,
        } = task;
        if !a.transition(AttemptState::Queued, AttemptState::Reading) {
            return; // cancelled or expired before a worker picked it up
        }
        // 1. Read the source through the validated DFS path into staging.
        let (identity, staged) = match self.dfs.read_object(&a.key) {
            Ok(x) => x,
            Err(ReadError::Missing) => return self.fail(&a, PromotionFailure::SourceChanged),
            Err(ReadError::Invalid(_)) => return self.fail(&a, PromotionFailure::Checksum),
            Err(ReadError::Io(_)) => return self.fail(&a, PromotionFailure::Io),
        };
        if identity != a.source {
            return self.fail(&a, PromotionFailure::SourceChanged);
        }
        self.hooks.pass(PromotionStage::Read);
        // 2. Revalidate the exact source (generation + checksum + length) after staging.
        match self.dfs.stat(&a.key) {
            Ok(now) if now == identity => {}
            _ => return self.fail(&a, PromotionFailure::SourceChanged),
        }
        drop(pin);
        // 3. Only now allocate and issue the MEMORY target.
        let target = match self.tier.allocate(&a.key, a.id, identity.len) {
            Ok(t) => t,
            Err(c) => {
                self.settle(&a, AttemptState::Failed(FailReason::Capacity(c)), false);
                return;
            }
        };
        {
            let mut st = a.st.lock();
            if st.state != AttemptState::Reading {
                return; // settled meanwhile: the unissued target simply drops
            }
            st.state = AttemptState::Staged;
            st.target = Some(target.clone());
        }
        self.hooks.pass(PromotionStage::Target);
        // 4. Write through the fence, hashing what landed in the target chunk by chunk.
        let mut written = xxhash_rust::xxh3::Xxh3::new();
        for (i, chunk) in staged.chunks(PROMOTION_CHUNK).enumerate() {
            if target
                .write_chunk_hashed(i * PROMOTION_CHUNK, chunk, &mut written)
                .is_err()
            {
                self.stats.fenced_writers.fetch_add(1, Ordering::Relaxed);
                return;
            }
            if i == 0 {
                self.hooks.pass(PromotionStage::Write);
            }
        }
        // 5. Exact bytes and checksum before publication (of the target's bytes, hashed as
        // they were written: only this writer writes a target, and the fence stops it).
        if target.len() != identity.len || written.digest() != identity.checksum {
            return self.fail(&a, PromotionFailure::Checksum);
        }
        if !a.transition(AttemptState::Staged, AttemptState::Verified) {
            self.stats.fenced_writers.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // The staged bytes are no longer read: staging returns before the commit is
        // observable, so a waiter that saw Committed finds its staging quota free.
        drop(staged);
        drop(staging);
        self.hooks.pass(PromotionStage::Commit);
        // 6. Commit (refused if the attempt expired meanwhile).
        self.commit(&a, a.id);
        drop(target);
    }
}
