//! Benchmark body of `engine-host bench scheduler`: the round cost of the real Scheduler
//! (`apply` + `plan` + `d2h_done`) with about 10k waiting requests and about 1k outstanding
//! storage operations, beside the same scenario with storage disabled, measured side by
//! side in one run (µs and, when the binary counts them, allocations per round). A second
//! pair measures storage enabled with nothing to do: every arrival repeats one prompt the
//! Device already holds, its reusable bound block-aligned (no QUERY, no GET, no new block
//! to back up), beside the same workload with storage disabled. A third pair runs the
//! loaded storage side beside itself holding a tenth of the GETs (same arrivals, same
//! operations per round): its ratio shows whether a round's cost follows what changed in it
//! or what is outstanding. Each pair runs `trials`
//! times, alternating which side goes first, and reports the trial with the median mean of
//! each side, so a noisy VM's drift falls on both sides alike. Then both sides of each pair
//! run at once, warmed up side by side and timed in alternating blocks of `BLOCK_ROUNDS`
//! rounds: the median of the block ratios (each block beside its partner, a few
//! milliseconds apart) resolves differences of a few percent that whole trials cannot.
//!
//! It drives a Scheduler directly with synthetic agreed inputs: new requests topping the
//! live set up to the target, StorageDone completions for the operations the Scheduler
//! issued (QUERYs answered at once with all-missing or partially-present existence, PUTs
//! answered at once, GETs withheld so about `outstanding` reads stay in flight), and rank
//! digests for every forward it planned. There is no executor, no device, no Host memory
//! and no clock. Timed rounds start once the first round's arrivals have all finished, so
//! that what they admit arrived into a running scheduler, and the Ready holds have stopped
//! growing; the storage credits are sized so that they never bind, so the timed rounds see
//! a steady flow (their halves' operations per round are printed). It owns only
//! measurement and must never be used as a test of timing.

use super::geometry::RankLayout;
use super::{AgreedInputs, Scheduler, SchedulerConfig};
use crate::engine::pipeline::RoundPipeline;
use crate::model::{RankDigest, SyntheticModel};
use messages::settings::StorageConfig;
use messages::{Namespace, OperationId, PressureObservation, RequestId, StorageDone, StorageOp};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

/// Sizes of one benchmark run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerBenchConfig {
    /// Live requests the arrivals keep the scheduler at (most of them wait).
    pub waiting: usize,
    /// Storage operations held outstanding (GETs whose completions are withheld).
    pub outstanding: usize,
    /// Timed rounds per scenario (after an untimed warm-up).
    pub rounds: usize,
    /// Prompt length in tokens (the `tiny` profile has 4-token blocks).
    pub prompt_tokens: u32,
    /// Output tokens per request (a request runs about `max_tokens + 1` rounds).
    pub max_tokens: u32,
    /// Device blocks of the cache group (small: most requests wait).
    pub device_blocks: u32,
    /// Requests running at once.
    pub max_running: usize,
    /// Times each pair of scenarios runs (alternating order); the median trial is reported.
    pub trials: usize,
}

impl Default for SchedulerBenchConfig {
    fn default() -> Self {
        Self {
            waiting: 10_000,
            outstanding: 1_000,
            rounds: 200,
            prompt_tokens: 32,
            max_tokens: 2,
            device_blocks: 256,
            max_running: 16,
            trials: 5,
        }
    }
}

/// Figures of one scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundFigures {
    pub label: &'static str,
    pub rounds: usize,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// None when the binary has no allocation counter.
    pub allocations_per_round: Option<f64>,
    /// Mean over timed rounds of the live (unfinished) requests after `apply`.
    pub live_requests: f64,
    /// Mean over timed rounds of the StorageTransferManager's outstanding tickets (issued
    /// operations, plus completed reads whose Ready hold waits for admission).
    pub outstanding_tickets: f64,
    /// Mean of the manager's requests waiting on a QUERY or GET.
    pub storage_waiting_requests: f64,
    /// Mean of the manager's Ready holds (read, waiting for Device admission).
    pub ready_holds: f64,
    pub storage_ops_per_round: f64,
    /// Storage operations per round in the first and the second half of the timed rounds:
    /// equal within noise in a steady state.
    pub storage_ops_halves: (f64, f64),
    pub admitted_per_round: f64,
    pub finished_per_round: f64,
    /// Prefill forwards in the timed rounds of requests that arrived in the first round
    /// (0 once the warm-up has reached steady state).
    pub first_round_forwards: usize,
    /// Prompt length of the scenario's arrivals.
    pub prompt_tokens: u32,
}

/// One workload's median trials, storage enabled and disabled.
#[derive(Clone, Debug, PartialEq)]
pub struct PairFigures {
    pub storage: RoundFigures,
    pub disabled: RoundFigures,
    /// Storage ÷ disabled mean µs of each trial, in trial order.
    pub trial_ratios: Vec<f64>,
    /// Storage ÷ disabled mean µs of each block of the interleaved run, in block order.
    pub block_ratios: Vec<f64>,
}

fn ratio(a: &RoundFigures, b: &RoundFigures) -> f64 {
    a.mean_us / b.mean_us.max(f64::MIN_POSITIVE)
}

