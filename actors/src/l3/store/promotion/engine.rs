//! The promotion engine (seed 003, notes/dfs-promotion.md), generic over the tier it
//! promotes into: admission with per-key dedup across every trigger, attempt records with a
//! global monotonic `attempt_id`, the bounded worker pipeline (read the source through the
//! validated DFS path into staging, checksummed in the same pass, revalidate its identity,
//! only then reserve a target, hand it the staged buffer whole where the tier can own it or
//! else write it chunk by chunk hashing what landed, verify exact bytes and checksum,
//! commit),
//! exactly-once settlement (compare-and-set on attempt id + state), expiry on an injected
//! clock and cancellation of an abandoned attempt where the store asks for them.
//!
//! It must never commit a partially written or unverified target, never let a stale
//! attempt commit, never drop a target's last owner before its writer drained (expiry and
//! failure only abort), never settle an attempt twice, never revoke a committed replica
//! because a waiter went away, and never release staging while the staged bytes can still
//! be read.
//!
//! Lost executors and notifications (seed 003): the engine retains conservatively. A worker
//! that never returns keeps its target and its staging reserved for the life of the
//! process; expiry aborts the target and answers the waiters, but no elapsed-time reaper
//! frees anything a worker can still touch. A killed process leaves on the shared DFS at
//! most an invisible `.tmp-*` file, never a visible partial object.

use super::hooks::{PromotionHooks, PromotionStage};
use super::staging::{StagingBudget, StagingReservation};
use super::stats::{FailReason, PromotionStats};
use super::{
    matches_identity, read_failure, read_failure_reason, Adoption, PromotionTier, WriteError,
};
use crate::clock::SharedClock;
use crate::l3::store::dfs::{split_key, DfsStore, ObjectIdentity};
use crate::l3::store::{CapacityReason, PromotionFailure, PromotionResult, StoreError};
use messages::{Namespace, StorageKey};
use parking_lot::{Condvar, Mutex, RwLock, RwLockWriteGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Attempt ids: global to the process, monotonic, never reused (a stale notification can
/// never name a newer attempt).
static NEXT_ATTEMPT_ID: AtomicU64 = AtomicU64::new(1);

/// How often a blocked waiter wakes to run the expiry reaper (engines with expiry only).
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// The life of one attempt. Terminal states absorb.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptState {
    /// Admitted, waiting for a worker.
    Queued,
    /// A worker is reading the source into staging.
    Reading,
    /// A target was reserved; the writer is copying into it.
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
}

#[derive(Debug)]
struct AttemptSt<G> {
    state: AttemptState,
    waiters: u32,
    /// A detached trigger keeps the attempt running after its last waiter leaves.
    detached: bool,
    target: Option<G>,
    /// What the target's commit answered (Committed or AlreadyInMemory).
    committed_as: PromotionResult,
    /// Settlement finished (stats and the live map are updated): waiters may observe.
    done: bool,
}

impl<G> AttemptSt<G> {
    fn result(&self) -> PromotionResult {
        match self.state {
            AttemptState::Committed => self.committed_as,
            AttemptState::Failed(FailReason::Failure(f)) => PromotionResult::Failed(f),
            AttemptState::Failed(FailReason::Capacity(c)) => PromotionResult::Capacity(c),
            AttemptState::Expired => PromotionResult::Failed(PromotionFailure::Expired),
            // Seen only by a waiter racing its own cancellation: not readable.
            _ => PromotionResult::Failed(PromotionFailure::Busy),
        }
    }
}

/// One promotion attempt of one key: the only live one for that key. `G` is the tier's
/// target handle.
#[derive(Debug)]
pub struct Attempt<G> {
    pub id: u64,
    pub key: StorageKey,
    /// The source identity observed at admission.
    pub source: ObjectIdentity,
    pub deadline_us: u64,
    st: Mutex<AttemptSt<G>>,
    cv: Condvar,
}

impl<G> Attempt<G> {
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

/// Sources pinned by promotions reading them: not removable through the owning store.
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
pub struct Task<G> {
    attempt: Arc<Attempt<G>>,
    staging: StagingReservation,
    pin: SourcePin,
}

/// Limits and policy of one engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromotionLimits {
    /// Admitted attempts in flight at once (a hard cap).
    pub max_in_flight: u64,
    /// Whether a queued attempt whose last waiter went away is cancelled (otherwise it
    /// runs to its end).
    pub cancel_abandoned: bool,
}

/// Attempt expiry: a deadline `ttl_us` after admission on `clock`. Expiry aborts the
/// target and answers the waiters; it never frees what a worker still owns.
#[derive(Clone, Debug)]
pub struct Expiry {
    pub clock: SharedClock,
    pub ttl_us: u64,
}

/// Tasks whose worker returned (every owner it held is dropped).
#[derive(Debug, Default)]
struct Drained {
    n: Mutex<u64>,
    cv: Condvar,
}

/// Counts a worker's return on every path, after its owners dropped.
struct DrainGuard<'a>(&'a Drained);

