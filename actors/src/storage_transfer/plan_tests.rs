//! Tests of planning against the one decider, the way the Scheduler plans: between
//! `begin_round` and `end_plan` every QUERY/GET/PUT is decided on the manager's own credits
//! and gates (operation IDs continue, refusals take none), the plan's operations come back
//! in plan order, hand-backs apply after the plan's new operations, and the backup
//! candidates leave the queue in order, only as PUTs carry them. Time is explicit ticks; no
//! sleeps.

use super::tests_support::config;
use super::*;
use messages::settings::StorageConfig;
use messages::{
    HostRange, ObjectFailure, OperationId, PressureObservation, Rejection, RequestId, StorageDone,
    StorageKey, StorageOp, StorageOpKind,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

use super::tests_support::{dests, key, keys, MS};
fn pressure(jobs: u64) -> PressureObservation {
    PressureObservation {
        queued_jobs: jobs,
        queued_bytes: 0,
        oldest_age_us: 0,
    }
}
fn input(tick_us: u64, jobs: u64, done: Vec<StorageDone>) -> RoundInput {
    RoundInput {
        tick_us,
        pressure: pressure(jobs),
        cancellations: vec![],
        completions: done,
    }
}
fn cand(k: &str, h: u64) -> BackupCandidate {
    BackupCandidate {
        key: key(k).into(),
        host: HostRef(h),
    }
}

/// Applies a round and starts its plan (as the Scheduler's `apply` does).
fn begin(m: &mut StorageTransferManager, input: RoundInput) -> StorageReport {
    m.begin_round(input).unwrap()
}

fn op_ids(ops: &[StorageOp]) -> Vec<OperationId> {
    ops.iter().map(|o| o.id()).collect()
}

/// Ends a plan; also returns the credits as planned (before the plan's hand-backs).
fn end(m: &mut StorageTransferManager, handbacks: Vec<HandBack>) -> (Vec<StorageOp>, Credits) {
    let planned = m.credits().clone();
    (m.end_plan(handbacks), planned)
}

#[test]
fn planner_and_manager_agree_on_admissions_and_refusals() {
    let cfg = StorageConfig {
        operation_credits: 4,
        max_host_blocks: 6,
        ..config()
    };
    let mut m = StorageTransferManager::new(cfg);
    // Round 1: four QUERYs fit the four operation credits; the fifth is refused for
    // operation credits, an empty one for its keys.
    begin(&mut m, input(0, 0, vec![]));
    let mut planned = vec![];
    let mut leases = vec![];
    for r in 1..=4u64 {
        let n = if r == 1 { 6 } else { 2 };
        let (op, lease) = m
            .plan_query(RequestId(r), keys(&format!("r{r}-"), n), None)
            .unwrap();
        assert_eq!(lease.request(), RequestId(r));
        assert_eq!(lease.serial, r);
        planned.push(op);
        leases.push(lease);
    }
    assert_eq!(
        m.plan_query(RequestId(5), keys("r5-", 1), None),
        Err(Refusal::OperationCredits)
    );
    assert_eq!(
        m.plan_query(RequestId(6), vec![], None),
        Err(Refusal::NoKeys)
    );
    let (ops, planned_credits) = end(&mut m, vec![]);
    assert_eq!(op_ids(&ops), planned);
    assert_eq!(
        planned,
        (1..=4).map(OperationId).collect::<Vec<_>>(),
        "IDs continue from the manager's last"
    );
    for (i, op) in ops.iter().enumerate() {
        let StorageOp::Query(q) = op else {
            panic!("not a QUERY: {op:?}")
        };
        assert_eq!(q.request, Some(RequestId(i as u64 + 1)));
        assert_eq!(q.keys.len(), if i == 0 { 6 } else { 2 });
    }
    assert_eq!(
        m.credits(),
        &planned_credits,
        "same credits after the plan ends"
    );
    let s = m.stats();
    assert_eq!(
        (
            s.operation_credits_in_use,
            s.last_operation_id,
            s.pressure_bypasses
        ),
        (4, 4, 0)
    );
    assert_eq!(s.outstanding_tickets, 4);
    assert_eq!(m.last_operation_id() + 1, 5);

    // Round 2: r1..r3 answered (their credits return); r1's GET takes every Host credit,
    // so a new QUERY is refused for Host credits on both sides.
    let report = begin(
        &mut m,
        input(
            MS,
            0,
            vec![
                StorageDone::query(OperationId(1), vec![true; 6], true),
                StorageDone::query(OperationId(2), vec![false; 2], true),
                StorageDone::query(OperationId(3), vec![false; 2], true),
            ],
        ),
    );
    assert_eq!(report.effects.query_results.len(), 3);
    assert_eq!(m.credits().operations_used(), 1);
    // r2 and r3 found nothing: the scheduler hands their leases back.
    let mut leases = leases.into_iter();
    let _l1 = leases.next().unwrap();
    let handbacks = vec![
        HandBack::Detach(leases.next().unwrap()),
        HandBack::Detach(leases.next().unwrap()),
    ];
    let get = m
        .plan_get(RequestId(1), keys("r1-", 6), dests(100, 6), None)
        .unwrap();
    assert_eq!(get, OperationId(5));
    assert_eq!(m.host_credits_left(), 0);
    assert_eq!(
        m.plan_query(RequestId(7), keys("r7-", 1), None),
        Err(Refusal::HostCredits)
    );
    let (ops, planned_credits) = end(&mut m, handbacks);
    assert_eq!(op_ids(&ops), vec![OperationId(5)]);
    assert!(matches!(&ops[0], StorageOp::Get(g) if g.destinations.len() == 6));
    assert_eq!(m.credits(), &planned_credits);
    let s = m.stats();
    assert_eq!((s.operation_credits_in_use, s.host_credits_in_use), (2, 6));
    assert_eq!(s.last_operation_id, 5);

    // Round 3: pressure closes the gate; r4 (still in QUERY) is bypassed and its QUERY
    // cancelled; a new QUERY is refused for pressure (before the Host check) and counted.
    let report = begin(&mut m, input(2 * MS, 10, vec![]));
    assert!(m.gate_closed());
    assert_eq!(
        report.effects.waits_ended,
        vec![
            (RequestId(2), WaitEnd::Detached),
            (RequestId(3), WaitEnd::Detached),
            (RequestId(4), WaitEnd::Pressure)
        ],
        "last plan's hand-backs first, then this round's bypass"
    );
    assert_eq!(
        m.plan_query(RequestId(8), keys("r8-", 1), None),
        Err(Refusal::PressureClosed)
    );
    let ops = m.end_plan(vec![]);
    assert_eq!(
        ops,
        vec![StorageOp::Cancel(messages::StorageCancelOp {
            op: OperationId(4)
        })]
    );
    let s = m.stats();
    assert_eq!(
        s.pressure_bypasses, 2,
        "one bypassed wait, one refused QUERY"
    );
    assert_eq!(s.last_operation_id, 5, "a refusal takes no ID");

    // Round 4: the gate reopens, but an unretired GET quarantines the replica: both sides
    // refuse with Disabled.
    let report = begin(
        &mut m,
        input(
            3 * MS,
            0,
            vec![StorageDone::get(
                OperationId(5),
                vec![false; 6],
                vec![0; 6],
                vec![None; 6],
                false,
            )],
        ),
    );
    assert_eq!(report.effects.quarantined.len(), 6);
    assert!(!m.l3_enabled());
    assert_eq!(
        m.plan_query(RequestId(9), keys("r9-", 1), None),
        Err(Refusal::Disabled)
    );
    let ops = m.end_plan(vec![]);
    assert!(ops.is_empty());
    let s = m.stats();
    assert!(!s.l3_enabled);
    assert_eq!(s.last_operation_id, 5);
    assert_eq!(s.pressure_bypasses, 2);
}

#[test]
fn the_manager_decides_what_a_tampered_intent_could_only_claim() {
    // The scenarios of the old replay check, now decided once by the manager: the plan's
    // IDs and lease serials are the manager's next ones, and a refusal is its own.
    // The first QUERY takes operation 1 with lease serial 1 (never 2).
    let mut m = StorageTransferManager::new(config());
    begin(&mut m, input(0, 0, vec![]));
    let (op, lease) = m.plan_query(RequestId(1), keys("a", 1), None).unwrap();
    assert_eq!((op, lease.serial), (OperationId(1), 1));
    // A second QUERY of the same plan takes the next ID.
    let (op2, lease2) = m.plan_query(RequestId(2), keys("b", 1), None).unwrap();
    assert_eq!((op2, lease2.serial), (OperationId(2), 2));
    let ops = m.end_plan(vec![]);
    assert_eq!(op_ids(&ops), vec![OperationId(1), OperationId(2)]);

    // With the gate closed the QUERY is refused for pressure (not admitted, and not
    // refused for another reason such as Host credits).
    let mut m = StorageTransferManager::new(config());
    begin(&mut m, input(0, 10, vec![]));
    assert!(m.gate_closed());
    assert_eq!(
        m.plan_query(RequestId(1), keys("a", 1), None),
        Err(Refusal::PressureClosed)
    );
    assert!(m.end_plan(vec![]).is_empty());

    // A GET for a request without an answered QUERY is refused; it takes no ID.
    let mut m = StorageTransferManager::new(config());
    begin(&mut m, input(0, 0, vec![]));
    assert_eq!(
        m.plan_get(RequestId(1), keys("a", 1), dests(10, 1), None),
        Err(Refusal::NotWaiting(RequestId(1)))
    );
    // A PUT takes the manager's next ID (1, never a planner's guess).
    m.offer_backups(vec![cand("k0", 1)]);
    assert!(m.end_plan(vec![]).is_empty());
    begin(&mut m, input(MS, 0, vec![]));
    let puts = m.plan_backups_keyed(&mut |_: &StorageKey, _: HostRef| Some(HostRange::new(0, 16)));
    assert_eq!(puts, vec![OperationId(1)]);
    let ops = m.end_plan(vec![]);
    assert_eq!(op_ids(&ops), vec![OperationId(1)]);
    assert!(matches!(&ops[0], StorageOp::Put(p) if p.keys == keys("k", 1)));
}

#[test]
fn gets_after_answered_queries_commit_with_planned_ids_and_charge_host_credits() {
    let mut m = StorageTransferManager::new(config());
    begin(&mut m, input(0, 0, vec![]));
    let (q1, _l1) = m.plan_query(RequestId(1), keys("a", 3), None).unwrap();
    let (q2, _l2) = m.plan_query(RequestId(2), keys("b", 2), None).unwrap();
    m.end_plan(vec![]);

    let report = begin(
        &mut m,
        input(
            MS,
            0,
            vec![
                StorageDone::query(q1, vec![true, true, false], true),
                StorageDone::query(q2, vec![true, true], true),
            ],
        ),
    );
    let results: Vec<_> = report
        .effects
        .query_results
        .iter()
        .map(|r| (r.request, r.op, r.exists.clone()))
        .collect();
    assert_eq!(
        results,
        vec![
            (RequestId(1), q1, vec![true, true, false]),
            (RequestId(2), q2, vec![true, true]),
        ]
    );
    assert_eq!(m.wait_phase(RequestId(1)), Some(WaitPhase::QueryDone));
    assert_eq!(m.credits().operations_used(), 0, "answered QUERYs settled");
    let g1 = m
        .plan_get(RequestId(1), keys("a", 2), dests(100, 2), None)
        .unwrap();
    let g2 = m
        .plan_get(RequestId(2), keys("b", 2), dests(200, 2), None)
        .unwrap();
    assert_eq!((g1, g2), (OperationId(3), OperationId(4)));
    assert_eq!(m.host_credits_left(), 64 - 4);
    let (ops, planned_credits) = end(&mut m, vec![]);
    assert_eq!(op_ids(&ops), vec![g1, g2]);
    let StorageOp::Get(get) = &ops[0] else {
        panic!("not a GET: {:?}", ops[0]);
    };
    assert_eq!(get.request, Some(RequestId(1)));
    assert_eq!(get.keys, keys("a", 2));
    assert_eq!(
        get.destinations,
        vec![HostRange::new(0, 16), HostRange::new(16, 16)]
    );
    assert_eq!(m.credits(), &planned_credits);
    let s = m.stats();
    assert_eq!((s.operation_credits_in_use, s.host_credits_in_use), (2, 4));
    assert_eq!(m.wait_phase(RequestId(1)), Some(WaitPhase::Get(g1)));

    // The GET completes: rows publish and the Ready hold keeps the Host credits.
    let report = begin(
        &mut m,
        input(
            2 * MS,
            0,
            vec![StorageDone::get(
                g1,
                vec![true, true],
                vec![16, 16],
                vec![None, None],
                true,
            )],
        ),
    );
    let published: Vec<HostRef> = report.effects.publish.iter().map(|r| r.host).collect();
    assert_eq!(published, vec![HostRef(100), HostRef(101)]);
    assert_eq!(m.ready_refs(RequestId(1)), vec![HostRef(100), HostRef(101)]);
    assert_eq!(m.credits().hosts_used(), 4);
}

#[test]
fn handbacks_apply_after_new_operations_and_report_next_round() {
    let cfg = StorageConfig {
        operation_credits: 2,
        ..config()
    };
    let mut m = StorageTransferManager::new(cfg);
    // r1: QUERY → GET → Ready hold (one operation credit held by the GET's ticket).
    begin(&mut m, input(0, 0, vec![]));
    let (q1, l1) = m.plan_query(RequestId(1), keys("a", 2), None).unwrap();
    m.end_plan(vec![]);
    begin(
        &mut m,
        input(MS, 0, vec![StorageDone::query(q1, vec![true; 2], true)]),
    );
    let g1 = m
        .plan_get(RequestId(1), keys("a", 2), dests(100, 2), None)
        .unwrap();
    // r2: a QUERY that stays outstanding; together they use both operation credits.
    let (q2, _l2) = m.plan_query(RequestId(2), keys("b", 1), None).unwrap();
    m.end_plan(vec![]);
    let report = begin(
        &mut m,
        input(
            2 * MS,
            0,
            vec![StorageDone::get(
                g1,
                vec![true; 2],
                vec![16; 2],
                vec![None; 2],
                true,
            )],
        ),
    );
    assert_eq!(report.effects.publish.len(), 2);
    assert_eq!(m.stats().ready_holds, 1);
    assert_eq!(m.credits().operations_used(), 2);

    // The plan hands r1's Ready hold back (which frees a credit) and cancels r2 *before*
    // planning r3's QUERY: the planner saw no free credit, and neither may the manager.
    let handbacks = vec![HandBack::Detach(l1), HandBack::Cancel(RequestId(2))];
    assert_eq!(
        m.plan_query(RequestId(3), keys("c", 1), None),
        Err(Refusal::OperationCredits)
    );
    let (ops, _) = end(&mut m, handbacks);
    assert_eq!(
        ops,
        vec![StorageOp::Cancel(messages::StorageCancelOp { op: q2 })],
        "the cancel of r2's outstanding QUERY goes out when this plan ends"
    );
    let s = m.stats();
    assert_eq!(s.last_operation_id, 3, "no QUERY was issued for r3");
    assert_eq!(s.ready_holds, 0);
    assert_eq!(
        s.operation_credits_in_use, 1,
        "r2's QUERY is still in flight"
    );
    assert_eq!(s.host_credits_in_use, 0);
    assert_eq!(m.wait_phase(RequestId(1)), None);
    assert_eq!(m.wait_phase(RequestId(2)), None);

    // The hand-backs' effects arrive with the next report; the freed credit plans now.
    let report = begin(&mut m, input(3 * MS, 0, vec![]));
    assert_eq!(report.effects.release, vec![HostRef(100), HostRef(101)]);
    assert_eq!(report.effects.settled, vec![g1]);
    assert_eq!(
        report.effects.waits_ended,
        vec![(RequestId(2), WaitEnd::Detached)]
    );
    assert!(report.effects.cancels.is_empty(), "already submitted");
    let (q3, _l3) = m.plan_query(RequestId(3), keys("c", 1), None).unwrap();
    let ops = m.end_plan(vec![]);
    assert_eq!(op_ids(&ops), vec![q3]);
    assert_eq!(q3, OperationId(4));

    // The cancelled QUERY's acknowledgement settles it; nothing is published for r2.
    let report = begin(
        &mut m,
        input(
            4 * MS,
            0,
            vec![StorageDone::rejected(
                q2,
                StorageOpKind::Query,
                1,
                Rejection::Cancelled,
            )],
        ),
    );
    assert_eq!(report.effects.settled, vec![q2]);
    assert!(report.effects.query_results.is_empty());
    assert_eq!(m.stats().operation_credits_in_use, 1);
}

#[test]
fn backup_candidates_leave_the_queue_in_order_only_as_puts_carry_them() {
    // Backups may use half the Host credits: 4 of 8.
    let cfg = StorageConfig {
        operation_credits: 8,
        max_host_blocks: 8,
        backup_candidate_capacity: 4,
        ..config()
    };
    let mut m = StorageTransferManager::new(cfg);
    begin(&mut m, input(0, 0, vec![]));
    assert!(m.queued_candidate_list().is_empty());
    let (q1, _l1) = m.plan_query(RequestId(1), keys("r", 7), None).unwrap();
    m.end_plan(vec![]);
    // Six offers into a queue of four: c0 and c1 overflow; a second c3 coalesces.
    m.offer_backups(numbered_cands(6));
    m.offer_backups(vec![cand("c3", 99)]);
    assert_eq!(m.queued_candidates(), 4);

    let report = begin(
        &mut m,
        input(MS, 0, vec![StorageDone::query(q1, vec![true; 7], true)]),
    );
    assert_eq!(
        report.effects.forgotten,
        vec![HostRef(10), HostRef(11), HostRef(99)]
    );
    assert_eq!(
        m.queued_candidate_list(),
        vec![
            cand("c2", 12),
            cand("c3", 13),
            cand("c4", 14),
            cand("c5", 15)
        ],
        "oldest first; the round takes none before its PUTs do"
    );
    // A GET into 7 destinations leaves one Host credit: one PUT key fits this round.
    let g = m
        .plan_get(RequestId(1), keys("r", 7), dests(100, 7), None)
        .unwrap();
    let mut asked = vec![];
    let puts = m.plan_backups_keyed(&mut |k: &StorageKey, h: HostRef| {
        asked.push(k.clone());
        (h != HostRef(12)).then(|| HostRange::new(h.0 * 64, 64))
    });
    assert_eq!(puts, vec![OperationId(3)]);
    assert_eq!(asked, vec![key("c2"), key("c3")], "c2 evicted, c3 resident");
    let s = m.stats();
    assert_eq!(
        s.dropped_backup_keys[DropReason::Unavailable.index()],
        1,
        "unavailable 1"
    );
    assert_eq!(
        m.queued_candidate_list(),
        vec![cand("c4", 14), cand("c5", 15)],
        "no credit carried c4 and c5: never taken, still queued"
    );
    let ops = m.end_plan(vec![]);
    let kinds: Vec<String> = ops
        .iter()
        .map(|o| match o {
            StorageOp::Get(_) => "get".to_string(),
            StorageOp::Put(p) => format!("put {:?}", p.keys),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        vec!["get".to_string(), format!("put {:?}", vec![key("c3")])]
    );
    assert_eq!(op_ids(&ops), vec![g, OperationId(3)]);
    assert_eq!(m.ticket(OperationId(3)).unwrap().refs, vec![HostRef(13)]);
    let StorageOp::Put(put) = &ops[1] else {
        panic!("not a PUT: {:?}", ops[1]);
    };
    assert_eq!(put.keys, vec![key("c3")]);
    assert_eq!(put.sources, vec![HostRange::new(13 * 64, 64)]);
    let s = m.stats();
    assert_eq!(s.host_credits_in_use, 8);
    assert_eq!(
        (
            s.backup_operation_credits_in_use,
            s.backup_host_credits_in_use
        ),
        (1, 1)
    );
    assert_eq!(s.dropped_backup_keys[DropReason::Unavailable.index()], 1);
    assert_eq!(s.dropped_backup_keys[DropReason::Overflow.index()], 2);
    assert_eq!(s.coalesced_backup_keys, 1);
    assert_eq!(m.queued_candidates(), 2, "c4 and c5 still in the queue");

    // After the plan: a new candidate, and one for c3 (its PUT is pending: coalesced).
    m.offer_backups(vec![cand("c6", 16), cand("c3", 98)]);
    let report = begin(
        &mut m,
        input(
            2 * MS,
            0,
            vec![
                StorageDone::get(g, vec![false; 7], vec![0; 7], vec![None; 7], true),
                StorageDone::put(OperationId(3), vec![true], vec![64], vec![false], true),
            ],
        ),
    );
    assert_eq!(report.effects.backed_up, vec![BlockPage::from(key("c3"))]);
    assert_eq!(report.effects.forgotten, vec![HostRef(98)]);
    assert_eq!(
        m.queued_candidate_list(),
        vec![cand("c4", 14), cand("c5", 15), cand("c6", 16)],
        "the older candidates first, in their order"
    );
    let puts =
        m.plan_backups_keyed(&mut |_: &StorageKey, h: HostRef| Some(HostRange::new(h.0 * 64, 64)));
    assert_eq!(puts, vec![OperationId(4)]);
    let ops = m.end_plan(vec![]);
    assert_eq!(op_ids(&ops), vec![OperationId(4)]);
    assert!(
        matches!(&ops[0], StorageOp::Put(p) if p.keys == vec![key("c4"), key("c5"), key("c6")])
    );
    assert_eq!(m.stats().backup_host_credits_in_use, 3);
}

/// A manager whose backups may have `bytes_in_flight` outstanding, `candidates` offered
/// and a first round begun.
fn bytes_bound_manager(
    bytes_in_flight: u64,
    candidates: impl IntoIterator<Item = BackupCandidate>,
) -> StorageTransferManager {
    let cfg = StorageConfig {
        backup_bytes_in_flight: bytes_in_flight,
        ..config()
    };
    let mut m = StorageTransferManager::new(cfg);
    m.offer_backups(candidates);
    begin(&mut m, input(0, 0, vec![]));
    m
}

/// Candidates `c0`, `c1`, … of Host references 10, 11, …
fn numbered_cands(n: u64) -> impl Iterator<Item = BackupCandidate> {
    (0..n).map(|i| cand(&format!("c{i}"), 10 + i))
}

/// The residency that finds every candidate with a 64-byte page.
fn page64(_: &StorageKey, h: HostRef) -> Option<HostRange> {
    Some(HostRange::new(h.0 * 64, 64))
}

#[test]
fn backup_puts_split_by_payload_bytes_and_wait_while_the_bound_is_outstanding() {
    // 384 bytes in flight: a PUT takes 64-byte pages until it carries 96 (two pages), and
    // a new one is admitted only while less than 384 is outstanding. The operation credits
    // would allow four backup PUTs: the bytes bound three.
    let mut m = bytes_bound_manager(384, numbered_cands(16));
    let puts = m.plan_backups_keyed(&mut page64);
    assert_eq!(puts.len(), 3);
    let ops = m.end_plan(vec![]);
    let sizes: Vec<usize> = ops
        .iter()
        .map(|o| match o {
            StorageOp::Put(p) => p.keys.len(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(sizes, vec![2, 2, 2]);
    assert!(matches!(&ops[0], StorageOp::Put(p) if p.keys == vec![key("c0"), key("c1")]));
    assert_eq!(
        m.queued_candidates(),
        10,
        "the rest wait in the queue, in order"
    );
    // A later round with nothing settled admits nothing more.
    begin(&mut m, input(MS, 0, vec![]));
    assert!(m.plan_backups_keyed(&mut page64).is_empty());
    m.end_plan(vec![]);
    // One PUT settles: room for exactly one more, the next candidates in order.
    begin(
        &mut m,
        input(
            2 * MS,
            0,
            vec![StorageDone::put(
                puts[0],
                vec![true; 2],
                vec![64; 2],
                vec![false; 2],
                true,
            )],
        ),
    );
    let more = m.plan_backups_keyed(&mut page64);
    assert_eq!(more.len(), 1);
    let ops = m.end_plan(vec![]);
    assert!(matches!(&ops[0], StorageOp::Put(p) if p.keys == vec![key("c6"), key("c7")]));
    assert_eq!(m.queued_candidates(), 8);
    let s = m.stats();
    assert!(
        s.dropped_backup_keys.iter().all(|n| *n == 0),
        "waiting is not dropping: {:?}",
        s.dropped_backup_keys
    );
}

#[test]
fn a_backup_put_whose_pages_reach_a_quarter_of_the_bound_exactly_takes_no_further_key() {
    // 512 bytes in flight: a PUT carries up to a quarter, 128. Two 64-byte pages land on
    // it exactly, so the PUT is full there: the third page starts the next PUT.
    let mut m = bytes_bound_manager(512, numbered_cands(4));
    let puts = m.plan_backups_keyed(&mut page64);
    assert_eq!(puts.len(), 2);
    let ops = m.end_plan(vec![]);
    assert!(matches!(&ops[0], StorageOp::Put(p) if p.keys == vec![key("c0"), key("c1")]));
    assert!(matches!(&ops[1], StorageOp::Put(p) if p.keys == vec![key("c2"), key("c3")]));
    assert_eq!(m.queued_candidates(), 0);
}

#[test]
fn one_backup_page_larger_than_the_bound_still_goes_alone() {
    let mut m = bytes_bound_manager(16, vec![cand("a", 1), cand("b", 2)]);
    let puts = m.plan_backups_keyed(&mut page64);
    assert_eq!(puts.len(), 1);
    let ops = m.end_plan(vec![]);
    assert!(matches!(&ops[0], StorageOp::Put(p) if p.keys == vec![key("a")]));
    assert_eq!(m.queued_candidates(), 1);
}

#[test]
fn closed_gate_offers_no_candidates_and_dispatches_nothing() {
    let mut m = StorageTransferManager::new(config());
    m.offer_backups(vec![cand("a", 1), cand("b", 2)]);
    let report = begin(&mut m, input(0, 10, vec![]));
    assert!(m.queued_candidate_list().is_empty());
    assert_eq!(report.effects.forgotten, vec![HostRef(1), HostRef(2)]);
    let puts = m.plan_backups_keyed(&mut |_: &StorageKey, _: HostRef| -> Option<HostRange> {
        panic!("no residency check with the gate closed")
    });
    assert!(puts.is_empty());
    assert!(m.end_plan(vec![]).is_empty());
    assert_eq!(
        m.stats().dropped_backup_keys[DropReason::Pressure.index()],
        2
    );
}

// ----- property test -------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Step {
    /// QUERYs for `n` fresh requests of `keys` keys each (0 keys: refused).
    Queries { n: usize, keys: usize },
    /// GETs for answered requests (picked), `keys` rows each.
    Gets { pick: usize, keys: usize },
    /// Complete an outstanding ticket with an outcome.
    Complete { pick: usize, outcome: u8 },
    /// The next round's pressure.
    Pressure { jobs: u64 },
    /// Advance the next round's tick.
    Tick { ms: u64 },
    /// Offer candidates (some keys repeat).
    Offer { first: u64, n: u64 },
    /// Dispatch PUTs; bit i of the mask evicts the i-th candidate asked.
    Dispatch { evict: u8 },
    /// Hand back a lease, or cancel a request.
    Handback { pick: usize, cancel: bool },
    /// Run the round (begin_round … end_plan).
    Round,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1usize..4, 0usize..5).prop_map(|(n, keys)| Step::Queries { n, keys }),
        4 => (0usize..8, 1usize..4).prop_map(|(pick, keys)| Step::Gets { pick, keys }),
        4 => (0usize..8, 0u8..10).prop_map(|(pick, outcome)| Step::Complete { pick, outcome }),
        1 => prop_oneof![Just(0u64), Just(3), Just(7), Just(12)].prop_map(|jobs| Step::Pressure { jobs }),
        2 => (0u64..70).prop_map(|ms| Step::Tick { ms }),
        2 => (0u64..8, 1u64..5).prop_map(|(first, n)| Step::Offer { first, n }),
        2 => any::<u8>().prop_map(|evict| Step::Dispatch { evict }),
        2 => (0usize..8, any::<bool>()).prop_map(|(pick, cancel)| Step::Handback { pick, cancel }),
        4 => Just(Step::Round),
    ]
}

/// What the test's executor owes: issued operations not yet completed.
#[derive(Debug)]
struct Owed {
    kind: StorageOpKind,
    keys: usize,
}

struct Sim {
    m: StorageTransferManager,
    tick_us: u64,
    jobs: u64,
    next_request: u64,
    next_host: u64,
    owed: BTreeMap<OperationId, Owed>,
    pending_done: Vec<StorageDone>,
    answered: BTreeSet<RequestId>,
    leases: BTreeMap<RequestId, StorageLease>,
    issued: Vec<OperationId>,
}

impl Sim {
    fn new() -> Self {
        let cfg = StorageConfig {
            operation_credits: 3,
            max_host_blocks: 6,
            max_keys_per_operation: 4,
            backup_candidate_capacity: 4,
            backup_bytes_in_flight: 1 << 40,
            ..config()
        };
        Self {
            m: StorageTransferManager::new(cfg),
            tick_us: 0,
            jobs: 0,
            next_request: 0,
            next_host: 1000,
            owed: BTreeMap::new(),
            pending_done: vec![],
            answered: BTreeSet::new(),
            leases: BTreeMap::new(),
            issued: vec![],
        }
    }

    fn done_for(op: OperationId, o: &Owed, outcome: u8) -> StorageDone {
        let n = o.keys;
        let bits: Vec<bool> = (0..n)
            .map(|i| (outcome as usize + i).is_multiple_of(2))
            .collect();
        match (o.kind, outcome) {
            (_, 0) => StorageDone::rejected(op, o.kind, n, Rejection::Cancelled),
            (_, 1) => StorageDone::failed(op, o.kind, n, true, "backend"),
            (StorageOpKind::Get, 2) => StorageDone::get(
                op,
                vec![false; n],
                vec![0; n],
                vec![Some(ObjectFailure::Missing); n],
                true,
            ),
            (StorageOpKind::Get, 9) => {
                StorageDone::get(op, vec![true; n], vec![16; n], vec![None; n], false)
            }
            (StorageOpKind::Query, _) => StorageDone::query(op, bits, true),
            (StorageOpKind::Get, _) => {
                StorageDone::get(op, bits.clone(), vec![16; n], vec![None; n], true)
            }
            (StorageOpKind::Put, _) => {
                StorageDone::put(op, bits.clone(), vec![16; n], vec![false; n], true)
            }
        }
    }

    /// One round: begin_round with the queued completions, the plan built by `plan`, the
    /// plan's end; checks the invariants.
    fn round(&mut self, steps: &[Step]) -> Result<(), TestCaseError> {
        let done = std::mem::take(&mut self.pending_done);
        let report = self
            .m
            .begin_round(input(self.tick_us, self.jobs, done))
            .map_err(|e| TestCaseError::fail(format!("begin_round: {e:?}")))?;
        for r in &report.effects.query_results {
            self.answered.insert(r.request);
        }
        for (r, _) in &report.effects.waits_ended {
            self.answered.remove(r);
        }
        self.answered
            .retain(|r| self.m.wait_phase(*r) == Some(WaitPhase::QueryDone));
        let mut planned: Vec<OperationId> = vec![];
        let mut handbacks: Vec<HandBack> = vec![];
        for s in steps {
            match s {
                Step::Queries { n, keys: k } => {
                    for _ in 0..*n {
                        self.next_request += 1;
                        let r = RequestId(self.next_request);
                        let ks = keys(&format!("q{}-", r.0), *k);
                        if let Ok((op, lease)) = self.m.plan_query(r, ks, None) {
                            planned.push(op);
                            self.leases.insert(r, lease);
                        }
                    }
                }
                Step::Gets { pick, keys: k } => {
                    if self.answered.is_empty() {
                        continue;
                    }
                    let r = *self
                        .answered
                        .iter()
                        .nth(pick % self.answered.len())
                        .unwrap();
                    self.answered.remove(&r);
                    let d = dests(self.next_host, *k);
                    self.next_host += *k as u64;
                    if let Ok(op) = self.m.plan_get(r, keys(&format!("g{}-", r.0), *k), d, None) {
                        planned.push(op);
                    }
                }
                Step::Dispatch { evict } => {
                    let mut i = 0u32;
                    let mut residency = |_: &StorageKey, h: HostRef| {
                        i += 1;
                        ((evict >> (i % 8)) & 1 == 0).then(|| HostRange::new(h.0 * 16, 16))
                    };
                    planned.extend(self.m.plan_backups_keyed(&mut residency));
                }
                Step::Handback { pick, cancel } => {
                    if self.leases.is_empty() {
                        continue;
                    }
                    let r = *self.leases.keys().nth(pick % self.leases.len()).unwrap();
                    let lease = self.leases.remove(&r).unwrap();
                    self.answered.remove(&r);
                    if *cancel {
                        let _ = lease; // a cancel needs no lease
                        handbacks.push(HandBack::Cancel(r));
                    } else {
                        handbacks.push(HandBack::Detach(lease));
                    }
                }
                _ => {}
            }
        }
        let planned_credits = self.m.credits().clone();
        let handed_back = !handbacks.is_empty();
        let ops = self.m.end_plan(handbacks);
        let new: Vec<OperationId> = ops
            .iter()
            .filter(|o| !matches!(o, StorageOp::Cancel(_)))
            .map(|o| o.id())
            .collect();
        prop_assert_eq!(
            &new,
            &planned,
            "the plan's operations are its decisions, in order"
        );
        for op in &new {
            if let Some(last) = self.issued.last() {
                prop_assert!(op > last, "IDs increase: {} after {}", op, last);
            }
            self.issued.push(*op);
        }
        for o in &ops {
            match o {
                StorageOp::Query(q) => {
                    self.owed.insert(
                        q.op,
                        Owed {
                            kind: StorageOpKind::Query,
                            keys: q.keys.len(),
                        },
                    );
                }
                StorageOp::Get(g) => {
                    self.owed.insert(
                        g.op,
                        Owed {
                            kind: StorageOpKind::Get,
                            keys: g.keys.len(),
                        },
                    );
                }
                StorageOp::Put(put) => {
                    self.owed.insert(
                        put.op,
                        Owed {
                            kind: StorageOpKind::Put,
                            keys: put.keys.len(),
                        },
                    );
                }
                StorageOp::Cancel(c) => {
                    prop_assert!(self.issued.contains(&c.op), "cancel of unknown {}", c.op);
                }
            }
        }
        if !handed_back {
            prop_assert_eq!(self.m.credits(), &planned_credits);
        }
        let c = self.m.credits();
        prop_assert!(c.operations_used() <= c.operation_total());
        prop_assert!(c.hosts_used() <= c.host_total());
        prop_assert!(c.backup_operations_used() <= c.backup_operation_max());
        prop_assert!(c.backup_hosts_used() <= c.backup_host_max());
        prop_assert!(c.backup_hosts_used() <= c.host_total() / 2);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn planned_rounds_emit_their_decisions_in_plan_order(steps in prop::collection::vec(step(), 1..80)) {
        let mut sim = Sim::new();
        let mut round: Vec<Step> = vec![];
        let mut offered = 0u64;
        for s in steps {
            match s {
                Step::Round => {
                    let plan = std::mem::take(&mut round);
                    sim.round(&plan)?;
                }
                Step::Complete { pick, outcome } => {
                    if sim.owed.is_empty() {
                        continue;
                    }
                    let op = *sim.owed.keys().nth(pick % sim.owed.len()).unwrap();
                    let o = sim.owed.remove(&op).unwrap();
                    sim.pending_done.push(Sim::done_for(op, &o, outcome));
                }
                Step::Pressure { jobs } => sim.jobs = jobs,
                Step::Tick { ms } => sim.tick_us += ms * MS,
                Step::Offer { first, n } => {
                    let cands: Vec<_> = (first..first + n)
                        .map(|k| {
                            offered += 1;
                            cand(&format!("b{k}"), 1_000_000 + offered)
                        })
                        .collect();
                    sim.m.offer_backups(cands);
                }
                other => round.push(other),
            }
        }
        sim.round(&round)?;
        // Drain: answer everything (retired), reopen the gate, let Ready holds expire.
        sim.jobs = 0;
        for _ in 0..4 {
            let owed = std::mem::take(&mut sim.owed);
            for (op, o) in owed {
                sim.pending_done.push(Sim::done_for(op, &o, 3));
            }
            sim.tick_us += 1_000 * MS;
            sim.round(&[])?;
        }
        let s = sim.m.stats();
        let ids: BTreeSet<OperationId> = sim.issued.iter().copied().collect();
        prop_assert_eq!(ids.len(), sim.issued.len(), "every issued ID is unique");
        prop_assert_eq!(s.last_operation_id, sim.issued.last().map_or(0, |o| o.0));
        if s.quarantined_refs == 0 {
            prop_assert_eq!(s.outstanding_tickets, 0);
            prop_assert_eq!(s.operation_credits_in_use, 0);
            prop_assert_eq!(s.host_credits_in_use, 0);
        }
    }
}
