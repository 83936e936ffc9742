//! Unit tests of the shared promotion engine over a tiny in-test tier that can refuse a
//! reservation, fail or corrupt a write, and fail its residency query, above a temporary
//! DFS root. Threads are ordered with gates; time moves only through a ManualClock. They
//! never depend on either real tier.

use super::hooks::PromotionStage;
use super::staging::StagingBudget;
use super::stats::FailReason;
use super::*;
use crate::clock::ManualClock;
use crate::l3::store::dfs::DfsStore;
use crate::l3::store::faulty::Gate;
use crate::l3::store::{KeyResult, PromotionResult as R};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const CHUNK: usize = 64;
const TTL_US: u64 = 1_000_000;

/// One reserved target of the test tier: a buffer nobody reads before `commit`.
#[derive(Debug)]
struct Slot {
    key: StorageKey,
    bytes: Mutex<Vec<u8>>,
    aborted: AtomicBool,
}

/// A tier whose faults the test sets: a refused reservation, a failed write at an offset,
/// a corrupted landing, a failed residency query, an admission capacity gate.
#[derive(Debug, Default)]
struct TestTier {
    published: Mutex<HashMap<StorageKey, Vec<u8>>>,
    refuse_reserve: Mutex<Option<CapacityReason>>,
    refuse_admission: Mutex<Option<CapacityReason>>,
    fail_write_at: Mutex<Option<usize>>,
    corrupt_landing: AtomicBool,
    fail_residency: AtomicBool,
    reserves: AtomicU64,
    writes: AtomicU64,
    aborts: AtomicU64,
}

impl TestTier {
    fn published(&self, key: &StorageKey) -> Option<Vec<u8>> {
        self.published.lock().get(key).cloned()
    }
}

impl TierAdmission for TestTier {
    fn resident(&self, keys: &[StorageKey]) -> Result<Vec<bool>, StoreError> {
        if self.fail_residency.load(Ordering::SeqCst) {
            return Err(StoreError::new("test", "residency query failed"));
        }
        Ok(keys.iter().map(|k| self.holds(k)).collect())
    }
    fn holds(&self, key: &StorageKey) -> bool {
        self.published.lock().contains_key(key)
    }
    fn check_capacity(&self, _len: u64) -> Result<(), CapacityReason> {
        match *self.refuse_admission.lock() {
            Some(c) => Err(c),
            None => Ok(()),
        }
    }
}

impl PromotionTarget for TestTier {
    type Target = Arc<Slot>;
    const CHUNK: usize = CHUNK;

    fn reserve(
        &self,
        key: &StorageKey,
        _attempt_id: u64,
        source: &ObjectIdentity,
    ) -> Result<Arc<Slot>, CapacityReason> {
        self.reserves.fetch_add(1, Ordering::SeqCst);
        if let Some(c) = *self.refuse_reserve.lock() {
            return Err(c);
        }
        Ok(Arc::new(Slot {
            key: key.clone(),
            bytes: Mutex::new(vec![0; source.len as usize]),
            aborted: AtomicBool::new(false),
        }))
    }

    fn write(
        &self,
        t: &Arc<Slot>,
        offset: usize,
        chunk: &[u8],
        landed: &mut xxhash_rust::xxh3::Xxh3,
    ) -> Result<(), WriteError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        if t.aborted.load(Ordering::SeqCst) {
            return Err(WriteError::Aborted);
        }
        if *self.fail_write_at.lock() == Some(offset) {
            return Err(WriteError::Failed(FailReason::Failure(
                PromotionFailure::Io,
            )));
        }
        let mut b = t.bytes.lock();
        let dst = &mut b[offset..offset + chunk.len()];
        dst.copy_from_slice(chunk);
        if offset == 0 && self.corrupt_landing.load(Ordering::SeqCst) {
            dst[0] ^= 0xff;
        }
        landed.update(dst);
        Ok(())
    }

    fn commit(&self, t: Arc<Slot>) -> PromotionResult {
        let bytes = t.bytes.lock().clone();
        match self.published.lock().insert(t.key.clone(), bytes) {
            None => R::Committed,
            Some(_) => R::AlreadyInMemory,
        }
    }

    fn abort(&self, t: &Arc<Slot>) {
        t.aborted.store(true, Ordering::SeqCst);
        self.aborts.fetch_add(1, Ordering::SeqCst);
    }

    fn is_aborted(&self, t: &Arc<Slot>) -> bool {
        t.aborted.load(Ordering::SeqCst)
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    engine: Arc<PromotionEngine<TestTier>>,
    tx: flume::Sender<Task<Arc<Slot>>>,
}

