//! Seed 003's validation gates for the local store, one test per gate. Threads are ordered
//! with gates; time moves only through a ManualClock.

use super::promotion::PROMOTION_CHUNK;
use super::*;
use crate::clock::ManualClock;
use crate::l3::store::faulty::Gate;
use crate::l3::store::promotion::hooks::PromotionStage;
use crate::l3::store::promotion::stats::{self, FailReason};
use crate::l3::store::{CapacityReason, PromotionFailure, PromotionResult as R};
use std::io::{Seek, SeekFrom, Write};

const TTL_US: u64 = 1_000_000;

fn k(name: &str) -> StorageKey {
    StorageKey::new(format!("tsl3-00000000000000aa-{name}"))
}

fn payload(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

struct Fx {
    _dir: tempfile::TempDir,
    store: Arc<LocalStore>,
    clock: Arc<ManualClock>,
}

#[derive(Clone, Copy)]
struct Limits {
    memory: u64,
    staging: u64,
    workers: u32,
    in_flight: u32,
    promote_after_get: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory: 1 << 20,
            staging: 1 << 20,
            workers: 2,
            in_flight: 16,
            promote_after_get: true,
        }
    }
}

fn fx(l: Limits) -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000);
    let cfg = LocalStoreConfig {
        dir: dir.path().join("dfs"),
        memory_bytes: l.memory,
        promotion_workers: l.workers,
        staging_bytes: l.staging,
        max_promotions_in_flight: l.in_flight,
        dfs_io_concurrency: 4,
        promotion_ttl_us: TTL_US,
        promote_after_get: l.promote_after_get,
    };
    let store = Arc::new(LocalStore::open(&cfg, clock.clone()).unwrap());
    Fx {
        _dir: dir,
        store,
        clock,
    }
}

impl Fx {
    /// An object in DFS only (as if another host wrote it).
    fn seed(&self, key: &StorageKey, bytes: &[u8]) {
        assert_eq!(
            self.store.dfs().put_one(key, bytes),
            KeyResult::Ok {
                bytes: bytes.len() as u64
            }
        );
    }
    fn read(&self, key: &StorageKey, len: usize) -> (KeyResult, Vec<u8>) {
        let mut d = vec![0u8; len];
        let r = self
            .store
            .get(std::slice::from_ref(key), &mut [&mut d])
            .unwrap();
        (r[0], d)
    }
    fn memory_hits(&self) -> u64 {
        self.store.stats.memory_hits.load(Ordering::Relaxed)
    }
    fn dfs_reads(&self) -> u64 {
        self.store.stats.dfs_reads.load(Ordering::Relaxed)
    }
    fn funnel_holds(&self) {
        let f = self.store.promotion_stats().funnel();
        assert!(f.holds(), "{f:?}");
    }
    fn quiescent(&self) {
        let f = self.store.promotion_stats().funnel();
        assert!(f.holds(), "{f:?}");
        assert_eq!(f.in_flight, 0, "{f:?}");
        self.store
            .engine()
            .wait_drained(f.attempted - f.cancelled.min(f.attempted));
        assert_eq!(self.store.staging().used(), 0, "staging settled");
        assert_eq!(self.store.memory().budget().fenced_outstanding(), 0);
    }
}

fn stat(fx: &Fx) -> &stats::PromotionStats {
    fx.store.promotion_stats()
}

#[test]
fn memory_hit_is_already_in_memory() {
    let f = fx(Limits::default());
    f.store.put(&[k("a")], &[&payload(1, 100)]).unwrap();
    assert!(f.store.memory().contains(&k("a")), "write-through");
    assert_eq!(
        f.store.prefetch_to_memory(&[k("a")]).unwrap(),
        vec![R::AlreadyInMemory]
    );
    assert_eq!(stat(&f).attempted.load(Ordering::Relaxed), 0);
    assert!(f.store.capabilities().promotion);
}

#[test]
fn dfs_only_object_is_committed_and_served_from_memory() {
    let f = fx(Limits::default());
    let data = payload(2, 3 * PROMOTION_CHUNK + 17);
    f.seed(&k("a"), &data);
    assert!(!f.store.memory().contains(&k("a")));
    assert_eq!(
        f.store.prefetch_to_memory(&[k("a")]).unwrap(),
        vec![R::Committed]
    );
    let (r, bytes) = f.read(&k("a"), data.len());
    assert_eq!(
        r,
        KeyResult::Ok {
            bytes: data.len() as u64
        }
    );
    assert_eq!(bytes, data);
    assert_eq!((f.memory_hits(), f.dfs_reads()), (1, 0));
    f.quiescent();
}

