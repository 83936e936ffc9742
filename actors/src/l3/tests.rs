//! Executor tests (seed 000: ts-l3): bounded queues per kind, the outstanding limit,
//! health epochs and the single probe, queued cancellation, byte round trips through the
//! shared Host buffer, quarantine, malformed results, pressure and close. Time is a
//! ManualClock; FaultyStore gates order the worker threads (no sleeps).

use super::executor::{L3Executor, Submitted};
use super::store::faulty::{Call, Fault, FaultyStore, Gate};
use super::store::memory::MemoryStore;
use super::store::{Store, StoreCapabilities};
use crate::clock::{Clock, ManualClock, SharedClock};
use crate::host::storage::HostCacheStorage;
use messages::{
    settings::StorageRuntimeConfig, HealthStatus, HostRange, ObjectFailure, OperationId, Rejection,
    StorageCancelOp, StorageDone, StorageGetOp, StorageKey, StorageOp, StorageOpKind, StoragePutOp,
    StorageQueryOp,
};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn runtime() -> StorageRuntimeConfig {
    StorageRuntimeConfig {
        query_workers: 1,
        get_workers: 1,
        put_workers: 1,
        query_queue_capacity: 8,
        get_queue_capacity: 8,
        put_queue_capacity: 8,
        outstanding_limit: 64,
        health_cooldown_ms: 100,
        close_deadline_ms: 5000,
    }
}

fn key(s: &str) -> StorageKey {
    StorageKey::new(format!("tsl3-00000000000000aa-{s}"))
}

fn q(id: u64, keys: &[&str]) -> StorageOp {
    StorageOp::Query(StorageQueryOp {
        op: OperationId(id),
        request: None,
        keys: keys.iter().map(|k| key(k)).collect(),
    })
}

fn get(id: u64, keys: &[(&str, u64, u64)]) -> StorageOp {
    StorageOp::Get(StorageGetOp {
        op: OperationId(id),
        request: None,
        keys: keys.iter().map(|k| key(k.0)).collect(),
        destinations: keys.iter().map(|k| HostRange::new(k.1, k.2)).collect(),
    })
}

fn put(id: u64, keys: &[(&str, u64, u64)]) -> StorageOp {
    StorageOp::Put(StoragePutOp {
        op: OperationId(id),
        keys: keys.iter().map(|k| key(k.0)).collect(),
        sources: keys.iter().map(|k| HostRange::new(k.1, k.2)).collect(),
    })
}

fn cancel(id: u64) -> StorageOp {
    StorageOp::Cancel(StorageCancelOp {
        op: OperationId(id),
    })
}

struct Rig {
    exec: L3Executor,
    host: Arc<HostCacheStorage>,
    clock: Arc<ManualClock>,
}

fn rig(store: Arc<dyn Store>, rt: StorageRuntimeConfig) -> Rig {
    let host = HostCacheStorage::new(1 << 20).unwrap();
    let clock = ManualClock::new(1_000);
    let shared: SharedClock = clock.clone();
    let exec = L3Executor::start(store, host.clone(), rt, shared).unwrap();
    Rig { exec, host, clock }
}

/// Waits until `n` completions are undelivered, then polls them all, by op id.
fn settle(exec: &L3Executor, n: usize) -> HashMap<u64, StorageDone> {
    assert!(
        exec.wait_undelivered(n, WAIT),
        "{n} completions never arrived"
    );
    let (done, _) = exec.poll();
    assert_eq!(done.len(), n, "{done:?}");
    done.into_iter()
        .map(|d| {
            d.validate().unwrap();
            (d.op.0, d)
        })
        .collect()
}

/// Ran without an exception or rejection and retired (a query miss is still a clean run).
fn ran_ok(d: &StorageDone) -> bool {
    d.retired && d.rejection.is_none() && d.error.is_none()
}

fn faulty(retire: bool) -> Arc<FaultyStore<MemoryStore>> {
    Arc::new(FaultyStore::new(MemoryStore::new(), retire))
}

