//! engine-host: the tsl3 binary. It parses the CLI, loads layered settings, and runs one
//! subcommand. Only this crate knows every actor and wires them.

mod alloc_count;

use engine_host::settings;

use clap::{Parser, Subcommand};
use std::collections::HashMap;
use std::process::ExitCode;

/// Counts allocations only while a benchmark has switched counting on (alloc_count.rs).
#[global_allocator]
static GLOBAL: alloc_count::CountingAllocator = alloc_count::CountingAllocator;

#[derive(Parser, Debug)]
#[command(
    name = "engine-host",
    version,
    about = "tsl3: the asynchronous global L3 KV cache engine host"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

fn store_help() -> String {
    format!(
        "L3 backend: {}",
        messages::settings::StoreKind::NAMES.join(" | ")
    )
}

/// `--tp`'s help: the TP sizes each profile can be split across.
fn tp_help() -> String {
    let sizes: Vec<String> = settings::MODEL_PROFILES
        .iter()
        .filter_map(|n| actors::model::ModelProfile::by_name(n).ok())
        .map(|p| {
            let s: Vec<String> = p.tp_sizes(64).iter().map(|x| x.to_string()).collect();
            format!("{} {}", p.name, s.join("|"))
        })
        .collect();
    format!(
        "Ranks of the replica (TP size), one process each; must divide the model profile's KV heads: {}",
        sizes.join(", ")
    )
}

fn flat_kv_profile_help() -> String {
    format!(
        "A profile of one full-attention cache group: {}",
        actors::device::bench::flat_kv_profiles().join(" | ")
    )
}

/// Flags shared by `serve` and `launch` (beside the layered settings).
#[derive(clap::Args, Debug, Clone, Default)]
struct ServeFlags {
    /// Settings file layered over config/default.toml.
    #[arg(long)]
    config: Option<String>,
    /// HTTP address of the leader's API.
    #[arg(long)]
    listen: Option<String>,
    #[arg(long, help = store_help())]
    store: Option<String>,
    /// Directory of the local store's shared-DFS tier.
    #[arg(long)]
    store_dir: Option<String>,
    #[arg(long, help = settings::profile_help())]
    model_profile: Option<String>,
}