#[test]
fn missing_object_and_bad_key_are_missing_source() {
    let f = fx(Limits::default());
    let bad = StorageKey::new("tsl3-00000000000000aa-../x");
    assert_eq!(
        f.store.prefetch_to_memory(&[k("nope"), bad]).unwrap(),
        vec![R::MissingSource, R::MissingSource]
    );
    assert_eq!(stat(&f).attempted.load(Ordering::Relaxed), 0);
}

#[test]
fn mixed_batch_answers_in_input_order() {
    let f = fx(Limits::default());
    f.store.put(&[k("mem")], &[&payload(1, 64)]).unwrap();
    f.seed(&k("d1"), &payload(2, 64));
    f.seed(&k("d2"), &payload(3, 128));
    let r = f
        .store
        .prefetch_to_memory(&[k("d1"), k("mem"), k("gone"), k("d2")])
        .unwrap();
    assert_eq!(
        r,
        vec![
            R::Committed,
            R::AlreadyInMemory,
            R::MissingSource,
            R::Committed
        ]
    );
    assert_eq!(f.read(&k("d2"), 128).1, payload(3, 128));
    f.quiescent();
}

#[test]
fn duplicate_keys_share_one_attempt() {
    let f = fx(Limits::default());
    f.seed(&k("a"), &payload(1, 64));
    f.seed(&k("b"), &payload(2, 64));
    let t = f
        .store
        .submit_prefetch(&[k("a"), k("a"), k("b"), k("a")])
        .unwrap();
    let ids = t.attempt_ids();
    assert_eq!(ids[0], ids[1]);
    assert_eq!(ids[0], ids[3]);
    assert_ne!(ids[0], ids[2]);
    assert_eq!(t.wait(), vec![R::Committed; 4]);
    assert_eq!(stat(&f).attempted.load(Ordering::Relaxed), 2);
    assert_eq!(stat(&f).committed.load(Ordering::Relaxed), 2);
    f.quiescent();
}

fn corrupt_payload_byte(f: &Fx, key: &StorageKey, at: u64) {
    let path = f.store.dfs().object_path(key).unwrap();
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(
        crate::l3::store::dfs::DFS_HEADER_LEN as u64 + at,
    ))
    .unwrap();
    file.write_all(&[0xEE]).unwrap();
}

#[test]
fn partial_failure_keeps_the_good_keys() {
    let f = fx(Limits::default());
    f.seed(&k("good"), &payload(1, 256));
    f.seed(&k("bad"), &payload(2, 256));
    corrupt_payload_byte(&f, &k("bad"), 10);
    let r = f
        .store
        .prefetch_to_memory(&[k("good"), k("bad"), k("missing")])
        .unwrap();
    assert_eq!(
        r,
        vec![
            R::Committed,
            R::Failed(PromotionFailure::Checksum),
            R::MissingSource
        ]
    );
    assert!(f.store.memory().contains(&k("good")));
    assert!(!f.store.memory().contains(&k("bad")));
    assert_eq!(
        stat(&f).failed_by(FailReason::Failure(PromotionFailure::Checksum)),
        1
    );
    f.quiescent();
}

#[test]
fn a_plain_get_reads_dfs_straight_into_the_destination_and_a_corrupt_byte_is_invalid() {
    let f = fx(Limits::default());
    let len = 3 * PROMOTION_CHUNK + 11;
    let (good, bad) = (payload(1, len), payload(2, len));
    f.seed(&k("good"), &good);
    f.seed(&k("bad"), &bad);
    corrupt_payload_byte(&f, &k("bad"), (2 * PROMOTION_CHUNK + 3) as u64);
    let (r, bytes) = f.read(&k("good"), len);
    assert_eq!(r, KeyResult::Ok { bytes: len as u64 });
    assert_eq!(bytes, good);
    let (r, _) = f.read(&k("bad"), len);
    assert_eq!(r, KeyResult::Invalid, "the checksum of the read's own pass");
    let dfs = &f.store.dfs().stats;
    assert_eq!(
        dfs.invalid(crate::l3::store::dfs::InvalidReason::Checksum),
        1
    );
    // Neither GET staged: no store-owned payload buffer, no staging quota, no MEMORY copy.
    assert_eq!(dfs.staged_reads.load(Ordering::Relaxed), 0);
    assert_eq!(f.store.staging().peak(), 0);
    assert_eq!(f.store.memory().budget().used(), 0);
    assert_eq!(f.dfs_reads(), 2);
    // Promotion is what stages, once, and its target is that very buffer (MEMORY holds
    // one object's bytes, staging is back to zero).
    assert_eq!(
        f.store.prefetch_to_memory(&[k("good")]).unwrap(),
        vec![R::Committed]
    );
    assert_eq!(dfs.staged_reads.load(Ordering::Relaxed), 1);
    assert_eq!(f.store.memory().budget().used(), len as u64);
    assert_eq!(f.read(&k("good"), len).1, good);
    assert_eq!(f.memory_hits(), 1);
    f.quiescent();
}

