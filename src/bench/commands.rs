//! The `engine-host bench` subcommands: one clap `Args` struct per bench (its flags, defaults
//! and help texts), the `BenchCommand` enum that names them with their one-line descriptions,
//! and `BenchRun`, each bench's run: it turns the parsed flags into the bench's config, calls
//! the measuring code in the actors crate or in this `bench` module, and prints the figures.
//! It owns the command lines, never the measurements: no timing, counting or assertion lives
//! here, and it never installs a global allocator (the binary owns that and lends its counter
//! through `BenchEnv`).

use crate::settings;
use clap::Subcommand;
use std::collections::HashMap;

/// What the binary lends a bench: the process environment and, where the binary installed
/// its counting allocator, that allocator's counter.
pub struct BenchEnv<'a> {
    pub vars: &'a HashMap<String, String>,
    pub allocations: Option<AllocationCounter>,
}

/// The binary's allocation counter: `enable` switches counting on process-wide, `count` reads
/// the allocations counted since.
#[derive(Clone, Copy)]
pub struct AllocationCounter {
    pub enable: fn(),
    pub count: fn() -> u64,
}

/// One bench's run from its parsed flags.
pub trait BenchRun {
    fn run(self, env: &BenchEnv) -> Result<(), String>;
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// GET and PUT throughput of 1000 x 64 KiB through our Mooncake adapter and through
    /// Mooncake's own Python client against the same master (deploy/mooncake/start.sh).
    Mooncake(MooncakeArgs),
    /// DFS -> MEMORY promotion throughput (refills of a tier whose memory was used before; the first fill of fresh memory printed apart) beside a plain file read + memcpy of the same bytes.
    Promotion(PromotionArgs),
    /// Round cost (apply + plan + d2h_done) of the real Scheduler with waiting requests and
    /// outstanding storage operations, beside the same round with storage disabled, and
    /// storage enabled with nothing to do beside its disabled twin, and the loaded storage
    /// round beside itself holding a tenth of the GETs: µs and allocations per round (median
    /// of alternating trials), the idle ratio, the scaling ratio, then the loaded ratio last.
    Scheduler(SchedulerArgs),
    /// StorageTransferManager::apply_round alone with outstanding operations and waiting
    /// requests.
    Stm(StmArgs),
    /// Control-plane round latency on loopback (all ranks in this process, real TCP): p50
    /// and p99 µs of idle rounds and of rounds carrying `records` completion records.
    Agreement(AgreementArgs),
    /// Matching and query planning against 1M Host and 100k Device blocks with 32k-token
    /// prompts: µs per request and per block, bytes per pooled block.
    Matcher(MatcherArgs),
    /// GET and PUT throughput of 64 KiB objects through the L3 executor on MemoryStore,
    /// beside a plain memcpy of the same bytes.
    Executor(ExecutorArgs),
    /// End-to-end TTFT of real engine-host processes per cohort (recompute, Device, Host,
    /// L3 from the shared-DFS tier with a warm and a cold page cache, L3 from the MEMORY
    /// tier, partial hit, miss) over a sweep of prompt lengths; every restored output is
    /// compared with recomputation. Writes ttft.json and ttft.svg under --out.
    Ttft(TtftArgs),
    /// Replays a public KV-cache trace (Mooncake FAST'25 or Alibaba Bailian JSONL, detected
    /// by its fields) through --instances engine hosts sharing one L3, in three cohorts
    /// (no-l3, shared-l3, restart): ideal against achieved cached-token rates, misses by
    /// reason, TTFT percentiles. Writes replay.json and replay.svg under --out.
    Replay(ReplayArgs),
    /// Create-only PUT throughput of the shared-DFS tier (group-committed batches, and one
    /// object per call) beside a plain sequential write of the same bytes with the same
    /// fsync policy.
    DfsPut(DfsPutArgs),
    /// A warm-cache GET of the shared-DFS tier beside a memcpy of the same bytes into the
    /// same destinations over the same threads (interleaved rounds): the store -> Host hop's
    /// time beyond raw transfer.
    DfsGet(DfsGetArgs),
    /// One prompt's flat KV: device compute, D2H, H2D and the restored forward, beside the
    /// cost model's recomputation time.
    FlatKv(FlatKvArgs),
    /// Writes a synthetic multi-turn conversation trace (Alibaba Bailian JSONL) for `bench
    /// replay`: each turn's prompt extends the previous turn's prompt at its (nonaligned)
    /// end by the answer and a new user message; sessions share a system prompt.
    ConversationTrace(ConversationTraceArgs),
    /// CPU of an idle `engine-host serve` (local store, no requests): CPU seconds per wall
    /// second over a fixed window, from every thread's /proc schedstat, the busiest threads
    /// first and the fraction of a core last.
    Idle(IdleArgs),
    /// Dependent-load latency over working sets from L1-sized to beyond the last-level
    /// cache (a random cycle through 64-byte lines): the price of one cold table touch, in
    /// which the scheduler round's cache misses are counted.
    Memory(MemoryArgs),
}