impl ServeFlags {
    fn overrides(&self) -> settings::Overrides {
        settings::Overrides {
            listen: self.listen.clone(),
            store: self.store.clone(),
            store_dir: self.store_dir.clone(),
            model_profile: self.model_profile.clone(),
            ..Default::default()
        }
    }
    fn args(&self) -> Vec<String> {
        let mut v = vec![];
        for (flag, val) in [
            ("--config", &self.config),
            ("--store", &self.store),
            ("--store-dir", &self.store_dir),
            ("--model-profile", &self.model_profile),
        ] {
            if let Some(x) = val {
                v.push(flag.to_string());
                v.push(x.clone());
            }
        }
        v
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one rank: the scheduler, the cache hierarchy and (on rank 0) the HTTP API.
    Serve {
        #[command(flatten)]
        flags: ServeFlags,
        /// This process's TP rank.
        #[arg(long)]
        rank: Option<u32>,
        /// Ranks in the replica.
        #[arg(long)]
        world: Option<u32>,
        /// Mesh addresses of every rank, in rank order (host:port,host:port,...).
        #[arg(long, value_delimiter = ',')]
        peers: Option<Vec<String>>,
        /// Base address of the ranks' /metrics and /health: rank r serves them on its port
        /// + r (default: --listen's port + r; launch sets it for each rank).
        #[arg(long)]
        metrics_listen: Option<String>,
        /// Resolve and validate the settings this command line gives, print them and exit
        /// (0 when valid, 2 otherwise) without starting anything.
        #[arg(long)]
        check_config: bool,
    },
    /// Start N rank processes of one replica on this machine (generated mesh settings);
    /// `--listen` is the leader's HTTP address. Exits non-zero when any rank fails.
    Launch {
        #[arg(long, help = tp_help())]
        tp: u32,
        #[command(flatten)]
        flags: ServeFlags,
    },
    /// Validate a settings file (layered over the defaults and TSL3_* environment) and print
    /// the resolved settings.
    CheckConfig {
        /// The settings file.
        file: String,
    },
    /// Print the settings reference, docs/settings.md: every key with its type, default,
    /// meaning and rule, and every benchmark option
    /// (`engine-host settings-doc > docs/settings.md`).
    SettingsDoc,
    /// Run a benchmark and print its figures (ratios measured side by side in one run).
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// GET and PUT throughput of 1000 x 64 KiB through our Mooncake adapter and through
    /// Mooncake's own Python client against the same master (deploy/mooncake/start.sh).
    Mooncake {
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
    },
    /// DFS -> MEMORY promotion throughput beside a plain file read + memcpy of the same bytes.
    Promotion {
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
    },
    /// Round cost (apply + plan + d2h_done) of the real Scheduler with waiting requests and
    /// outstanding storage operations, beside the same round with storage disabled: µs and
    /// allocations per round, the ratio last.
    Scheduler {
        /// Storage operations held outstanding (GETs whose completions are withheld).
        #[arg(long, default_value_t = 1000)]
        outstanding: usize,
        /// Live requests the arrivals keep the scheduler at (most of them wait).
        #[arg(long, default_value_t = 10_000)]
        waiting: usize,
        /// Timed rounds per scenario (after an untimed warm-up).
        #[arg(long, default_value_t = 200)]
        rounds: usize,
        /// Prompt length in tokens (the tiny profile has 4-token blocks).
        #[arg(long, default_value_t = 32)]
        prompt_tokens: u32,
        /// Device blocks of the cache group (small: most requests wait).
        #[arg(long, default_value_t = 256)]
        device_blocks: u32,
        /// Requests running at once.
        #[arg(long, default_value_t = 16)]
        max_running: usize,
    },
    /// StorageTransferManager::apply_round alone with outstanding operations and waiting
    /// requests.
    Stm {
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
    },
    /// Control-plane round latency on loopback (all ranks in this process, real TCP): p50
    /// and p99 µs of idle rounds and of rounds carrying `records` completion records.
    Agreement {
        /// Rank counts to measure.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        ranks: Vec<u32>,
        /// Timed rounds per rank count and case.
        #[arg(long, default_value_t = 200)]
        rounds: usize,
        /// Completion records each round carries in the loaded case.
        #[arg(long, default_value_t = 1000)]
        records: usize,
    },
    /// Matching and query planning against 1M Host and 100k Device blocks with 32k-token
    /// prompts: µs per request and per block, bytes per pooled block.
    Matcher {
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
    },
    /// GET and PUT throughput of 64 KiB objects through the L3 executor on MemoryStore,
    /// beside a plain memcpy of the same bytes.
    Executor {
        /// Objects of 64 KiB.
        #[arg(long, default_value_t = 2048)]
        objects: usize,
        /// Keys per operation.
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// PUT + GET rounds.
        #[arg(long, default_value_t = 8)]
        rounds: usize,
    },
    /// End-to-end TTFT of real engine-host processes per cohort (recompute, Device, Host,
    /// L3 from the shared-DFS tier with a warm and a cold page cache, L3 from the MEMORY
    /// tier, partial hit, miss) over a sweep of prompt lengths; every restored output is
    /// compared with recomputation. Writes ttft.json and ttft.svg under --out.
    Ttft {
        #[arg(long, default_value = "llama-8b-like", help = settings::profile_help())]
        profile: String,
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
    },
    /// Replays a public KV-cache trace (Mooncake FAST'25 or Alibaba Bailian JSONL, detected
    /// by its fields) through --instances engine hosts sharing one L3, in three cohorts
    /// (no-l3, shared-l3, restart): ideal against achieved cached-token rates, misses by
    /// reason, TTFT percentiles. Writes replay.json and replay.svg under --out.
    Replay {
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
    },
    /// Create-only PUT throughput of the shared-DFS tier (group-committed batches, and one
    /// object per call) beside a plain sequential write of the same bytes with the same
    /// fsync policy.
    DfsPut {
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
    },
    /// One prompt's flat KV: device compute, D2H, H2D and the restored forward, beside the
    /// cost model's recomputation time.
    FlatKv {
        #[arg(long, default_value = "llama-8b-like", help = flat_kv_profile_help())]
        profile: String,
        /// Prompt length in tokens.
        #[arg(long, default_value_t = 512)]
        tokens: u64,
    },
}

/// (name, `--help` text) of every `bench` subcommand, for the settings reference.
fn bench_help() -> Vec<(String, String)> {
    use clap::CommandFactory;
    let mut cli = Cli::command();
    cli.build();
    let Some(bench) = cli.find_subcommand("bench") else {
        return vec![];
    };
    bench
        .get_subcommands()
        .filter(|c| c.get_name() != "help")
        .map(|c| {
            (
                c.get_name().to_string(),
                c.clone().render_long_help().to_string(),
            )
        })
        .collect()
}

fn run_bench(which: BenchCommand, env: &HashMap<String, String>) -> Result<(), String> {
    match which {
        BenchCommand::Mooncake {
            config,
            python,
            objects,
            object_bytes,
            rounds,
        } => {
            let s = settings::load(config.as_deref(), env, &settings::Overrides::default())?;
            let python = python
                .or_else(|| env.get(actors::names::env::MOONCAKE_PYTHON).cloned())
                .unwrap_or_else(|| "deploy/.mooncake/venv-master/bin/python".to_string());
            let r = actors::l3::store::mooncake::bench::bench_mooncake(
                &s.storage.mooncake,
                &python,
                objects,
                object_bytes,
                rounds,
            )?;
            print!("{}", r.render());
            Ok(())
        }
        BenchCommand::Promotion {
            dir,
            objects,
            object_bytes,
            workers,
            rounds,
        } => {
            let base = engine_host::bench::ScratchDir::create(&dir, "promotion")?;
            actors::l3::store::local::bench::bench_promotion(
                base.path(),
                objects,
                object_bytes,
                workers,
                rounds,
            )
            .map(|_| ())
            .map_err(|e| e.to_string())
        }
        BenchCommand::Scheduler {
            outstanding,
            waiting,
            rounds,
            prompt_tokens,
            device_blocks,
            max_running,
        } => {
            let cfg = actors::scheduler::bench::SchedulerBenchConfig {
                waiting,
                outstanding,
                rounds,
                prompt_tokens,
                device_blocks,
                max_running,
                ..Default::default()
            };
            alloc_count::enable();
            let r =
                actors::scheduler::bench::bench_scheduler(&cfg, Some(alloc_count::allocations))?;
            print!("{r}");
            Ok(())
        }
        BenchCommand::Agreement {
            ranks,
            rounds,
            records,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            for world in ranks {
                for per_round in [0, records] {
                    let f = rt
                        .block_on(actors::control_plane::bench::measure(
                            world,
                            per_round,
                            rounds.max(1),
                        ))
                        .map_err(|e| e.to_string())?;
                    println!(
                        "agreement ranks={} records/round={} rounds={} p50={}us p99={}us",
                        f.world, f.records, f.rounds, f.p50_us, f.p99_us
                    );
                }
            }
            Ok(())
        }
        BenchCommand::Stm {
            outstanding,
            waiting,
            rounds,
            per_round,
        } => {
            let r =
                actors::storage_transfer::bench::bench_stm(outstanding, waiting, rounds, per_round);
            println!(
                "storage transfer manager round: {} rounds, {} outstanding operations, {} waiting requests, {} completions/round: {:.2} us/round",
                r.rounds, r.outstanding_operations, r.waiting_requests, r.completions_per_round, r.us_per_round
            );
            Ok(())
        }
        BenchCommand::Matcher {
            host_blocks,
            device_blocks,
            prompt_tokens,
            requests,
        } => {
            let r =
                actors::cache::bench::bench_matcher(&actors::cache::bench::MatcherBenchConfig {
                    host_blocks,
                    device_blocks,
                    prompt_tokens,
                    requests,
                });
            print!("{r}");
            Ok(())
        }
        BenchCommand::Executor {
            objects,
            batch,
            rounds,
        } => actors::l3::bench::bench_executor(objects, batch, rounds)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        BenchCommand::Ttft {
            profile,
            lengths,
            runs,
            soft_deadline_ms,
            no_device_time,
            max_tokens,
            tpot_tokens,
            out,
            mooncake,
        } => engine_host::bench::ttft::run(&engine_host::bench::ttft::TtftConfig {
            profile,
            lengths,
            runs,
            soft_deadline_ms,
            emulate_device_time: !no_device_time,
            max_tokens,
            tpot_tokens,
            out: out.into(),
            mooncake,
        }),
        BenchCommand::Replay {
            trace,
            limit,
            instances,
            profile,
            speedup,
            concurrency,
            routing,
            max_output,
            soft_deadline_ms,
            no_device_time,
            device_blocks,
            out,
            mooncake,
        } => engine_host::bench::replay::run(&engine_host::bench::replay::ReplayConfig {
            trace: trace.into(),
            limit,
            instances,
            profile,
            speedup,
            concurrency,
            routing: routing.parse()?,
            max_output,
            soft_deadline_ms,
            emulate_device_time: !no_device_time,
            device_blocks,
            out: out.into(),
            mooncake,
        }),
        BenchCommand::DfsPut {
            dir,
            objects,
            object_bytes,
            batch,
        } => {
            let base = engine_host::bench::ScratchDir::create(&dir, "dfs-put")?;
            let r = actors::l3::store::dfs_bench::bench_dfs_put(
                base.path(),
                objects,
                object_bytes,
                batch,
            );
            drop(base);
            println!("{}", r?);
            Ok(())
        }
        BenchCommand::FlatKv { profile, tokens } => {
            let r = actors::device::bench::flat_kv(&profile, tokens).map_err(|e| e.to_string())?;
            print!("{r}");
            Ok(())
        }
    }
}

fn init_telemetry(
    s: &settings::Settings,
    env: &HashMap<String, String>,
) -> Result<engine_host::telemetry::TelemetryGuard, String> {
    let target = engine_host::telemetry::resolve_target(
        &s.telemetry.otlp_endpoint,
        &s.telemetry.otlp_protocol,
        env.get(actors::names::env::OTEL_EXPORTER_OTLP_ENDPOINT)
            .map(|v| v.as_str()),
    )
    .map_err(|e| e.to_string())?;
    // The OTLP exporter runs on a runtime of its own (kept for the process).
    let rt = Box::leak(Box::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?,
    ));
    let _enter = rt.enter();
    engine_host::telemetry::init(target, "tsl3-engine-host", s.tp.rank)
        .map_err(|e| format!("{e:#}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let env: HashMap<String, String> = std::env::vars().collect();
    match cli.command {
        Command::Serve {
            flags,
            rank,
            world,
            peers,
            metrics_listen,
            check_config,
        } => {
            let mut o = flags.overrides();
            o.metrics_listen = metrics_listen;
            o.rank = rank;
            o.world = world;
            o.peers = peers;
            let s = match settings::load(flags.config.as_deref(), &env, &o) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            if check_config {
                print!("{}", settings::to_toml(&s));
                return ExitCode::SUCCESS;
            }
            let _guard = match init_telemetry(&s, &env) {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            match engine_host::serve::run(s) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Launch { tp, flags } => {
            // Every rank would refuse settings that do not resolve for this world: say so
            // once, before starting any (the mesh addresses and secret are launch's own).
            let mut metrics = vec![];
            if (1..=64).contains(&tp) {
                let mut o = flags.overrides();
                o.world = Some(tp);
                o.rank = Some(0);
                o.peers = Some((0..tp).map(|r| format!("127.0.0.1:{}", r + 1)).collect());
                let mut env = env.clone();
                env.entry("TSL3_TP__SECRET".into())
                    .or_insert_with(|| "launch".into());
                let s = match settings::load(flags.config.as_deref(), &env, &o) {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::from(2);
                    }
                };
                // Rank r's /metrics and /health: the base port + r (the leader's are on its
                // API address unless server.metrics_listen moves them).
                for r in 0..tp {
                    match s.metrics_address_of(r) {
                        Ok(a) => metrics.push(a),
                        Err(e) => {
                            eprintln!("error: {e}");
                            return ExitCode::from(2);
                        }
                    }
                }
            }
            engine_host::launch::run(tp, flags.args(), flags.listen.clone(), metrics, &env)
        }
        Command::SettingsDoc => {
            print!("{}", engine_host::settings_doc::render(&bench_help()));
            ExitCode::SUCCESS
        }
        Command::CheckConfig { file } => {
            let loaded = settings::load(Some(&file), &env, &settings::Overrides::default())
                .and_then(|s| match engine_host::serve::preflight(&s) {
                    Ok(_) => Ok(s),
                    Err(e) => Err(e.to_string().replace('\n', " ")),
                });
            match loaded {
                Ok(s) => {
                    print!("{}", settings::to_toml(&s));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Bench { which } => match run_bench(which, &env) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