/// The lowest and the highest trial ratio.
fn spread(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// The median trial ratio (the upper one of an even count; 0 for none). Each trial runs
/// its two sides back to back, so its ratio is paired: a slow spell of a shared machine
/// that spans one trial moves both of its sides, and the median of the paired ratios
/// leans less on such spells than the ratio of each side's median trial.
fn median_ratio(v: &[f64]) -> f64 {
    let v = sorted(v);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The ratios in ascending order.
fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

impl PairFigures {
    /// Round cost with storage over round cost without (median trials' mean µs).
    pub fn time_ratio(&self) -> f64 {
        ratio(&self.storage, &self.disabled)
    }

    /// The pair's ratio line: `what` names the workload.
    fn write_ratio(&self, f: &mut fmt::Formatter<'_>, what: &str) -> fmt::Result {
        let allocs = match (
            self.storage.allocations_per_round,
            self.disabled.allocations_per_round,
        ) {
            (Some(a), Some(b)) => format!(", {:.2}x allocations", a / b.max(1.0)),
            _ => String::new(),
        };
        ratio_line(
            f,
            &format!("storage/disabled{what}"),
            self.time_ratio(),
            &allocs,
            &self.trial_ratios,
            &self.block_ratios,
        )
    }
}

/// One ratio line: `ratio {what}: {ratio}x us/round{extra} (trials lo-hi, paired median m,
/// over n trials; interleaved m, quartiles q1-q3, over b blocks of k rounds)`.
fn ratio_line(
    f: &mut fmt::Formatter<'_>,
    what: &str,
    ratio: f64,
    extra: &str,
    trials: &[f64],
    blocks: &[f64],
) -> fmt::Result {
    let (lo, hi) = spread(trials);
    let (q1, q3) = quartiles(blocks);
    writeln!(
        f,
        "ratio {what}: {ratio:.2}x us/round{extra} (trials {lo:.2}x-{hi:.2}x, paired median {:.2}x, over {} trials; interleaved {:.2}x, quartiles {q1:.2}x-{q3:.2}x, over {} blocks of {BLOCK_ROUNDS} rounds)",
        median_ratio(trials),
        trials.len(),
        median_ratio(blocks),
        blocks.len()
    )
}

/// The lower and the upper quartile (0 for none).
fn quartiles(v: &[f64]) -> (f64, f64) {
    let v = sorted(v);
    let at = |q: usize| v.get(v.len() * q / 4).copied().unwrap_or(0.0);
    (at(1), at(3))
}

/// How many times fewer GETs the scaling pair's second side holds.
pub const SCALING_FACTOR: usize = 10;

/// The loaded storage side beside itself holding `SCALING_FACTOR` times fewer GETs (same
/// arrivals, same operations per round): a round's storage cost follows what changed in it,
/// not what is outstanding, so the ratio stays near 1.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalingFigures {
    /// Storage enabled, `outstanding` GETs held.
    pub held: RoundFigures,
    /// Storage enabled, `outstanding / SCALING_FACTOR` GETs held.
    pub fewer: RoundFigures,
    /// Held ÷ fewer mean µs of each trial, in trial order.
    pub trial_ratios: Vec<f64>,
    /// Held ÷ fewer mean µs of each block of the interleaved run, in block order.
    pub block_ratios: Vec<f64>,
}

impl ScalingFigures {
    /// Round cost holding every GET over round cost holding a tenth of them.
    pub fn time_ratio(&self) -> f64 {
        ratio(&self.held, &self.fewer)
    }
}

/// The pairs of one run; `Display` prints the idle ratio, the scaling ratio, then the
/// loaded ratio last.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerBenchReport {
    pub config: SchedulerBenchConfig,
    /// Distinct prompts, with outstanding reads.
    pub loaded: PairFigures,
    /// Storage enabled with nothing to do (one Device-held prompt).
    pub idle: PairFigures,
    /// The loaded storage side with all and with a tenth of the held GETs.
    pub scaling: ScalingFigures,
}

impl fmt::Display for RoundFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let allocs = match self.allocations_per_round {
            Some(a) => format!("{a:.0} allocations/round"),
            None => "allocations not counted".to_string(),
        };
        writeln!(
            f,
            "scheduler round [{}]: {:.1} us/round mean, p50 {:.1} us, p99 {:.1} us, {} ({} rounds)",
            self.label, self.mean_us, self.p50_us, self.p99_us, allocs, self.rounds
        )?;
        writeln!(
            f,
            "  {}-token prompts, live requests {:.0}, outstanding storage tickets {:.0} ({:.0} requests waiting on QUERY/GET, {:.0} Ready holds), storage ops {:.1}/round (halves {:.1}, {:.1}), admitted {:.1}/round, finished {:.1}/round",
            self.prompt_tokens,
            self.live_requests,
            self.outstanding_tickets,
            self.storage_waiting_requests,
            self.ready_holds,
            self.storage_ops_per_round,
            self.storage_ops_halves.0,
            self.storage_ops_halves.1,
            self.admitted_per_round,
            self.finished_per_round
        )
    }
}

impl fmt::Display for SchedulerBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(
            f,
            "scheduler bench: profile tiny, {} live requests, {} outstanding GETs held, {}-token prompts, {} device blocks, max_running {}; warm-up until the first round's arrivals have finished; median of {} trials per side, then {} interleaved blocks of {} rounds per side",
            c.waiting,
            c.outstanding,
            c.prompt_tokens,
            c.device_blocks,
            c.max_running,
            c.trials,
            interleaved_blocks(c),
            BLOCK_ROUNDS
        )?;
        write!(f, "{}{}", self.idle.storage, self.idle.disabled)?;
        write!(f, "{}{}", self.loaded.storage, self.loaded.disabled)?;
        write!(f, "{}{}", self.scaling.held, self.scaling.fewer)?;
        self.idle.write_ratio(f, ", nothing to do")?;
        let s = &self.scaling;
        ratio_line(
            f,
            &format!(
                "storage enabled, {} / {} GETs held",
                c.outstanding,
                c.outstanding / SCALING_FACTOR
            ),
            s.time_ratio(),
            "",
            &s.trial_ratios,
            &s.block_ratios,
        )?;
        self.loaded.write_ratio(f, "")
    }
}