#[derive(Clone)]
struct Setup {
    workers: u32,
    cancel_abandoned: bool,
    expiry: Option<Expiry>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            workers: 2,
            cancel_abandoned: false,
            expiry: None,
        }
    }
}

fn rig(s: Setup) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let dfs = Arc::new(DfsStore::open(dir.path().join("dfs"), 4).unwrap());
    let engine = Arc::new(PromotionEngine::new(
        dfs,
        TestTier::default(),
        StagingBudget::new(1 << 20),
        PromotionLimits {
            max_in_flight: 16,
            cancel_abandoned: s.cancel_abandoned,
        },
        s.expiry,
    ));
    let (tx, rx) = flume::unbounded();
    engine.spawn_workers(s.workers, "test-promote", rx).unwrap();
    Rig {
        _dir: dir,
        engine,
        tx,
    }
}

fn k(n: u32) -> StorageKey {
    StorageKey::new(format!("tsl3-00000000000000ee-k{n}"))
}

fn payload(n: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32 ^ n.wrapping_mul(131)) as u8)
        .collect()
}

impl Rig {
    fn tier(&self) -> &TestTier {
        self.engine.target()
    }
    fn stats(&self) -> &stats::PromotionStats {
        &self.engine.stats
    }
    fn seed(&self, key: &StorageKey, bytes: &[u8]) {
        let r = self.engine.dfs().put_one(key, bytes);
        assert_eq!(
            r,
            KeyResult::Ok {
                bytes: bytes.len() as u64
            }
        );
    }
    fn submit(&self, keys: &[StorageKey]) -> PromotionTicket<TestTier> {
        self.engine.submit(keys, &self.tx).unwrap()
    }
    fn prefetch(&self, keys: &[StorageKey]) -> Vec<PromotionResult> {
        self.submit(keys).wait()
    }
    /// The DFS object, read through the validated path: exactly `want`.
    fn assert_dfs_readable(&self, key: &StorageKey, want: &[u8]) {
        let mut d = vec![0u8; want.len()];
        let r = self.engine.dfs().get_one(key, &mut d);
        assert_eq!(
            r,
            KeyResult::Ok {
                bytes: want.len() as u64
            }
        );
        assert_eq!(d, want);
    }
    fn quiescent(&self) {
        let f = self.stats().funnel();
        assert!(f.holds(), "{f:?}");
        assert_eq!(f.in_flight, 0, "{f:?}");
        self.engine.wait_drained(f.attempted);
        assert_eq!(self.engine.staging().used(), 0, "staging settled");
    }
}

#[test]
fn a_refused_reservation_fails_the_attempt_and_the_dfs_object_stays_readable() {
    let r = rig(Setup::default());
    let data = payload(1, 300);
    r.seed(&k(1), &data);
    *r.tier().refuse_reserve.lock() = Some(CapacityReason::Allocation);
    assert_eq!(
        r.prefetch(&[k(1)]),
        vec![R::Capacity(CapacityReason::Allocation)]
    );
    let s = r.stats();
    assert_eq!(s.attempted.load(Ordering::SeqCst), 1);
    assert_eq!(
        s.failed_by(FailReason::Capacity(CapacityReason::Allocation)),
        1
    );
    assert_eq!(s.committed.load(Ordering::SeqCst), 0);
    assert_eq!(r.tier().reserves.load(Ordering::SeqCst), 1);
    assert_eq!(r.tier().writes.load(Ordering::SeqCst), 0, "nothing written");
    assert_eq!(r.tier().published(&k(1)), None);
    r.quiescent();
    r.assert_dfs_readable(&k(1), &data);
    // The refusal was the tier's answer of the moment: a later trigger promotes.
    *r.tier().refuse_reserve.lock() = None;
    assert_eq!(r.prefetch(&[k(1)]), vec![R::Committed]);
    assert_eq!(r.tier().published(&k(1)), Some(data));
    r.quiescent();
}