#[test]
fn exact_bytes_and_checksum_are_verified_on_disk() {
    let f = fx(Limits::default());
    f.seed(&k("flip"), &payload(1, 1000));
    f.seed(&k("short"), &payload(2, 1000));
    corrupt_payload_byte(&f, &k("flip"), 999);
    let path = f.store.dfs().object_path(&k("short")).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_len(crate::l3::store::dfs::DFS_HEADER_LEN as u64 + 999)
        .unwrap();
    assert_eq!(
        f.store
            .prefetch_to_memory(&[k("flip"), k("short")])
            .unwrap(),
        vec![
            R::Failed(PromotionFailure::Checksum),
            R::Failed(PromotionFailure::Checksum)
        ]
    );
    assert_eq!(f.store.memory().resident_count(), 0, "nothing published");
    // Proven invalid on the first read: removed, so later readers miss and a PUT lands.
    assert_eq!(f.read(&k("flip"), 1000).0, KeyResult::Missing);
    assert_eq!(f.read(&k("short"), 1000).0, KeyResult::Missing);
    assert!(f.store.dfs().stats.invalid_removed.load(Ordering::Relaxed) >= 2);
    f.quiescent();
}

#[test]
fn repeated_and_concurrent_triggers_admit_once() {
    let f = fx(Limits::default());
    let data = payload(5, 4096);
    f.seed(&k("a"), &data);
    let g = Gate::new();
    f.store.hooks().arm(PromotionStage::Read, g.clone());
    let first = f.store.submit_prefetch(&[k("a")]).unwrap();
    g.wait_entered(1);
    let id = first.attempt_ids()[0];
    let barrier = Arc::new(std::sync::Barrier::new(5));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let s = f.store.clone();
            let b = barrier.clone();
            std::thread::spawn(move || {
                b.wait();
                let t = s.submit_prefetch(&[k("a")]).unwrap();
                let ids = t.attempt_ids();
                (ids, t.wait())
            })
        })
        .collect();
    barrier.wait();
    // Every trigger joined the one live attempt before the gate opens.
    while stat(&f).joined.load(Ordering::SeqCst) < 4 {
        std::thread::yield_now();
    }
    assert_eq!(g.entered(), 1, "one worker reads the source once");
    g.release();
    assert_eq!(first.wait(), vec![R::Committed]);
    for t in threads {
        let (ids, r) = t.join().unwrap();
        assert_eq!(ids, vec![id]);
        assert_eq!(r, vec![R::Committed]);
    }
    assert_eq!(stat(&f).attempted.load(Ordering::Relaxed), 1);
    // A repeated trigger after the commit admits nothing new.
    assert_eq!(
        f.store.prefetch_to_memory(&[k("a")]).unwrap(),
        vec![R::AlreadyInMemory]
    );
    assert_eq!(stat(&f).attempted.load(Ordering::Relaxed), 1);
    f.quiescent();
}

