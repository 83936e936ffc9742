//! Scenario tests of the StorageTransferManager: deadlines, cancellation in each state,
//! operation IDs, ownership, credits, the gate, detached completions, clear, partial
//! results, quarantine, backups and determinism. Time is explicit ticks; no sleeps.

use super::tests_support::config;
use super::*;
use messages::settings::StorageConfig;
use messages::{
    HostRange, ObjectFailure, OperationId, PressureObservation, Rejection, RequestId, StorageDone,
    StorageKey, StorageOp, StorageOpKind, StoragePutOp,
};

use super::tests_support::{dests, key, keys, MS};
fn round(tick_us: u64) -> RoundInput {
    RoundInput {
        tick_us,
        ..Default::default()
    }
}
fn with_done(tick_us: u64, done: Vec<StorageDone>) -> RoundInput {
    RoundInput {
        tick_us,
        completions: done,
        ..Default::default()
    }
}
fn pressure(jobs: u64) -> PressureObservation {
    PressureObservation {
        queued_jobs: jobs,
        queued_bytes: 0,
        oldest_age_us: 0,
    }
}
/// PUT dispatch the way the Scheduler drives it, as one round at the applied tick:
/// `begin_round` applies the round, `plan_backups` takes candidates off the queue, rechecks
/// residency and decides the PUTs, `end_plan` returns them (the candidates no PUT carried
/// stay queued).
fn dispatch(
    m: &mut StorageTransferManager,
    jobs: u64,
    residency: &mut dyn FnMut(&StorageKey, HostRef) -> Option<HostRange>,
) -> Vec<StoragePutOp> {
    m.begin_round(RoundInput {
        tick_us: m.now_us(),
        pressure: pressure(jobs),
        ..Default::default()
    })
    .unwrap();
    let planned = m.plan_backups_keyed(residency);
    let puts: Vec<StoragePutOp> = m
        .end_plan(vec![])
        .into_iter()
        .filter_map(|o| match o {
            StorageOp::Put(p) => Some(p),
            _ => None,
        })
        .collect();
    assert_eq!(puts.iter().map(|p| p.op).collect::<Vec<_>>(), planned);
    puts
}
fn get_ok(op: OperationId, n: usize) -> StorageDone {
    StorageDone::get(op, vec![true; n], vec![16; n], vec![None; n], true)
}

/// Query then answer then GET for `r`; returns (lease, get op).
fn to_get(
    m: &mut StorageTransferManager,
    r: u64,
    n: usize,
    first_host: u64,
    tick: u64,
) -> (StorageLease, OperationId) {
    let (q, lease) = m
        .issue_query(RequestId(r), keys(&format!("r{r}-"), n))
        .unwrap();
    let fx = m
        .apply_round(with_done(
            tick,
            vec![StorageDone::query(q.op, vec![true; n], true)],
        ))
        .unwrap();
    assert_eq!(fx.query_results.len(), 1);
    assert_eq!(fx.query_results[0].request, RequestId(r));
    let g = m
        .issue_get(
            RequestId(r),
            keys(&format!("r{r}-"), n),
            dests(first_host, n),
        )
        .unwrap();
    (lease, g.op)
}

#[test]
fn recycled_effects_come_back_empty_with_their_buffers() {
    let mut m = StorageTransferManager::new(config()); // soft deadline 100 ms
    m.apply_round(round(10 * MS)).unwrap();
    let (_lease, get) = to_get(&mut m, 1, 2, 100, 60 * MS);
    let fx = m.begin_round(round(110 * MS)).unwrap().effects;
    assert_eq!(fx.waits_ended, vec![(RequestId(1), WaitEnd::SoftTimeout)]);
    // The round's cancellation went to the outbox (submitted with the next plan).
    assert!(fx.cancels.is_empty());
    assert_eq!(
        m.end_plan(Vec::new()),
        vec![StorageOp::Cancel(messages::StorageCancelOp { op: get })]
    );
    let room = fx.waits_ended.capacity();
    let boxed: *const RoundEffects = &*fx;
    m.recycle(fx);
    // The next (quiet) round reuses the box and its lists: nothing of the last round's
    // effects is reported again, and the buffer kept its room.
    let fx = m.begin_round(round(120 * MS)).unwrap().effects;
    assert!(fx.is_empty(), "recycled effects leaked entries: {fx:?}");
    assert!(std::ptr::eq(boxed, &*fx), "the recycled box was not reused");
    assert!(fx.waits_ended.capacity() >= room.max(1));
    m.end_plan(Vec::new());
    // A burst's buffer is given back down to the recycled capacity.
    let mut burst = RoundEffects {
        settled: (0..RECYCLED_CAPACITY as u64 * 4).map(OperationId).collect(),
        ..Default::default()
    };
    burst.clear();
    assert!(burst.is_empty());
    assert!(burst.settled.capacity() <= RECYCLED_CAPACITY);
}

#[test]
fn an_ended_deadline_never_fires_for_the_same_requests_later_wait() {
    let mut m = StorageTransferManager::new(config()); // soft deadline 100 ms
    m.apply_round(round(10 * MS)).unwrap();
    let (q, _lease) = m.issue_query(RequestId(1), keys("a-", 2)).unwrap();
    // The client cancels at 20 ms; the request waits again from 50 ms (deadline 150 ms).
    let fx = m
        .apply_round(RoundInput {
            tick_us: 20 * MS,
            cancellations: vec![RequestId(1)],
            ..Default::default()
        })
        .unwrap();
    assert_eq!(fx.waits_ended, vec![(RequestId(1), WaitEnd::Detached)]);
    assert_eq!(fx.cancels, vec![messages::StorageCancelOp { op: q.op }]);
    m.apply_round(round(50 * MS)).unwrap();
    let (_q, _lease) = m.issue_query(RequestId(1), keys("b-", 2)).unwrap();
    // 110 ms: the first wait's deadline comes due, but that wait has ended.
    let fx = m.apply_round(round(110 * MS)).unwrap();
    assert!(fx.waits_ended.is_empty(), "{fx:?}");
    assert!(m.is_waiting(RequestId(1)));
    assert_eq!(m.stats().soft_timeouts, 0);
    let fx = m.apply_round(round(150 * MS)).unwrap();
    assert_eq!(fx.waits_ended, vec![(RequestId(1), WaitEnd::SoftTimeout)]);
    assert_eq!(m.stats().soft_timeouts, 1);
}

/// The manager's time is the newest agreed tick it applied: an older tick (a round whose
/// tick lags) neither moves it back nor expires anything again.
#[test]
fn the_applied_tick_never_goes_back() {
    let mut m = StorageTransferManager::new(config()); // soft deadline 100 ms
    m.apply_round(round(10 * MS)).unwrap();
    assert_eq!(m.now_us(), 10 * MS);
    let (_q, _lease) = m.issue_query(RequestId(1), keys("a-", 1)).unwrap();
    m.apply_round(round(50 * MS)).unwrap();
    let fx = m.apply_round(round(20 * MS)).unwrap();
    assert!(fx.is_empty(), "{fx:?}");
    assert_eq!(m.now_us(), 50 * MS);
    // The deadline (110 ms) fires once, at its tick, and a lagging tick after it is quiet.
    let fx = m.apply_round(round(110 * MS)).unwrap();
    assert_eq!(fx.waits_ended, vec![(RequestId(1), WaitEnd::SoftTimeout)]);
    assert!(m.apply_round(round(105 * MS)).unwrap().is_empty());
    assert_eq!((m.now_us(), m.stats().soft_timeouts), (110 * MS, 1));
}