#[test]
fn an_admission_capacity_gate_rejects_before_any_attempt() {
    let r = rig(Setup::default());
    r.seed(&k(1), &payload(1, 100));
    *r.tier().refuse_admission.lock() = Some(CapacityReason::Watermark);
    assert_eq!(
        r.prefetch(&[k(1)]),
        vec![R::Capacity(CapacityReason::Watermark)]
    );
    assert_eq!(r.stats().rejected_by(CapacityReason::Watermark), 1);
    assert_eq!(r.stats().attempted.load(Ordering::SeqCst), 0);
    assert_eq!(r.tier().reserves.load(Ordering::SeqCst), 0);
    r.quiescent();
}

#[test]
fn a_failed_write_aborts_the_target_and_leaves_no_partial_object_visible() {
    let r = rig(Setup::default());
    let data = payload(2, 3 * CHUNK + 5);
    r.seed(&k(1), &data);
    *r.tier().fail_write_at.lock() = Some(2 * CHUNK);
    assert_eq!(r.prefetch(&[k(1)]), vec![R::Failed(PromotionFailure::Io)]);
    // Two chunks landed, the third failed: the engine aborted the target, never committed.
    assert_eq!(r.tier().writes.load(Ordering::SeqCst), 3);
    assert_eq!(r.tier().aborts.load(Ordering::SeqCst), 1);
    assert_eq!(r.tier().published(&k(1)), None);
    assert_eq!(
        r.stats()
            .failed_by(FailReason::Failure(PromotionFailure::Io)),
        1
    );
    r.quiescent();
    r.assert_dfs_readable(&k(1), &data);
    *r.tier().fail_write_at.lock() = None;
    assert_eq!(r.prefetch(&[k(1)]), vec![R::Committed]);
    assert_eq!(r.tier().writes.load(Ordering::SeqCst), 3 + 4);
    assert_eq!(r.tier().published(&k(1)), Some(data));
    r.quiescent();
}

#[test]
fn bytes_that_land_differently_fail_checksum_and_are_aborted() {
    let r = rig(Setup::default());
    let data = payload(3, 2 * CHUNK);
    r.seed(&k(1), &data);
    r.tier().corrupt_landing.store(true, Ordering::SeqCst);
    assert_eq!(
        r.prefetch(&[k(1)]),
        vec![R::Failed(PromotionFailure::Checksum)]
    );
    assert_eq!(r.tier().aborts.load(Ordering::SeqCst), 1);
    assert_eq!(r.tier().published(&k(1)), None);
    r.quiescent();
    // The source itself was fine: it is still there, exact.
    r.assert_dfs_readable(&k(1), &data);
}

#[test]
fn two_promotions_of_one_key_run_once() {
    let r = rig(Setup::default());
    let data = payload(4, 5 * CHUNK);
    r.seed(&k(1), &data);
    let g = Gate::new();
    r.engine.hooks.arm(PromotionStage::Read, g.clone());
    let first = r.submit(&[k(1), k(1)]);
    g.wait_entered(1);
    let second = r.submit(&[k(1)]);
    let id = first.attempt_ids()[0];
    assert!(id.is_some());
    assert_eq!(first.attempt_ids(), vec![id, id]);
    assert_eq!(second.attempt_ids(), vec![id]);
    assert_eq!(r.stats().joined.load(Ordering::SeqCst), 1);
    g.release();
    assert_eq!(first.wait(), vec![R::Committed, R::Committed]);
    assert_eq!(second.wait(), vec![R::Committed]);
    assert_eq!(g.entered(), 1, "one worker read the source once");
    assert_eq!(r.tier().reserves.load(Ordering::SeqCst), 1);
    assert_eq!(r.tier().writes.load(Ordering::SeqCst), 5);
    assert_eq!(r.stats().attempted.load(Ordering::SeqCst), 1);
    assert_eq!(r.stats().committed.load(Ordering::SeqCst), 1);
    // Once committed, the tier answers residency: nothing new is admitted.
    assert_eq!(r.prefetch(&[k(1)]), vec![R::AlreadyInMemory]);
    assert_eq!(r.stats().attempted.load(Ordering::SeqCst), 1);
    assert_eq!(r.tier().published(&k(1)), Some(data));
    r.quiescent();
}