impl Drop for DrainGuard<'_> {
    fn drop(&mut self) {
        let mut n = self.0.n.lock();
        *n += 1;
        self.0.cv.notify_all();
    }
}

/// The promotion machinery of one store, over the tier `T` it promotes into.
pub struct PromotionEngine<T: PromotionTier> {
    pub(crate) dfs: Arc<DfsStore>,
    pub(crate) target: T,
    pub(crate) staging: Arc<StagingBudget>,
    pub(crate) pins: Arc<PinTable>,
    /// Read by a worker from its source revalidation through its commit; written by a
    /// purge of a tier that cannot abort a write in progress (`purge_barrier`).
    barrier: RwLock<()>,
    expiry: Option<Expiry>,
    limits: PromotionLimits,
    live: Mutex<HashMap<StorageKey, Arc<Attempt<T::Target>>>>,
    pub stats: PromotionStats,
    pub hooks: PromotionHooks,
    drained: Drained,
}

impl<T: PromotionTier> std::fmt::Debug for PromotionEngine<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromotionEngine")
            .field("dfs", &self.dfs.root())
            .field("target", &self.target)
            .field("limits", &self.limits)
            .finish()
    }
}

enum Slot {
    Done(PromotionResult),
    Handle(usize),
}

/// The local future of one trigger: one result per submitted key, in input order.
/// Dropping it unconsumed gives up this trigger's interest only.
pub struct PromotionTicket<T: PromotionTier> {
    engine: Arc<PromotionEngine<T>>,
    slots: Vec<Slot>,
    handles: Vec<Option<Arc<Attempt<T::Target>>>>,
}

impl<T: PromotionTier> PromotionTicket<T> {
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

impl<T: PromotionTier> PromotionTicket<T> {
    /// Gives up waiting without giving up the promotions: every attempt this trigger
    /// admitted or joined runs to its end even if no waiter is left (a detached trigger is
    /// never cancelled as abandoned). Returns how many attempts it left running.
    pub fn detach(mut self) -> usize {
        let mut n = 0;
        for a in self.handles.iter_mut().filter_map(Option::take) {
            {
                let mut st = a.st.lock();
                st.detached = true;
                st.waiters = st.waiters.saturating_sub(1);
            }
            n += 1;
        }
        n
    }
}

impl<T: PromotionTier> Drop for PromotionTicket<T> {
    fn drop(&mut self) {
        for a in self.handles.iter_mut().filter_map(Option::take) {
            self.engine.release_waiter(&a);
        }
    }
}

enum Admission<G> {
    Done(PromotionResult),
    Wait(Arc<Attempt<G>>),
}

impl<T: PromotionTier> PromotionEngine<T> {
    pub fn new(
        dfs: Arc<DfsStore>,
        target: T,
        staging: Arc<StagingBudget>,
        limits: PromotionLimits,
        expiry: Option<Expiry>,
    ) -> Self {
        Self {
            dfs,
            target,
            staging,
            pins: Arc::new(PinTable::default()),
            barrier: RwLock::new(()),
            expiry,
            limits,
            live: Mutex::new(HashMap::new()),
            stats: PromotionStats::default(),
            hooks: PromotionHooks::default(),
            drained: Drained::default(),
        }
    }

    pub fn dfs(&self) -> &Arc<DfsStore> {
        &self.dfs
    }
    /// The tier promotions land in.
    pub fn target(&self) -> &T {
        &self.target
    }
    pub fn staging(&self) -> &StagingBudget {
        &self.staging
    }

    /// Waits for every worker between its source revalidation and its commit, and keeps
    /// new ones out while held. A store whose tier cannot abort a write in progress
    /// (Mooncake's PUT) holds it across a purge, so no promotion recreates a purged object.
    pub fn purge_barrier(&self) -> RwLockWriteGuard<'_, ()> {
        self.barrier.write()
    }