/// Credits sized to the workload, so that they never bind: every live request may hold a
/// read ticket (QUERY, GET or Ready hold) and its Host destinations, and backups (at most
/// half the credits) still find room. With the withheld GETs counted against credits sized
/// to them alone, the Ready holds (each waits for Device admission behind the whole queue,
/// about `waiting / finished-per-round` rounds) filled the rest within a few hundred rounds
/// and the storage side then stopped preparing: its operations per round decayed from
/// about 18 to 0 across the timed rounds, a transient rather than a load.
fn storage_config(cfg: &SchedulerBenchConfig) -> StorageConfig {
    let waiting = u32::try_from(cfg.waiting).unwrap_or(u32::MAX / 4);
    crate::storage_transfer::bench::unbounded_contract(
        waiting.saturating_mul(2).saturating_add(64),
        host_credit_blocks(cfg),
        8,
    )
}

/// The Host blocks every live request's read may reserve: one per prompt token bounds the
/// blocks of every group at any block size.
fn host_credit_blocks(cfg: &SchedulerBenchConfig) -> u32 {
    u32::try_from(cfg.waiting)
        .unwrap_or(u32::MAX / 64)
        .saturating_mul(cfg.prompt_tokens.saturating_add(1))
        .saturating_add(1024)
}

/// The workload of a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    /// A distinct prompt per request; GETs withheld to hold `outstanding` reads.
    Loaded,
    /// Every request repeats one prompt (held by the Device after the first): storage has
    /// nothing to prepare or back up.
    NothingToDo,
}

/// A distinct prompt per request (no shared prefixes).
fn prompt(id: u64, len: u32, vocab: u32) -> Vec<u32> {
    (0..len as u64)
        .map(|j| {
            let x = id
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(j.wrapping_mul(0xBF58_476D_1CE4_E5B9));
            ((x >> 17) % vocab.max(1) as u64) as u32
        })
        .collect()
}

/// The repeated prompt's length for nothing to do: the shortest at least `tokens` whose
/// reusable bound (every token but the last) ends on a parent-block boundary, so the
/// Device's full blocks cover the bound after the first arrival. A bound inside a block
/// needs a tail the Device never keeps: the storage side's first arrival would QUERY and GET
/// it (work to do, once) and leave a Host tail that its later admissions find and the
/// disabled side never has, which measures a different cache state, not storage overhead.
fn prompt_with_aligned_bound(tokens: u32, parent_tokens: u32) -> u32 {
    tokens
        .saturating_sub(1)
        .next_multiple_of(parent_tokens.max(1))
        .saturating_add(1)
}

/// What the synthetic executor owes the Scheduler.
#[derive(Default)]
struct Owed {
    /// QUERYs to answer next round: (op, keys, request).
    queries: Vec<(OperationId, usize, u64)>,
    /// PUTs to answer next round: (op, keys).
    puts: Vec<(OperationId, usize)>,
    /// Withheld GETs in issue order: op -> destination lengths.
    gets: BTreeMap<OperationId, Vec<u64>>,
    /// Cancelled GETs to answer next round: (op, destination lengths).
    cancelled: Vec<(OperationId, Vec<u64>)>,
}

impl Owed {
    fn take(&mut self, plan_storage: Vec<StorageOp>) {
        for op in plan_storage {
            match op {
                StorageOp::Query(q) => {
                    self.queries
                        .push((q.op, q.keys.len(), q.request.map_or(0, |r| r.0)))
                }
                StorageOp::Put(p) => self.puts.push((p.op, p.keys.len())),
                StorageOp::Get(g) => {
                    self.gets
                        .insert(g.op, g.destinations.iter().map(|d| d.len).collect());
                }
                StorageOp::Cancel(c) => {
                    if let Some(lens) = self.gets.remove(&c.op) {
                        self.cancelled.push((c.op, lens));
                    }
                }
            }
        }
    }

    /// This round's completions: every QUERY (a quarter all-missing, the rest with the
    /// first half present), every PUT, every cancelled GET, and the oldest GETs above
    /// `hold`.
    fn completions(&mut self, hold: usize) -> Vec<StorageDone> {
        let mut out = Vec::new();
        for (op, n, req) in self.queries.drain(..) {
            let exists = (0..n).map(|i| req % 4 != 0 && i < n.div_ceil(2)).collect();
            out.push(StorageDone::query(op, exists, true));
        }
        for (op, n) in self.puts.drain(..) {
            out.push(StorageDone::put(
                op,
                vec![true; n],
                vec![0; n],
                vec![false; n],
                true,
            ));
        }
        for (op, lens) in self.cancelled.drain(..) {
            let n = lens.len();
            out.push(StorageDone::get(
                op,
                vec![false; n],
                lens,
                vec![None; n],
                true,
            ));
        }
        while self.gets.len() > hold {
            let Some((op, lens)) = self.gets.pop_first() else {
                break;
            };
            let n = lens.len();
            out.push(StorageDone::get(
                op,
                vec![true; n],
                lens,
                vec![None; n],
                true,
            ));
        }
        out
    }
}

struct Driver {
    cfg: SchedulerBenchConfig,
    workload: Workload,
    pipeline: RoundPipeline,
    owed: Owed,
    digests: Vec<(RequestId, Vec<RankDigest>)>,
    next_request: u64,
    tick_us: u64,
    vocab: u32,
    /// Prompt length of this workload's arrivals (see `prompt_with_aligned_bound`).
    prompt_tokens: u32,
    /// The last request ID of the first round's arrivals (0 before the first round).
    first_round_last: u64,
}