impl BenchCommand {
    /// Runs the chosen bench: the dispatch table.
    pub fn run(self, env: &BenchEnv) -> Result<(), String> {
        match self {
            Self::Mooncake(a) => a.run(env),
            Self::Promotion(a) => a.run(env),
            Self::Scheduler(a) => a.run(env),
            Self::Stm(a) => a.run(env),
            Self::Agreement(a) => a.run(env),
            Self::Matcher(a) => a.run(env),
            Self::Executor(a) => a.run(env),
            Self::Ttft(a) => a.run(env),
            Self::Replay(a) => a.run(env),
            Self::DfsPut(a) => a.run(env),
            Self::DfsGet(a) => a.run(env),
            Self::FlatKv(a) => a.run(env),
            Self::Idle(a) => a.run(env),
            Self::Memory(a) => a.run(env),
            Self::ConversationTrace(a) => a.run(env),
        }
    }
}

// The flags of `bench mooncake`.
#[derive(clap::Args, Debug)]
pub struct MooncakeArgs {
    /// Settings file for the [storage.mooncake] section (defaults and TSL3_* apply).
    #[arg(long)]
    config: Option<String>,
    /// Python interpreter with Mooncake's client ($MOONCAKE_PYTHON by default).
    #[arg(long)]
    python: Option<String>,
    /// Objects each client PUTs and GETs per round.
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    /// Bytes per object.
    #[arg(long, default_value_t = 65536)]
    object_bytes: usize,
    /// Rounds the clients alternate (each on a fresh namespace); each figure is the median.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

impl BenchRun for MooncakeArgs {
    fn run(self, env: &BenchEnv) -> Result<(), String> {
        let s = settings::load(
            self.config.as_deref(),
            env.vars,
            &settings::Overrides::default(),
        )?;
        let python = self
            .python
            .or_else(|| env.vars.get(actors::names::env::MOONCAKE_PYTHON).cloned())
            .unwrap_or_else(|| "deploy/.mooncake/venv-master/bin/python".to_string());
        let r = actors::l3::store::mooncake::bench::bench_mooncake(
            &s.storage.mooncake,
            &python,
            self.objects,
            self.object_bytes,
            self.rounds,
        )?;
        print!("{}", r.render());
        Ok(())
    }
}

// The flags of `bench promotion`.
#[derive(clap::Args, Debug)]
pub struct PromotionArgs {
    /// Directory for the DFS tier (a temporary one under it is used and removed, with
    /// the directories the run created).
    #[arg(long, default_value = ".tsl3/bench")]
    dir: String,
    /// Objects written to the DFS tier, then read and promoted.
    #[arg(long, default_value_t = 64)]
    objects: usize,
    /// Bytes per object.
    #[arg(long, default_value_t = 4 << 20)]
    object_bytes: usize,
    /// Promotion workers.
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Timed rounds of each side, alternately.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

impl BenchRun for PromotionArgs {
    fn run(self, _env: &BenchEnv) -> Result<(), String> {
        let base = super::ScratchDir::create(&self.dir, "promotion")?;
        actors::l3::store::local::bench::bench_promotion(
            base.path(),
            self.objects,
            self.object_bytes,
            self.workers,
            self.rounds,
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    }
}

// The flags of `bench scheduler`.
#[derive(clap::Args, Debug)]
pub struct SchedulerArgs {
    /// Storage operations held outstanding (GETs whose completions are withheld).
    #[arg(long, default_value_t = 1000)]
    outstanding: usize,
    /// Live requests the arrivals keep the scheduler at (most of them wait).
    #[arg(long, default_value_t = 10_000)]
    waiting: usize,
    /// Timed rounds per scenario (after an untimed warm-up).
    #[arg(long, default_value_t = 200)]
    rounds: usize,
    /// Prompt length in tokens (the tiny profile has 4-token blocks); the nothing-to-do
    /// pair's repeated prompt is the shortest at least this long whose reusable bound is
    /// block-aligned.
    #[arg(long, default_value_t = 32)]
    prompt_tokens: u32,
    /// Device blocks of the cache group (small: most requests wait).
    #[arg(long, default_value_t = 256)]
    device_blocks: u32,
    /// Requests running at once.
    #[arg(long, default_value_t = 16)]
    max_running: usize,
    /// Output tokens per request (a request runs about max_tokens + 1 rounds): with
    /// `--waiting` equal to `--max-running` and a long decode, few prompts arrive and the
    /// storage path has little to do.
    #[arg(long, default_value_t = 2)]
    max_tokens: u32,
    /// Trials of each pair of scenarios (storage enabled and disabled, alternating which
    /// runs first); each side reports its median trial.
    #[arg(long, default_value_t = 5)]
    trials: usize,
    /// Run one side of one pair once and print its figures alone (no ratio): for a
    /// profiler, e.g. `valgrind --tool=callgrind --toggle-collect='*timed_round*'`.
    #[arg(long, value_enum)]
    only: Option<SchedulerScenario>,
}

/// One side of one `bench scheduler` pair.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum SchedulerScenario {
    LoadedStorage,
    LoadedDisabled,
    IdleStorage,
    IdleDisabled,
}

impl From<SchedulerScenario> for actors::scheduler::bench::Scenario {
    fn from(s: SchedulerScenario) -> Self {
        use actors::scheduler::bench::Scenario as S;
        match s {
            SchedulerScenario::LoadedStorage => S::LoadedStorage,
            SchedulerScenario::LoadedDisabled => S::LoadedDisabled,
            SchedulerScenario::IdleStorage => S::IdleStorage,
            SchedulerScenario::IdleDisabled => S::IdleDisabled,
        }
    }
}

impl BenchRun for SchedulerArgs {
    fn run(self, env: &BenchEnv) -> Result<(), String> {
        let cfg = actors::scheduler::bench::SchedulerBenchConfig {
            waiting: self.waiting,
            outstanding: self.outstanding,
            rounds: self.rounds,
            prompt_tokens: self.prompt_tokens,
            device_blocks: self.device_blocks,
            max_running: self.max_running,
            max_tokens: self.max_tokens,
            trials: self.trials,
        };
        let allocations = env.allocations.map(|a| {
            (a.enable)();
            a.count
        });
        if let Some(only) = self.only {
            let r =
                actors::scheduler::bench::bench_scheduler_scenario(&cfg, only.into(), allocations)?;
            print!("{r}");
            return Ok(());
        }
        let r = actors::scheduler::bench::bench_scheduler(&cfg, allocations)?;
        print!("{r}");
        Ok(())
    }
}

// The flags of `bench stm`.
#[derive(clap::Args, Debug)]
pub struct StmArgs {
    /// Storage operations held outstanding (at least twice --per-round).
    #[arg(long, default_value_t = 1000)]
    outstanding: usize,
    /// Waiting requests.
    #[arg(long, default_value_t = 10_000)]
    waiting: usize,
    /// Timed rounds.
    #[arg(long, default_value_t = 200)]
    rounds: usize,
    /// GET and QUERY completions each round agrees (that many of each).
    #[arg(long, default_value_t = 32)]
    per_round: usize,
}

impl BenchRun for StmArgs {
    fn run(self, _env: &BenchEnv) -> Result<(), String> {
        let r = actors::storage_transfer::bench::bench_stm(
            self.outstanding,
            self.waiting,
            self.rounds,
            self.per_round,
        );
        println!(
            "storage transfer manager round: {} rounds, {} outstanding operations, {} waiting requests, {} completions/round: {:.2} us/round",
            r.rounds, r.outstanding_operations, r.waiting_requests, r.completions_per_round, r.us_per_round
        );
        Ok(())
    }
}

// The flags of `bench agreement`.
#[derive(clap::Args, Debug)]
pub struct AgreementArgs {
    /// Rank counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    ranks: Vec<u32>,
    /// Timed rounds per rank count and case.
    #[arg(long, default_value_t = 200)]
    rounds: usize,
    /// Completion records each round carries in the loaded case.
    #[arg(long, default_value_t = 1000)]
    records: usize,
}

impl BenchRun for AgreementArgs {
    fn run(self, _env: &BenchEnv) -> Result<(), String> {
        use actors::control_plane::Topology;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let mut summary = vec![];
        for world in self.ranks {
            for per_round in [0, self.records] {
                // The world's topology, then (from 3 ranks, where the two differ) the other
                // one beside it.
                let mut over = vec![None];
                if world >= 3 {
                    over.push(Some(match Topology::for_world(world) {
                        Topology::Star => Topology::FullMesh,
                        Topology::FullMesh => Topology::Star,
                    }));
                }
                let mut figures = vec![];
                for topology in over {
                    let f = rt
                        .block_on(actors::control_plane::bench::measure_over(
                            world,
                            per_round,
                            self.rounds.max(1),
                            topology,
                        ))
                        .map_err(|e| e.to_string())?;
                    // Every rank reports every record: a round handles world x records.
                    let per_record = (f.records > 0)
                        .then(|| f.p50_us as f64 / (f.world as f64 * f.records as f64));
                    println!(
                        "agreement ranks={} topology={:?} frames/round={:.1} records/round={} rounds={} p50={}us p99={}us{}",
                        f.world,
                        f.topology,
                        f.frames_per_round,
                        f.records,
                        f.rounds,
                        f.p50_us,
                        f.p99_us,
                        per_record
                            .map(|r| format!(" p50 per rank and record={r:.3}us"))
                            .unwrap_or_default()
                    );
                    figures.push(f);
                }
                let star = figures.iter().find(|f| f.topology == Topology::Star);
                let mesh = figures.iter().find(|f| f.topology == Topology::FullMesh);
                if let (Some(star), Some(mesh), 2) = (star, mesh, figures.len()) {
                    println!(
                        "agreement ranks={} records/round={}: star / full mesh p50 {:.2}x, p99 {:.2}x",
                        world,
                        per_round,
                        star.p50_us as f64 / mesh.p50_us.max(1) as f64,
                        star.p99_us as f64 / mesh.p99_us.max(1) as f64,
                    );
                }
                let f = &figures[0];
                if f.world == 8 {
                    summary.push(if f.records == 0 {
                        format!(
                            "8 ranks idle: p99 {:.2} ms (target <= 1 ms)",
                            f.p99_us as f64 / 1e3
                        )
                    } else {
                        format!(
                            "8 ranks, {} records: p50 {:.1} ms (target <= 8 ms with 1000)",
                            f.records,
                            f.p50_us as f64 / 1e3
                        )
                    });
                }
            }
        }
        for line in summary {
            println!("agreement {line}");
        }
        Ok(())
    }
}

// The flags of `bench matcher`.
#[derive(clap::Args, Debug)]
pub struct MatcherArgs {
    /// Blocks in the Host pool.
    #[arg(long, default_value_t = 1_000_000)]
    host_blocks: u32,
    /// Blocks in the Device pool.
    #[arg(long, default_value_t = 100_000)]
    device_blocks: u32,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 32_768)]
    prompt_tokens: u32,
    /// Timed requests per phase.
    #[arg(long, default_value_t = 20)]
    requests: u32,
}

