//! Agreement as pure logic: per-operation agreement with retained partial records, key-wise
//! AND/OR reductions, the tick and pressure, and protocol errors raised identically on
//! every rank.

use actors::control_plane::{seal_local_report, Agreement};
use messages::{
    AdminCommand, ControlError, FrontendMessage, ObjectFailure, OperationId, PressureObservation,
    Rejection, RequestId, RoundReport, StorageDone, StorageOpKind,
};

fn op(n: u64) -> OperationId {
    OperationId(n)
}

fn q(n: u64, keys: usize) -> StorageDone {
    StorageDone::query(op(n), vec![true; keys], true)
}

fn report(rank: u32, round: u64, completions: Vec<StorageDone>) -> RoundReport {
    let mut r = RoundReport::idle(rank, round, 1_000 * (round + 1) + rank as u64);
    r.completions = completions;
    r
}

fn ops(a: &messages::AgreedRound) -> Vec<u64> {
    a.completions.iter().map(|d| d.op.0).collect()
}

#[test]
fn out_of_order_owner_completion_agrees_per_operation() {
    let mut ag = Agreement::new(2);
    // Rank 1 finishes op 7 before op 3; rank 0 the reverse.
    let a = ag
        .agree(vec![
            report(0, 0, vec![q(3, 2)]),
            report(1, 0, vec![q(7, 2)]),
        ])
        .unwrap();
    assert!(a.completions.is_empty());
    assert_eq!(ag.pending_operations(), vec![op(3), op(7)]);
    let a = ag
        .agree(vec![
            report(0, 1, vec![q(7, 2)]),
            report(1, 1, vec![q(3, 2)]),
        ])
        .unwrap();
    assert_eq!(ops(&a), vec![3, 7], "agreed, ordered by OperationId");
    assert!(ag.pending_operations().is_empty());
}

#[test]
fn a_slow_earlier_operation_never_blocks_a_later_complete_one() {
    let mut ag = Agreement::new(3);
    let a = ag
        .agree(vec![
            report(0, 5, vec![q(1, 1), q(2, 1)]),
            report(1, 5, vec![q(2, 1)]),
            report(2, 5, vec![q(2, 1), q(1, 1)]),
        ])
        .unwrap();
    assert_eq!(ops(&a), vec![2]);
    assert_eq!(ag.pending_operations(), vec![op(1)]);
    // Partial records of op 1 are retained across idle rounds.
    for round in 6..9 {
        let a = ag
            .agree(vec![
                report(0, round, vec![]),
                report(1, round, vec![]),
                report(2, round, vec![]),
            ])
            .unwrap();
        assert!(a.completions.is_empty());
        assert_eq!(ag.pending_operations(), vec![op(1)]);
    }
    let a = ag
        .agree(vec![
            report(0, 9, vec![]),
            report(1, 9, vec![q(1, 1)]),
            report(2, 9, vec![]),
        ])
        .unwrap();
    assert_eq!(ops(&a), vec![1]);
}

#[test]
fn per_key_success_and_retirement_and_reduce_failures_or_reduce() {
    let mut ag = Agreement::new(3);
    let r0 = StorageDone::get(
        op(4),
        vec![true, true, false, true, false],
        vec![10, 10, 0, 10, 0],
        vec![
            None,
            None,
            Some(ObjectFailure::Missing),
            None,
            Some(ObjectFailure::Missing),
        ],
        true,
    );
    let r1 = StorageDone::get(
        op(4),
        vec![true, false, true, true, false],
        vec![5, 0, 5, 5, 0],
        vec![
            None,
            Some(ObjectFailure::Invalid),
            None,
            None,
            Some(ObjectFailure::Invalid),
        ],
        false,
    );
    // Rank 2 owns none of these rows: success, no bytes, no failure evidence.
    let r2 = StorageDone::get(op(4), vec![true; 5], vec![0; 5], vec![None; 5], true);
    let a = ag
        .agree(vec![
            report(0, 0, vec![r0]),
            report(1, 0, vec![r1]),
            report(2, 0, vec![r2]),
        ])
        .unwrap();
    let d = &a.completions[0];
    assert_eq!(d.kind, StorageOpKind::Get);
    assert_eq!(d.success, vec![true, false, false, true, false]);
    assert_eq!(
        d.failures,
        vec![
            None,
            Some(ObjectFailure::Invalid),
            Some(ObjectFailure::Missing),
            None,
            Some(ObjectFailure::Invalid)
        ]
    );
    assert_eq!(d.bytes, vec![15, 10, 5, 15, 0]);
    assert!(!d.retired, "retirement is an operation-wide AND");
    assert!(!d.fully_succeeded());
    d.validate().unwrap();
}

