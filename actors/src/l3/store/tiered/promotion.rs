//! DFS → MEMORY promotion into Mooncake (seed 003 `batch_prefetch_to_memory` with the
//! Mooncake store as the MEMORY tier): admission with per-key dedup across every trigger
//! (duplicates in one batch and concurrent triggers share one attempt), bounded workers,
//! a bounded staging budget and a hard in-flight cap, and exactly-once settlement.
//!
//! The pipeline of one attempt: read the DFS source into staging (the staging reservation
//! was taken at admission by compare-and-swap), verify its exact length and xxh3 checksum,
//! re-check that the source identity (length, checksum, per-write generation) is unchanged
//! since admission, then issue one create-only Mooncake PUT from the staged bytes.
//!
//! Why there is no target fencing here (unlike the in-process tier of `local`): the MEMORY
//! target is allocated by the Mooncake master inside that one create-only PUT call, which
//! copies from our staging buffer and publishes the object only when the copy completed;
//! the ffi layer never keeps a source pointer beyond the call, and the staging buffer and
//! its reservation live in the worker's frame until the call returned. So no partially
//! written replica is ever readable, there is no target of ours that a stale attempt could
//! still write after settlement, and the staging bytes are released exactly once, by the
//! worker, after the last access. Mooncake's own create-only semantics decide between two
//! instances promoting the same key (the first value stays; both are readable).
//!
//! It must never PUT bytes that failed verification, never PUT after the source changed,
//! never settle an attempt twice, and never release staging while the PUT can read it.
//! A namespace purge waits for PUTs in progress (a read/write lock) so that no promotion
//! recreates a purged object in Mooncake.

use crate::l3::store::dfs::{split_key, DfsStore, ObjectIdentity, ReadError};
use crate::l3::store::faulty::Gate;
use crate::l3::store::promotion::staging::{StagingBudget, StagingReservation};
use crate::l3::store::promotion::stats::{FailReason, PromotionStats};
use crate::l3::store::{
    CapacityReason, KeyResult, PromotionFailure, PromotionResult, Store, StoreError,
};
use messages::StorageKey;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use xxhash_rust::xxh3::xxh3_64;

/// Attempt ids: global to the process, monotonic, never reused.
static NEXT_ATTEMPT_ID: AtomicU64 = AtomicU64::new(1);

/// Limits of the promotion machinery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierLimits {
    pub workers: u32,
    pub staging_bytes: u64,
    pub max_in_flight: u32,
}

/// Maps the MEMORY tier's answer to one promotion PUT row to seed 003's result. An
/// already-exists answer means a readable replica: the promotion's goal holds.
pub fn put_outcome(r: &KeyResult) -> PromotionResult {
    match r {
        KeyResult::Ok { .. } => PromotionResult::Committed,
        KeyResult::AlreadyExists => PromotionResult::AlreadyInMemory,
        KeyResult::Capacity => PromotionResult::Capacity(CapacityReason::Allocation),
        _ => PromotionResult::Failed(PromotionFailure::Io),
    }
}

/// Maps a failed DFS source read to seed 003's result (`at_admission`: before any attempt
/// exists, a vanished source is simply missing).
pub fn read_failure(e: &ReadError, at_admission: bool) -> PromotionResult {
    match e {
        ReadError::Missing if at_admission => PromotionResult::MissingSource,
        ReadError::Missing => PromotionResult::Failed(PromotionFailure::SourceChanged),
        ReadError::Invalid(_) => PromotionResult::Failed(PromotionFailure::Checksum),
        ReadError::Io(_) => PromotionResult::Failed(PromotionFailure::Io),
    }
}

/// Whether staged bytes are exactly the object the identity names.
pub fn verified(staged: &[u8], identity: &ObjectIdentity) -> bool {
    staged.len() as u64 == identity.len && xxh3_64(staged) == identity.checksum
}

/// One promotion attempt of one key: the only live one for that key.
#[derive(Debug)]
pub struct Attempt {
    pub id: u64,
    pub key: StorageKey,
    /// The source identity observed at admission.
    pub source: ObjectIdentity,
    settled: AtomicBool,
    result: Mutex<Option<PromotionResult>>,
    cv: Condvar,
}

impl Attempt {
    fn wait(&self) -> PromotionResult {
        let mut r = self.result.lock();
        loop {
            if let Some(x) = *r {
                return x;
            }
            self.cv.wait(&mut r);
        }
    }
}

/// Work handed to a worker: the attempt and the staging bytes reserved for it.
#[derive(Debug)]
pub struct Task {
    attempt: Arc<Attempt>,
    staging: StagingReservation,
}

/// Test hooks: a gate passed by a worker after verification, before the MEMORY PUT.
#[derive(Debug, Default)]
pub struct TierHooks {
    pub before_put: Mutex<Option<Arc<Gate>>>,
}

