//! Benchmark body (wired as `engine-host bench stm` by the binary): the cost of
//! `StorageTransferManager::apply_round` with about 1k outstanding storage operations and
//! 10k waiting requests, in microseconds per round. Not a test: it asserts no timings.

use super::manager::{RoundInput, StorageTransferManager};
use super::{Destinations, HostRef, StorageLease};
use messages::settings::{PressureWatermark, StorageConfig};
use messages::{HostRange, OperationId, PressureObservation, RequestId, StorageDone, StorageKey};
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// Figures of one benchmark run.
#[derive(Clone, Debug, PartialEq)]
pub struct StmBenchReport {
    pub rounds: u64,
    pub outstanding_operations: u64,
    pub waiting_requests: u64,
    pub completions_per_round: u64,
    pub us_per_round: f64,
}

fn bench_config(outstanding: u32) -> StorageConfig {
    unbounded_contract(outstanding, outstanding.saturating_mul(8).max(8), 4)
}

/// A storage contract for benchmarks: the given credits and key limit, no pressure gate
/// (unreachable high watermarks) and no soft deadline or Ready expiry in a run's time.
pub fn unbounded_contract(
    operation_credits: u32,
    max_host_blocks: u32,
    max_keys_per_operation: u32,
) -> StorageConfig {
    StorageConfig {
        operation_credits,
        max_host_blocks,
        max_keys_per_operation,
        lookahead_tokens: 4096,
        negative_metadata_capacity: 1024,
        backup_candidate_capacity: 1024,
        backup_bytes_in_flight: 1 << 40,
        soft_deadline_ms: 1 << 40,
        ready_hold_ms: 1 << 40,
        min_extension_tokens: 1,
        pressure_high: PressureWatermark {
            queued_jobs: u64::MAX,
            queued_bytes: u64::MAX,
            oldest_age_ms: u64::MAX / 1000,
        },
        pressure_low: PressureWatermark {
            queued_jobs: 1,
            queued_bytes: 1,
            oldest_age_ms: 1,
        },
    }
}

fn keys(r: u64) -> Vec<StorageKey> {
    (0..4)
        .map(|i| StorageKey::new(format!("k{r}-{i}")))
        .collect()
}

/// Run `rounds` rounds holding about `outstanding` operations and `waiting` waiting
/// requests; each round agrees `per_round` GET and `per_round` QUERY completions, then
/// (untimed) admits the Ready requests and issues replacements. Prints and returns figures.
pub fn bench_stm(
    outstanding: usize,
    waiting: usize,
    rounds: usize,
    per_round: usize,
) -> StmBenchReport {
    let outstanding = outstanding.max(2 * per_round.max(1));
    let mut m = StorageTransferManager::new(bench_config(outstanding as u32));
    let mut leases: HashMap<RequestId, StorageLease> = HashMap::new();
    let mut next_req = 0u64;
    let mut next_host = 0u64;
    let mut tick = 1u64;
    // Build `waiting` requests whose QUERY is answered (QueryDone), in credit-sized batches.
    let mut answered: VecDeque<RequestId> = VecDeque::new();
    while answered.len() < waiting.max(outstanding) {
        let mut done = Vec::new();
        for _ in 0..outstanding.min(waiting.max(outstanding) - answered.len()) {
            let r = RequestId(next_req);
            next_req += 1;
            if let Ok((q, lease)) = m.issue_query(r, keys(r.0)) {
                leases.insert(r, lease);
                done.push(StorageDone::query(q.op, vec![true; 4], true));
                answered.push_back(r);
            }
        }
        // A batch the manager refused whole would be refused again: stop with what there
        // is (the figures then show too few waiting requests) instead of spinning.
        if done.is_empty() {
            break;
        }
        tick += 1;
        let _ = m.apply_round(RoundInput {
            tick_us: tick,
            completions: done,
            ..Default::default()
        });
    }
    // Fill the credits with GETs (half) and QUERYs (half).
    let mut gets: VecDeque<OperationId> = VecDeque::new();
    let mut queries: VecDeque<OperationId> = VecDeque::new();
    let issue_get = |m: &mut StorageTransferManager,
                     answered: &mut VecDeque<RequestId>,
                     next_host: &mut u64|
     -> Option<OperationId> {
        let r = answered.pop_front()?;
        let mut dests = Destinations::with_capacity(4);
        for i in 0..4 {
            *next_host += 1;
            dests.push(HostRef(*next_host), HostRange::new(i * 4096, 4096));
        }
        m.issue_get(r, keys(r.0), dests).ok().map(|g| g.op)
    };
    for _ in 0..outstanding / 2 {
        if let Some(op) = issue_get(&mut m, &mut answered, &mut next_host) {
            gets.push_back(op);
        }
    }
    while (m.credits().operations_used() as usize) < outstanding {
        let r = RequestId(next_req);
        next_req += 1;
        match m.issue_query(r, keys(r.0)) {
            Ok((q, lease)) => {
                leases.insert(r, lease);
                queries.push_back(q.op);
            }
            Err(_) => break,
        }
    }
    let mut timed = std::time::Duration::ZERO;
    let mut completions = 0u64;
    for _ in 0..rounds {
        tick += 1;
        let mut done = Vec::new();
        for _ in 0..per_round {
            if let Some(op) = gets.pop_front() {
                done.push(StorageDone::get(
                    op,
                    vec![true; 4],
                    vec![4096; 4],
                    vec![None; 4],
                    true,
                ));
            }
            if let Some(op) = queries.pop_front() {
                done.push(StorageDone::query(op, vec![true; 4], true));
            }
        }
        completions += done.len() as u64;
        let input = RoundInput {
            tick_us: tick,
            pressure: PressureObservation::default(),
            cancellations: Vec::new(),
            completions: done,
        };
        let start = Instant::now();
        let fx = m.apply_round(input);
        timed += start.elapsed();
        let Ok(fx) = fx else { break };
        // Untimed: admission takes the Ready holds; answered QUERYs become GETs; new
        // requests replace the admitted ones.
        let mut admitted = Vec::new();
        for (r, _) in &fx.waits_ended {
            admitted.push(*r);
        }
        for r in admitted {
            if let Some(lease) = leases.remove(&r) {
                let _ = m.detach(lease);
            }
        }
        for q in &fx.query_results {
            answered.push_back(q.request);
        }
        for _ in 0..per_round {
            if let Some(op) = issue_get(&mut m, &mut answered, &mut next_host) {
                gets.push_back(op);
            }
            let r = RequestId(next_req);
            next_req += 1;
            if let Ok((q, lease)) = m.issue_query(r, keys(r.0)) {
                leases.insert(r, lease);
                queries.push_back(q.op);
            }
        }
    }
    let stats = m.stats();
    let report = StmBenchReport {
        rounds: rounds as u64,
        outstanding_operations: stats.outstanding_tickets,
        waiting_requests: stats.waiting_requests,
        completions_per_round: completions / rounds.max(1) as u64,
        us_per_round: timed.as_secs_f64() * 1e6 / rounds.max(1) as f64,
    };
    println!(
        "stm apply_round: {:.2} us/round over {} rounds ({} outstanding operations, {} waiting requests, {} completions/round)",
        report.us_per_round,
        report.rounds,
        report.outstanding_operations,
        report.waiting_requests,
        report.completions_per_round
    );
    report
}