#[test]
fn a_non_owner_contributes_no_failure_evidence_and_all_success_publishes() {
    let mut ag = Agreement::new(2);
    let r0 = StorageDone::get(op(1), vec![true, true], vec![8, 0], vec![None, None], true);
    let r1 = StorageDone::get(op(1), vec![true, true], vec![0, 8], vec![None, None], true);
    let a = ag
        .agree(vec![report(0, 0, vec![r0]), report(1, 0, vec![r1])])
        .unwrap();
    let d = &a.completions[0];
    assert!(d.fully_succeeded());
    assert_eq!(d.bytes, vec![8, 8]);
    assert_eq!(d.failures, vec![None, None]);
}

#[test]
fn put_capacity_is_or_reduced_and_rejection_needs_every_owner() {
    let mut ag = Agreement::new(2);
    let p0 = StorageDone::put(
        op(1),
        vec![true, false],
        vec![4, 0],
        vec![false, true],
        true,
    );
    let p1 = StorageDone::put(
        op(1),
        vec![true, true],
        vec![4, 4],
        vec![false, false],
        true,
    );
    let all_rej = |n| StorageDone::rejected(op(n), StorageOpKind::Query, 2, Rejection::QueueFull);
    let one_rej = StorageDone::rejected(op(3), StorageOpKind::Query, 2, Rejection::Unhealthy);
    let ok3 = StorageDone::query(op(3), vec![true, true], true);
    let a = ag
        .agree(vec![
            report(0, 0, vec![p0, all_rej(2), one_rej]),
            report(1, 0, vec![p1, all_rej(2), ok3]),
        ])
        .unwrap();
    assert_eq!(ops(&a), vec![1, 2, 3]);
    assert_eq!(a.completions[0].capacity, vec![false, true]);
    assert_eq!(a.completions[0].success, vec![true, false]);
    assert_eq!(a.completions[1].rejection, Some(Rejection::QueueFull));
    assert_eq!(a.completions[2].rejection, None);
    assert_eq!(a.completions[2].success, vec![false, false]);
    let err = a.completions[2].error.clone().unwrap();
    assert!(err.contains("rank 0") && err.contains("unhealthy"), "{err}");
    for d in &a.completions {
        d.validate().unwrap();
    }
}

#[test]
fn tick_is_the_leaders_clock_and_pressure_is_max_every_round() {
    let mut ag = Agreement::new(3);
    for round in 0..4u64 {
        let mut rs: Vec<RoundReport> = (0..3).map(|r| RoundReport::idle(r, round, 0)).collect();
        rs[0].clock_us = 100 + round;
        rs[1].clock_us = 999_999; // another rank's clock never becomes the tick
        rs[2].clock_us = 1;
        rs[0].pressure = PressureObservation {
            queued_jobs: 1,
            queued_bytes: 50,
            oldest_age_us: 3,
        };
        rs[1].pressure = PressureObservation {
            queued_jobs: 7,
            queued_bytes: 0,
            oldest_age_us: 2,
        };
        rs[2].pressure = PressureObservation {
            queued_jobs: 0,
            queued_bytes: 9,
            oldest_age_us: 30,
        };
        rs[0].frontend.push(FrontendMessage::Cancel {
            id: RequestId(round),
        });
        rs.reverse(); // arrival order does not matter
        let a = ag.agree(rs).unwrap();
        assert_eq!(a.round, round);
        assert_eq!(a.tick_us, 100 + round);
        assert_eq!(
            a.pressure,
            PressureObservation {
                queued_jobs: 7,
                queued_bytes: 50,
                oldest_age_us: 30
            }
        );
        assert_eq!(
            a.frontend,
            vec![FrontendMessage::Cancel {
                id: RequestId(round)
            }]
        );
        assert!(a.completions.is_empty());
    }
}

/// Feeds the same reports to one Agreement per rank and returns every rank's error.
fn every_rank_raises(world: u32, prior: &[Vec<RoundReport>], bad: Vec<RoundReport>) -> Vec<String> {
    (0..world)
        .map(|_| {
            let mut ag = Agreement::new(world);
            for p in prior {
                ag.agree(p.clone()).unwrap();
            }
            match ag.agree(bad.clone()) {
                Err(e @ ControlError::Protocol { .. }) => e.to_string(),
                other => panic!("expected a protocol error, got {other:?}"),
            }
        })
        .collect()
}

fn assert_same(errs: &[String], needle: &str) {
    assert!(errs.iter().all(|e| e == &errs[0]), "{errs:?}");
    assert!(errs[0].contains(needle), "{} lacks {needle}", errs[0]);
}