#[test]
fn a_failed_residency_query_fails_the_trigger_and_admits_nothing() {
    let r = rig(Setup::default());
    r.seed(&k(1), &payload(5, 10));
    r.tier().fail_residency.store(true, Ordering::SeqCst);
    assert!(r.engine.submit(&[k(1)], &r.tx).is_err());
    assert_eq!(r.stats().attempted.load(Ordering::SeqCst), 0);
    assert_eq!(r.engine.staging().used(), 0);
    // An empty trigger asks nothing.
    assert_eq!(r.prefetch(&[]), vec![]);
    r.tier().fail_residency.store(false, Ordering::SeqCst);
    assert_eq!(r.prefetch(&[k(1)]), vec![R::Committed]);
    r.quiescent();
}

#[test]
fn an_abandoned_queued_attempt_is_cancelled_only_where_the_engine_cancels() {
    for cancel in [true, false] {
        let r = rig(Setup {
            workers: 1,
            cancel_abandoned: cancel,
            ..Setup::default()
        });
        r.seed(&k(1), &payload(1, 100));
        r.seed(&k(2), &payload(2, 100));
        let g = Gate::new();
        r.engine.hooks.arm_once(PromotionStage::Read, g.clone());
        let blocker = r.submit(&[k(1)]);
        g.wait_entered(1);
        // The only worker is held: k(2) stays queued, and its only waiter goes away.
        drop(r.submit(&[k(2)]));
        assert_eq!(
            r.stats().cancelled.load(Ordering::SeqCst),
            cancel as u64,
            "cancel={cancel}"
        );
        g.release();
        assert_eq!(blocker.wait(), vec![R::Committed]);
        r.engine.wait_drained(2);
        assert_eq!(
            r.tier().published(&k(2)).is_some(),
            !cancel,
            "cancel={cancel}"
        );
        r.quiescent();
    }
}

#[test]
fn expiry_aborts_a_reserved_target_and_the_late_writer_stops() {
    let clock = ManualClock::new(1_000);
    let r = rig(Setup {
        expiry: Some(Expiry {
            clock: clock.clone(),
            ttl_us: TTL_US,
        }),
        ..Setup::default()
    });
    r.seed(&k(1), &payload(1, 3 * CHUNK));
    let g = Gate::new();
    r.engine.hooks.arm_once(PromotionStage::Target, g.clone());
    let t = r.submit(&[k(1)]);
    g.wait_entered(1);
    clock.advance_us(TTL_US + 1);
    assert_eq!(r.engine.expire_stale(), 1);
    assert_eq!(t.wait(), vec![R::Failed(PromotionFailure::Expired)]);
    assert_eq!(r.tier().aborts.load(Ordering::SeqCst), 1);
    g.release();
    r.engine.wait_drained(1);
    // The writer found its target aborted at the first chunk and stopped there.
    assert_eq!(r.tier().writes.load(Ordering::SeqCst), 1);
    assert_eq!(r.stats().fenced_writers.load(Ordering::SeqCst), 1);
    assert_eq!(r.tier().published(&k(1)), None);
    assert_eq!(r.stats().expired.load(Ordering::SeqCst), 1);
    r.quiescent();
}

#[test]
fn without_expiry_nothing_expires() {
    let r = rig(Setup::default());
    r.seed(&k(1), &payload(1, 10));
    let g = Gate::new();
    r.engine.hooks.arm_once(PromotionStage::Target, g.clone());
    let t = r.submit(&[k(1)]);
    g.wait_entered(1);
    assert_eq!(r.engine.expire_stale(), 0);
    g.release();
    assert_eq!(t.wait(), vec![R::Committed]);
    assert_eq!(r.stats().expired.load(Ordering::SeqCst), 0);
    r.quiescent();
}