#[test]
fn shared_staging_quota_and_in_flight_cap_give_capacity() {
    let f = fx(Limits {
        staging: 1500,
        in_flight: 2,
        ..Limits::default()
    });
    for n in ["a", "b", "c"] {
        f.seed(&k(n), &payload(1, 1000));
    }
    f.seed(&k("small"), &payload(1, 400));
    f.seed(&k("tiny"), &payload(1, 10));
    let g = Gate::new();
    f.store.hooks().arm(PromotionStage::Read, g.clone());
    let ta = f.store.submit_prefetch(&[k("a")]).unwrap();
    g.wait_entered(1);
    // Staging is shared by every trigger: 1000 of 1500 bytes are held.
    assert_eq!(
        f.store.prefetch_to_memory(&[k("b")]).unwrap(),
        vec![R::Capacity(CapacityReason::Quota)]
    );
    let ts = f.store.submit_prefetch(&[k("small")]).unwrap();
    g.wait_entered(2);
    // Two attempts in flight: the hard cap refuses a third.
    assert_eq!(
        f.store.prefetch_to_memory(&[k("tiny")]).unwrap(),
        vec![R::Capacity(CapacityReason::InFlightCap)]
    );
    assert_eq!(stat(&f).rejected_by(CapacityReason::Quota), 1);
    assert_eq!(stat(&f).rejected_by(CapacityReason::InFlightCap), 1);
    assert!(f.store.staging().peak() <= 1500);
    g.release();
    assert_eq!(ta.wait(), vec![R::Committed]);
    assert_eq!(ts.wait(), vec![R::Committed]);
    assert_eq!(
        f.store.prefetch_to_memory(&[k("b"), k("tiny")]).unwrap(),
        vec![R::Committed, R::Committed]
    );
    f.quiescent();
}

#[test]
fn memory_pressure_gives_capacity() {
    let f = fx(Limits {
        memory: 1000,
        ..Limits::default()
    });
    f.store.put(&[k("resident")], &[&payload(1, 600)]).unwrap();
    f.seed(&k("b"), &payload(2, 600));
    f.seed(&k("huge"), &payload(3, 2000));
    assert_eq!(
        f.store.prefetch_to_memory(&[k("huge")]).unwrap(),
        vec![R::Capacity(CapacityReason::Allocation)]
    );
    {
        // A lease (a GET in progress) keeps the resident replica: no room without it.
        let _lease = f.store.memory().lease(&k("resident")).unwrap();
        assert_eq!(
            f.store.prefetch_to_memory(&[k("b")]).unwrap(),
            vec![R::Capacity(CapacityReason::Watermark)]
        );
    }
    // Unleased, the replica is evictable in LRU order: promotion succeeds.
    assert_eq!(
        f.store.prefetch_to_memory(&[k("b")]).unwrap(),
        vec![R::Committed]
    );
    assert!(!f.store.memory().contains(&k("resident")));
    // The evicted object is still readable from DFS.
    assert_eq!(f.read(&k("resident"), 600).1, payload(1, 600));
    assert_eq!(stat(&f).attempted.load(Ordering::Relaxed), 1);
    f.quiescent();
}

/// A store with one promotion worker, held at its read of "blocker" (released through the
/// gate; its ticket is the third value), and objects "a" and "c" in DFS only.
fn one_worker_held() -> (Fx, Arc<Gate>, PromotionTicket<MemoryTier>) {
    let f = fx(Limits {
        workers: 1,
        ..Limits::default()
    });
    f.seed(&k("blocker"), &payload(1, 64));
    f.seed(&k("a"), &payload(2, 64));
    f.seed(&k("c"), &payload(3, 64));
    let g = Gate::new();
    f.store.hooks().arm_once(PromotionStage::Read, g.clone());
    let tb = f.store.submit_prefetch(&[k("blocker")]).unwrap();
    g.wait_entered(1);
    (f, g, tb)
}

#[test]
fn cancelling_one_waiter_leaves_the_others_result() {
    let (f, g, tb) = one_worker_held();
    // The only worker is held: "a" and "c" stay queued.
    let ta1 = f.store.submit_prefetch(&[k("a")]).unwrap();
    let ta2 = f.store.submit_prefetch(&[k("a")]).unwrap();
    let tc = f.store.submit_prefetch(&[k("c")]).unwrap();
    assert_eq!(ta1.attempt_ids(), ta2.attempt_ids());
    drop(ta1); // one waiter of "a" goes away: the other still waits
    drop(tc); // the only waiter of "c" goes away: its queued attempt is cancelled
    assert_eq!(stat(&f).cancelled.load(Ordering::SeqCst), 1);
    f.funnel_holds();
    g.release();
    assert_eq!(tb.wait(), vec![R::Committed]);
    assert_eq!(ta2.wait(), vec![R::Committed]);
    assert!(f.store.memory().contains(&k("a")));
    f.store.engine().wait_drained(3);
    assert!(
        !f.store.memory().contains(&k("c")),
        "cancelled before any work"
    );
    assert_eq!(stat(&f).committed.load(Ordering::SeqCst), 2);
    f.quiescent();
}