/// The promotion machinery of one tiered store.
pub struct TierPromotion {
    pub(crate) dfs: Arc<DfsStore>,
    pub(crate) memory: Arc<dyn Store>,
    pub(crate) staging: Arc<StagingBudget>,
    max_in_flight: u64,
    live: Mutex<HashMap<StorageKey, Arc<Attempt>>>,
    /// Read by a worker from its source re-check through its PUT; written by a purge.
    pub(crate) purge: RwLock<()>,
    pub stats: PromotionStats,
    pub hooks: TierHooks,
}

impl std::fmt::Debug for TierPromotion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierPromotion")
            .field("dfs", &self.dfs.root())
            .field("memory", &self.memory.name())
            .finish()
    }
}

enum Slot {
    Done(PromotionResult),
    Wait(usize),
}

/// The local future of one trigger: one result per submitted key, in input order.
pub struct TierTicket {
    slots: Vec<Slot>,
    attempts: Vec<Arc<Attempt>>,
}

impl TierTicket {
    /// The attempt each input key waits on (None: answered at admission).
    pub fn attempt_ids(&self) -> Vec<Option<u64>> {
        self.slots
            .iter()
            .map(|s| match s {
                Slot::Done(_) => None,
                Slot::Wait(i) => Some(self.attempts[*i].id),
            })
            .collect()
    }

    /// Blocks until every attempt of this trigger settled.
    pub fn wait(self) -> Vec<PromotionResult> {
        let got: Vec<PromotionResult> = self.attempts.iter().map(|a| a.wait()).collect();
        self.slots
            .iter()
            .map(|s| match s {
                Slot::Done(r) => *r,
                Slot::Wait(i) => got[*i],
            })
            .collect()
    }
}

enum Admission {
    Done(PromotionResult),
    Wait(Arc<Attempt>),
}

impl TierPromotion {
    pub fn new(dfs: Arc<DfsStore>, memory: Arc<dyn Store>, limits: TierLimits) -> Self {
        Self {
            dfs,
            memory,
            staging: StagingBudget::new(limits.staging_bytes),
            max_in_flight: limits.max_in_flight.max(1) as u64,
            live: Mutex::new(HashMap::new()),
            purge: RwLock::new(()),
            stats: PromotionStats::default(),
            hooks: TierHooks::default(),
        }
    }