#[test]
fn an_invalid_report_makes_every_rank_raise_the_same_error() {
    // An invalid local record becomes the report's error before the exchange.
    let mut bad = StorageDone::get(op(2), vec![true], vec![1], vec![None], true);
    bad.bytes.push(3);
    let sealed = seal_local_report(report(1, 0, vec![q(1, 1), bad]));
    assert!(sealed.completions.is_empty());
    assert!(sealed
        .error
        .as_deref()
        .unwrap()
        .contains("differ in length"));
    let errs = every_rank_raises(
        3,
        &[],
        vec![report(0, 0, vec![q(1, 1)]), sealed, report(2, 0, vec![])],
    );
    assert_same(&errs, "rank 1 reported an invalid poll");

    // A peer record that fails validation (a peer that skipped sealing).
    let mut q_fail = q(5, 1);
    q_fail.failures[0] = Some(ObjectFailure::Missing);
    q_fail.success[0] = false;
    let errs = every_rank_raises(
        2,
        &[],
        vec![report(0, 0, vec![]), report(1, 0, vec![q_fail])],
    );
    assert_same(&errs, "query cannot report read failures");

    // Mismatched key counts for one operation, in one round and across rounds.
    let errs = every_rank_raises(
        2,
        &[],
        vec![report(0, 0, vec![q(1, 2)]), report(1, 0, vec![q(1, 3)])],
    );
    assert_same(&errs, "rank 1 reports 3 keys for op1 but another owner 2");
    let prior = vec![vec![report(0, 0, vec![q(1, 2)]), report(1, 0, vec![])]];
    let errs = every_rank_raises(
        2,
        &prior,
        vec![report(0, 1, vec![]), report(1, 1, vec![q(1, 4)])],
    );
    assert_same(&errs, "4 keys for op1");

    // Duplicate op from one owner: in one report, across rounds, after agreement.
    let errs = every_rank_raises(
        2,
        &[],
        vec![report(0, 0, vec![q(1, 1), q(1, 1)]), report(1, 0, vec![])],
    );
    assert_same(&errs, "rank 0 sent op1 twice");
    let errs = every_rank_raises(
        2,
        &prior,
        vec![report(0, 1, vec![q(1, 2)]), report(1, 1, vec![])],
    );
    assert_same(&errs, "rank 0 sent op1 twice");
    let agreed = vec![vec![
        report(0, 0, vec![q(1, 1)]),
        report(1, 0, vec![q(1, 1)]),
    ]];
    let errs = every_rank_raises(
        2,
        &agreed,
        vec![report(0, 1, vec![]), report(1, 1, vec![q(1, 1)])],
    );
    assert_same(&errs, "after it was agreed");

    // Kind mismatch, frontend messages from a non-leader, a skipped round.
    let g = StorageDone::get(op(1), vec![true], vec![1], vec![None], true);
    let errs = every_rank_raises(
        2,
        &[],
        vec![report(0, 0, vec![q(1, 1)]), report(1, 0, vec![g])],
    );
    assert_same(&errs, "as get but another owner as query");
    let mut r1 = report(1, 0, vec![]);
    r1.frontend
        .push(FrontendMessage::Admin(AdminCommand::ClearCache));
    let errs = every_rank_raises(2, &[], vec![report(0, 0, vec![]), r1]);
    assert_same(&errs, "rank 1 is not the leader");
    let idle0 = vec![vec![report(0, 0, vec![]), report(1, 0, vec![])]];
    let errs = every_rank_raises(2, &idle0, vec![report(0, 2, vec![]), report(1, 2, vec![])]);
    assert_same(&errs, "round 2 follows round 0");
}

proptest::proptest! {
    /// Random valid owner records of one GET always agree into a valid record whose per-key
    /// success is the AND and whose failure is set exactly when some owner confirmed one.
    #[test]
    fn random_owner_records_reduce_to_a_valid_record(
        rows in proptest::collection::vec(proptest::collection::vec(0u8..4, 1..6), 1..5),
        keys in 1usize..6,
    ) {
        let world = rows.len() as u32;
        let recs: Vec<StorageDone> = rows
            .iter()
            .map(|r| {
                let cell = |i: usize| r.get(i % r.len()).copied().unwrap_or(0);
                let success: Vec<bool> = (0..keys).map(|i| cell(i) == 0).collect();
                let failures = (0..keys)
                    .map(|i| match cell(i) {
                        2 => Some(ObjectFailure::Missing),
                        3 => Some(ObjectFailure::Invalid),
                        _ => None,
                    })
                    .collect();
                StorageDone::get(op(1), success, vec![0; keys], failures, true)
            })
            .collect();
        let mut ag = Agreement::new(world);
        let reports: Vec<RoundReport> = recs
            .iter()
            .enumerate()
            .map(|(r, d)| report(r as u32, 0, vec![d.clone()]))
            .collect();
        let a = ag.agree(reports).unwrap();
        let d = &a.completions[0];
        proptest::prop_assert!(d.validate().is_ok());
        for i in 0..keys {
            proptest::prop_assert_eq!(d.success[i], recs.iter().all(|r| r.success[i]));
            proptest::prop_assert_eq!(d.failures[i].is_some(), recs.iter().any(|r| r.failures[i].is_some()));
        }
    }
}
