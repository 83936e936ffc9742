//! Unit tests of the tiered store over an in-process MEMORY tier (MemoryStore behind
//! FaultyStore) and a temporary DFS root; the live Mooncake tests are in
//! actors/tests/tiered_live.rs.

use super::promotion::{put_outcome, read_failure, verified, TierLimits};
use super::*;
use crate::l3::store::dfs::{ObjectIdentity, ReadError, DFS_HEADER_LEN};
use crate::l3::store::faulty::{Call, Fault, FaultyStore, Gate};
use crate::l3::store::memory::MemoryStore;
use crate::l3::store::{CapacityReason, PromotionFailure, PromotionResult as R};
use std::io::{Seek, SeekFrom, Write};

const LEN: usize = 4096;

struct Rig {
    _dir: tempfile::TempDir,
    memory: Arc<FaultyStore<MemoryStore>>,
    store: TieredStore,
}

fn rig_with(limits: TierLimits) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let dfs = Arc::new(DfsStore::open(dir.path().join("dfs"), 4).unwrap());
    let memory = Arc::new(FaultyStore::new(MemoryStore::new(), false));
    let store = TieredStore::with_tiers(memory.clone(), dfs, limits).unwrap();
    Rig {
        _dir: dir,
        memory,
        store,
    }
}

fn rig() -> Rig {
    rig_with(TierLimits {
        workers: 2,
        staging_bytes: 1 << 20,
        max_in_flight: 16,
    })
}

fn ns() -> Namespace {
    Namespace("tsl3-00000000000000aa".into())
}
fn key(n: u32) -> StorageKey {
    ns().key(0x1000 + n as u128, 0, n, 0)
}
fn payload(n: u32) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u32 ^ n.wrapping_mul(31)) as u8)
        .collect()
}

impl Rig {
    fn put_dfs(&self, n: u32) {
        let r = self.store.dfs().put(&[key(n)], &[&payload(n)]).unwrap();
        assert_eq!(r, vec![KeyResult::Ok { bytes: LEN as u64 }]);
    }
    fn in_memory(&self, n: u32) -> bool {
        self.memory.inner().contains(&key(n))
    }
    fn quiescent(&self) {
        let f = self.store.promotion_stats().funnel();
        assert!(f.holds(), "{f:?}");
        assert_eq!(f.in_flight, 0);
        assert_eq!(self.store.staging().used(), 0);
    }
}

#[test]
fn a_dfs_only_key_commits_into_memory_and_is_then_read_from_memory() {
    let r = rig();
    r.put_dfs(1);
    assert!(!r.in_memory(1));
    assert_eq!(
        r.store.prefetch_to_memory(&[key(1)]).unwrap(),
        vec![R::Committed]
    );
    assert_eq!(
        r.memory.inner().object(&key(1)).unwrap().as_ref(),
        payload(1).as_slice()
    );
    let mut buf = vec![0u8; LEN];
    let got = r.store.get(&[key(1)], &mut [&mut buf[..]]).unwrap();
    assert_eq!(got, vec![KeyResult::Ok { bytes: LEN as u64 }]);
    assert_eq!(buf, payload(1));
    assert_eq!(r.store.stats.memory_hits.load(Ordering::Relaxed), 1);
    assert_eq!(r.store.stats.dfs_reads.load(Ordering::Relaxed), 0);
    r.quiescent();
    assert_eq!(r.store.promotion_stats().funnel().committed, 1);
}

#[test]
fn a_mixed_batch_with_duplicates_answers_in_input_order_with_one_attempt_per_key() {
    let r = rig();
    r.put_dfs(1);
    r.put_dfs(2);
    r.store.put(&[key(3)], &[&payload(3)]).unwrap(); // write-through: in MEMORY already
    assert!(r.in_memory(3));
    let batch = [key(1), key(9), key(3), key(1), key(2), key(9), key(2)];
    let ticket = r.store.submit_prefetch(&batch).unwrap();
    let ids = ticket.attempt_ids();
    assert_eq!(ids[0], ids[3]);
    assert_eq!(ids[4], ids[6]);
    assert!(ids[0].is_some() && ids[4].is_some() && ids[0] != ids[4]);
    assert_eq!((ids[1], ids[2], ids[5]), (None, None, None));
    assert_eq!(
        ticket.wait(),
        vec![
            R::Committed,
            R::MissingSource,
            R::AlreadyInMemory,
            R::Committed,
            R::Committed,
            R::MissingSource,
            R::Committed
        ]
    );
    assert_eq!(r.store.promotion_stats().funnel().attempted, 2);
    assert!(r.in_memory(1) && r.in_memory(2) && !r.in_memory(9));
    r.quiescent();
}