    /// Starts `n` workers that run tasks until every sender is dropped.
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
                    .name(format!("tsl3-tier-promote-{i}"))
                    .spawn(move || {
                        while let Ok(task) = rx.recv() {
                            engine.run(task);
                        }
                    })
            })
            .collect()
    }

    pub fn live_attempt(&self, key: &StorageKey) -> Option<Arc<Attempt>> {
        self.live.lock().get(key).cloned()
    }

    /// Admits every distinct key (duplicates share one attempt) without blocking on any
    /// promotion. One MEMORY existence query covers the batch; a failed query fails the
    /// call.
    pub fn submit(
        &self,
        keys: &[StorageKey],
        tx: &flume::Sender<Task>,
    ) -> Result<TierTicket, StoreError> {
        let mut first: HashMap<&StorageKey, usize> = HashMap::new();
        let mut distinct: Vec<&StorageKey> = Vec::new();
        for k in keys {
            if !first.contains_key(k) {
                first.insert(k, distinct.len());
                distinct.push(k);
            }
        }
        let queried: Vec<StorageKey> = distinct.iter().map(|k| (*k).clone()).collect();
        let in_memory = if queried.is_empty() {
            Vec::new()
        } else {
            self.memory.query(&queried)?
        };
        if in_memory.len() != queried.len() {
            return Err(StoreError::new(
                "tiered",
                "MEMORY query answered a different number of keys",
            ));
        }
        let mut attempts = Vec::new();
        let decided: Vec<Slot> = distinct
            .iter()
            .zip(&in_memory)
            .map(|(k, hit)| match self.admit(k, *hit, tx) {
                Admission::Done(r) => Slot::Done(r),
                Admission::Wait(a) => {
                    attempts.push(a);
                    Slot::Wait(attempts.len() - 1)
                }
            })
            .collect();
        let slots = keys
            .iter()
            .map(|k| match &decided[first[k]] {
                Slot::Done(r) => Slot::Done(*r),
                Slot::Wait(i) => Slot::Wait(*i),
            })
            .collect();
        Ok(TierTicket { slots, attempts })
    }

    fn admit(&self, key: &StorageKey, in_memory: bool, tx: &flume::Sender<Task>) -> Admission {
        use PromotionResult as R;
        if in_memory {
            self.stats.already_in_memory.fetch_add(1, Ordering::Relaxed);
            return Admission::Done(R::AlreadyInMemory);
        }
        if split_key(key).is_none() {
            self.stats.missing_source.fetch_add(1, Ordering::Relaxed);
            return Admission::Done(R::MissingSource);
        }
        if let Some(a) = self.live_attempt(key) {
            self.stats.joined.fetch_add(1, Ordering::Relaxed);
            return Admission::Wait(a);
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
        let staging =
            match self
                .stats
                .admit_resources(self.max_in_flight, &self.staging, source.len)
            {
                Ok(s) => s,
                Err(c) => return reject(c),
            };
        let attempt = {
            let mut live = self.live.lock();
            if let Some(a) = live.get(key).cloned() {
                // Another trigger admitted it meanwhile: join (the reservation drops).
                self.stats.in_flight.fetch_sub(1, Ordering::AcqRel);
                self.stats.joined.fetch_add(1, Ordering::Relaxed);
                return Admission::Wait(a);
            }
            let a = Arc::new(Attempt {
                id: NEXT_ATTEMPT_ID.fetch_add(1, Ordering::Relaxed),
                key: key.clone(),
                source,
                settled: AtomicBool::new(false),
                result: Mutex::new(None),
                cv: Condvar::new(),
            });
            live.insert(key.clone(), a.clone());
            self.stats.attempted.fetch_add(1, Ordering::SeqCst);
            a
        };
        let task = Task {
            attempt: attempt.clone(),
            staging,
        };
        if let Err(flume::SendError(task)) = tx.send(task) {
            drop(task.staging);
            self.settle(&attempt, R::Failed(PromotionFailure::Busy));
        }
        Admission::Wait(attempt)
    }

    /// Settles an attempt exactly once (compare-and-swap): stats, the live map and the
    /// in-flight slot, then the waiters. A second call is refused and changes nothing.
    pub(crate) fn settle(&self, a: &Attempt, r: PromotionResult) -> bool {
        if a.settled
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        match r {
            // An already-exists PUT is a readable replica: the attempt committed its goal.
            PromotionResult::Committed | PromotionResult::AlreadyInMemory => {
                self.stats.committed.fetch_add(1, Ordering::SeqCst);
            }
            PromotionResult::Capacity(c) => self.stats.record_failed(FailReason::Capacity(c)),
            PromotionResult::Failed(f) => self.stats.record_failed(FailReason::Failure(f)),
            PromotionResult::MissingSource | PromotionResult::Unsupported => self
                .stats
                .record_failed(FailReason::Failure(PromotionFailure::SourceChanged)),
        }
        {
            let mut live = self.live.lock();
            if live.get(&a.key).is_some_and(|x| x.id == a.id) {
                live.remove(&a.key);
            }
        }
        self.stats.in_flight.fetch_sub(1, Ordering::SeqCst);
        let mut slot = a.result.lock();
        *slot = Some(r);
        a.cv.notify_all();
        true
    }

    /// The worker pipeline of one attempt; staging is released once, after the PUT call
    /// returned and before the attempt settles (a waiter that saw the result finds it free).
    fn run(&self, task: Task) {
        let Task { attempt, staging } = task;
        let r = self.promote(&attempt);
        drop(staging);
        self.settle(&attempt, r);
    }

    fn promote(&self, a: &Attempt) -> PromotionResult {
        // 1. Read the source through the validated DFS path into staging.
        let (identity, staged) = match self.dfs.read_object(&a.key) {
            Ok(x) => x,
            Err(e) => return read_failure(&e, false),
        };
        if identity != a.source {
            return PromotionResult::Failed(PromotionFailure::SourceChanged);
        }
        // 2. Exact bytes and checksum of what is staged.
        if !verified(&staged, &identity) {
            return PromotionResult::Failed(PromotionFailure::Checksum);
        }
        let gate = self.hooks.before_put.lock().clone();
        if let Some(g) = gate {
            g.pass();
        }
        // 3. The source identity is unchanged (a purge waits while we hold this).
        let _purge = self.purge.read();
        match self.dfs.stat(&a.key) {
            Ok(now) if now == identity => {}
            _ => return PromotionResult::Failed(PromotionFailure::SourceChanged),
        }
        // 4. One create-only PUT: Mooncake allocates the target and copies from staging.
        match self
            .memory
            .put(std::slice::from_ref(&a.key), &[staged.as_slice()])
        {
            Ok(rows) if rows.len() == 1 => put_outcome(&rows[0]),
            Ok(_) => PromotionResult::Failed(PromotionFailure::Io),
            Err(e) => {
                tracing::warn!(key = %a.key, error = %e, "promotion PUT into MEMORY failed");
                PromotionResult::Failed(PromotionFailure::Io)
            }
        }
    }
}