impl Driver {
    fn new(cfg: &SchedulerBenchConfig, storage: bool, workload: Workload) -> Result<Self, String> {
        let model = SyntheticModel::by_name("tiny").map_err(|e| e.to_string())?;
        let groups = model.profile().groups.len() as u32;
        let max_running = cfg.max_running.max(1);
        // Room beside the reads' credits for D2H destinations and backup sources.
        let host_blocks = host_credit_blocks(cfg).saturating_add(16_384);
        let layout = RankLayout::new(
            model.profile(),
            0,
            1,
            cfg.device_blocks,
            host_blocks,
            (max_running as u32).saturating_mul(groups).max(1),
        )?;
        let vocab = model.profile().vocab;
        let prompt_tokens = match workload {
            Workload::Loaded => cfg.prompt_tokens,
            Workload::NothingToDo => {
                prompt_with_aligned_bound(cfg.prompt_tokens, layout.geometry.parent_tokens())
            }
        };
        let scheduler = Scheduler::new(
            SchedulerConfig {
                layout,
                namespace: Namespace("tsl3-00000000benchsched".into()),
                storage: storage.then(|| storage_config(cfg)),
                max_running,
                tail_capacity: 1024,
            },
            model,
        )
        .map_err(|e| e.to_string())?;
        Ok(Self {
            cfg: cfg.clone(),
            workload,
            pipeline: RoundPipeline::new(scheduler),
            owed: Owed::default(),
            digests: vec![],
            next_request: 0,
            tick_us: 0,
            vocab,
            prompt_tokens,
            first_round_last: 0,
        })
    }

    /// The next round's agreed inputs (untimed).
    fn inputs(&mut self) -> AgreedInputs {
        self.tick_us += 1_000;
        let live = self.pipeline.scheduler().live_requests();
        let mut new_requests = vec![];
        for _ in live..self.cfg.waiting {
            self.next_request += 1;
            let id = self.next_request;
            let seed = match self.workload {
                Workload::Loaded => id,
                Workload::NothingToDo => 0,
            };
            new_requests.push(
                (
                    RequestId(id),
                    prompt(seed, self.prompt_tokens, self.vocab),
                    self.cfg.max_tokens,
                )
                    .into(),
            );
        }
        if self.first_round_last == 0 {
            self.first_round_last = self.next_request;
        }
        AgreedInputs {
            tick_us: self.tick_us,
            pressure: PressureObservation::default(),
            new_requests,
            cancellations: vec![],
            completions: self.owed.completions(self.cfg.outstanding),
            digests: std::mem::take(&mut self.digests),
            logprobs: vec![],
        }
    }

    /// One round: the timed pipeline (Scheduler apply and plan with the
    /// StorageTransferManager deciding storage, D2H completion and backup offers), then
    /// (untimed) the engine's part.
    /// `timed`: a measured round (through `timed_round`); false for warm-up rounds.
    fn round(
        &mut self,
        timed: bool,
        allocations: Option<fn() -> u64>,
    ) -> Result<RoundSample, String> {
        let input = self.inputs();
        let a0 = allocations.map(|f| f());
        let start = Instant::now();
        let (plan, live) = if timed {
            timed_round(&mut self.pipeline, input)?
        } else {
            round_work(&mut self.pipeline, input)?
        };
        let us = start.elapsed().as_secs_f64() * 1e6;
        let allocs = match (a0, allocations) {
            (Some(a0), Some(f)) => Some(f().saturating_sub(a0)),
            _ => None,
        };
        // Untimed: the engine's part (digests of the forwards, the executor's owed work).
        let ops = plan.storage.len();
        let forwards = plan.forwards.len();
        let first_round = self.first_round_last;
        let first_round_forwards = plan
            .forwards
            .iter()
            .filter(|(id, _)| id.0 <= first_round)
            .count();
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
        self.owed.take(plan.storage);
        let finished = self
            .pipeline
            .scheduler_mut()
            .drain_events()
            .iter()
            .filter(|e| matches!(e, super::RequestEvent::Finished { .. }))
            .count();
        let stats = self.pipeline.stm().map(|s| s.stats());
        let outstanding = stats.as_ref().map_or(0, |s| s.outstanding_tickets);
        let waiting = stats.as_ref().map_or(0, |s| s.waiting_requests);
        let ready = stats.as_ref().map_or(0, |s| s.ready_holds);
        Ok(RoundSample {
            us,
            allocs,
            live,
            outstanding,
            waiting,
            ready,
            ops,
            forwards,
            finished,
            first_round_forwards,
        })
    }
}

/// The timed part of a round, in a function of its own so that a profiler can count it
/// alone (`valgrind --tool=callgrind --toggle-collect='*timed_round*'`).
#[inline(never)]
fn timed_round(
    pipeline: &mut RoundPipeline,
    input: AgreedInputs,
) -> Result<(crate::engine::pipeline::RoundPlan, usize), String> {
    round_work(pipeline, input)
}

/// One round's work (inlined into each caller, so a profiler attributes it to the caller:
/// `timed_round`, or the warm-up's `Driver::round`):
/// the pipeline's round, the live count after it, then the D2H completion.
#[inline(always)]
fn round_work(
    pipeline: &mut RoundPipeline,
    input: AgreedInputs,
) -> Result<(crate::engine::pipeline::RoundPlan, usize), String> {
    let plan = pipeline.round(input).map_err(|e| e.to_string())?;
    let live = pipeline.scheduler().live_requests();
    pipeline.d2h_done();
    Ok((plan, live))
}

struct RoundSample {
    us: f64,
    allocs: Option<u64>,
    live: usize,
    outstanding: u64,
    waiting: u64,
    ready: u64,
    ops: usize,
    forwards: usize,
    finished: usize,
    first_round_forwards: usize,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Rounds per block of the steady-state warm-up.
const WARM_BLOCK: usize = 100;

/// The most untimed rounds the warm-up runs to fill the live set and the held GETs.
const WARM_UP_ROUNDS: usize = 20_000;

/// Storage operations per round in each half of the samples.
fn halves(samples: &[RoundSample]) -> (f64, f64) {
    let (a, b) = samples.split_at(samples.len() / 2);
    let per_round =
        |v: &[RoundSample]| v.iter().map(|s| s.ops as f64).sum::<f64>() / (v.len().max(1) as f64);
    (per_round(a), per_round(b))
}

fn run_scenario(
    cfg: &SchedulerBenchConfig,
    storage: bool,
    workload: Workload,
    allocations: Option<fn() -> u64>,
) -> Result<RoundFigures, String> {
    let mut d = warmed(cfg, storage, workload)?;
    let rounds = cfg.rounds.max(1);
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        samples.push(d.round(true, allocations)?);
    }
    Ok(figures(&d, &samples, storage, workload))
}