#[test]
fn queue_bounds_are_per_kind() {
    let store = faulty(true);
    let gate = Gate::new();
    store.inject(Call::Any, None, Fault::Gate(gate.clone()));
    let rt = StorageRuntimeConfig {
        query_queue_capacity: 1,
        get_queue_capacity: 2,
        put_queue_capacity: 3,
        ..runtime()
    };
    let r = rig(store, rt);
    // One job per kind occupies that kind's single worker.
    assert_eq!(r.exec.submit(q(1, &["a"])), Submitted::Queued);
    assert_eq!(r.exec.submit(get(2, &[("a", 0, 8)])), Submitted::Queued);
    assert_eq!(r.exec.submit(put(3, &[("a", 0, 8)])), Submitted::Queued);
    gate.wait_entered(3);
    let mut id = 10;
    let mut fill = |make: &dyn Fn(u64) -> StorageOp, cap: usize| {
        for _ in 0..cap {
            id += 1;
            assert_eq!(r.exec.submit(make(id)), Submitted::Queued);
        }
        id += 1;
        assert_eq!(
            r.exec.submit(make(id)),
            Submitted::Rejected(Rejection::QueueFull)
        );
        id
    };
    let q_full = fill(&|i| q(i, &["x"]), 1);
    let g_full = fill(&|i| get(i, &[("x", 4096 * i, 8)]), 2);
    let p_full = fill(&|i| put(i, &[("x", 4096 * i, 8)]), 3);
    let stats = r.exec.stats();
    assert_eq!(stats.jobs[StorageOpKind::Query.index()].queued, 1);
    assert_eq!(stats.jobs[StorageOpKind::Get.index()].queued, 2);
    assert_eq!(stats.jobs[StorageOpKind::Put.index()].queued, 3);
    assert_eq!(stats.kind(StorageOpKind::Put).rejected, 1);
    gate.release();
    let done = settle(&r.exec, 3 + 6 + 3);
    for full in [q_full, g_full, p_full] {
        assert_eq!(done[&full].rejection, Some(Rejection::QueueFull));
        assert!(done[&full].retired);
    }
    assert_eq!(
        done.values().filter(|d| d.rejection.is_none()).count(),
        9,
        "every admitted job ran"
    );
}

#[test]
fn outstanding_limit_counts_undelivered_results() {
    let rt = StorageRuntimeConfig {
        query_queue_capacity: 2,
        get_queue_capacity: 2,
        put_queue_capacity: 2,
        outstanding_limit: 2,
        ..runtime()
    };
    let r = rig(Arc::new(MemoryStore::new()), rt);
    assert_eq!(r.exec.submit(q(1, &["a"])), Submitted::Queued);
    assert_eq!(r.exec.submit(q(2, &["b"])), Submitted::Queued);
    assert!(r.exec.wait_undelivered(2, WAIT));
    // Both jobs finished, but their results are undelivered: they still count.
    let (gauges, _) = (r.exec.stats().jobs, ());
    assert_eq!(gauges[0].queued + gauges[0].running, 0);
    assert_eq!(
        r.exec.submit(q(3, &["c"])),
        Submitted::Rejected(Rejection::OutstandingLimit)
    );
    let done = settle(&r.exec, 3);
    assert!(ran_ok(&done[&1]) && ran_ok(&done[&2]));
    assert_eq!(done[&3].rejection, Some(Rejection::OutstandingLimit));
    // Delivery frees the budget.
    assert_eq!(r.exec.submit(q(4, &["d"])), Submitted::Queued);
    assert!(ran_ok(&settle(&r.exec, 1)[&4]));
}

#[test]
fn a_stale_success_never_undoes_a_newer_outage() {
    let store = faulty(true);
    let gate = Gate::new();
    store.inject(Call::Query, Some(1), Fault::Gate(gate.clone()));
    let rt = StorageRuntimeConfig {
        query_workers: 2,
        ..runtime()
    };
    let r = rig(store.clone(), rt);
    assert_eq!(r.exec.submit(q(1, &["a"])), Submitted::Queued);
    gate.wait_entered(1);
    store.inject(Call::Query, Some(1), Fault::Error("backend down".into()));
    assert_eq!(r.exec.submit(q(2, &["a"])), Submitted::Queued);
    let failed = settle(&r.exec, 1);
    assert!(failed[&2].error.is_some() && failed[&2].retired);
    let h = r.exec.health();
    assert_eq!((h.state, h.epoch), (HealthStatus::Cooldown, 1));
    // The older job (epoch 0) now succeeds: stale, it must not restore health.
    gate.release();
    assert!(ran_ok(&settle(&r.exec, 1)[&1]));
    let h = r.exec.health();
    assert_eq!((h.state, h.epoch), (HealthStatus::Cooldown, 1));
    assert_eq!(
        r.exec.submit(q(3, &["a"])),
        Submitted::Rejected(Rejection::Unhealthy)
    );
    r.clock.advance_ms(100);
    assert_eq!(r.exec.health().state, HealthStatus::Probing);
}