/// The waits the manager reports: requests on a QUERY or a GET, in request order; a Ready
/// hold and an ended wait are not waiting.
#[test]
fn waiting_requests_name_the_waits_in_request_order_and_no_ready_hold() {
    let mut m = StorageTransferManager::new(config());
    let (_lease, get) = to_get(&mut m, 7, 1, 70, MS);
    let (_q3, _lease3) = m.issue_query(RequestId(3), keys("c-", 1)).unwrap();
    let (_q5, _lease5) = m.issue_query(RequestId(5), keys("e-", 1)).unwrap();
    assert_eq!(
        m.waiting_requests(),
        vec![RequestId(3), RequestId(5), RequestId(7)]
    );
    // Request 7's GET publishes: a Ready hold, no longer waiting.
    m.apply_round(with_done(2 * MS, vec![get_ok(get, 1)]))
        .unwrap();
    assert_eq!(m.stats().ready_holds, 1);
    assert!(!m.is_waiting(RequestId(7)));
    assert!(m.is_waiting(RequestId(5)));
    // Request 3 is cancelled: its wait ended.
    m.apply_round(RoundInput {
        tick_us: 3 * MS,
        cancellations: vec![RequestId(3)],
        ..Default::default()
    })
    .unwrap();
    assert!(!m.is_waiting(RequestId(3)));
    assert!(
        !m.is_waiting(RequestId(9)),
        "an unknown request waits on nothing"
    );
    assert_eq!(m.waiting_requests(), vec![RequestId(5)]);
    assert_eq!(m.stats().waiting_requests, 1);
}

/// A Ready hold's expiry entry stays queued after the hold ended (here: the client
/// cancelled it); when it comes due it must not expire the request's later wait.
#[test]
fn an_ended_ready_hold_never_expires_the_same_requests_later_wait() {
    let mut m = StorageTransferManager::new(config()); // ready hold 50 ms
    let (_lease, get) = to_get(&mut m, 1, 2, 100, MS);
    m.apply_round(with_done(20 * MS, vec![get_ok(get, 2)]))
        .unwrap();
    assert_eq!(m.stats().ready_holds, 1); // expires at 70 ms
    let fx = m
        .apply_round(RoundInput {
            tick_us: 30 * MS,
            cancellations: vec![RequestId(1)],
            ..Default::default()
        })
        .unwrap();
    assert_eq!(fx.release, vec![HostRef(100), HostRef(101)]);
    // The request waits again (a QUERY issued at 40 ms: soft deadline 140 ms).
    m.apply_round(round(40 * MS)).unwrap();
    let (q, _lease) = m.issue_query(RequestId(1), keys("again-", 2)).unwrap();
    // 70 ms: the ended hold's expiry comes due; it names no hold any more.
    let fx = m.apply_round(round(70 * MS)).unwrap();
    assert!(fx.is_empty(), "{fx:?}");
    assert!(m.is_waiting(RequestId(1)));
    assert_eq!(m.stats().ready_expirations, 0);
    // The later wait is intact: its QUERY's answer still reaches it.
    let fx = m
        .apply_round(with_done(
            80 * MS,
            vec![StorageDone::query(q.op, vec![true, false], true)],
        ))
        .unwrap();
    assert_eq!(fx.query_results.len(), 1);
    assert_eq!(fx.query_results[0].request, RequestId(1));
}

#[test]
fn soft_deadline_counts_from_query_issue_and_includes_queue_wait() {
    let mut m = StorageTransferManager::new(config()); // soft deadline 100 ms
    m.apply_round(round(10 * MS)).unwrap();
    let (_lease, get) = to_get(&mut m, 1, 2, 100, 60 * MS);
    // 109 ms after the QUERY at 10 ms: not yet due.
    let fx = m.apply_round(round(109 * MS)).unwrap();
    assert!(fx.waits_ended.is_empty());
    let fx = m.apply_round(round(110 * MS)).unwrap();
    assert_eq!(fx.waits_ended, vec![(RequestId(1), WaitEnd::SoftTimeout)]);
    assert_eq!(fx.cancels, vec![messages::StorageCancelOp { op: get }]);
    assert!(
        fx.release.is_empty(),
        "a soft timeout never releases native buffers"
    );
    assert_eq!(m.stats().soft_timeouts, 1);
    assert_eq!(m.stats().ready_expirations, 0);
    assert!(m.l3_enabled());
    assert_eq!(m.attached_waiter(get), None);
    // The late, retired result cannot publish; it only releases the references.
    let fx = m
        .apply_round(with_done(200 * MS, vec![get_ok(get, 2)]))
        .unwrap();
    assert!(fx.publish.is_empty());
    assert_eq!(fx.release, vec![HostRef(100), HostRef(101)]);
    assert_eq!(fx.settled, vec![get]);
    assert_eq!(m.stats().operation_credits_in_use, 0);
    assert_eq!(m.stats().host_credits_in_use, 0);
}

#[test]
fn ready_hold_expires_at_tick_and_counts_separately() {
    let mut m = StorageTransferManager::new(config()); // ready hold 50 ms
    let (_lease, get) = to_get(&mut m, 1, 2, 100, MS);
    let fx = m
        .apply_round(with_done(20 * MS, vec![get_ok(get, 2)]))
        .unwrap();
    assert_eq!(fx.publish.len(), 2);
    assert_eq!(fx.waits_ended, vec![(RequestId(1), WaitEnd::Completed)]);
    assert!(fx.release.is_empty(), "the Ready hold keeps the references");
    assert_eq!(m.stats().ready_holds, 1);
    assert_eq!(m.ready_refs(RequestId(1)), vec![HostRef(100), HostRef(101)]);
    // The soft deadline no longer applies to a Ready hold.
    let fx = m.apply_round(round(69 * MS)).unwrap();
    assert!(fx.is_empty());
    let fx = m.apply_round(round(70 * MS)).unwrap();
    assert_eq!(fx.ready_expired, vec![RequestId(1)]);
    assert_eq!(fx.release, vec![HostRef(100), HostRef(101)]);
    assert_eq!(fx.settled, vec![get]);
    let s = m.stats();
    assert_eq!(
        (s.ready_expirations, s.soft_timeouts, s.ready_holds),
        (1, 0, 0)
    );
    assert_eq!(s.operation_credits_in_use, 0);
}

/// A Ready hold made just before its request's soft deadline outlives the deadline
/// queue's entries: it still expires on time with no deadline left queued.
#[test]
fn a_ready_hold_expires_when_no_soft_deadline_is_queued() {
    let mut m = StorageTransferManager::new(config()); // soft deadline 100 ms, hold 50 ms
    let (_lease, get) = to_get(&mut m, 1, 1, 10, 0);
    m.apply_round(with_done(99 * MS, vec![get_ok(get, 1)]))
        .unwrap();
    assert_eq!(m.stats().ready_holds, 1); // expires at 149 ms
                                          // 100 ms: the QUERY's deadline entry comes due and names no wait any more.
    assert!(m.apply_round(round(100 * MS)).unwrap().is_empty());
    let fx = m.apply_round(round(149 * MS)).unwrap();
    assert_eq!(fx.ready_expired, vec![RequestId(1)]);
    assert_eq!(fx.release, vec![HostRef(10)]);
    assert_eq!(m.stats().ready_expirations, 1);
}