#[test]
fn a_corrupted_dfs_object_fails_checksum_and_nothing_lands_in_memory() {
    let r = rig();
    r.put_dfs(1);
    let path = r.store.dfs().object_path(&key(1)).unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(DFS_HEADER_LEN as u64 + 10)).unwrap();
    f.write_all(&[0xEE; 8]).unwrap();
    drop(f);
    assert_eq!(
        r.store.prefetch_to_memory(&[key(1)]).unwrap(),
        vec![R::Failed(PromotionFailure::Checksum)]
    );
    assert!(!r.in_memory(1));
    let mut buf = vec![0u8; LEN];
    let got = r.store.get(&[key(1)], &mut [&mut buf[..]]).unwrap();
    // The failed promotion proved the object invalid and removed it: now a miss.
    assert_eq!(got, vec![KeyResult::Missing]);
    assert_eq!(
        r.store.dfs().stats.invalid_removed.load(Ordering::Relaxed),
        1
    );
    r.quiescent();
}

#[test]
fn a_source_replaced_before_the_put_fails_source_changed() {
    let r = rig();
    r.put_dfs(1);
    let gate = Gate::new();
    *r.store.hooks().before_put.lock() = Some(gate.clone());
    let ticket = r.store.submit_prefetch(&[key(1)]).unwrap();
    gate.wait_entered(1);
    // A new object under the same key: a new generation.
    assert!(r.store.dfs().remove(&key(1)).unwrap());
    r.put_dfs(1);
    gate.release();
    assert_eq!(
        ticket.wait(),
        vec![R::Failed(PromotionFailure::SourceChanged)]
    );
    assert!(!r.in_memory(1));
    r.quiescent();
}

#[test]
fn concurrent_triggers_share_one_attempt_and_one_memory_put() {
    let r = rig();
    r.put_dfs(1);
    let gate = Gate::new();
    *r.store.hooks().before_put.lock() = Some(gate.clone());
    let first = r.store.submit_prefetch(&[key(1)]).unwrap();
    gate.wait_entered(1);
    let second = r.store.submit_prefetch(&[key(1), key(1)]).unwrap();
    assert_eq!(first.attempt_ids()[0], second.attempt_ids()[0]);
    assert_eq!(r.store.promotion_stats().joined.load(Ordering::Relaxed), 1);
    gate.release();
    assert_eq!(first.wait(), vec![R::Committed]);
    assert_eq!(second.wait(), vec![R::Committed, R::Committed]);
    assert_eq!(gate.entered(), 1);
    assert_eq!(r.store.promotion_stats().funnel().attempted, 1);
    r.quiescent();
}

#[test]
fn memory_capacity_rejection_answers_allocation_and_the_dfs_copy_stands() {
    let r = rig();
    r.put_dfs(1);
    r.memory.inject(Call::Put, Some(2), Fault::Capacity);
    assert_eq!(
        r.store.prefetch_to_memory(&[key(1)]).unwrap(),
        vec![R::Capacity(CapacityReason::Allocation)]
    );
    // Write-through: the MEMORY copy is refused, the DFS write is the row.
    let w = r.store.put(&[key(2)], &[&payload(2)]).unwrap();
    assert_eq!(w, vec![KeyResult::Ok { bytes: LEN as u64 }]);
    assert_eq!(r.store.stats.memory_put_capacity.load(Ordering::Relaxed), 1);
    assert!(!r.in_memory(2));
    assert_eq!(r.store.query(&[key(2)]).unwrap(), vec![true]);
    r.quiescent();
}

#[test]
fn staging_and_in_flight_caps_reject_before_admission() {
    let r = rig_with(TierLimits {
        workers: 1,
        staging_bytes: LEN as u64,
        max_in_flight: 8,
    });
    r.put_dfs(1);
    r.put_dfs(2);
    let gate = Gate::new();
    *r.store.hooks().before_put.lock() = Some(gate.clone());
    let held = r.store.submit_prefetch(&[key(1)]).unwrap();
    gate.wait_entered(1);
    assert_eq!(
        r.store.prefetch_to_memory(&[key(2)]).unwrap(),
        vec![R::Capacity(CapacityReason::Quota)]
    );
    gate.release();
    assert_eq!(held.wait(), vec![R::Committed]);
    r.quiescent();

    let r = rig_with(TierLimits {
        workers: 1,
        staging_bytes: 1 << 20,
        max_in_flight: 1,
    });
    r.put_dfs(1);
    r.put_dfs(2);
    let gate = Gate::new();
    *r.store.hooks().before_put.lock() = Some(gate.clone());
    let held = r.store.submit_prefetch(&[key(1)]).unwrap();
    gate.wait_entered(1);
    assert_eq!(
        r.store.prefetch_to_memory(&[key(2)]).unwrap(),
        vec![R::Capacity(CapacityReason::InFlightCap)]
    );
    assert_eq!(
        r.store
            .promotion_stats()
            .rejected_by(CapacityReason::InFlightCap),
        1
    );
    gate.release();
    assert_eq!(held.wait(), vec![R::Committed]);
    r.quiescent();
}