#[test]
fn a_detached_trigger_runs_to_commit_with_no_waiter_left() {
    let (f, g, tb) = one_worker_held();
    // "a" and "c" stay queued behind the held worker, and nobody waits for them.
    assert_eq!(f.store.promote_detached(&[k("a"), k("c")]).unwrap(), 2);
    // A waiter that joins "a" and goes away does not cancel it either.
    drop(f.store.submit_prefetch(&[k("a")]).unwrap());
    assert_eq!(stat(&f).cancelled.load(Ordering::SeqCst), 0);
    g.release();
    assert_eq!(tb.wait(), vec![R::Committed]);
    f.store.engine().wait_drained(3);
    assert!(f.store.memory().contains(&k("a")));
    assert!(f.store.memory().contains(&k("c")));
    assert_eq!(stat(&f).committed.load(Ordering::SeqCst), 3);
    assert_eq!(f.read(&k("c"), 64).1, payload(3, 64));
    assert_eq!(f.memory_hits(), 1);
    // Resident keys start nothing.
    assert_eq!(f.store.promote_detached(&[k("a")]).unwrap(), 0);
    f.quiescent();
}

#[test]
fn without_promote_after_get_a_detached_trigger_starts_nothing() {
    let f = fx(Limits {
        promote_after_get: false,
        ..Limits::default()
    });
    let store = &f.store;
    f.seed(&k("a"), &payload(1, 64));
    assert!(
        !store.capabilities().promotion,
        "the executor triggers nothing"
    );
    assert_eq!(store.promote_detached(&[k("a")]).unwrap(), 0);
    assert_eq!(store.promotion_stats().attempted.load(Ordering::SeqCst), 0);
    assert!(!store.memory().contains(&k("a")));
    // The explicit trigger still promotes.
    assert_eq!(
        store.prefetch_to_memory(&[k("a")]).unwrap(),
        vec![R::Committed]
    );
}

#[test]
fn cancel_after_commit_keeps_the_replica() {
    let f = fx(Limits::default());
    f.seed(&k("a"), &payload(1, 64));
    let g = Gate::new();
    f.store.hooks().arm_once(PromotionStage::Read, g.clone());
    let t1 = f.store.submit_prefetch(&[k("a")]).unwrap();
    g.wait_entered(1);
    let t2 = f.store.submit_prefetch(&[k("a")]).unwrap();
    assert_eq!(t1.attempt_ids(), t2.attempt_ids());
    g.release();
    assert_eq!(t2.wait(), vec![R::Committed]);
    drop(t1);
    assert!(f.store.memory().contains(&k("a")));
    assert_eq!(f.read(&k("a"), 64).1, payload(1, 64));
    assert_eq!(f.memory_hits(), 1);
    assert_eq!(stat(&f).cancelled.load(Ordering::SeqCst), 0);
    f.quiescent();
}

#[derive(Clone, Copy, Debug)]
enum Change {
    Removed,
    Replaced,
    SameBytesNewGeneration,
}

#[test]
fn source_removed_replaced_or_regenerated_mid_read_fails_safely() {
    for change in [
        Change::Removed,
        Change::Replaced,
        Change::SameBytesNewGeneration,
    ] {
        let f = fx(Limits::default());
        let old = payload(1, 4096);
        f.seed(&k("a"), &old);
        let g = Gate::new();
        f.store.hooks().arm_once(PromotionStage::Read, g.clone());
        let t = f.store.submit_prefetch(&[k("a")]).unwrap();
        g.wait_entered(1);
        // Another host changes the object while it sits in our staging.
        assert!(f.store.dfs().remove(&k("a")).unwrap());
        let new = payload(9, 4096);
        match change {
            Change::Removed => {}
            Change::Replaced => f.seed(&k("a"), &new),
            Change::SameBytesNewGeneration => f.seed(&k("a"), &old),
        }
        g.release();
        assert_eq!(
            t.wait(),
            vec![R::Failed(PromotionFailure::SourceChanged)],
            "{change:?}"
        );
        assert!(!f.store.memory().contains(&k("a")), "{change:?}");
        let (r, bytes) = f.read(&k("a"), 4096);
        match change {
            Change::Removed => assert_eq!(r, KeyResult::Missing),
            Change::Replaced => assert_eq!(bytes, new),
            Change::SameBytesNewGeneration => assert_eq!(bytes, old),
        }
        f.quiescent();
    }
}