#[test]
fn exactly_one_probe_after_cooldown() {
    let store = faulty(true);
    store.inject(Call::Query, Some(1), Fault::Error("down".into()));
    let r = rig(store.clone(), runtime());
    r.exec.submit(q(1, &["a"]));
    settle(&r.exec, 1);
    assert_eq!(
        r.exec.submit(q(2, &["a"])),
        Submitted::Rejected(Rejection::Unhealthy)
    );
    settle(&r.exec, 1);
    r.clock.advance_ms(99);
    assert_eq!(r.exec.health().state, HealthStatus::Cooldown);
    r.clock.advance_ms(1);
    // Reading health repeatedly never consumes the probe.
    for _ in 0..3 {
        assert_eq!(r.exec.health().state, HealthStatus::Probing);
    }
    let gate = Gate::new();
    store.inject(Call::Query, Some(1), Fault::Gate(gate.clone()));
    assert_eq!(r.exec.submit(q(3, &["a"])), Submitted::Queued, "the probe");
    gate.wait_entered(1);
    assert_eq!(
        r.exec.submit(q(4, &["a"])),
        Submitted::Rejected(Rejection::Unhealthy)
    );
    assert_eq!(
        r.exec.submit(get(5, &[("a", 0, 8)])),
        Submitted::Rejected(Rejection::Unhealthy),
        "one probe for the whole executor"
    );
    gate.release();
    let done = settle(&r.exec, 3);
    assert!(ran_ok(&done[&3]));
    assert_eq!(done[&4].rejection, Some(Rejection::Unhealthy));
    let h = r.exec.health();
    assert_eq!((h.state, h.epoch), (HealthStatus::Healthy, 1));
    assert_eq!(r.exec.submit(q(6, &["a"])), Submitted::Queued);
    assert_eq!(r.exec.submit(q(7, &["a"])), Submitted::Queued);
}

#[test]
fn queued_cancel_is_acknowledged_while_the_worker_is_busy() {
    let store = faulty(true);
    store
        .inner()
        .put(&[key("a"), key("b")], &[&[7u8; 16], &[9u8; 16]])
        .unwrap();
    let gate = Gate::new();
    store.inject(Call::Get, Some(1), Fault::Gate(gate.clone()));
    let r = rig(store, runtime());
    assert_eq!(r.exec.submit(get(1, &[("a", 0, 16)])), Submitted::Queued);
    gate.wait_entered(1);
    assert_eq!(r.exec.submit(get(2, &[("b", 4096, 16)])), Submitted::Queued);
    // The worker is held inside the store: the acknowledgement cannot wait for it.
    assert_eq!(r.exec.submit(cancel(2)), Submitted::CancelAcknowledged);
    assert_eq!(r.exec.submit(cancel(2)), Submitted::CancelIgnored);
    // Started I/O keeps its own lifetime.
    assert_eq!(r.exec.submit(cancel(1)), Submitted::CancelIgnored);
    let (done, pressure) = r.exec.poll();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].op, OperationId(2));
    assert_eq!(done[0].rejection, Some(Rejection::Cancelled));
    assert!(done[0].retired);
    assert_eq!(pressure.queued[StorageOpKind::Get.index()].jobs, 1);
    assert_eq!(
        pressure.queued[StorageOpKind::Get.index()].payload_bytes,
        16
    );
    gate.release();
    let d = settle(&r.exec, 1);
    assert!(d[&1].fully_succeeded());
    // The inert item was skipped: a later job runs after it and its destination is untouched.
    assert_eq!(r.exec.submit(get(3, &[("a", 8192, 16)])), Submitted::Queued);
    assert!(settle(&r.exec, 1)[&3].fully_succeeded());
    assert_eq!(
        r.host.read(HostRange::new(4096, 16)).unwrap(),
        vec![0u8; 16]
    );
    assert_eq!(r.host.read(HostRange::new(0, 16)).unwrap(), vec![7u8; 16]);
    let s = r.exec.stats();
    assert_eq!(s.kind(StorageOpKind::Get).cancelled, 1);
    assert_eq!(s.kind(StorageOpKind::Get).completed, 2);
}