impl BenchRun for MatcherArgs {
    fn run(self, _env: &BenchEnv) -> Result<(), String> {
        let r = actors::cache::bench::bench_matcher(&actors::cache::bench::MatcherBenchConfig {
            host_blocks: self.host_blocks,
            device_blocks: self.device_blocks,
            prompt_tokens: self.prompt_tokens,
            requests: self.requests,
        });
        print!("{r}");
        Ok(())
    }
}

// The flags of `bench executor`.
#[derive(clap::Args, Debug)]
pub struct ExecutorArgs {
    /// Objects of 64 KiB.
    #[arg(long, default_value_t = 2048)]
    objects: usize,
    /// Keys per operation.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// PUT + GET rounds.
    #[arg(long, default_value_t = 8)]
    rounds: usize,
}

impl BenchRun for ExecutorArgs {
    fn run(self, _env: &BenchEnv) -> Result<(), String> {
        actors::l3::bench::bench_executor(self.objects, self.batch, self.rounds)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

// The flags of `bench ttft`.
#[derive(clap::Args, Debug)]
pub struct TtftArgs {
    #[arg(long, default_value = "llama-8b-like", help = settings::profile_help())]
    profile: String,
    /// Serve this model directory (transformer backend, real CPU compute) instead of
    /// --profile; `engine-host model init-random DIR` writes one.
    #[arg(long)]
    model_dir: Option<String>,
    /// Prompt lengths in tokens.
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384")]
    lengths: Vec<u64>,
    /// Timed requests per cohort and length.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// The one wait budget of every cohort (storage.contract.soft_deadline_ms).
    #[arg(long, default_value_t = 2000)]
    soft_deadline_ms: u64,
    /// Run the device as fast as the CPU can instead of sleeping the cost model's time.
    #[arg(long)]
    no_device_time: bool,
    /// Tokens generated per timed request.
    #[arg(long, default_value_t = 4)]
    max_tokens: u32,
    /// Decode length of the concurrent-decode TPOT check (0: skip it).
    #[arg(long, default_value_t = 32)]
    tpot_tokens: u32,
    /// Output directory (JSON, SVG, logs, store directories).
    #[arg(long, default_value = ".tsl3/bench/ttft")]
    out: String,
    /// Also measure Mooncake Store as the MEMORY tier: the instance named by the
    /// environment deploy/mooncake/env.sh exports.
    #[arg(long)]
    mooncake: bool,
    /// Measure only these cohorts (comma-separated; `recompute` always runs, every ratio
    /// needs it): e.g. `--cohorts host,l3-dfs-warm` skips the other processes. Default:
    /// every cohort.
    #[arg(long, value_delimiter = ',')]
    cohorts: Vec<String>,
}

impl BenchRun for TtftArgs {
    fn run(self, _env: &BenchEnv) -> Result<(), String> {
        super::ttft::run(&super::ttft::TtftConfig {
            profile: self.profile,
            model_dir: self.model_dir.map(Into::into),
            lengths: self.lengths,
            runs: self.runs,
            soft_deadline_ms: self.soft_deadline_ms,
            emulate_device_time: !self.no_device_time,
            max_tokens: self.max_tokens,
            tpot_tokens: self.tpot_tokens,
            out: self.out.into(),
            mooncake: self.mooncake,
            cohorts: self.cohorts,
        })
    }
}

// The flags of `bench replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The trace file (JSONL), e.g. ../shared/data/mooncake_conversation_trace.jsonl.
    #[arg(long)]
    trace: String,
    /// Replay only the first K requests.
    #[arg(long)]
    limit: Option<usize>,
    /// Engine-host processes sharing the L3.
    #[arg(long, default_value_t = 2)]
    instances: usize,
    #[arg(long, default_value = "replay-small", help = settings::profile_help())]
    profile: String,
    /// Open loop at this multiple of the trace's timestamps (default: closed loop).
    #[arg(long)]
    speedup: Option<f64>,
    /// Closed loop: requests in flight at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// round-robin | affinity (by conversation, or by first block).
    #[arg(long, default_value = "round-robin")]
    routing: String,
    /// Generated tokens per request: the trace's output length capped at this.
    #[arg(long, default_value_t = 16)]
    max_output: u32,
    /// The wait budget of every request (storage.contract.soft_deadline_ms).
    #[arg(long, default_value_t = 2000)]
    soft_deadline_ms: u64,
    /// Run the device as fast as the CPU can instead of sleeping the cost model's time.
    #[arg(long)]
    no_device_time: bool,
    /// Device blocks per group of each instance (0: twice the longest prompt).
    #[arg(long, default_value_t = 0)]
    device_blocks: u64,
    /// Output directory (JSON, SVG, logs, store directories).
    #[arg(long, default_value = ".tsl3/bench/replay")]
    out: String,
    /// Share Mooncake Store (the instance named by the environment deploy/mooncake/
    /// env.sh exports) instead of a local-store directory.
    #[arg(long)]
    mooncake: bool,
    /// model.tail_hints of every instance (0: tails off, only aligned boundaries reused).
    #[arg(long, default_value_t = 4096)]
    tail_hints: u32,
}

impl BenchRun for ReplayArgs {
    fn run(self, _env: &BenchEnv) -> Result<(), String> {
        super::replay::run(&super::replay::ReplayConfig {
            trace: self.trace.into(),
            limit: self.limit,
            instances: self.instances,
            profile: self.profile,
            speedup: self.speedup,
            concurrency: self.concurrency,
            routing: self.routing.parse()?,
            max_output: self.max_output,
            soft_deadline_ms: self.soft_deadline_ms,
            emulate_device_time: !self.no_device_time,
            device_blocks: self.device_blocks,
            out: self.out.into(),
            mooncake: self.mooncake,
            tail_hints: self.tail_hints,
        })
    }
}

// The flags of `bench conversation-trace`.
#[derive(clap::Args, Debug)]
pub struct ConversationTraceArgs {
    /// The JSONL file to write.
    #[arg(long)]
    out: String,
    /// Conversations.
    #[arg(long, default_value_t = 48)]
    sessions: u32,
    /// Turns per conversation.
    #[arg(long, default_value_t = 4)]
    turns: u32,
    /// The system prompt every conversation starts with.
    #[arg(long, default_value_t = 600)]
    system_tokens: u64,
    /// Mean user message (each in [mean/2, 3 mean/2]).
    #[arg(long, default_value_t = 200)]
    user_tokens: u64,
    /// Mean answer (each in [mean/2, 3 mean/2]); the next turn's prompt holds it.
    #[arg(long, default_value_t = 150)]
    output_tokens: u64,
    /// Milliseconds between arrivals (turn k of session s at (k * sessions + s) * gap).
    #[arg(long, default_value_t = 100.0)]
    gap_ms: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl BenchRun for ConversationTraceArgs {
    fn run(self, _env: &BenchEnv) -> Result<(), String> {
        let spec = super::trace::ConversationSpec {
            sessions: self.sessions,
            turns: self.turns,
            system_tokens: self.system_tokens,
            user_tokens: self.user_tokens,
            output_tokens: self.output_tokens,
            gap_ms: self.gap_ms,
            seed: self.seed,
        };
        if spec.sessions == 0 || spec.turns == 0 || spec.system_tokens + spec.user_tokens == 0 {
            return Err(
                "--sessions, --turns and --system-tokens + --user-tokens must be at least 1".into(),
            );
        }
        let text = spec.jsonl();
        std::fs::write(&self.out, &text).map_err(|e| format!("{}: {e}", self.out))?;
        println!(
            "wrote {} requests ({} sessions x {} turns) to {}",
            spec.sessions * spec.turns,
            spec.sessions,
            spec.turns,
            self.out
        );
        Ok(())
    }
}

// The flags of `bench dfs-put`.
#[derive(clap::Args, Debug)]
pub struct DfsPutArgs {
    /// Directory for the runs (fresh subdirectories, removed afterwards with the
    /// directories the run created).
    #[arg(long, default_value = ".tsl3/bench")]
    dir: String,
    /// Objects written per run.
    #[arg(long, default_value_t = 2048)]
    objects: usize,
    /// Bytes per object.
    #[arg(long, default_value_t = 65536)]
    object_bytes: usize,
    /// Objects per PUT call (and per syncfs of the baseline).
    #[arg(long, default_value_t = 64)]
    batch: usize,
}

impl BenchRun for DfsPutArgs {
    fn run(self, _env: &BenchEnv) -> Result<(), String> {
        let base = super::ScratchDir::create(&self.dir, "dfs-put")?;
        let r = actors::l3::store::dfs_bench::bench_dfs_put(
            base.path(),
            self.objects,
            self.object_bytes,
            self.batch,
        );
        drop(base);
        println!("{}", r?);
        Ok(())
    }
}

// The flags of `bench dfs-get`.
#[derive(clap::Args, Debug)]
pub struct DfsGetArgs {
    /// Directory for the run (a fresh subdirectory, removed afterwards).
    #[arg(long, default_value = ".tsl3/bench")]
    dir: String,
    /// Objects read per round.
    #[arg(long, default_value_t = 512)]
    objects: usize,
    /// Bytes per object (llama-8b-like: a 16-token block is 2 MiB).
    #[arg(long, default_value_t = 2 << 20)]
    object_bytes: usize,
    /// Keys per GET call.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Interleaved rounds (the best of each is kept).
    #[arg(long, default_value_t = 4)]
    rounds: usize,
}

impl BenchRun for DfsGetArgs {
    fn run(self, _env: &BenchEnv) -> Result<(), String> {
        let base = super::ScratchDir::create(&self.dir, "dfs-get")?;
        let r = actors::l3::store::dfs_bench::bench_dfs_get(
            base.path(),
            self.objects,
            self.object_bytes,
            self.batch,
            self.rounds,
        );
        drop(base);
        println!("{}", r?);
        Ok(())
    }
}

/// `bench flat-kv --profile`'s help: the profiles of one full-attention cache group.
fn flat_kv_profile_help() -> String {
    format!(
        "A profile of one full-attention cache group: {}",
        actors::device::bench::flat_kv_profiles().join(" | ")
    )
}

// The flags of `bench flat-kv`.
#[derive(clap::Args, Debug)]
pub struct FlatKvArgs {
    #[arg(long, default_value = "llama-8b-like", help = flat_kv_profile_help())]
    profile: String,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 512)]
    tokens: u64,
}