#[test]
fn get_falls_back_to_dfs_only_where_memory_provably_stopped() {
    let r = rig();
    r.store.put(&[key(1)], &[&payload(1)]).unwrap();
    let mut buf = vec![0u8; LEN];
    r.memory
        .inject(Call::Get, Some(1), Fault::RetiredFailure(-800));
    let got = r.store.get(&[key(1)], &mut [&mut buf[..]]).unwrap();
    assert_eq!(got, vec![KeyResult::Ok { bytes: LEN as u64 }]);
    assert_eq!(buf, payload(1));
    assert_eq!(r.store.stats.dfs_reads.load(Ordering::Relaxed), 1);
    r.memory.inject(Call::Get, Some(1), Fault::Unretired);
    let got = r.store.get(&[key(1)], &mut [&mut buf[..]]).unwrap();
    assert_eq!(
        got,
        vec![KeyResult::Failed {
            code: -800,
            retired: false
        }]
    );
    assert_eq!(r.store.stats.dfs_reads.load(Ordering::Relaxed), 1);
    assert!(!r.store.failures_retire());
    assert!(r.store.capabilities().promotion);
}

#[test]
fn an_unretired_memory_put_failure_is_the_row_and_the_dfs_copy_stands() {
    let r = rig();
    r.memory.inject(Call::Put, Some(1), Fault::Unretired);
    let w = r.store.put(&[key(1)], &[&payload(1)]).unwrap();
    assert_eq!(
        w,
        vec![KeyResult::Failed {
            code: -800,
            retired: false
        }]
    );
    // A retry finds the DFS copy: idempotent success, no second MEMORY write.
    let w = r.store.put(&[key(1)], &[&payload(1)]).unwrap();
    assert_eq!(w, vec![KeyResult::AlreadyExists]);
    assert_eq!(r.store.query(&[key(1), key(2)]).unwrap(), vec![true, false]);
}

#[test]
fn a_failed_memory_query_fails_the_trigger_but_not_query() {
    let r = rig();
    r.put_dfs(1);
    r.memory
        .inject(Call::Query, Some(1), Fault::Error("master down".into()));
    assert!(r.store.prefetch_to_memory(&[key(1)]).is_err());
    r.memory
        .inject(Call::Query, Some(1), Fault::Error("master down".into()));
    assert_eq!(r.store.query(&[key(1)]).unwrap(), vec![true]);
    assert_eq!(r.store.prefetch_to_memory(&[]).unwrap(), vec![]);
    r.quiescent();
}

#[test]
fn remove_namespace_purges_both_tiers() {
    let r = rig();
    r.store
        .put(&[key(1), key(2)], &[&payload(1), &payload(2)])
        .unwrap();
    assert_eq!(r.store.remove_namespace(&ns()).unwrap(), 2);
    assert!(!r.in_memory(1) && !r.in_memory(2));
    assert_eq!(
        r.store.query(&[key(1), key(2)]).unwrap(),
        vec![false, false]
    );
    assert_eq!(
        r.store.prefetch_to_memory(&[key(1)]).unwrap(),
        vec![R::MissingSource]
    );
}

#[test]
fn pure_mappings() {
    assert_eq!(put_outcome(&KeyResult::Ok { bytes: 1 }), R::Committed);
    assert_eq!(put_outcome(&KeyResult::AlreadyExists), R::AlreadyInMemory);
    assert_eq!(
        put_outcome(&KeyResult::Capacity),
        R::Capacity(CapacityReason::Allocation)
    );
    assert_eq!(
        put_outcome(&KeyResult::Failed {
            code: -900,
            retired: false
        }),
        R::Failed(PromotionFailure::Io)
    );
    assert_eq!(read_failure(&ReadError::Missing, true), R::MissingSource);
    assert_eq!(
        read_failure(&ReadError::Missing, false),
        R::Failed(PromotionFailure::SourceChanged)
    );
    assert_eq!(
        read_failure(
            &ReadError::Invalid(crate::l3::store::dfs::InvalidReason::Checksum),
            true
        ),
        R::Failed(PromotionFailure::Checksum)
    );
    let bytes = payload(7);
    let id = ObjectIdentity {
        len: LEN as u64,
        checksum: xxhash_rust::xxh3::xxh3_64(&bytes),
        generation: 5,
    };
    assert!(verified(&bytes, &id));
    assert!(!verified(&bytes[1..], &id));
    let mut flipped = bytes.clone();
    flipped[0] ^= 1;
    assert!(!verified(&flipped, &id));
    assert!(falls_back(&KeyResult::Missing));
    assert!(falls_back(&KeyResult::Failed {
        code: 1,
        retired: true
    }));
    assert!(!falls_back(&KeyResult::Failed {
        code: 1,
        retired: false
    }));
    assert!(!falls_back(&KeyResult::Ok { bytes: 1 }));
    let unretired = KeyResult::Failed {
        code: -900,
        retired: false,
    };
    assert_eq!(
        put_row(KeyResult::Ok { bytes: 1 }, Some(unretired)),
        unretired
    );
    assert_eq!(
        put_row(KeyResult::Ok { bytes: 1 }, Some(KeyResult::Capacity)),
        KeyResult::Ok { bytes: 1 }
    );
    assert_eq!(
        put_row(KeyResult::AlreadyExists, None),
        KeyResult::AlreadyExists
    );
}