/// A driver of the scenario past its warm-up: the next round is a steady-state round.
fn warmed(cfg: &SchedulerBenchConfig, storage: bool, workload: Workload) -> Result<Driver, String> {
    let mut d = Driver::new(cfg, storage, workload)?;
    // Untimed warm-up (bounded): fill the live set and the withheld GETs, then run until
    // the first round's arrivals have all finished, so that every request the timed rounds
    // admit arrived into a running scheduler, as in steady state. (The first round's
    // arrivals come all at once: the storage side cannot prepare most of them, its credits
    // being spent, so admitting them would measure a start-up mix; and with them still
    // queued, the storage side would hash each timed arrival's prompt at arrival and each
    // admitted request's at admission, twice a round's prompts.) With nothing to do, also
    // until the storage work has settled.
    let mut finished = 0usize;
    let mut reached = false;
    for _ in 0..WARM_UP_ROUNDS {
        finished += d.round(false, None)?.finished;
        let held = d.owed.gets.len();
        let settled = d
            .pipeline
            .stm()
            .is_none_or(|s| s.outstanding_tickets() == 0);
        if d.pipeline.scheduler().live_requests() >= cfg.waiting
            && finished >= cfg.waiting
            && (!storage || held >= cfg.outstanding)
            && (workload == Workload::Loaded || settled)
        {
            reached = true;
            break;
        }
    }
    // Figures of a scenario that never filled would describe a start-up mix, not the
    // scenario asked for: refused with what it reached.
    if !reached {
        // What the storage side had still to reach: its held GETs, or (with nothing to do)
        // its settled tickets.
        let storage_part = match d.pipeline.stm() {
            Some(s) if workload == Workload::NothingToDo => {
                format!(", {} storage tickets outstanding", s.outstanding_tickets())
            }
            Some(_) => format!(", {} of {} GETs held", d.owed.gets.len(), cfg.outstanding),
            None => String::new(),
        };
        return Err(format!(
            "the scenario did not reach its steady state in {WARM_UP_ROUNDS} rounds: {} of {} live requests, {finished} of {} finished{storage_part}",
            d.pipeline.scheduler().live_requests(),
            cfg.waiting,
            cfg.waiting,
        ));
    }
    for _ in 0..10 {
        d.round(false, None)?;
    }
    // Then until the Ready holds have stopped growing (each waits for Device admission
    // behind the queue, so their number rises for about one queue wait after the live set
    // fills): the timed rounds then see the steady flow of QUERYs, GETs, completions and
    // admissions, not a start-up transient.
    // Without storage (or with nothing to prepare) there are no Ready holds to wait for.
    let mut previous: Option<f64> = None;
    let blocks = if storage && workload == Workload::Loaded {
        200
    } else {
        0
    };
    for _ in 0..blocks {
        let mut sum = 0.0;
        for _ in 0..WARM_BLOCK {
            d.round(false, None)?;
            sum += d.pipeline.stm().map_or(0, |s| s.stats().ready_holds) as f64;
        }
        let mean = sum / WARM_BLOCK as f64;
        if previous.is_some_and(|p| (mean - p).abs() <= 0.02 * mean.max(1.0)) {
            break;
        }
        previous = Some(mean);
    }
    Ok(d)
}

/// The figures of a scenario's timed rounds (`samples`, at least one).
fn figures(d: &Driver, samples: &[RoundSample], storage: bool, workload: Workload) -> RoundFigures {
    let rounds = samples.len();
    let n = samples.len().max(1) as f64;
    let mut us: Vec<f64> = samples.iter().map(|s| s.us).collect();
    us.sort_by(f64::total_cmp);
    let mean = |f: &dyn Fn(&RoundSample) -> f64| samples.iter().map(f).sum::<f64>() / n;
    let allocations_per_round = samples
        .iter()
        .map(|s| s.allocs)
        .collect::<Option<Vec<u64>>>()
        .map(|v| v.iter().sum::<u64>() as f64 / n);
    RoundFigures {
        label: match (storage, workload) {
            (true, Workload::Loaded) => "storage enabled",
            (false, Workload::Loaded) => "storage disabled",
            (true, Workload::NothingToDo) => "storage enabled, nothing to do",
            (false, Workload::NothingToDo) => "storage disabled, same workload",
        },
        rounds,
        mean_us: mean(&|s| s.us),
        p50_us: percentile(&us, 0.50),
        p99_us: percentile(&us, 0.99),
        allocations_per_round,
        live_requests: mean(&|s| s.live as f64),
        outstanding_tickets: mean(&|s| s.outstanding as f64),
        storage_waiting_requests: mean(&|s| s.waiting as f64),
        ready_holds: mean(&|s| s.ready as f64),
        storage_ops_per_round: mean(&|s| s.ops as f64),
        storage_ops_halves: halves(samples),
        admitted_per_round: mean(&|s| s.forwards as f64),
        finished_per_round: mean(&|s| s.finished as f64),
        first_round_forwards: samples.iter().map(|s| s.first_round_forwards).sum(),
        prompt_tokens: d.prompt_tokens,
    }
}

/// Timed rounds in each block of an interleaved pair (see `interleaved`).
pub const BLOCK_ROUNDS: usize = 50;

/// Blocks each side of an interleaved pair runs: as many timed rounds as all its trials.
fn interleaved_blocks(cfg: &SchedulerBenchConfig) -> usize {
    cfg.trials.max(1) * (cfg.rounds / BLOCK_ROUNDS).max(1)
}