#[test]
fn bytes_round_trip_through_the_store_into_the_shared_host_buffer() {
    let mem = Arc::new(MemoryStore::new());
    let r = rig(mem.clone(), runtime());
    let a: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
    let b: Vec<u8> = (0..777u32).map(|i| (i * 7 % 251) as u8).collect();
    r.host.write(100, &a).unwrap();
    r.host.write(5000, &b).unwrap();
    r.exec.submit(put(1, &[("a", 100, 3000), ("b", 5000, 777)]));
    let p = settle(&r.exec, 1).remove(&1).unwrap();
    assert!(p.fully_succeeded());
    assert_eq!(p.new_writes, 2);
    assert_eq!(p.bytes, vec![3000, 777]);
    assert_eq!(&*mem.object(&key("a")).unwrap(), &a[..]);
    // Create-only: a second PUT of the same key is idempotent success, not a new write.
    r.exec.submit(put(2, &[("a", 5000, 3000)]));
    let p2 = settle(&r.exec, 1).remove(&2).unwrap();
    assert!(p2.fully_succeeded());
    assert_eq!(p2.new_writes, 0);
    assert_eq!(&*mem.object(&key("a")).unwrap(), &a[..]);
    r.exec.submit(get(
        3,
        &[
            ("b", 20_001, 777),
            ("a", 40_003, 3000),
            ("zz", 60_000, 10),
            ("b", 70_000, 800),
        ],
    ));
    let g = settle(&r.exec, 1).remove(&3).unwrap();
    assert!(g.retired);
    assert_eq!(g.success, vec![true, true, false, false]);
    assert_eq!(
        g.failures,
        vec![
            None,
            None,
            Some(ObjectFailure::Missing),
            Some(ObjectFailure::Invalid)
        ]
    );
    assert_eq!(r.host.read(HostRange::new(20_001, 777)).unwrap(), b);
    assert_eq!(r.host.read(HostRange::new(40_003, 3000)).unwrap(), a);
    assert_eq!(
        r.exec.health().state,
        HealthStatus::Healthy,
        "misses are not outages"
    );
    let s = r.exec.stats();
    assert_eq!(s.kind(StorageOpKind::Put).new_writes, 2);
    assert_eq!(s.kind(StorageOpKind::Put).payload_bytes, 3777 + 3000);
    assert_eq!(s.kind(StorageOpKind::Get).payload_bytes, 3777);
    let report = r.exec.close();
    assert!(!report.restart_required && report.store_closed);
    assert!(!r.host.is_retained_for_process());
}

#[test]
fn an_unretired_result_quarantines_and_close_requires_restart() {
    let store = faulty(false);
    store.inject(Call::Put, Some(1), Fault::Unretired);
    let r = rig(store.clone(), runtime());
    r.exec.submit(put(1, &[("a", 0, 8), ("b", 8, 8)]));
    let d = settle(&r.exec, 1).remove(&1).unwrap();
    assert!(!d.retired);
    assert_eq!(d.success, vec![false, false]);
    assert_eq!(r.exec.health().state, HealthStatus::Quarantined);
    for (i, op) in [q(2, &["a"]), get(3, &[("a", 0, 8)]), put(4, &[("c", 0, 8)])]
        .into_iter()
        .enumerate()
    {
        assert_eq!(
            r.exec.submit(op),
            Submitted::Rejected(Rejection::Quarantined),
            "command {i}"
        );
    }
    let s = r.exec.stats();
    assert_eq!(s.kind(StorageOpKind::Put).quarantined_refs, 2);
    assert_eq!(s.jobs[StorageOpKind::Put.index()].unretired, 1);
    // The unretired job stays native work: pressure keeps it, time ages it.
    r.clock.advance_ms(7);
    let (done, pressure) = r.exec.poll();
    assert_eq!(done.len(), 3);
    assert_eq!(pressure.queued[StorageOpKind::Put.index()].jobs, 1);
    assert_eq!(pressure.oldest_age_us, 7000);
    let report = r.exec.close();
    assert!(report.restart_required && report.quarantined);
    assert!(!report.store_closed);
    assert!(r.host.is_retained_for_process());
    assert!(
        Arc::strong_count(&store) >= 2,
        "the store client is kept for the process"
    );
}