    /// Blocks until `n` tasks in total have left their worker (their writers drained).
    pub fn wait_drained(&self, n: u64) {
        let mut d = self.drained.n.lock();
        while *d < n {
            self.drained.cv.wait(&mut d);
        }
    }

    pub fn drained(&self) -> u64 {
        *self.drained.n.lock()
    }

    /// Starts `n` workers named `{name}-{i}` that run tasks until every sender is dropped.
    pub fn spawn_workers(
        self: &Arc<Self>,
        n: u32,
        name: &str,
        rx: flume::Receiver<Task<T::Target>>,
    ) -> Result<Vec<JoinHandle<()>>, std::io::Error> {
        (0..n.max(1))
            .map(|i| {
                let engine = self.clone();
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || {
                        // Best-effort work: the foreground gets the cores first.
                        if let Err(e) = super::background::lower_current_thread() {
                            tracing::debug!(error = %e, "promotion worker keeps its priority");
                        }
                        while let Ok(task) = rx.recv() {
                            let guard = DrainGuard(&engine.drained);
                            engine.run(task);
                            drop(guard);
                        }
                    })
            })
            .collect()
    }

    /// The live attempt of a key, if any.
    pub fn live_attempt(&self, key: &StorageKey) -> Option<Arc<Attempt<T::Target>>> {
        self.live.lock().get(key).cloned()
    }

    /// Admits every distinct key (duplicates share one attempt) without blocking on any
    /// promotion and returns the ticket. One residency question to the tier covers the
    /// batch; a failed one fails the call and admits nothing.
    pub fn submit(
        self: &Arc<Self>,
        keys: &[StorageKey],
        tx: &flume::Sender<Task<T::Target>>,
    ) -> Result<PromotionTicket<T>, StoreError> {
        self.expire_stale();
        let mut first: HashMap<&StorageKey, usize> = HashMap::new();
        let mut distinct: Vec<StorageKey> = Vec::new();
        for k in keys {
            if !first.contains_key(k) {
                first.insert(k, distinct.len());
                distinct.push(k.clone());
            }
        }
        let resident = if distinct.is_empty() {
            Vec::new()
        } else {
            self.target.resident(&distinct)?
        };
        if resident.len() != distinct.len() {
            return Err(StoreError::new(
                "promotion",
                "the tier's residency answered a different number of keys",
            ));
        }
        let mut handles = Vec::new();
        let decided: Vec<Slot> = distinct
            .iter()
            .zip(resident)
            .map(|(k, hit)| match self.admit(k, hit, tx) {
                Admission::Done(r) => Slot::Done(r),
                Admission::Wait(a) => {
                    handles.push(Some(a));
                    Slot::Handle(handles.len() - 1)
                }
            })
            .collect();
        let slots = keys
            .iter()
            .map(|k| match &decided[first[k]] {
                Slot::Done(r) => Slot::Done(*r),
                Slot::Handle(h) => Slot::Handle(*h),
            })
            .collect();
        Ok(PromotionTicket {
            engine: self.clone(),
            slots,
            handles,
        })
    }

    fn join(&self, a: &Attempt<T::Target>) -> bool {
        let mut st = a.st.lock();
        if st.state.is_terminal() {
            return false;
        }
        st.waiters += 1;
        self.stats.joined.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn admit(
        &self,
        key: &StorageKey,
        resident: bool,
        tx: &flume::Sender<Task<T::Target>>,
    ) -> Admission<T::Target> {
        use PromotionResult as R;
        if resident {
            self.stats.already_in_memory.fetch_add(1, Ordering::Relaxed);
            return Admission::Done(R::AlreadyInMemory);
        }
        if split_key(key).is_none() {
            self.stats.missing_source.fetch_add(1, Ordering::Relaxed);
            return Admission::Done(R::MissingSource);
        }
        if let Some(a) = self.live_attempt(key) {
            if self.join(&a) {
                return Admission::Wait(a);
            }
        }
        let source = match self.dfs.stat(key) {
            Ok(id) => id,
            Err(e) => {
                let r = read_failure(&e, true);
                if r == R::MissingSource {
                    self.stats.missing_source.fetch_add(1, Ordering::Relaxed);
                }
                return Admission::Done(r);
            }
        };
        let reject = |c: CapacityReason| {
            self.stats.record_rejected(c);
            Admission::Done(R::Capacity(c))
        };
        if let Err(c) = self.target.check_capacity(source.len) {
            return reject(c);
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
                // Another trigger admitted it meanwhile: join (the reservation drops).
                if self.join(&a) {
                    self.stats.in_flight.fetch_sub(1, Ordering::AcqRel);
                    return Admission::Wait(a);
                }
            }
            if self.target.holds(key) {
                self.stats.in_flight.fetch_sub(1, Ordering::AcqRel);
                self.stats.already_in_memory.fetch_add(1, Ordering::Relaxed);
                return Admission::Done(R::AlreadyInMemory);
            }
            let deadline_us = match &self.expiry {
                Some(e) => e.clock.now_us().saturating_add(e.ttl_us),
                None => u64::MAX,
            };
            let a = Arc::new(Attempt {
                id: NEXT_ATTEMPT_ID.fetch_add(1, Ordering::Relaxed),
                key: key.clone(),
                source,
                deadline_us,
                st: Mutex::new(AttemptSt {
                    state: AttemptState::Queued,
                    waiters: 1,
                    detached: false,
                    target: None,
                    committed_as: R::Committed,
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

    /// Settles a non-terminal attempt into a terminal failure state exactly once: aborts
    /// its target (the target's owners let go when the writer drops its handle). With
    /// `only_queued`, settles only an attempt no worker has picked up.
    fn settle(&self, a: &Attempt<T::Target>, to: AttemptState, only_queued: bool) -> bool {
        let target = {
            let mut st = a.st.lock();
            if st.state.is_terminal() || (only_queued && st.state != AttemptState::Queued) {
                return false;
            }
            st.state = to;
            st.target.take()
        };
        if let Some(t) = target {
            self.target.abort(&t);
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
    fn finish(&self, a: &Attempt<T::Target>) {
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

    /// Commits a verified attempt: the same attempt id, state Verified, target not
    /// aborted. Anything else (a stale id, an unwritten target, an expired attempt) is
    /// refused.
    fn commit(&self, a: &Attempt<T::Target>, attempt_id: u64) -> bool {
        {
            let mut st = a.st.lock();
            let ok = a.id == attempt_id
                && st.state == AttemptState::Verified
                && st
                    .target
                    .as_ref()
                    .is_some_and(|t| !self.target.is_aborted(t));
            if !ok {
                drop(st);
                self.stats
                    .stale_commits_rejected
                    .fetch_add(1, Ordering::Relaxed);
                return false;
            }
            if let Some(t) = st.target.take() {
                st.committed_as = self.target.commit(t);
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

    /// Expires every live attempt past its deadline: abort and unlink, never free. An
    /// engine without expiry expires nothing.
    pub fn expire_stale(&self) -> u64 {
        let Some(expiry) = &self.expiry else {
            return 0;
        };
        let now = expiry.clock.now_us();
        let stale: Vec<Arc<Attempt<T::Target>>> = self
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
        let victims: Vec<Arc<Attempt<T::Target>>> = self
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

    fn wait_attempt(&self, a: &Attempt<T::Target>) -> PromotionResult {
        if self.expiry.is_none() {
            let mut st = a.st.lock();
            while !st.done {
                a.cv.wait(&mut st);
            }
            return st.result();
        }
        loop {
            {
                let mut st = a.st.lock();
                if st.done {
                    return st.result();
                }
                a.cv.wait_for(&mut st, WAIT_SLICE);
                if st.done {
                    return st.result();
                }
            }
            self.expire_stale();
        }
    }

    /// One waiter stops consuming. Where the engine cancels abandoned attempts, a queued
    /// one nobody waits for is cancelled; a running one runs to its end; a committed
    /// replica is never revoked.
    fn release_waiter(&self, a: &Attempt<T::Target>) {
        let cancel = {
            let mut st = a.st.lock();
            st.waiters = st.waiters.saturating_sub(1);
            self.limits.cancel_abandoned
                && !st.detached
                && st.waiters == 0
                && st.state == AttemptState::Queued
        };
        if cancel {
            self.settle(a, AttemptState::Cancelled, true);
        }
    }

    /// One task on a worker. The pipeline owns the staging and the pin, so both are gone
    /// when it returns, before any failure it reports is settled (a waiter that saw the
    /// result finds its staging quota free).
    fn run(&self, task: Task<T::Target>) {
        let Task {
            attempt: a,
            staging,
            pin,
        } = task;
        if !a.transition(AttemptState::Queued, AttemptState::Reading) {
            return; // cancelled or expired before a worker picked it up
        }
        if let Some(failed) = self.promote(&a, staging, pin) {
            self.settle(&a, failed, false);
        }
    }

    /// The worker pipeline of one attempt; returns the failure to settle, if any. Every
    /// owner (staging, pin, target handle) lives in this frame until its last access: a
    /// late resume after expiry touches only what it still owns, and an aborted target
    /// refuses its writes.
    fn promote(
        &self,
        a: &Attempt<T::Target>,
        staging: StagingReservation,
        pin: SourcePin,
    ) -> Option<AttemptState> {
        let failed = |f: PromotionFailure| Some(AttemptState::Failed(FailReason::Failure(f)));
        // 1. Read the source through the validated DFS path into staging.
        let (identity, staged) = match self
            .dfs
            .read_object_with(&a.key, |len| self.target.staging_buffer(len))
        {
            Ok(x) => x,
            Err(e) => return failed(read_failure_reason(&e)),
        };
        if identity != a.source {
            return failed(PromotionFailure::SourceChanged);
        }
        self.hooks.pass(PromotionStage::Read);
        // 2. Revalidate the exact source (generation + checksum + length) after staging; a
        // purge behind the barrier waits from here through the commit.
        let barrier = self.barrier.read();
        match self.dfs.stat(&a.key) {
            Ok(now) if now == identity => {}
            _ => return failed(PromotionFailure::SourceChanged),
        }
        drop(pin);
        // 3. Only now reserve the target.
        let target = match self.target.reserve(&a.key, a.id, &identity) {
            Ok(t) => t,
            Err(c) => return Some(AttemptState::Failed(FailReason::Capacity(c))),
        };
        {
            let mut st = a.st.lock();
            if st.state != AttemptState::Reading {
                return None; // settled meanwhile: the unissued target simply drops
            }
            st.state = AttemptState::Staged;
            st.target = Some(target.clone());
        }
        self.hooks.pass(PromotionStage::Target);
        // 4. Land the staged bytes. A tier that can own them takes the buffer itself: its
        // bytes are exactly the ones the DFS read hashed as they landed (checked against
        // the source identity above), and nothing else can reach the buffer in between.
        // Otherwise write chunk by chunk, hashing what landed in the target (an empty
        // object is one empty write).
        let staged_len = staged.len();
        let staged = match self.target.adopt(&target, staged) {
            Adoption::Landed => {
                self.hooks.pass(PromotionStage::Write);
                None
            }
            Adoption::Refused(WriteError::Aborted) => {
                self.stats.fenced_writers.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            Adoption::Refused(WriteError::Failed(r)) => return Some(AttemptState::Failed(r)),
            Adoption::Declined(staged) => Some(staged),
        };
        if let Some(staged) = &staged {
            let mut landed = xxhash_rust::xxh3::Xxh3::new();
            let mut written = 0usize;
            let mut chunks = staged.chunks(T::CHUNK);
            let head = chunks.next().unwrap_or(&[]);
            for (i, chunk) in std::iter::once(head).chain(chunks).enumerate() {
                match self.target.write(&target, written, chunk, &mut landed) {
                    Ok(()) => {}
                    Err(WriteError::Aborted) => {
                        self.stats.fenced_writers.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                    Err(WriteError::Failed(r)) => return Some(AttemptState::Failed(r)),
                }
                written += chunk.len();
                if i == 0 && !chunk.is_empty() {
                    self.hooks.pass(PromotionStage::Write);
                }
            }
            // 5. Exact bytes and checksum before the commit (of the target's bytes, hashed
            // as they landed: only this writer writes a target, and an abort stops it).
            if !matches_identity(written as u64, landed.digest(), &identity) {
                return failed(PromotionFailure::Checksum);
            }
        } else if staged_len as u64 != identity.len {
            return failed(PromotionFailure::Checksum);
        }
        if !a.transition(AttemptState::Staged, AttemptState::Verified) {
            self.stats.fenced_writers.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // The staged bytes are no longer read: staging returns before the commit is
        // observable, so a waiter that saw Committed finds its staging quota free.
        drop(staged);
        drop(staging);
        self.hooks.pass(PromotionStage::Commit);
        // 6. Commit (refused if the attempt expired or was fenced meanwhile).
        self.commit(a, a.id);
        drop(target);
        drop(barrier);
        None
    }
}