/// The mean µs of `BLOCK_ROUNDS` timed rounds of `d`.
fn timed_block(d: &mut Driver) -> Result<f64, String> {
    let mut us = 0.0;
    for _ in 0..BLOCK_ROUNDS {
        us += d.round(true, None)?.us;
    }
    Ok(us / BLOCK_ROUNDS as f64)
}

/// Both sides of a pair warmed up in one process, then timed in alternating blocks of
/// `BLOCK_ROUNDS` rounds (side a leads the even block pairs, side b the odd ones): the
/// ratio of each block of a to its partner block of b. Partner blocks run within a few
/// milliseconds of each other, so a slow spell of a shared machine that lasts longer moves
/// both alike, and the median of the block ratios resolves a few percent where the ratios
/// of whole trials spread by tens. A block's first rounds refill the caches the other
/// side's block used; that refill weighs more on the cheaper side, so short blocks pull the
/// ratio towards 1 (10-round blocks read 3-6% below 50-round ones here): blocks are long
/// enough for it to fade.
fn interleaved(
    a: (&SchedulerBenchConfig, bool),
    b: (&SchedulerBenchConfig, bool),
    workload: Workload,
    blocks: usize,
) -> Result<Vec<f64>, String> {
    let mut da = warmed(a.0, a.1, workload)?;
    let mut db = warmed(b.0, b.1, workload)?;
    let mut ratios = Vec::with_capacity(blocks);
    for k in 0..blocks {
        let (x, y) = in_turn(k, || timed_block(&mut da), || timed_block(&mut db))?;
        ratios.push(x / y.max(f64::MIN_POSITIVE));
    }
    Ok(ratios)
}

/// Runs both scenarios (storage enabled, then disabled) in one process. `allocations`
/// reads the binary's allocation counter (monotonic, process-wide); None skips counting.
pub fn bench_scheduler(
    cfg: &SchedulerBenchConfig,
    allocations: Option<fn() -> u64>,
) -> Result<SchedulerBenchReport, String> {
    let loaded_cfg = workload_config(cfg, Workload::Loaded)?;
    let loaded = run_pair(&loaded_cfg, Workload::Loaded, allocations)?;
    let idle_cfg = workload_config(cfg, Workload::NothingToDo)?;
    let idle = run_pair(&idle_cfg, Workload::NothingToDo, allocations)?;
    let fewer_cfg = SchedulerBenchConfig {
        outstanding: loaded_cfg.outstanding / SCALING_FACTOR,
        ..loaded_cfg.clone()
    };
    let (mut held, mut fewer, trial_ratios) = alternate(
        cfg.trials,
        || run_scenario(&loaded_cfg, true, Workload::Loaded, allocations),
        || run_scenario(&fewer_cfg, true, Workload::Loaded, allocations),
    )?;
    let block_ratios = interleaved(
        (&loaded_cfg, true),
        (&fewer_cfg, true),
        Workload::Loaded,
        interleaved_blocks(cfg),
    )?;
    held.label = "storage enabled, scaling pair, every GET held";
    fewer.label = "storage enabled, scaling pair, a tenth of the GETs held";
    Ok(SchedulerBenchReport {
        config: cfg.clone(),
        loaded,
        idle,
        scaling: ScalingFigures {
            held,
            fewer,
            trial_ratios,
            block_ratios,
        },
    })
}

/// One side of one pair, for a profiler to count alone (`bench scheduler --only`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Distinct prompts, outstanding reads, storage enabled.
    LoadedStorage,
    /// The same workload with storage disabled.
    LoadedDisabled,
    /// One Device-held prompt, storage enabled (nothing to do).
    IdleStorage,
    /// The same workload with storage disabled.
    IdleDisabled,
}

/// Runs one scenario once (no trials, no pair): its figures alone.
pub fn bench_scheduler_scenario(
    cfg: &SchedulerBenchConfig,
    scenario: Scenario,
    allocations: Option<fn() -> u64>,
) -> Result<RoundFigures, String> {
    let (storage, workload) = match scenario {
        Scenario::LoadedStorage => (true, Workload::Loaded),
        Scenario::LoadedDisabled => (false, Workload::Loaded),
        Scenario::IdleStorage => (true, Workload::NothingToDo),
        Scenario::IdleDisabled => (false, Workload::NothingToDo),
    };
    let cfg = workload_config(cfg, workload)?;
    run_scenario(&cfg, storage, workload, allocations)
}

/// The sizes a workload runs with: the loaded one holds `outstanding` reads (and needs the
/// waiting requests for them); nothing to do holds none.
fn workload_config(
    cfg: &SchedulerBenchConfig,
    workload: Workload,
) -> Result<SchedulerBenchConfig, String> {
    if workload == Workload::NothingToDo {
        return Ok(SchedulerBenchConfig {
            outstanding: 0,
            ..cfg.clone()
        });
    }
    if cfg.outstanding.saturating_mul(2) > cfg.waiting {
        return Err(format!(
            "{} outstanding reads need at least {} waiting requests: otherwise every request waits on a withheld GET and no round admits anything",
            cfg.outstanding,
            cfg.outstanding.saturating_mul(2)
        ));
    }
    Ok(cfg.clone())
}

/// The figures of the trial with the median mean (the upper one of an even count).
fn median_trial(mut trials: Vec<RoundFigures>) -> Option<RoundFigures> {
    trials.sort_by(|a, b| a.mean_us.total_cmp(&b.mean_us));
    let mid = trials.len() / 2;
    trials.into_iter().nth(mid)
}

/// Runs `cfg.trials` trials of the workload, each with storage enabled and disabled; even
/// trials run the enabled side first, odd ones the disabled side.
fn run_pair(
    cfg: &SchedulerBenchConfig,
    workload: Workload,
    allocations: Option<fn() -> u64>,
) -> Result<PairFigures, String> {
    let (storage, disabled, trial_ratios) = alternate(
        cfg.trials,
        || run_scenario(cfg, true, workload, allocations),
        || run_scenario(cfg, false, workload, allocations),
    )?;
    let block_ratios = interleaved((cfg, true), (cfg, false), workload, interleaved_blocks(cfg))?;
    Ok(PairFigures {
        storage,
        disabled,
        trial_ratios,
        block_ratios,
    })
}