#[test]
fn malformed_results_follow_failures_retire() {
    for retire in [true, false] {
        let store = faulty(retire);
        store
            .inner()
            .put(&[key("a"), key("b")], &[&[1; 8], &[2; 8]])
            .unwrap();
        store.inject(Call::Get, Some(1), Fault::Malformed);
        let r = rig(store, runtime());
        r.exec.submit(get(1, &[("a", 0, 8), ("b", 8, 8)]));
        let d = settle(&r.exec, 1).remove(&1).unwrap();
        assert_eq!(d.retired, retire);
        assert!(d.error.as_deref().unwrap().contains("malformed"));
        assert_eq!(
            d.failures,
            vec![None, None],
            "malformed carries no evidence"
        );
        assert_eq!(d.success, vec![false, false]);
        let h = r.exec.health().state;
        let report = r.exec.close();
        if retire {
            assert_eq!(h, HealthStatus::Cooldown, "malformed is an outage");
            assert!(!report.restart_required && report.store_closed);
        } else {
            assert_eq!(h, HealthStatus::Quarantined);
            assert!(report.restart_required && !report.store_closed);
        }
    }
}

#[test]
fn outage_classification() {
    // Retired capacity rejections and retired misses are not outages.
    let store = faulty(false);
    store.inject(Call::Put, Some(1), Fault::Capacity);
    let r = rig(store.clone(), runtime());
    r.exec.submit(put(1, &[("a", 0, 8)]));
    let d = settle(&r.exec, 1).remove(&1).unwrap();
    assert_eq!((d.capacity.clone(), d.retired), (vec![true], true));
    r.exec.submit(get(2, &[("missing", 0, 8)]));
    let d = settle(&r.exec, 1).remove(&2).unwrap();
    assert_eq!(d.failures, vec![Some(ObjectFailure::Missing)]);
    r.exec.submit(q(3, &["missing"]));
    assert_eq!(settle(&r.exec, 1)[&3].success, vec![false]);
    assert_eq!(r.exec.health().state, HealthStatus::Healthy);
    // An unknown (retired) native failure is an outage but no quarantine.
    store.inject(Call::Get, Some(1), Fault::RetiredFailure(-1));
    r.exec.submit(get(4, &[("missing", 0, 8)]));
    let d = settle(&r.exec, 1).remove(&4).unwrap();
    assert!(d.retired && d.failures == vec![None]);
    assert_eq!(r.exec.health().state, HealthStatus::Cooldown);
    // An exception on a store whose failures do not retire quarantines a GET...
    r.clock.advance_ms(100);
    store.inject(Call::Get, Some(1), Fault::Error("lost".into()));
    assert_eq!(r.exec.submit(get(5, &[("a", 0, 8)])), Submitted::Queued);
    let d = settle(&r.exec, 1).remove(&5).unwrap();
    assert!(!d.retired);
    assert_eq!(r.exec.health().state, HealthStatus::Quarantined);
}

#[test]
fn a_failed_query_is_retired_even_when_failures_do_not_retire() {
    let store = faulty(false);
    store.inject(Call::Query, Some(1), Fault::Malformed);
    let r = rig(store, runtime());
    r.exec.submit(q(1, &["a", "b"]));
    let d = settle(&r.exec, 1).remove(&1).unwrap();
    assert!(d.retired && d.error.is_some());
    assert_eq!(r.exec.health().state, HealthStatus::Cooldown);
    assert!(!r.exec.close().restart_required);
}