#[test]
fn a_pinned_source_is_not_removable_while_promoted() {
    let f = fx(Limits::default());
    f.seed(&k("a"), &payload(1, 64));
    let g = Gate::new();
    f.store.hooks().arm_once(PromotionStage::Read, g.clone());
    let t = f.store.submit_prefetch(&[k("a")]).unwrap();
    g.wait_entered(1);
    assert_eq!(f.store.remove(&k("a")).unwrap(), RemoveOutcome::Pinned);
    assert!(f.store.dfs().stat(&k("a")).is_ok());
    g.release();
    assert_eq!(t.wait(), vec![R::Committed]);
    assert_eq!(f.store.remove(&k("a")).unwrap(), RemoveOutcome::Removed);
    assert_eq!(f.store.query(&[k("a")]).unwrap(), vec![false]);
    assert_eq!(f.store.remove(&k("a")).unwrap(), RemoveOutcome::Absent);
    f.quiescent();
}

#[test]
fn paused_writer_after_target_issuance_blocks_reuse_until_drained() {
    let len = 1000usize;
    let f = fx(Limits {
        memory: len as u64,
        ..Limits::default()
    });
    f.seed(&k("a"), &payload(1, len));
    f.seed(&k("b"), &payload(2, len));
    let g = Gate::new();
    f.store.hooks().arm_once(PromotionStage::Target, g.clone());
    let ta = f.store.submit_prefetch(&[k("a")]).unwrap();
    g.wait_entered(1);
    // The task deadline passes while the writer holds the target.
    f.clock.advance_us(TTL_US + 1);
    f.store.expire_stale();
    assert_eq!(ta.wait(), vec![R::Failed(PromotionFailure::Expired)]);
    assert_eq!(stat(&f).expired.load(Ordering::SeqCst), 1);
    // Expiry fenced the target but its bytes are still charged: no reuse for "b".
    let budget = f.store.memory().budget();
    assert_eq!(budget.used(), len as u64);
    assert_eq!(budget.fenced_outstanding(), len as u64);
    assert_eq!(
        f.store.prefetch_to_memory(&[k("b")]).unwrap(),
        vec![R::Capacity(CapacityReason::Watermark)]
    );
    // The writer resumes late, finds the fence, writes nothing, and drains.
    g.release();
    f.store.engine().wait_drained(1);
    assert_eq!(budget.used(), 0);
    assert_eq!(stat(&f).fenced_writers.load(Ordering::SeqCst), 1);
    assert_eq!(
        f.store.prefetch_to_memory(&[k("b")]).unwrap(),
        vec![R::Committed]
    );
    assert_eq!(f.read(&k("b"), len).1, payload(2, len));
    assert!(!f.store.memory().contains(&k("a")));
    assert_eq!(stat(&f).committed.load(Ordering::SeqCst), 1);
    f.quiescent();
}

#[test]
fn every_stage_timed_out_and_resumed_late_is_safe() {
    let len = 2 * PROMOTION_CHUNK + 5;
    for stage in [
        PromotionStage::Read,
        PromotionStage::Target,
        PromotionStage::Write,
        PromotionStage::Commit,
    ] {
        let f = fx(Limits {
            memory: 2 * len as u64,
            staging: 2 * len as u64,
            ..Limits::default()
        });
        let (a, b) = (payload(1, len), payload(2, len));
        f.seed(&k("a"), &a);
        f.seed(&k("b"), &b);
        let g = Gate::new();
        f.store.hooks().arm_once(stage, g.clone());
        let ta = f.store.submit_prefetch(&[k("a")]).unwrap();
        let first_id = ta.attempt_ids()[0].unwrap();
        g.wait_entered(1);
        f.clock.advance_us(TTL_US + 1);
        f.store.expire_stale();
        assert_eq!(
            ta.wait(),
            vec![R::Failed(PromotionFailure::Expired)],
            "{stage:?}"
        );
        // Another object takes MEMORY while the stale worker is paused.
        assert_eq!(
            f.store.prefetch_to_memory(&[k("b")]).unwrap(),
            vec![R::Committed],
            "{stage:?}"
        );
        g.release();
        f.store.engine().wait_drained(2);
        // No publication of the expired attempt, no cross-object write, one settlement.
        assert!(!f.store.memory().contains(&k("a")), "{stage:?}");
        assert_eq!(f.read(&k("b"), len).1, b, "{stage:?}");
        let s = stat(&f);
        assert_eq!(s.expired.load(Ordering::SeqCst), 1, "{stage:?}");
        assert_eq!(s.committed.load(Ordering::SeqCst), 1, "{stage:?}");
        assert_eq!(s.failed.load(Ordering::SeqCst), 0, "{stage:?}");
        assert_eq!(f.store.memory().budget().used(), len as u64, "{stage:?}");
        f.quiescent();
        // The key promotes again under a fresh, larger attempt id.
        let t = f.store.submit_prefetch(&[k("a")]).unwrap();
        assert!(t.attempt_ids()[0].unwrap() > first_id);
        assert_eq!(t.wait(), vec![R::Committed], "{stage:?}");
        assert_eq!(f.read(&k("a"), len).1, a, "{stage:?}");
        f.quiescent();
    }
}

