//! Determinism of the RoundPipeline (Scheduler apply and plan, asking the one decider): two
//! pipelines built from identical configurations and fed the same agreed inputs plan the
//! same rounds, byte for byte, and at quiescence hold no storage tickets, credits or cache
//! references. The executor here is a deterministic function of the committed plan: no
//! clock, no I/O, no threads.

use crate::engine::pipeline::{RoundPipeline, RoundPlan};
use crate::model::{RankDigest, SyntheticModel};
use crate::scheduler::geometry::RankLayout;
use crate::scheduler::{AgreedInputs, RequestEvent, Scheduler, SchedulerConfig};
use crate::storage_transfer::{ClearKind, DropReason};
use messages::settings::{PressureWatermark, StorageConfig};
use messages::{
    Namespace, OperationId, PressureObservation, Rejection, RequestId, StorageDone, StorageOp,
    StorageOpKind,
};
use std::collections::BTreeMap;

const ROUND_US: u64 = 10_000;
const PROMPT: usize = 32;

fn storage_config() -> StorageConfig {
    StorageConfig {
        operation_credits: 8,
        max_host_blocks: 128,
        max_keys_per_operation: 8,
        lookahead_tokens: 4096,
        negative_metadata_capacity: 64,
        backup_candidate_capacity: 64,
        backup_bytes_in_flight: 1 << 40,
        // Three rounds: a QUERY withheld for five rounds times out.
        soft_deadline_ms: 30,
        ready_hold_ms: 30,
        min_extension_tokens: 1,
        pressure_high: PressureWatermark {
            queued_jobs: 1_000,
            queued_bytes: 1 << 40,
            oldest_age_ms: 1 << 20,
        },
        pressure_low: PressureWatermark {
            queued_jobs: 500,
            queued_bytes: 1 << 39,
            oldest_age_ms: 1 << 19,
        },
    }
}

fn pipeline() -> RoundPipeline {
    let model = SyntheticModel::by_name("tiny").unwrap();
    let max_running = 2usize;
    let groups = model.profile().groups.len() as u32;
    let layout =
        RankLayout::new(model.profile(), 0, 1, 64, 256, max_running as u32 * groups).unwrap();
    let scheduler = Scheduler::new(
        SchedulerConfig {
            layout,
            namespace: Namespace("tsl3-00000000pipetests".into()),
            storage: Some(storage_config()),
            max_running,
            tail_capacity: 1024,
        },
        model,
    )
    .unwrap();
    RoundPipeline::new(scheduler)
}

/// Prompts of two families sharing their first 24 tokens; the tails differ per request.
fn prompt(id: u64, vocab: u32) -> Vec<u32> {
    let family = id % 2;
    (0..PROMPT as u64)
        .map(|j| {
            let seed = if j < 24 {
                family * 1_000 + j
            } else {
                id * 7_919 + j
            };
            ((seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 23) % vocab as u64) as u32
        })
        .collect()
}

/// What the synthetic executor owes: the answer and the round it is due.
struct Owed {
    due: u64,
    done: StorageDone,
}

/// A deterministic executor: QUERYs answer 'exists' for the first half of their keys
/// (every fifth QUERY is withheld past the soft deadline), GETs and PUTs succeed, a
/// cancelled read is acknowledged as rejected the round after its CANCEL.
#[derive(Default)]
struct Executor {
    owed: BTreeMap<OperationId, Owed>,
    digests: Vec<(RequestId, Vec<RankDigest>)>,
}

impl Executor {
    fn take(&mut self, round: u64, plan: &RoundPlan) {
        for op in &plan.storage {
            match op {
                StorageOp::Query(q) => {
                    let n = q.keys.len();
                    let exists = (0..n).map(|i| i < n / 2).collect();
                    let due = if q.op.0 % 5 == 0 {
                        round + 6
                    } else {
                        round + 1
                    };
                    self.owed.insert(
                        q.op,
                        Owed {
                            due,
                            done: StorageDone::query(q.op, exists, true),
                        },
                    );
                }
                StorageOp::Get(g) => {
                    let n = g.keys.len();
                    let lens = g.destinations.iter().map(|d| d.len).collect();
                    self.owed.insert(
                        g.op,
                        Owed {
                            due: round + 1,
                            done: StorageDone::get(g.op, vec![true; n], lens, vec![None; n], true),
                        },
                    );
                }
                StorageOp::Put(p) => {
                    let n = p.keys.len();
                    let lens = p.sources.iter().map(|s| s.len).collect();
                    self.owed.insert(
                        p.op,
                        Owed {
                            due: round + 1,
                            done: StorageDone::put(p.op, vec![true; n], lens, vec![false; n], true),
                        },
                    );
                }
                StorageOp::Cancel(c) => {
                    if let Some(o) = self.owed.get_mut(&c.op) {
                        let kind = o.done.kind;
                        if kind != StorageOpKind::Put {
                            o.done = StorageDone::rejected(
                                c.op,
                                kind,
                                o.done.len(),
                                Rejection::Cancelled,
                            );
                            o.due = round + 1;
                        }
                    }
                }
            }
        }
        for (id, step) in &plan.forwards {
            self.digests.push((
                *id,
                vec![RankDigest {
                    shard: step.shard,
                    tokens: step.tokens.len() as u64,
                    value: id.0,
                }],
            ));
        }
    }