#[test]
fn pressure_snapshot_counts_bytes_and_oldest_age() {
    let store = faulty(true);
    let gate = Gate::new();
    store.inject(Call::Any, None, Fault::Gate(gate.clone()));
    let r = rig(store, runtime());
    r.exec.submit(q(1, &["a", "b"]));
    r.clock.advance_us(500);
    r.exec.submit(get(2, &[("a", 0, 1000), ("b", 4096, 2000)]));
    r.clock.advance_us(250);
    r.exec.submit(put(3, &[("c", 8192, 1000)]));
    gate.wait_entered(3);
    r.exec.submit(get(4, &[("d", 20_000, 100)]));
    r.clock.set_us(3_000);
    let (done, p) = r.exec.poll();
    assert!(done.is_empty());
    let k = |kind: StorageOpKind| p.queued[kind.index()];
    assert_eq!(
        (
            k(StorageOpKind::Query).jobs,
            k(StorageOpKind::Query).payload_bytes
        ),
        (1, 0)
    );
    assert_eq!(
        (
            k(StorageOpKind::Get).jobs,
            k(StorageOpKind::Get).payload_bytes
        ),
        (2, 3100)
    );
    assert_eq!(
        (
            k(StorageOpKind::Put).jobs,
            k(StorageOpKind::Put).payload_bytes
        ),
        (1, 1000)
    );
    assert_eq!(p.oldest_age_us, 2_000, "op 1 was queued at t=1000");
    let o = p.observation();
    assert_eq!((o.queued_jobs, o.queued_bytes), (4, 4100));
    gate.release();
    assert!(r.exec.wait_undelivered(4, WAIT));
    let (done, p) = r.exec.poll();
    assert_eq!(done.len(), 4);
    assert_eq!(p, Default::default(), "retired work is excluded");
}

#[test]
fn invalid_commands_settle_as_invalid_rejections() {
    let r = rig(Arc::new(MemoryStore::new()), runtime());
    let len = r.host.len();
    assert_eq!(
        r.exec.submit(get(1, &[("a", len - 4, 8)])),
        Submitted::Rejected(Rejection::Invalid)
    );
    assert_eq!(
        r.exec.submit(get(2, &[("a", 0, 8), ("b", 4, 8)])),
        Submitted::Rejected(Rejection::Invalid),
        "overlapping destinations"
    );
    let done = settle(&r.exec, 2);
    assert!(done
        .values()
        .all(|d| d.rejection == Some(Rejection::Invalid) && d.retired));
}

#[test]
fn close_with_a_busy_worker_keeps_the_store_and_settles_queued_jobs() {
    let store = faulty(true);
    let gate = Gate::new();
    store.inject(Call::Get, Some(1), Fault::Gate(gate.clone()));
    let rt = StorageRuntimeConfig {
        close_deadline_ms: 20,
        ..runtime()
    };
    let r = rig(store, rt);
    r.exec.submit(get(1, &[("a", 0, 8)]));
    gate.wait_entered(1);
    r.exec.submit(get(2, &[("a", 4096, 8)]));
    let report = r.exec.close();
    assert!(report.restart_required);
    assert!(!report.quarantined);
    assert_eq!(report.unjoined_workers, 1);
    assert!(!report.store_closed);
    assert!(r.host.is_retained_for_process());
    assert_eq!(report.completions.len(), 1);
    assert_eq!(report.completions[0].op, OperationId(2));
    assert_eq!(report.completions[0].rejection, Some(Rejection::Shutdown));
    gate.release();
}

/// A MemoryStore that declares the promotion capability and counts its triggers.
struct PromotingStore {
    inner: MemoryStore,
    promoted: parking_lot::Mutex<Vec<StorageKey>>,
}

impl Store for PromotingStore {
    fn name(&self) -> &'static str {
        "promoting"
    }
    fn failures_retire(&self) -> bool {
        true
    }
    fn capabilities(&self) -> StoreCapabilities {
        StoreCapabilities { promotion: true }
    }
    fn query(&self, k: &[StorageKey]) -> Result<Vec<bool>, super::store::StoreError> {
        self.inner.query(k)
    }
    fn get(
        &self,
        k: &[StorageKey],
        d: &mut [&mut [u8]],
    ) -> Result<Vec<super::store::KeyResult>, super::store::StoreError> {
        self.inner.get(k, d)
    }
    fn put(
        &self,
        k: &[StorageKey],
        s: &[&[u8]],
    ) -> Result<Vec<super::store::KeyResult>, super::store::StoreError> {
        self.inner.put(k, s)
    }
    fn remove_namespace(&self, ns: &messages::Namespace) -> Result<u64, super::store::StoreError> {
        self.inner.remove_namespace(ns)
    }
    fn promote_detached(&self, keys: &[StorageKey]) -> Result<usize, super::store::StoreError> {
        self.promoted.lock().extend(keys.iter().cloned());
        Ok(keys.len())
    }
}