#[test]
fn a_stale_attempt_id_cannot_commit() {
    let f = fx(Limits::default());
    let data = payload(7, 512);
    f.seed(&k("a"), &data);
    let g1 = Gate::new();
    f.store.hooks().arm_once(PromotionStage::Target, g1.clone());
    let t1 = f.store.submit_prefetch(&[k("a")]).unwrap();
    let id1 = t1.attempt_ids()[0].unwrap();
    g1.wait_entered(1);
    f.clock.advance_us(TTL_US + 1);
    f.store.expire_stale();
    assert_eq!(t1.wait(), vec![R::Failed(PromotionFailure::Expired)]);
    let g2 = Gate::new();
    f.store.hooks().arm_once(PromotionStage::Commit, g2.clone());
    let t2 = f.store.submit_prefetch(&[k("a")]).unwrap();
    let id2 = t2.attempt_ids()[0].unwrap();
    assert!(id2 > id1, "attempt ids are never reused");
    g2.wait_entered(1);
    // Attempt 2 is verified and waits to commit; attempt 1's late success is refused.
    assert!(!f.store.engine().try_commit(&k("a"), id1));
    g1.release();
    f.store.engine().wait_drained(1);
    assert!(!f.store.memory().contains(&k("a")));
    assert!(f.store.engine().try_commit(&k("a"), id2));
    // The worker's own commit of attempt 2 is now a no-op: settled exactly once.
    g2.release();
    assert_eq!(t2.wait(), vec![R::Committed]);
    f.store.engine().wait_drained(2);
    assert_eq!(stat(&f).committed.load(Ordering::SeqCst), 1);
    assert!(stat(&f).stale_commits_rejected.load(Ordering::SeqCst) >= 2);
    assert_eq!(f.read(&k("a"), 512).1, data);
    f.quiescent();
}

#[test]
fn eviction_between_promotion_and_admission_reselects_dfs() {
    let f = fx(Limits::default());
    let data = payload(3, 2048);
    f.seed(&k("a"), &data);
    assert_eq!(
        f.store.prefetch_to_memory(&[k("a")]).unwrap(),
        vec![R::Committed]
    );
    assert!(f.store.evict_memory(&k("a")));
    let (r, bytes) = f.read(&k("a"), data.len());
    assert_eq!(r, KeyResult::Ok { bytes: 2048 });
    assert_eq!(bytes, data);
    assert_eq!((f.memory_hits(), f.dfs_reads()), (0, 1));
    // Promoted again, admission reads MEMORY.
    assert_eq!(
        f.store.prefetch_to_memory(&[k("a")]).unwrap(),
        vec![R::Committed]
    );
    assert_eq!(f.read(&k("a"), data.len()).1, data);
    assert_eq!(f.memory_hits(), 1);
    f.quiescent();
}

#[test]
fn funnel_identity_holds_through_every_outcome() {
    let f = fx(Limits {
        workers: 1,
        ..Limits::default()
    });
    for (i, n) in ["ok", "bad", "queued", "late"].iter().enumerate() {
        f.seed(&k(n), &payload(i as u8, 300));
    }
    corrupt_payload_byte(&f, &k("bad"), 3);
    assert_eq!(
        f.store.prefetch_to_memory(&[k("ok"), k("bad")]).unwrap(),
        vec![R::Committed, R::Failed(PromotionFailure::Checksum)]
    );
    let g = Gate::new();
    f.store.hooks().arm_once(PromotionStage::Write, g.clone());
    let tl = f.store.submit_prefetch(&[k("late")]).unwrap();
    g.wait_entered(1);
    let tq = f.store.submit_prefetch(&[k("queued")]).unwrap();
    let fun = stat(&f).funnel();
    assert_eq!((fun.attempted, fun.in_flight), (4, 2));
    assert!(fun.holds(), "{fun:?}");
    drop(tq);
    f.clock.advance_us(TTL_US + 1);
    f.store.expire_stale();
    assert_eq!(tl.wait(), vec![R::Failed(PromotionFailure::Expired)]);
    g.release();
    f.store.engine().wait_drained(4);
    let fun = stat(&f).funnel();
    assert_eq!(
        (
            fun.committed,
            fun.failed,
            fun.expired,
            fun.cancelled,
            fun.in_flight
        ),
        (1, 1, 1, 1, 0)
    );
    assert!(fun.holds());
    f.quiescent();
}