impl BenchRun for FlatKvArgs {
    fn run(self, _env: &BenchEnv) -> Result<(), String> {
        let r = actors::device::bench::flat_kv(&self.profile, self.tokens)
            .map_err(|e| e.to_string())?;
        print!("{r}");
        Ok(())
    }
}

// The flags of `bench memory`.
#[derive(clap::Args, Debug)]
pub struct MemoryArgs {
    /// Working-set sizes in KiB, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "32,256,512,1024,2048,4096,8192,16384,65536,262144"
    )]
    sizes_kib: Vec<u64>,
    /// Dependent loads timed per size.
    #[arg(long, default_value_t = 20_000_000)]
    steps: u64,
}

impl BenchRun for MemoryArgs {
    fn run(self, _env: &BenchEnv) -> Result<(), String> {
        super::memory::run(&super::memory::MemoryConfig {
            sizes_kib: self.sizes_kib,
            steps: self.steps,
        })
    }
}

// The flags of `bench idle`.
#[derive(clap::Args, Debug)]
pub struct IdleArgs {
    /// Seconds of the measured window.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Seconds the serve process settles after it answered /health.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Directory for the scratch store and the log (removed afterwards).
    #[arg(long, default_value = "/tmp")]
    dir: String,
}

impl BenchRun for IdleArgs {
    fn run(self, _env: &BenchEnv) -> Result<(), String> {
        let secs = |v: f64, flag: &str| {
            std::time::Duration::try_from_secs_f64(v)
                .map_err(|_| format!("--{flag} {v}: not a number of seconds"))
        };
        super::idle::run(&super::idle::IdleConfig {
            window: secs(self.seconds, "seconds")?,
            warmup: secs(self.warmup, "warmup")?,
            dir: self.dir,
        })
    }
}