/// Runs `a` and `b` once each, `a` first in an even turn `k` and `b` first in an odd one
/// (so neither side always runs on the caches the other left): their results, `a`'s first.
fn in_turn<T>(
    k: usize,
    a: impl FnOnce() -> Result<T, String>,
    b: impl FnOnce() -> Result<T, String>,
) -> Result<(T, T), String> {
    if k.is_multiple_of(2) {
        let x = a()?;
        Ok((x, b()?))
    } else {
        let y = b()?;
        Ok((a()?, y))
    }
}

/// Runs `trials` trials of sides `a` and `b` (even trials run `a` first, odd ones `b`):
/// each side's median trial and the a ÷ b ratio of each trial.
fn alternate(
    trials: usize,
    mut a: impl FnMut() -> Result<RoundFigures, String>,
    mut b: impl FnMut() -> Result<RoundFigures, String>,
) -> Result<(RoundFigures, RoundFigures, Vec<f64>), String> {
    let (mut xs, mut ys, mut ratios) = (vec![], vec![], vec![]);
    for t in 0..trials.max(1) {
        let (x, y) = in_turn(t, &mut a, &mut b)?;
        ratios.push(ratio(&x, &y));
        xs.push(x);
        ys.push(y);
    }
    let none = || "no trial ran".to_string();
    Ok((
        median_trial(xs).ok_or_else(none)?,
        median_trial(ys).ok_or_else(none)?,
        ratios,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> SchedulerBenchConfig {
        SchedulerBenchConfig {
            waiting: 200,
            outstanding: 20,
            rounds: 5,
            device_blocks: 32,
            max_running: 2,
            trials: 2,
            ..SchedulerBenchConfig::default()
        }
    }

    #[test]
    fn storage_scenario_holds_outstanding_reads_and_waiting_requests() {
        let r = bench_scheduler(&small(), None).unwrap();
        assert!(r.loaded.storage.outstanding_tickets >= 20.0, "{r}");
        // Live is read after `apply`, which may finish a request or two after the top-up.
        assert!(r.loaded.storage.live_requests >= 190.0, "{r}");
        assert_eq!(r.loaded.disabled.outstanding_tickets, 0.0);
        assert_eq!(r.loaded.disabled.storage_ops_per_round, 0.0);
        assert!(r.loaded.disabled.finished_per_round > 0.0, "{r}");
        assert!(r.loaded.storage.allocations_per_round.is_none());
        let text = r.to_string();
        assert!(text
            .lines()
            .last()
            .unwrap()
            .starts_with("ratio storage/disabled"));
    }

    #[test]
    fn the_loaded_storage_side_is_timed_in_a_steady_state() {
        // Credits sized to the held reads alone starved this side within the timed rounds
        // (its Ready holds took every credit left): operations per round decayed to none.
        let cfg = SchedulerBenchConfig {
            rounds: 400,
            ..small()
        };
        let f = bench_scheduler_scenario(&cfg, Scenario::LoadedStorage, None).unwrap();
        let (a, b) = f.storage_ops_halves;
        assert!(a > 0.0 && b > 0.0, "{f}");
        assert!((a - b).abs() <= 0.2 * a.max(b), "{f}");
        // Every arrival is prepared: its QUERY, for three in four a GET, and PUTs of its
        // computed blocks (starved credits left about 1.3 operations per arrival here).
        assert!(b >= 2.0 * f.admitted_per_round, "{f}");
        assert!(f.ready_holds > 0.0, "{f}");
    }

    #[test]
    fn the_nothing_to_do_pair_issues_no_storage_work_and_still_serves() {
        let r = bench_scheduler(&small(), None).unwrap();
        assert_eq!(r.idle.storage.storage_ops_per_round, 0.0, "{r}");
        assert_eq!(r.idle.storage.outstanding_tickets, 0.0, "{r}");
        assert_eq!(r.idle.storage.ready_holds, 0.0, "{r}");
        assert!(r.idle.storage.finished_per_round > 0.0, "{r}");
        assert!(r.idle.disabled.finished_per_round > 0.0, "{r}");
        assert_eq!(r.loaded.trial_ratios.len(), 2);
        assert_eq!(r.idle.trial_ratios.len(), 2);
        let text = r.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[lines.len() - 3].starts_with("ratio storage/disabled, nothing to do"));
    }

    #[test]
    fn the_scaling_pair_holds_a_tenth_of_the_gets_for_the_same_flow() {
        let cfg = SchedulerBenchConfig {
            outstanding: 50,
            ..small()
        };
        let r = bench_scheduler(&cfg, None).unwrap();
        let s = &r.scaling;
        assert_eq!(s.trial_ratios.len(), 2);
        assert_eq!(
            s.fewer.label,
            "storage enabled, scaling pair, a tenth of the GETs held"
        );
        assert_eq!(
            s.held.label,
            "storage enabled, scaling pair, every GET held"
        );
        // Ten times the held GETs means more requests waiting on storage, but the same
        // arrivals and storage operations per round.
        assert!(
            s.held.storage_waiting_requests >= s.fewer.storage_waiting_requests + 40.0,
            "{r}"
        );
        assert!(s.held.storage_ops_per_round > 0.0 && s.fewer.storage_ops_per_round > 0.0);
        assert_eq!(s.held.admitted_per_round, s.fewer.admitted_per_round, "{r}");
        let text = r.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[lines.len() - 2].starts_with("ratio storage enabled, 50 / 5 GETs held"),
            "{text}"
        );
    }

    #[test]
    fn every_pair_is_also_timed_in_interleaved_blocks() {
        let cfg = SchedulerBenchConfig {
            rounds: 2 * BLOCK_ROUNDS,
            ..small()
        };
        let r = bench_scheduler(&cfg, None).unwrap();
        // Two trials of two blocks' rounds: four blocks per pair.
        for (what, blocks) in [
            ("loaded", &r.loaded.block_ratios),
            ("nothing to do", &r.idle.block_ratios),
            ("scaling", &r.scaling.block_ratios),
        ] {
            assert_eq!(blocks.len(), 4, "{what}: {r}");
            assert!(
                blocks.iter().all(|x| x.is_finite() && *x > 0.0),
                "{what}: {blocks:?}"
            );
        }
        let text = r.to_string();
        for line in text.lines().filter(|l| l.starts_with("ratio ")) {
            let blocks = format!(", over 4 blocks of {BLOCK_ROUNDS} rounds)");
            assert!(line.contains(&blocks), "{line}");
        }
        assert_eq!(quartiles(&[4.0, 1.0, 3.0, 2.0]), (2.0, 4.0));
        assert_eq!(quartiles(&[]), (0.0, 0.0));
    }

    #[test]
    fn the_paired_median_is_the_middle_trial_ratio() {
        assert_eq!(median_ratio(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median_ratio(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median_ratio(&[]), 0.0);
    }

    #[test]
    fn the_median_trial_is_the_middle_mean() {
        let mut f = bench_scheduler(&small(), None).unwrap().loaded.storage;
        let trials: Vec<RoundFigures> = [3.0, 1.0, 2.0]
            .iter()
            .map(|m| {
                f.mean_us = *m;
                f.clone()
            })
            .collect();
        assert_eq!(median_trial(trials).unwrap().mean_us, 2.0);
        assert!(median_trial(vec![]).is_none());
    }

    #[test]
    fn one_scenario_alone_runs_its_own_side() {
        let on = bench_scheduler_scenario(&small(), Scenario::LoadedStorage, None).unwrap();
        assert_eq!(on.label, "storage enabled");
        assert!(on.outstanding_tickets >= 20.0, "{on}");
        let idle = bench_scheduler_scenario(&small(), Scenario::IdleDisabled, None).unwrap();
        assert_eq!(idle.label, "storage disabled, same workload");
        assert_eq!(idle.storage_ops_per_round, 0.0);
        let cfg = SchedulerBenchConfig {
            waiting: 30,
            ..small()
        };
        assert!(bench_scheduler_scenario(&cfg, Scenario::LoadedDisabled, None).is_err());
    }

    #[test]
    fn the_timed_rounds_admit_only_requests_that_arrived_into_a_running_scheduler() {
        for scenario in [
            Scenario::LoadedStorage,
            Scenario::LoadedDisabled,
            Scenario::IdleStorage,
            Scenario::IdleDisabled,
        ] {
            let f = bench_scheduler_scenario(&small(), scenario, None).unwrap();
            assert!(f.admitted_per_round > 0.0, "{scenario:?}: {f}");
            assert_eq!(f.first_round_forwards, 0, "{scenario:?}: {f}");
        }
    }

    #[test]
    fn the_repeated_prompt_puts_its_bound_on_a_block_boundary() {
        // Every token but the last is reusable: 33 tokens reuse 32, eight 4-token blocks.
        assert_eq!(prompt_with_aligned_bound(32, 4), 33);
        assert_eq!(prompt_with_aligned_bound(33, 4), 33);
        assert_eq!(prompt_with_aligned_bound(34, 4), 37);
        assert_eq!(prompt_with_aligned_bound(1, 4), 1);
        assert_eq!(prompt_with_aligned_bound(0, 4), 1);
        assert_eq!(prompt_with_aligned_bound(10, 0), 10);
    }

    #[test]
    fn too_few_waiting_requests_for_the_held_reads_is_refused() {
        let cfg = SchedulerBenchConfig {
            waiting: 30,
            outstanding: 20,
            ..small()
        };
        assert!(bench_scheduler(&cfg, None).is_err());
    }

    /// Requests that never finish (a decode far longer than the warm-up) never fill the
    /// scenario: it is refused with what it reached, not timed as a start-up mix.
    #[test]
    fn a_scenario_that_never_fills_is_refused_naming_what_it_reached() {
        let cfg = SchedulerBenchConfig {
            max_tokens: 1_000_000,
            ..small()
        };
        for storage in [true, false] {
            let Err(e) = warmed(&cfg, storage, Workload::Loaded) else {
                panic!("storage {storage}: warmed up");
            };
            assert!(
                e.starts_with(&format!(
                    "the scenario did not reach its steady state in {WARM_UP_ROUNDS} rounds:"
                )) && e.contains("0 of 200 finished"),
                "{e}"
            );
        }
    }

    #[test]
    fn owed_answers_queries_and_withholds_gets_above_the_hold() {
        let mut o = Owed::default();
        o.queries.push((OperationId(1), 4, 4));
        o.queries.push((OperationId(2), 4, 5));
        for i in 10..15 {
            o.gets.insert(OperationId(i), vec![16, 16]);
        }
        let done = o.completions(3);
        assert_eq!(done.len(), 4);
        assert_eq!(done[0].success, vec![false; 4]);
        assert_eq!(done[1].success, vec![true, true, false, false]);
        assert_eq!(done[2].op, OperationId(10));
        assert_eq!(done[3].op, OperationId(11));
        assert_eq!(o.gets.len(), 3);
        assert!(done.iter().all(|d| d.validate().is_ok()));
    }

    #[test]
    fn prompts_are_distinct_and_in_vocabulary() {
        let a = prompt(1, 32, 1000);
        let b = prompt(2, 32, 1000);
        assert_ne!(a, b);
        assert!(a.iter().all(|t| *t < 1000));
    }
}