    fn completions(&mut self, round: u64) -> Vec<StorageDone> {
        let due: Vec<OperationId> = self
            .owed
            .iter()
            .filter(|(_, o)| o.due <= round)
            .map(|(op, _)| *op)
            .collect();
        due.into_iter()
            .filter_map(|op| self.owed.remove(&op).map(|o| o.done))
            .collect()
    }
}

/// The agreed inputs of round `round`: arrivals in the first rounds, a few cancellations,
/// two rounds of pressure above the high watermark.
fn inputs(round: u64, exec: &mut Executor, vocab: u32) -> AgreedInputs {
    let mut new_requests = vec![];
    if round < 8 {
        for k in 0..2 {
            let id = round * 2 + k + 1;
            new_requests.push((RequestId(id), prompt(id, vocab), 2 + (id % 3) as u32).into());
        }
    }
    let cancellations = match round {
        3 => vec![RequestId(5)],
        6 => vec![RequestId(9), RequestId(2)],
        9 => vec![RequestId(14)],
        _ => vec![],
    };
    AgreedInputs {
        tick_us: (round + 1) * ROUND_US,
        pressure: PressureObservation {
            // The pressure gate closes for rounds 4 and 5 (high watermark 1000 jobs).
            queued_jobs: if (4..6).contains(&round) { 2_000 } else { 0 },
            ..PressureObservation::default()
        },
        new_requests,
        cancellations,
        completions: exec.completions(round),
        digests: std::mem::take(&mut exec.digests),
        logprobs: vec![],
    }
}

#[derive(Default, Debug)]
struct Seen {
    kinds: BTreeMap<&'static str, u64>,
    h2d: usize,
    d2h: usize,
    forwards: usize,
}

fn kind(op: &StorageOp) -> &'static str {
    match op {
        StorageOp::Query(_) => "query",
        StorageOp::Get(_) => "get",
        StorageOp::Put(_) => "put",
        StorageOp::Cancel(_) => "cancel",
    }
}