/// Waits (bounded) until `f` holds; the detached trigger follows the GET's settlement.
fn eventually(f: impl Fn() -> bool) -> bool {
    let until = std::time::Instant::now() + WAIT;
    while !f() {
        if std::time::Instant::now() > until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}

#[test]
fn get_triggers_promotion_of_what_it_read_only_when_the_store_declares_it() {
    let store = Arc::new(PromotingStore {
        inner: MemoryStore::new(),
        promoted: parking_lot::Mutex::new(Vec::new()),
    });
    store.inner.put(&[key("a")], &[&[3u8; 8]]).unwrap();
    let r = rig(store.clone(), runtime());
    // "a" is read in full; "zz" is missing: only "a" is promoted, after the GET landed.
    r.exec.submit(get(1, &[("a", 0, 8), ("zz", 8, 8)]));
    let done = settle(&r.exec, 1);
    assert!(done[&1].success[0] && !done[&1].success[1]);
    assert!(eventually(|| !store.promoted.lock().is_empty()));
    assert_eq!(*store.promoted.lock(), vec![key("a")]);
    assert!(eventually(|| r
        .exec
        .stats()
        .kind(StorageOpKind::Get)
        .backend_calls
        == 2));
    // A GET that read nothing triggers nothing.
    r.exec.submit(get(2, &[("zz", 0, 8)]));
    assert!(!settle(&r.exec, 1)[&2].success[0]);
    assert_eq!(store.promoted.lock().len(), 1);
    assert_eq!(r.exec.stats().kind(StorageOpKind::Get).backend_calls, 3);
    // Without the capability: one call, no trigger.
    let mem = Arc::new(MemoryStore::new());
    let r2 = rig(mem.clone(), runtime());
    r2.exec.submit(get(1, &[("a", 0, 8)]));
    settle(&r2.exec, 1);
    assert_eq!(r2.exec.stats().kind(StorageOpKind::Get).backend_calls, 1);
    assert_eq!(mem.backend_calls.load(Ordering::Relaxed), 1);
}

#[test]
fn queue_and_backend_time_follow_the_injected_clock() {
    let store = faulty(true);
    let gate = Gate::new();
    store.inject(Call::Query, Some(1), Fault::Gate(gate.clone()));
    let r = rig(store, runtime());
    r.exec.submit(q(1, &["a"]));
    gate.wait_entered(1);
    r.clock.advance_us(300);
    r.exec.submit(q(2, &["a"])); // queued at t+300
    r.clock.advance_us(200);
    gate.release();
    let _ = settle(&r.exec, 2);
    let s = r.exec.stats().kinds[0];
    assert_eq!(s.completed, 2);
    // Job 1: queue 0, backend >= 500 (it started at t, finished after +500). Job 2: queued at
    // t+300, started at t+500 -> queue time 200, backend 0.
    assert_eq!(s.queue_time_us_total, 200);
    assert_eq!(s.backend_time_us_total, 500);
    assert_eq!(r.clock.now_us(), 1_500);
}

mod actor {
    use super::*;
    use crate::l3::actor::{Close, Poll, Snapshot, Submit, WaitUndelivered};
    use crate::l3::L3ExecutorActor;
    use actix::Actor;

    #[test]
    fn the_actor_forwards_submit_poll_health_and_close() {
        let sys = actix::System::new();
        sys.block_on(async {
            let mem = Arc::new(MemoryStore::new());
            let r = rig(mem, runtime());
            r.host.write(0, &[8; 16]).unwrap();
            let host = r.host.clone();
            let addr = L3ExecutorActor::new(r.exec).start();
            let s = addr
                .send(Submit(vec![put(1, &[("a", 0, 16)]), q(2, &["zz"])]))
                .await
                .unwrap();
            assert_eq!(s, vec![Submitted::Queued, Submitted::Queued]);
            assert!(addr.send(WaitUndelivered(2, WAIT)).await.unwrap());
            let (done, _) = addr.send(Poll).await.unwrap();
            assert_eq!(done.len(), 2);
            assert_eq!(
                addr.send(Snapshot).await.unwrap().health.state,
                HealthStatus::Healthy
            );
            addr.send(Submit(vec![get(3, &[("a", 4096, 16)])]))
                .await
                .unwrap();
            assert!(addr.send(WaitUndelivered(1, WAIT)).await.unwrap());
            let (done, _) = addr.send(Poll).await.unwrap();
            assert!(done[0].fully_succeeded());
            assert_eq!(host.read(HostRange::new(4096, 16)).unwrap(), vec![8; 16]);
            let report = addr.send(Close).await.unwrap().unwrap();
            assert!(!report.restart_required);
            assert!(addr.send(Close).await.unwrap().is_none());
            let s = addr.send(Submit(vec![q(4, &["a"])])).await.unwrap();
            assert_eq!(s, vec![Submitted::Rejected(Rejection::Shutdown)]);
            let (done, _) = addr.send(Poll).await.unwrap();
            assert_eq!(done.len(), 1);
            assert_eq!(done[0].rejection, Some(Rejection::Shutdown));
        });
    }
}

#[test]
fn bench_runs_and_reports_a_ratio() {
    let f = super::bench::bench_executor(8, 4, 1).unwrap();
    assert_eq!(f.objects, 8);
    assert!(f.ratio > 0.0 && f.ratio.is_finite());
}

#[test]
fn a_dfs_get_lands_in_the_host_destination_and_a_corrupt_object_is_never_success() {
    use super::store::dfs::{DfsStore, InvalidReason, DFS_HEADER_LEN};
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let dfs = Arc::new(DfsStore::open(dir.path(), 2).unwrap());
    let a: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let b: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 253) as u8).collect();
    dfs.put(&[key("a"), key("b")], &[&a, &b]).unwrap();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(dfs.object_path(&key("b")).unwrap())
        .unwrap();
    file.seek(SeekFrom::Start(DFS_HEADER_LEN as u64 + 4321))
        .unwrap();
    file.write_all(&[b[4321] ^ 1]).unwrap();
    let r = rig(dfs.clone(), runtime());
    r.exec
        .submit(get(1, &[("a", 0, a.len() as u64), ("b", 400_000, 5000)]));
    let d = settle(&r.exec, 1).remove(&1).unwrap();
    assert!(ran_ok(&d), "{d:?}");
    assert_eq!(d.success, vec![true, false]);
    assert_eq!(d.failures, vec![None, Some(ObjectFailure::Invalid)]);
    assert_eq!(
        r.host.read(HostRange::new(0, a.len() as u64)).unwrap(),
        a,
        "the object's bytes, in the Host destination"
    );
    // Straight into Host memory: the store staged nothing, and the one pass that read the
    // corrupt object checksummed it.
    assert_eq!(dfs.stats.staged_reads.load(Ordering::Relaxed), 0);
    assert_eq!(dfs.stats.invalid(InvalidReason::Checksum), 1);
    assert_eq!(dfs.stats.reads_ok.load(Ordering::Relaxed), 1);
    let _ = r.exec.close();
}

#[test]
fn a_completion_wakes_the_round_loop_once_and_no_wake_comes_without_one() {
    use futures::FutureExt;
    let store = faulty(true);
    let gate = Gate::new();
    store.inject(Call::Query, Some(1), Fault::Gate(gate.clone()));
    let r = rig(store, runtime());
    let wake = r.exec.completion_wake();
    assert_eq!(r.exec.submit(q(1, &["a"])), Submitted::Queued);
    gate.wait_entered(1);
    assert!(
        wake.notified().now_or_never().is_none(),
        "no completion yet, so no wake"
    );
    gate.release();
    assert!(r.exec.wait_undelivered(1, WAIT));
    // The completion left one permit for a loop that was not waiting when it landed.
    assert!(wake.notified().now_or_never().is_some());
    assert!(wake.notified().now_or_never().is_none(), "one permit only");
    assert!(ran_ok(&settle(&r.exec, 1)[&1]));
}