#[test]
fn write_through_put_and_memory_first_get() {
    let f = fx(Limits {
        memory: 100,
        ..Limits::default()
    });
    let r = f
        .store
        .put(&[k("a"), k("big")], &[&payload(1, 80), &payload(2, 500)])
        .unwrap();
    assert_eq!(
        r,
        vec![KeyResult::Ok { bytes: 80 }, KeyResult::Ok { bytes: 500 }]
    );
    assert!(f.store.dfs().stat(&k("a")).is_ok() && f.store.memory().contains(&k("a")));
    assert!(
        !f.store.memory().contains(&k("big")),
        "best effort when full"
    );
    assert_eq!(
        f.store.put(&[k("a")], &[&payload(9, 80)]).unwrap(),
        vec![KeyResult::AlreadyExists]
    );
    assert_eq!(f.read(&k("a"), 80).1, payload(1, 80));
    assert_eq!(f.read(&k("big"), 500).1, payload(2, 500));
    assert_eq!((f.memory_hits(), f.dfs_reads()), (1, 1));
    let (r, _) = f.read(&k("a"), 90);
    assert_eq!(r, KeyResult::ShortRead { bytes: 80 });
    assert_eq!(f.read(&k("a"), 10).0, KeyResult::Invalid);
    assert_eq!(f.read(&k("none"), 10).0, KeyResult::Missing);
}

#[test]
fn purging_a_namespace_fences_its_live_promotions() {
    let f = fx(Limits::default());
    f.seed(&k("a"), &payload(1, 700));
    let g = Gate::new();
    f.store.hooks().arm_once(PromotionStage::Target, g.clone());
    let t = f.store.submit_prefetch(&[k("a")]).unwrap();
    g.wait_entered(1);
    let ns = Namespace("tsl3-00000000000000aa".into());
    assert_eq!(f.store.remove_namespace(&ns).unwrap(), 1);
    assert_eq!(t.wait(), vec![R::Failed(PromotionFailure::Fenced)]);
    g.release();
    f.store.engine().wait_drained(1);
    assert!(!f.store.memory().contains(&k("a")));
    assert_eq!(f.store.memory().budget().used(), 0);
    assert_eq!(f.store.query(&[k("a")]).unwrap(), vec![false]);
    f.quiescent();
}

#[test]
fn bench_promotion_runs_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let b = bench::bench_promotion(dir.path(), 4, 8192, 2, 1).unwrap();
    assert_eq!((b.objects, b.object_bytes), (4, 8192));
    assert!(b.baseline_bytes_per_s > 0.0 && b.promotion_bytes_per_s > 0.0);
    assert!((b.ratio - b.promotion_bytes_per_s / b.baseline_bytes_per_s).abs() < 1e-9);
}

#[test]
fn removing_an_object_fences_a_promotion_past_its_source_read() {
    let f = fx(Limits::default());
    f.seed(&k("a"), &payload(1, 300));
    let g = Gate::new();
    f.store.hooks().arm_once(PromotionStage::Target, g.clone());
    let t = f.store.submit_prefetch(&[k("a")]).unwrap();
    g.wait_entered(1);
    // The source pin was released after revalidation: removal proceeds and fences.
    assert_eq!(f.store.remove(&k("a")).unwrap(), RemoveOutcome::Removed);
    assert_eq!(t.wait(), vec![R::Failed(PromotionFailure::Fenced)]);
    g.release();
    f.store.engine().wait_drained(1);
    assert!(
        !f.store.memory().contains(&k("a")),
        "a removed object is never published"
    );
    assert_eq!(f.read(&k("a"), 300).0, KeyResult::Missing);
    f.quiescent();
}