#[test]
fn identical_pipelines_plan_identical_rounds_and_quiesce_without_leaks() {
    let mut a = pipeline();
    let mut b = pipeline();
    let vocab = a.scheduler().model().profile().vocab;
    let mut exec = Executor::default();
    let mut seen = Seen::default();
    let mut last_id = 0u64;
    let mut round = 0u64;
    let mut quiet = 0;
    while quiet < 3 {
        assert!(round < 300, "the trace never quiesced: {seen:?}");
        let agreed = inputs(round, &mut exec, vocab);
        let pa = a.round(agreed.clone()).unwrap();
        let pb = b.round(agreed).unwrap();
        assert_eq!(pa.storage, pb.storage, "round {round}: storage operations");
        assert_eq!(pa.h2d, pb.h2d, "round {round}: H2D copies");
        assert_eq!(pa.d2h, pb.d2h, "round {round}: D2H copies");
        assert_eq!(pa.forwards, pb.forwards, "round {round}: forwards");
        assert_eq!(
            a.scheduler_mut().drain_events(),
            b.scheduler_mut().drain_events(),
            "round {round}: request events"
        );
        a.d2h_done();
        b.d2h_done();
        assert_eq!(a.stm().unwrap().stats(), b.stm().unwrap().stats());
        for op in &pa.storage {
            *seen.kinds.entry(kind(op)).or_default() += 1;
            if !matches!(op, StorageOp::Cancel(_)) {
                assert!(op.id().0 > last_id, "round {round}: IDs increase");
                last_id = op.id().0;
            }
        }
        seen.h2d += pa.h2d.len();
        seen.d2h += pa.d2h.len();
        seen.forwards += pa.forwards.len();
        exec.take(round, &pa);
        let idle = round >= 8
            && pa.is_empty()
            && exec.owed.is_empty()
            && exec.digests.is_empty()
            && a.scheduler().live_requests() == 0;
        quiet = if idle { quiet + 1 } else { 0 };
        round += 1;
    }

    // The trace exercised every path it claims to.
    for k in ["query", "get", "put", "cancel"] {
        assert!(
            seen.kinds.get(k).copied().unwrap_or(0) > 0,
            "no {k}: {seen:?}"
        );
    }
    assert!(
        seen.h2d > 0 && seen.d2h > 0 && seen.forwards > 0,
        "{seen:?}"
    );
    let s = a.stm().unwrap().stats();
    assert!(
        s.soft_timeouts > 0,
        "no QUERY outlived its soft deadline: {s:?}"
    );
    assert!(
        s.pressure_bypasses > 0 && s.dropped_backup_keys[DropReason::Pressure.index()] > 0,
        "the closed gate bypassed no QUERY and dropped no candidate: {s:?}"
    );
    assert_eq!(
        a.scheduler().stats().finished + a.scheduler().stats().aborted,
        16
    );
    assert!(a.scheduler().stats().aborted > 0);
    assert!(
        a.scheduler().stats().prefix_l3 > 0,
        "no prefix came from L3"
    );

    // Quiescence: no ticket, credit, wait or cache reference is left behind.
    for p in [&a, &b] {
        let s = p.stm().unwrap().stats();
        assert_eq!(s.outstanding_tickets, 0, "{s:?}");
        assert_eq!(s.operation_credits_in_use, 0, "{s:?}");
        assert_eq!(s.host_credits_in_use, 0, "{s:?}");
        assert_eq!(s.backup_operation_credits_in_use, 0, "{s:?}");
        assert_eq!(s.backup_host_credits_in_use, 0, "{s:?}");
        assert_eq!((s.waiting_requests, s.ready_holds), (0, 0), "{s:?}");
        assert_eq!(s.quarantined_refs, 0);
        assert!(p.scheduler().quiescent());
        let layout = p.scheduler().layout();
        let cache = p.scheduler().cache();
        for g in 0..layout.host_blocks.len() {
            assert_eq!(
                cache.host().available(g as u32),
                layout.host_blocks[g] as u64,
                "group {g}: a Host block is still referenced"
            );
            assert_eq!(
                cache.device().available(g as u32),
                layout.device_blocks[g] as u64,
                "group {g}: a Device block is still referenced"
            );
        }
    }
    assert_eq!(a.scheduler().stats(), b.scheduler().stats());
    // The scheduler's own records of storage references (GET rows, PUT sources) are gone
    // too: a clear succeeds only when none is outstanding, and has nothing to cancel.
    for p in [&mut a, &mut b] {
        let cancels = p
            .apply_admin(ClearKind::FullClear, Some(Ok(())), None)
            .unwrap();
        assert!(cancels.is_empty(), "{cancels:?}");
    }
}

#[test]
fn finished_requests_report_the_same_splits_on_both_pipelines() {
    // A shorter trace without cancellations: every request finishes with the same prefix
    // split and fallback on both pipelines.
    let mut a = pipeline();
    let mut b = pipeline();
    let vocab = a.scheduler().model().profile().vocab;
    let mut exec = Executor::default();
    let mut finished: Vec<RequestEvent> = vec![];
    for round in 0..120u64 {
        let mut agreed = inputs(round, &mut exec, vocab);
        agreed.cancellations.clear();
        let pa = a.round(agreed.clone()).unwrap();
        let pb = b.round(agreed).unwrap();
        assert_eq!(pa.op_ids(), pb.op_ids(), "round {round}");
        let ea = a.scheduler_mut().drain_events();
        assert_eq!(ea, b.scheduler_mut().drain_events(), "round {round}");
        finished.extend(
            ea.into_iter()
                .filter(|e| matches!(e, RequestEvent::Finished { .. })),
        );
        a.d2h_done();
        b.d2h_done();
        exec.take(round, &pa);
    }
    assert_eq!(finished.len(), 16, "{finished:?}");
    assert_eq!(a.scheduler().live_requests(), 0);
}