/// Agreed completions are checked before any is applied: a completion of an unknown
/// operation, a second completion of a GET whose Ready hold is still held, one of the
/// wrong kind or with the wrong number of keys, or two of one operation in a round is a
/// protocol error that changes nothing.
#[test]
fn a_completion_the_manager_cannot_apply_is_a_protocol_error_that_changes_nothing() {
    let mut m = StorageTransferManager::new(config());
    let (_lease, get) = to_get(&mut m, 1, 2, 10, MS);
    let (_lease2, other) = to_get(&mut m, 2, 1, 20, MS);
    m.apply_round(with_done(2 * MS, vec![get_ok(get, 2)]))
        .unwrap();
    assert_eq!(m.stats().ready_holds, 1);
    let before = m.stats();
    let cases: Vec<(Vec<StorageDone>, &str)> = vec![
        (
            vec![get_ok(OperationId(999), 1)],
            "completion of an unknown operation",
        ),
        (vec![get_ok(get, 2)], "operation already completed"),
        (
            vec![StorageDone::query(other, vec![true], true)],
            "query completion for a get operation",
        ),
        (vec![get_ok(other, 3)], "3 key results for 1 keys"),
        (
            vec![get_ok(other, 1), get_ok(other, 1)],
            "completed twice in one round",
        ),
    ];
    for (done, needle) in cases {
        let e = m.apply_round(with_done(3 * MS, done)).unwrap_err();
        assert!(e.to_string().contains(needle), "{e} lacks {needle}");
        assert_eq!(m.stats(), before, "{needle}: the round changed the manager");
    }
    // The held GET's Ready hold and the outstanding one are intact.
    assert_eq!(m.ready_refs(RequestId(1)), vec![HostRef(10), HostRef(11)]);
    let fx = m
        .apply_round(with_done(4 * MS, vec![get_ok(other, 1)]))
        .unwrap();
    assert_eq!(fx.waits_ended, vec![(RequestId(2), WaitEnd::Completed)]);
}

