//! engine-host: the tsl3 binary. It parses the CLI, loads layered settings, and runs one
//! subcommand. Only this crate knows every actor and wires them.

mod alloc_count;

use engine_host::bench::commands::{AllocationCounter, BenchCommand, BenchEnv};
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
    /// A Hugging Face model directory served by the transformer backend (TP = 1); see
    /// `engine-host model init-random`.
    #[arg(long)]
    model_dir: Option<String>,
}

impl ServeFlags {
    fn overrides(&self) -> settings::Overrides {
        settings::Overrides {
            listen: self.listen.clone(),
            store: self.store.clone(),
            store_dir: self.store_dir.clone(),
            model_profile: self.model_profile.clone(),
            model_dir: self.model_dir.clone(),
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
            ("--model-dir", &self.model_dir),
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
    /// Model directory tools (`model init-random DIR`).
    Model {
        #[command(subcommand)]
        which: engine_host::model_cmd::ModelCommand,
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
    which.run(&BenchEnv {
        vars: env,
        allocations: Some(AllocationCounter {
            enable: alloc_count::enable,
            count: alloc_count::allocations,
        }),
    })
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
        Command::Model { which } => match which.run() {
            Ok(line) => {
                println!("{line}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
        Command::Bench { which } => match run_bench(which, &env) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