#[test]
fn cancellation_in_each_state() {
    let mut m = StorageTransferManager::new(config());
    // In QUERY.
    let (q, _l1) = m.issue_query(RequestId(1), keys("a", 1)).unwrap();
    // QUERY answered, no GET yet.
    let (q2, _l2) = m.issue_query(RequestId(2), keys("b", 1)).unwrap();
    m.apply_round(with_done(
        MS,
        vec![StorageDone::query(q2.op, vec![true], true)],
    ))
    .unwrap();
    // In GET.
    let (_l3, get) = to_get(&mut m, 3, 1, 30, 2 * MS);
    // In a Ready hold.
    let (_l4, get4) = to_get(&mut m, 4, 1, 40, 3 * MS);
    m.apply_round(with_done(4 * MS, vec![get_ok(get4, 1)]))
        .unwrap();
    assert_eq!(m.stats().ready_holds, 1);
    let fx = m
        .apply_round(RoundInput {
            tick_us: 5 * MS,
            cancellations: vec![
                RequestId(1),
                RequestId(2),
                RequestId(3),
                RequestId(4),
                RequestId(9),
            ],
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        fx.waits_ended,
        vec![
            (RequestId(1), WaitEnd::Detached),
            (RequestId(2), WaitEnd::Detached),
            (RequestId(3), WaitEnd::Detached)
        ]
    );
    let cancelled: Vec<_> = fx.cancels.iter().map(|c| c.op).collect();
    assert_eq!(cancelled, vec![q.op, get]);
    // Only the Ready hold's reference is released; the in-flight GET keeps its own.
    assert_eq!(fx.release, vec![HostRef(40)]);
    assert_eq!(fx.settled, vec![get4]);
    let s = m.stats();
    assert_eq!(
        (s.soft_timeouts, s.ready_expirations, s.ready_holds),
        (0, 0, 0)
    );
    assert_eq!(s.waiting_requests, 0);
    // Queued cancellation acknowledged: rejected, retired → references released.
    let fx = m
        .apply_round(with_done(
            6 * MS,
            vec![
                StorageDone::rejected(get, StorageOpKind::Get, 1, Rejection::Cancelled),
                StorageDone::rejected(q.op, StorageOpKind::Query, 1, Rejection::Cancelled),
            ],
        ))
        .unwrap();
    assert_eq!(fx.release, vec![HostRef(30)]);
    assert!(fx.negative.is_empty(), "a cancellation carries no evidence");
    assert_eq!(m.stats().outstanding_tickets, 0);
    assert_eq!(m.stats().operation_credits_in_use, 0);
}

#[test]
fn operation_ids_are_never_reused() {
    let mut m = StorageTransferManager::new(config());
    let mut seen = std::collections::BTreeSet::new();
    let mut last = 0;
    for r in 0..50u64 {
        let (q, lease) = m.issue_query(RequestId(r % 3), keys("k", 1)).unwrap();
        assert!(q.op.0 > last && seen.insert(q.op));
        last = q.op.0;
        m.apply_round(with_done(
            r,
            vec![StorageDone::query(q.op, vec![false], true)],
        ))
        .unwrap();
        m.detach(lease);
    }
    assert_eq!(m.stats().last_operation_id, 50);
}

#[test]
fn stale_lease_detach_does_nothing() {
    let mut m = StorageTransferManager::new(config());
    let (_q, old) = m.issue_query(RequestId(1), keys("a", 1)).unwrap();
    m.apply_round(round(200 * MS)).unwrap(); // soft timeout ends the wait
    let (_q2, _new) = m.issue_query(RequestId(1), keys("a", 1)).unwrap();
    let fx = m.detach(old);
    assert!(fx.is_empty());
    assert!(m.is_waiting(RequestId(1)), "the newer wait is untouched");
}

#[test]
fn no_reference_released_while_the_ticket_is_live() {
    let mut m = StorageTransferManager::new(config());
    let (lease, get) = to_get(&mut m, 1, 3, 10, MS);
    let fx = m.detach(lease);
    assert_eq!(fx.cancels.len(), 1);
    assert!(fx.release.is_empty());
    assert_eq!(m.ticket(get).map(|t| t.state), Some(TicketState::Issued));
    assert_eq!(m.stats().host_credits_in_use, 3);
    // A failed call whose store did not prove retirement: quarantine, nothing released.
    let done = StorageDone::failed(get, StorageOpKind::Get, 3, false, "transfer error");
    let fx = m.apply_round(with_done(2 * MS, vec![done])).unwrap();
    assert!(fx.release.is_empty());
    assert_eq!(fx.quarantined, vec![HostRef(10), HostRef(11), HostRef(12)]);
    let s = m.stats();
    assert_eq!(s.quarantined_refs, 3);
    assert_eq!(
        s.host_credits_in_use, 3,
        "quarantined references stay charged"
    );
    assert_eq!(s.operation_credits_in_use, 1);
    assert!(!m.l3_enabled());
    assert_eq!(
        m.issue_query(RequestId(2), keys("z", 1)).unwrap_err(),
        Refusal::Disabled
    );
    assert_eq!(
        m.offer_backup(key("w"), HostRef(99)),
        OfferOutcome::Dropped(DropReason::Disabled)
    );
    // A clear never frees quarantined references.
    let fx = m.clear(ClearKind::FullClear, Some(Ok(()))).unwrap();
    assert!(fx.release.is_empty());
    assert_eq!(m.stats().quarantined_refs, 3);
    assert!(
        !m.l3_enabled(),
        "only a restart reclaims quarantined storage"
    );
}

#[test]
fn backups_use_at_most_half_rounded_down() {
    let mut c = config();
    c.operation_credits = 5; // backups: 2
    c.max_host_blocks = 7; // backups: 3
    c.max_keys_per_operation = 2;
    let mut m = StorageTransferManager::new(c);
    for i in 0..6 {
        assert_eq!(
            m.offer_backup(key(&format!("p{i}")), HostRef(i)),
            OfferOutcome::Queued
        );
    }
    let mut res = |_: &StorageKey, h: HostRef| Some(HostRange::new(h.0 * 16, 16));
    let puts = dispatch(&mut m, 0, &mut res);
    assert_eq!(puts.len(), 2, "{puts:?}");
    let (p1, p2) = (&puts[0], &puts[1]);
    assert_eq!(p1.keys.len(), 2);
    assert_eq!(p2.keys.len(), 1, "only one backup Host credit left of 3");
    assert!(
        dispatch(&mut m, 0, &mut res).is_empty(),
        "backup op credits (2) in use"
    );
    assert_eq!(
        m.queued_candidates(),
        3,
        "temporary exhaustion leaves candidates queued"
    );
    let s = m.stats();
    assert_eq!(
        (
            s.backup_operation_credits_in_use,
            s.backup_host_credits_in_use
        ),
        (2, 3)
    );
    // Reads may still use the rest of the shared budget.
    let (q, _l) = m.issue_query(RequestId(1), keys("r", 1)).unwrap();
    m.apply_round(with_done(
        MS,
        vec![StorageDone::query(q.op, vec![true], true)],
    ))
    .unwrap();
    m.issue_get(RequestId(1), keys("r", 1), dests(50, 1))
        .unwrap();
    assert_eq!(m.stats().operation_credits_in_use, 3);
    assert!(dispatch(&mut m, 0, &mut res).is_empty());
}

#[test]
fn one_credit_budget_admits_reads_and_no_backups() {
    let mut c = config();
    c.operation_credits = 1;
    let mut m = StorageTransferManager::new(c);
    assert_eq!(
        m.offer_backup(key("p"), HostRef(1)),
        OfferOutcome::Dropped(DropReason::Disabled),
        "a permanently zero write budget rejects candidates at once"
    );
    assert_eq!(m.stats().dropped(DropReason::Disabled), 1);
    assert_eq!(m.queued_candidates(), 0);
    let (_l, get) = to_get(&mut m, 1, 2, 10, MS);
    assert_eq!(m.ticket(get).map(|t| t.kind), Some(StorageOpKind::Get));
    assert_eq!(
        m.issue_query(RequestId(2), keys("x", 1)).unwrap_err(),
        Refusal::OperationCredits
    );
}

#[test]
fn a_closing_gate_ends_the_query_waits_in_request_order() {
    let mut m = StorageTransferManager::new(StorageConfig {
        operation_credits: 64,
        ..config() // high 10 jobs, low 5
    });
    let ids: Vec<u64> = (0..40u64).map(|i| (i * 17) % 41 + 1).collect();
    let mut leases = Vec::new();
    for &r in &ids {
        let (_, lease) = m
            .issue_query(RequestId(r), keys(&format!("r{r}-"), 1))
            .unwrap();
        leases.push(lease);
    }
    let fx = m
        .apply_round(RoundInput {
            tick_us: MS,
            pressure: pressure(10),
            ..Default::default()
        })
        .unwrap();
    let ended: Vec<u64> = fx.waits_ended.iter().map(|(r, _)| r.0).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(ended, sorted);
    let mut ops: Vec<OperationId> = fx.cancels.iter().map(|c| c.op).collect();
    assert_eq!(ops.len(), ids.len());
    ops.dedup();
    assert_eq!(ops.len(), ids.len());
}

/// `query_credits_refusal` names the credits only while the gates are open: with the gate
/// closed the pressure refusal decides (and is counted where a planned QUERY meets it),
/// even while the detached QUERYs still hold every operation credit.
#[test]
fn exhausted_credits_refuse_a_query_only_while_the_gate_is_open() {
    let mut m = StorageTransferManager::new(config()); // high 10 jobs, low 5
    assert_eq!(m.query_credits_refusal(), None);
    let mut r = 0;
    while m
        .issue_query(RequestId(r), keys(&format!("q{r}-"), 1))
        .is_ok()
    {
        r += 1;
        assert!(r < 10_000, "the operation credits never ran out");
    }
    assert_eq!(m.query_credits_refusal(), Some(Refusal::OperationCredits));
    m.apply_round(RoundInput {
        tick_us: MS,
        pressure: pressure(10),
        ..Default::default()
    })
    .unwrap();
    assert!(m.gate_closed());
    assert!(
        m.stats().operation_credits_in_use > 0,
        "held until retirement"
    );
    assert_eq!(m.query_credits_refusal(), None);
}

#[test]
fn gate_hysteresis_detaches_queries_and_keeps_gets() {
    let mut m = StorageTransferManager::new(config()); // high 10 jobs, low 5
    let (_l1, q1) = m
        .issue_query(RequestId(1), keys("a", 1))
        .map(|(q, l)| (l, q.op))
        .unwrap();
    let (_l2, get) = to_get(&mut m, 2, 1, 20, MS);
    m.offer_backup(key("p"), HostRef(7));
    let fx = m
        .apply_round(RoundInput {
            tick_us: 2 * MS,
            pressure: pressure(10),
            ..Default::default()
        })
        .unwrap();
    assert!(m.gate_closed());
    assert_eq!(fx.waits_ended, vec![(RequestId(1), WaitEnd::Pressure)]);
    assert_eq!(fx.cancels, vec![messages::StorageCancelOp { op: q1 }]);
    assert!(
        m.is_waiting(RequestId(2)),
        "a submitted GET keeps its lifetime"
    );
    let s = m.stats();
    assert_eq!(s.dropped(DropReason::Pressure), 1);
    assert_eq!(s.pressure_bypasses, 1);
    assert!(s.gate_closed);
    assert_eq!(
        m.issue_query(RequestId(3), keys("c", 1)).unwrap_err(),
        Refusal::PressureClosed
    );
    assert_eq!(m.stats().pressure_bypasses, 2);
    assert_eq!(
        m.offer_backup(key("q"), HostRef(8)),
        OfferOutcome::Dropped(DropReason::Pressure)
    );
    // Between watermarks: still closed.
    m.apply_round(RoundInput {
        tick_us: 3 * MS,
        pressure: pressure(5),
        ..Default::default()
    })
    .unwrap();
    assert!(m.gate_closed());
    // The submitted GET completes and publishes while closed.
    let fx = m
        .apply_round(RoundInput {
            tick_us: 4 * MS,
            pressure: pressure(7),
            completions: vec![get_ok(get, 1)],
            ..Default::default()
        })
        .unwrap();
    assert_eq!(fx.publish.len(), 1);
    assert!(m.gate_closed());
    m.apply_round(RoundInput {
        tick_us: 5 * MS,
        pressure: pressure(4),
        ..Default::default()
    })
    .unwrap();
    assert!(!m.gate_closed());
    assert!(m.issue_query(RequestId(3), keys("c", 1)).is_ok());
}

#[test]
fn a_query_answered_while_closed_cannot_acquire_destinations() {
    let mut m = StorageTransferManager::new(config());
    let (_q, _l) = m.issue_query(RequestId(1), keys("a", 1)).unwrap();
    // Closed in the same round the QUERY is answered: the tick closes first.
    let (q2, _l2) = m.issue_query(RequestId(2), keys("b", 1)).unwrap();
    let fx = m
        .apply_round(RoundInput {
            tick_us: MS,
            pressure: pressure(100),
            completions: vec![StorageDone::query(q2.op, vec![true], true)],
            ..Default::default()
        })
        .unwrap();
    assert!(
        fx.query_results.is_empty(),
        "the request had already detached"
    );
    assert_eq!(
        m.issue_get(RequestId(2), keys("b", 1), dests(1, 1))
            .unwrap_err(),
        Refusal::NotWaiting(RequestId(2))
    );
}

#[test]
fn host_credit_exhaustion_rejects_a_new_query() {
    let mut c = config();
    c.max_host_blocks = 4;
    c.max_keys_per_operation = 4;
    let mut m = StorageTransferManager::new(c);
    let (_l, _get) = to_get(&mut m, 1, 4, 10, MS);
    assert_eq!(
        m.issue_query(RequestId(2), keys("b", 1)).unwrap_err(),
        Refusal::HostCredits
    );
    assert_eq!(m.stats().operation_credits_in_use, 1);
}

#[test]
fn detached_late_completion_cannot_publish() {
    let mut m = StorageTransferManager::new(config());
    let (lease, get) = to_get(&mut m, 1, 2, 10, MS);
    // Cancellation and completion in the same round: cancellation applies first.
    let fx = m
        .apply_round(RoundInput {
            tick_us: 2 * MS,
            cancellations: vec![RequestId(1)],
            completions: vec![get_ok(get, 2)],
            ..Default::default()
        })
        .unwrap();
    assert!(fx.publish.is_empty());
    assert_eq!(fx.release, vec![HostRef(10), HostRef(11)]);
    assert!(m.detach(lease).is_empty());
    // Expiry and completion in the same round: the tick applies first.
    let (_l2, get2) = to_get(&mut m, 2, 1, 20, 3 * MS);
    let fx = m
        .apply_round(with_done(500 * MS, vec![get_ok(get2, 1)]))
        .unwrap();
    assert_eq!(fx.waits_ended, vec![(RequestId(2), WaitEnd::SoftTimeout)]);
    assert!(fx.publish.is_empty());
    assert_eq!(fx.release, vec![HostRef(20)]);
}

#[test]
fn another_publication_may_satisfy_the_wait_early() {
    let mut m = StorageTransferManager::new(config());
    let (lease, get) = to_get(&mut m, 1, 1, 10, MS);
    assert_eq!(m.attached_waiter(get), Some(RequestId(1)));
    let fx = m.detach(lease); // the scheduler found the prefix published locally
    assert_eq!(fx.waits_ended, vec![(RequestId(1), WaitEnd::Detached)]);
    assert_eq!(m.attached_waiter(get), None);
    assert_eq!(m.stats().soft_timeouts, 0);
}

#[test]
fn clear_during_in_flight_get_releases_only_at_retirement() {
    let mut m = StorageTransferManager::new(config());
    let (_lease, get) = to_get(&mut m, 1, 2, 10, MS);
    let (_l2, get2) = to_get(&mut m, 2, 1, 20, MS);
    m.apply_round(with_done(2 * MS, vec![get_ok(get2, 1)]))
        .unwrap(); // Ready hold
    m.offer_backup(key("p"), HostRef(30));
    let refused = m.clear(ClearKind::FullClear, Some(Err("master unreachable".into())));
    assert!(matches!(refused, Err(ClearRefused::DeletionFailed(_))));
    assert!(
        m.is_waiting(RequestId(1)),
        "a deletion failure prevents local clearing"
    );
    assert_eq!(m.queued_candidates(), 1);
    let fx = m.clear(ClearKind::FullClear, Some(Ok(()))).unwrap();
    assert_eq!(fx.waits_ended, vec![(RequestId(1), WaitEnd::Detached)]);
    assert_eq!(fx.release, vec![HostRef(20)], "the Ready hold is dropped");
    assert_eq!(fx.cancels, vec![messages::StorageCancelOp { op: get }]);
    assert_eq!(m.stats().dropped(DropReason::Cleanup), 1);
    assert_eq!(
        m.stats().host_credits_in_use,
        2,
        "in-flight native refs stay"
    );
    let fx = m
        .apply_round(with_done(3 * MS, vec![get_ok(get, 2)]))
        .unwrap();
    assert!(fx.publish.is_empty());
    assert_eq!(fx.release, vec![HostRef(10), HostRef(11)]);
    assert_eq!(m.stats().host_credits_in_use, 0);
    // Rotation without remote deletion also clears.
    assert!(m.clear(ClearKind::NamespaceRotation, None).is_ok());
}

#[test]
fn partial_results_publish_only_fully_succeeded_rows() {
    let mut m = StorageTransferManager::new(config());
    let (_lease, get) = to_get(&mut m, 1, 3, 10, MS);
    let done = StorageDone::get(
        get,
        vec![true, false, true],
        vec![16, 3, 16],
        vec![None, Some(ObjectFailure::Invalid), None],
        true,
    );
    let fx = m.apply_round(with_done(2 * MS, vec![done])).unwrap();
    let rows: Vec<(usize, HostRef)> = fx.publish.iter().map(|p| (p.key_index, p.host)).collect();
    assert_eq!(rows, vec![(0, HostRef(10)), (2, HostRef(12))]);
    assert_eq!(fx.release, vec![HostRef(11)]);
    assert_eq!(fx.negative, vec![key("r1-1")]);
    assert!(m.is_negative(&key("r1-1")));
    assert!(
        !m.is_negative(&key("r1-0")),
        "a key read whole is no negative fact"
    );
    assert_eq!(
        m.stats().host_credits_in_use,
        2,
        "the Ready hold charges published rows"
    );
    assert_eq!(m.ready_refs(RequestId(1)), vec![HostRef(10), HostRef(12)]);
}

#[test]
fn rejections_and_errors_carry_no_negative_evidence() {
    let mut m = StorageTransferManager::new(config());
    let (_l, get) = to_get(&mut m, 1, 2, 10, MS);
    let fx = m
        .apply_round(with_done(
            2 * MS,
            vec![StorageDone::rejected(
                get,
                StorageOpKind::Get,
                2,
                Rejection::Unhealthy,
            )],
        ))
        .unwrap();
    assert!(fx.negative.is_empty() && fx.publish.is_empty());
    assert_eq!(fx.waits_ended, vec![(RequestId(1), WaitEnd::Completed)]);
    let (_l, get) = to_get(&mut m, 2, 1, 20, 3 * MS);
    let fx = m
        .apply_round(with_done(
            4 * MS,
            vec![StorageDone::failed(
                get,
                StorageOpKind::Get,
                1,
                true,
                "boom",
            )],
        ))
        .unwrap();
    assert!(fx.negative.is_empty() && fx.publish.is_empty());
    assert_eq!(fx.release, vec![HostRef(20)]);
    assert!(m.l3_enabled(), "a retired failure does not quarantine");
    assert_eq!(m.stats().negative_entries, 0);
}

#[test]
fn invalid_completions_change_nothing() {
    let mut m = StorageTransferManager::new(config());
    let (q, _l) = m.issue_query(RequestId(1), keys("a", 2)).unwrap();
    let before = m.stats();
    let wrong_len = StorageDone::query(q.op, vec![true], true);
    assert!(m.apply_round(with_done(MS, vec![wrong_len])).is_err());
    let unknown = StorageDone::query(OperationId(99), vec![true], true);
    assert!(m.apply_round(with_done(MS, vec![unknown])).is_err());
    let wrong_kind = StorageDone::put(q.op, vec![true; 2], vec![0; 2], vec![false; 2], true);
    assert!(m.apply_round(with_done(MS, vec![wrong_kind])).is_err());
    let ok = StorageDone::query(q.op, vec![true; 2], true);
    assert!(m
        .apply_round(with_done(MS, vec![ok.clone(), ok.clone()]))
        .is_err());
    assert_eq!(m.stats(), before);
    assert_eq!(
        m.now_us(),
        0,
        "an invalid round does not even apply its tick"
    );
    m.apply_round(with_done(MS, vec![ok.clone()])).unwrap();
    assert!(
        m.apply_round(with_done(MS, vec![ok])).is_err(),
        "completed twice"
    );
}

/// A GET's and a PUT's completion must report one result per row (the PUT's rows are its
/// sources: its ticket keeps no second copy of the object keys the operation carried).
#[test]
fn get_and_put_completions_with_the_wrong_row_count_change_nothing() {
    let mut m = StorageTransferManager::new(config());
    let (_l, get) = to_get(&mut m, 1, 2, 10, MS);
    m.offer_backup(key("p0"), HostRef(30));
    m.offer_backup(key("p1"), HostRef(31));
    let puts = m.plan_backups_keyed(&mut residency_all);
    let [put] = puts[..] else {
        panic!("{puts:?}");
    };
    let t = m.ticket(put).expect("the PUT's ticket");
    assert!(t.keys.is_empty(), "the object keys went out with the PUT");
    assert_eq!(t.refs, vec![HostRef(30), HostRef(31)]);
    assert_eq!(t.put_bytes, 32);
    m.end_plan(vec![]);
    assert_eq!(m.backup_bytes_outstanding, 32);
    let before = m.stats();
    let short_get = StorageDone::get(get, vec![true], vec![16], vec![None], true);
    assert!(m.apply_round(with_done(2 * MS, vec![short_get])).is_err());
    let long_put = StorageDone::put(put, vec![true; 3], vec![16; 3], vec![false; 3], true);
    assert!(m.apply_round(with_done(2 * MS, vec![long_put])).is_err());
    assert_eq!(m.stats(), before);
    let put_ok = StorageDone::put(put, vec![true; 2], vec![16; 2], vec![false; 2], true);
    let fx = m.apply_round(with_done(2 * MS, vec![put_ok])).unwrap();
    assert_eq!(
        fx.backed_up,
        vec![BlockPage::from(key("p0")), BlockPage::from(key("p1"))]
    );
    assert_eq!(fx.release, vec![HostRef(30), HostRef(31)]);
    assert_eq!(m.backup_bytes_outstanding, 0, "the bytes bound is returned");
}

fn residency_all(_: &StorageKey, h: HostRef) -> Option<HostRange> {
    Some(HostRange::new(h.0 * 16, 16))
}

/// The one PUT of a dispatch.
fn one_put(mut puts: Vec<StoragePutOp>) -> StoragePutOp {
    assert_eq!(puts.len(), 1, "{puts:?}");
    puts.remove(0)
}

#[test]
fn backup_dispatch_skips_evicted_and_coalesces_pending() {
    let mut m = StorageTransferManager::new(config());
    m.offer_backup(key("a"), HostRef(1));
    m.offer_backup(key("b"), HostRef(2));
    let mut res = |k: &StorageKey, h: HostRef| (k.text() != "b").then(|| HostRange::new(h.0, 16));
    let put = one_put(dispatch(&mut m, 0, &mut res));
    assert_eq!(put.keys, vec![key("a")]);
    assert_eq!(m.stats().dropped(DropReason::Unavailable), 1);
    assert_eq!(
        m.offer_backup(key("a"), HostRef(1)),
        OfferOutcome::Coalesced
    );
    assert_eq!(m.stats().dropped_backup_keys.iter().sum::<u64>(), 1);
    // A retired capacity rejection re-offers; a retired failure just releases.
    let fx = m
        .apply_round(with_done(
            MS,
            vec![StorageDone::put(
                put.op,
                vec![false],
                vec![0],
                vec![true],
                true,
            )],
        ))
        .unwrap();
    assert_eq!(fx.release, vec![HostRef(1)]);
    assert_eq!(
        fx.reoffer,
        vec![BackupCandidate {
            key: key("a").into(),
            host: HostRef(1)
        }]
    );
    assert_eq!(m.queued_candidates(), 1);
    // After the capacity backoff the candidate is dispatched again.
    let retry = m.capacity_retry_at_us();
    m.apply_round(with_done(retry, vec![])).unwrap();
    let put = one_put(dispatch(&mut m, 0, &mut residency_all));
    let fx = m
        .apply_round(with_done(
            retry + MS,
            vec![StorageDone::put(
                put.op,
                vec![true],
                vec![16],
                vec![false],
                true,
            )],
        ))
        .unwrap();
    assert_eq!(fx.backed_up, vec![BlockPage::from(key("a"))]);
    assert_eq!(fx.release, vec![HostRef(1)]);
    assert!(fx.reoffer.is_empty());
}

#[test]
fn backup_queue_overflow_and_unretired_put_quarantine() {
    let mut c = config();
    c.backup_candidate_capacity = 2;
    let mut m = StorageTransferManager::new(c);
    for i in 0..3 {
        m.offer_backup(key(&format!("k{i}")), HostRef(i));
    }
    assert_eq!(m.stats().dropped(DropReason::Overflow), 1);
    let put = one_put(dispatch(&mut m, 0, &mut residency_all));
    assert_eq!(put.keys, vec![key("k1"), key("k2")]);
    let fx = m
        .apply_round(with_done(
            MS,
            vec![StorageDone::failed(
                put.op,
                StorageOpKind::Put,
                2,
                false,
                "-1",
            )],
        ))
        .unwrap();
    assert_eq!(fx.quarantined, vec![HostRef(1), HostRef(2)]);
    assert!(fx.release.is_empty());
    assert!(!m.l3_enabled());
    assert_eq!(m.stats().backup_host_credits_in_use, 2);
}

#[test]
fn determinism_same_trace_same_outputs() {
    fn run() -> (Vec<RoundEffects>, Vec<String>, StmStats) {
        let mut m = StorageTransferManager::new(config());
        let mut out = Vec::new();
        let mut ops = Vec::new();
        let mut pending = Vec::new();
        let mut leases: Vec<StorageLease> = Vec::new();
        for r in 0..20u64 {
            if r % 4 == 0 && !leases.is_empty() {
                out.push(m.detach(leases.remove(0)));
            }
            let tick = r * 7 * MS;
            let mut done = Vec::new();
            for p in pending.drain(..) {
                done.push(p);
            }
            let fx = m
                .apply_round(RoundInput {
                    tick_us: tick,
                    pressure: pressure(if r % 9 == 4 { 12 } else { 1 }),
                    cancellations: if r % 5 == 3 {
                        vec![RequestId(r - 1)]
                    } else {
                        vec![]
                    },
                    completions: done,
                })
                .unwrap();
            for q in &fx.query_results {
                if let Ok(g) = m.issue_get(
                    q.request,
                    keys(&format!("q{}-", q.request.0), q.exists.len()),
                    dests(q.request.0 * 10, q.exists.len()),
                ) {
                    ops.push(format!("{:?}", g));
                    pending.push(get_ok(g.op, g.keys.len()));
                }
            }
            out.push(fx);
            if let Ok((q, lease)) = m.issue_query(RequestId(r), keys(&format!("q{r}-"), 2)) {
                ops.push(format!("{:?}", q));
                pending.push(StorageDone::query(q.op, vec![r % 2 == 0, true], true));
                leases.push(lease);
            }
            m.offer_backup(key(&format!("b{}", r % 4)), HostRef(1000 + r));
            let jobs = if r % 9 == 4 { 12 } else { 1 };
            for p in dispatch(&mut m, jobs, &mut residency_all) {
                ops.push(format!("{:?}", p));
            }
        }
        (out, ops, m.stats())
    }
    let a = run();
    let b = run();
    assert_eq!(a, b);
    assert!(a.1.len() > 10, "the trace exercised planning");
}

#[test]
fn refusals_change_nothing() {
    let mut m = StorageTransferManager::new(config());
    assert_eq!(
        m.issue_query(RequestId(1), vec![]).unwrap_err(),
        Refusal::NoKeys
    );
    assert!(matches!(
        m.issue_query(RequestId(1), keys("a", 17)).unwrap_err(),
        Refusal::TooManyKeys(17, 16)
    ));
    let (q, _l) = m.issue_query(RequestId(1), keys("a", 1)).unwrap();
    assert_eq!(
        m.issue_query(RequestId(1), keys("a", 1)).unwrap_err(),
        Refusal::AlreadyWaiting(RequestId(1))
    );
    assert_eq!(
        m.issue_get(RequestId(1), keys("a", 1), dests(1, 1))
            .unwrap_err(),
        Refusal::NotWaiting(RequestId(1)),
        "no GET before the QUERY is answered"
    );
    m.apply_round(with_done(
        MS,
        vec![StorageDone::query(q.op, vec![true], true)],
    ))
    .unwrap();
    let mut dup = dests(1, 2);
    dup[1].0 = HostRef(1);
    assert!(matches!(
        m.issue_get(RequestId(1), keys("a", 2), dup).unwrap_err(),
        Refusal::Malformed(_)
    ));
    assert!(matches!(
        m.issue_get(RequestId(1), keys("a", 2), dests(1, 1))
            .unwrap_err(),
        Refusal::Malformed(_)
    ));
    // As many references as keys, one range short (or one over): malformed all the same.
    for ranges in [1, 3] {
        let mut uneven: Destinations = dests(1, 2).into();
        uneven.ranges.resize(ranges, uneven.ranges[0]);
        assert_eq!(uneven.refs.len(), 2);
        assert!(matches!(
            m.issue_get(RequestId(1), keys("a", 2), uneven).unwrap_err(),
            Refusal::Malformed(_)
        ));
    }
    let s = m.stats();
    assert_eq!((s.operation_credits_in_use, s.host_credits_in_use), (0, 0));
    assert_eq!(s.last_operation_id, 1);
    let _ = StorageConfig::clone(m.config());
}

#[test]
fn bench_body_runs_at_small_scale() {
    let r = bench::bench_stm(40, 200, 5, 4);
    assert_eq!(r.rounds, 5);
    assert!(r.outstanding_operations >= 30, "{r:?}");
    assert!(r.waiting_requests >= 150, "{r:?}");
    assert!(r.completions_per_round >= 4);
}

#[test]
fn an_unretired_query_retains_nothing_and_quarantines_nothing() {
    let mut m = StorageTransferManager::new(config());
    let (q, _l) = m.issue_query(RequestId(1), keys("a", 2)).unwrap();
    let done = StorageDone::failed(q.op, StorageOpKind::Query, 2, false, "sdk error");
    let fx = m.apply_round(with_done(MS, vec![done])).unwrap();
    assert!(fx.quarantined.is_empty());
    assert_eq!(fx.settled, vec![q.op]);
    assert_eq!(fx.waits_ended, vec![(RequestId(1), WaitEnd::Completed)]);
    assert!(m.l3_enabled());
    assert_eq!(m.stats().operation_credits_in_use, 0);
}

#[test]
fn capacity_reoffer_while_closed_is_a_pressure_drop() {
    let mut m = StorageTransferManager::new(config());
    m.offer_backup(key("a"), HostRef(1));
    let put = one_put(dispatch(&mut m, 0, &mut residency_all));
    let fx = m
        .apply_round(RoundInput {
            tick_us: MS,
            pressure: pressure(50),
            completions: vec![StorageDone::put(
                put.op,
                vec![false],
                vec![0],
                vec![true],
                true,
            )],
            ..Default::default()
        })
        .unwrap();
    assert_eq!(fx.release, vec![HostRef(1)]);
    assert!(fx.reoffer.is_empty());
    assert_eq!(m.stats().dropped(DropReason::Pressure), 1);
    assert_eq!(m.queued_candidates(), 0);
}

/// A clear cancels every operation still in flight, a backup PUT (no waiter) included,
/// and none that already completed (a Ready hold's GET just settles).
#[test]
fn a_clear_cancels_the_operations_in_flight_and_no_completed_one() {
    let mut m = StorageTransferManager::new(config());
    let (_lease, held) = to_get(&mut m, 1, 1, 10, MS);
    m.apply_round(with_done(2 * MS, vec![get_ok(held, 1)]))
        .unwrap();
    assert_eq!(m.stats().ready_holds, 1);
    let (_lease2, reading) = to_get(&mut m, 2, 1, 20, 3 * MS);
    m.offer_backup(key("p"), HostRef(30));
    let put = one_put(dispatch(&mut m, 0, &mut residency_all));
    let fx = m.clear(ClearKind::FullClear, Some(Ok(()))).unwrap();
    let mut cancelled: Vec<OperationId> = fx.cancels.iter().map(|c| c.op).collect();
    cancelled.sort_unstable();
    assert_eq!(cancelled, vec![reading, put.op]);
    assert!(fx.settled.contains(&held), "{fx:?}");
}

/// Only a row the store refused for capacity goes back to the queue: a row that failed
/// otherwise is dropped (the next D2H of the block offers it again), a landed row is
/// backed up.
#[test]
fn a_put_row_that_failed_without_a_capacity_rejection_is_not_offered_again() {
    let mut m = StorageTransferManager::new(config());
    m.offer_backup(key("a"), HostRef(1));
    m.offer_backup(key("b"), HostRef(2));
    m.offer_backup(key("c"), HostRef(3));
    let put = one_put(dispatch(&mut m, 0, &mut residency_all));
    assert_eq!(put.keys.len(), 3);
    let mut done = StorageDone::put(
        put.op,
        vec![true, false, false],
        vec![16, 0, 0],
        vec![false, false, true],
        true,
    );
    done.new_writes = 1;
    let fx = m.apply_round(with_done(MS, vec![done])).unwrap();
    assert_eq!(fx.backed_up.len(), 1);
    assert_eq!(fx.reoffer.len(), 1, "only the capacity-refused row: {fx:?}");
    assert_eq!(fx.reoffer[0].host, HostRef(3));
    assert_eq!(m.queued_candidates(), 1);
}

#[test]
fn a_capacity_rejection_backs_off_backups_and_a_landed_write_resets_the_backoff() {
    use super::manager::{CAPACITY_BACKOFF_MAX_US, CAPACITY_BACKOFF_MIN_US};
    let mut m = StorageTransferManager::new(config());
    let rejected = |op| StorageDone::put(op, vec![false], vec![0], vec![true], true);
    m.offer_backup(key("a"), HostRef(1));
    let put = one_put(dispatch(&mut m, 0, &mut residency_all));
    let t0 = MS;
    let fx = m
        .apply_round(with_done(t0, vec![rejected(put.op)]))
        .unwrap();
    assert_eq!(fx.reoffer.len(), 1, "re-offered, not lost");
    assert_eq!(m.queued_candidates(), 1);
    // Within the backoff nothing is dispatched, however many rounds run.
    for t in [t0 + 1, t0 + CAPACITY_BACKOFF_MIN_US - 1] {
        m.apply_round(with_done(t, vec![])).unwrap();
        assert!(dispatch(&mut m, 0, &mut residency_all).is_empty(), "at {t}");
    }
    m.apply_round(with_done(t0 + CAPACITY_BACKOFF_MIN_US, vec![]))
        .unwrap();
    let put = one_put(dispatch(&mut m, 0, &mut residency_all));
    // A second rejection doubles the wait.
    let t1 = t0 + CAPACITY_BACKOFF_MIN_US + 10;
    m.apply_round(with_done(t1, vec![rejected(put.op)]))
        .unwrap();
    assert_eq!(m.capacity_retry_at_us(), t1 + 2 * CAPACITY_BACKOFF_MIN_US);
    // Repeated rejections never wait longer than the maximum.
    let mut t = t1;
    for _ in 0..20 {
        t = m.capacity_retry_at_us();
        m.apply_round(with_done(t, vec![])).unwrap();
        let put = one_put(dispatch(&mut m, 0, &mut residency_all));
        m.apply_round(with_done(t, vec![rejected(put.op)])).unwrap();
        assert!(m.capacity_retry_at_us() - t <= CAPACITY_BACKOFF_MAX_US);
    }
    assert_eq!(m.capacity_retry_at_us() - t, CAPACITY_BACKOFF_MAX_US);
    // A PUT whose keys the store already held (no new write) proves no space was freed:
    // the backoff stays at its maximum.
    let t = m.capacity_retry_at_us();
    m.apply_round(with_done(t, vec![])).unwrap();
    let put = one_put(dispatch(&mut m, 0, &mut residency_all));
    let already_held = StorageDone::put(put.op, vec![true], vec![16], vec![false], true);
    assert_eq!(already_held.new_writes, 0);
    m.apply_round(with_done(t, vec![already_held])).unwrap();
    m.offer_backup(key("c"), HostRef(3));
    let put = one_put(dispatch(&mut m, 0, &mut residency_all));
    m.apply_round(with_done(t + 5, vec![rejected(put.op)]))
        .unwrap();
    assert_eq!(m.capacity_retry_at_us(), t + 5 + CAPACITY_BACKOFF_MAX_US);
    // A write that lands resets the backoff: the next rejection waits the minimum again.
    let t = m.capacity_retry_at_us();
    m.apply_round(with_done(t, vec![])).unwrap();
    let put = one_put(dispatch(&mut m, 0, &mut residency_all));
    let mut ok = StorageDone::put(put.op, vec![true], vec![16], vec![false], true);
    ok.new_writes = 1;
    m.apply_round(with_done(t, vec![ok])).unwrap();
    m.offer_backup(key("b"), HostRef(2));
    let put = one_put(dispatch(&mut m, 0, &mut residency_all));
    m.apply_round(with_done(t + 5, vec![rejected(put.op)]))
        .unwrap();
    assert_eq!(m.capacity_retry_at_us(), t + 5 + CAPACITY_BACKOFF_MIN_US);
}

#[test]
fn a_page_candidate_gets_its_object_key_at_dispatch_and_a_clear_ends_its_coverage() {
    use super::backup::{BackupKey, BlockPage};
    let page = |n: u32| BlockPage {
        hash: 0xabc,
        group: 0,
        page: n,
    };
    let mut m = StorageTransferManager::new(config());
    m.offer_backup(page(0), HostRef(1));
    m.offer_backup(page(1), HostRef(2));
    assert_eq!(
        m.offer_backup(page(0), HostRef(3)),
        OfferOutcome::Coalesced,
        "the same page queued twice"
    );
    m.begin_round(RoundInput {
        tick_us: m.now_us(),
        ..Default::default()
    })
    .unwrap();
    let mut made = vec![];
    let planned = m.plan_backups(&mut |k: &BackupKey, h: HostRef| {
        made.push(k.page);
        Some((
            key(&format!("obj-{}", k.page)),
            HostRange::new(h.0 * 16, 16),
            HostRef(100 + h.0),
        ))
    });
    assert_eq!(planned.len(), 1);
    assert_eq!(made, vec![0, 1], "one key made per dispatched page");
    let put = match &m.end_plan(vec![])[..] {
        [StorageOp::Put(p)] => p.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(put.keys, vec![key("obj-0"), key("obj-1")]);
    assert_eq!(
        m.ticket(put.op).unwrap().refs,
        vec![HostRef(101), HostRef(102)],
        "the ticket holds the references residency named the sources by"
    );
    assert_eq!(
        m.offer_backup(page(0), HostRef(4)),
        OfferOutcome::Coalesced,
        "covered by the pending PUT"
    );
    // A namespace rotation: the page names another object now; the old PUT covers nothing.
    m.clear(ClearKind::NamespaceRotation, None).unwrap();
    assert_eq!(m.offer_backup(page(0), HostRef(5)), OfferOutcome::Queued);
    m.begin_round(RoundInput {
        tick_us: m.now_us(),
        ..Default::default()
    })
    .unwrap();
    let planned = m.plan_backups(&mut |_: &BackupKey, h: HostRef| {
        Some((key("new-obj-0"), HostRange::new(h.0 * 16, 16), h))
    });
    assert_eq!(planned.len(), 1);
    assert!(m
        .end_plan(vec![])
        .iter()
        .any(|o| matches!(o, StorageOp::Put(p) if p.keys == vec![key("new-obj-0")])));
    // The old PUT's completion leaves the new PUT's coverage in place.
    let fx = m
        .apply_round(with_done(
            MS,
            vec![StorageDone::put(
                put.op,
                vec![true, true],
                vec![16, 16],
                vec![false, false],
                true,
            )],
        ))
        .unwrap();
    assert_eq!(
        fx.backed_up,
        vec![page(0), page(1)],
        "the pages it backed up"
    );
    assert_eq!(
        m.offer_backup(page(0), HostRef(6)),
        OfferOutcome::Coalesced,
        "still covered by the new epoch's PUT"
    );
}

/// A batch of offers (`offer_backups` or `backup_offers`, the gates read once for the
/// batch) leaves the backup queue, its drop counts, its coalescing and its forgotten
/// references as offering each candidate alone does: gate open (with duplicates and
/// overflow), pressure gate closed, writes disabled.
#[test]
fn a_batch_of_offers_is_each_offer_in_turn() {
    let batch: Vec<BackupCandidate> = (0..12u64)
        .map(|i| BackupCandidate {
            key: key(&format!("b{}", i % 9)).into(),
            host: HostRef(i),
        })
        .collect();
    for state in 0..3 {
        let make = || {
            let mut c = config();
            c.backup_candidate_capacity = 5;
            if state == 2 {
                c.operation_credits = 1; // no write budget
            }
            let mut m = StorageTransferManager::new(c);
            m.offer_backup(key("b3"), HostRef(100));
            if state == 1 {
                m.apply_round(RoundInput {
                    tick_us: 2 * MS,
                    pressure: pressure(10),
                    ..Default::default()
                })
                .unwrap();
                assert!(m.gate_closed());
            }
            m
        };
        let (mut one, mut all, mut each) = (make(), make(), make());
        for c in &batch {
            one.offer_backup(c.key, c.host);
        }
        all.offer_backups(batch.iter().cloned());
        // The pipeline's way: one batch, each candidate offered as it is made.
        let mut offers = each.backup_offers();
        for c in &batch {
            let _ = offers.offer(c.clone());
        }
        assert_eq!(one.backups, all.backups, "state {state}");
        assert_eq!(one.backups, each.backups, "state {state}");
        let s = all.stats();
        match state {
            0 => {
                assert_eq!(all.queued_candidates(), 5);
                assert!(s.dropped(DropReason::Overflow) > 0, "{s:?}");
                assert!(s.coalesced_backup_keys > 0, "{s:?}");
            }
            1 => assert_eq!(s.dropped(DropReason::Pressure), 12 + 1),
            _ => assert_eq!(s.dropped(DropReason::Disabled), 12 + 1),
        }
    }
}
