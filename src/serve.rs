//! `engine-host serve`: the wiring of one rank. It turns settings into the rank's spec and
//! store, builds the rank (startup factory), establishes the ControlPlane mesh (a world of
//! one uses the same path), starts the event loop (`actors::engine::event_loop`) on its own
//! thread and — on the leader — serves the HTTP API. Signals (SIGTERM, Ctrl-C) ask the loop
//! to drain. It holds no loop, protocol or type translation of its own.

use crate::settings::Settings;
use actors::clock::{SharedClock, SystemClock};
use actors::control_plane::mesh::MeshSettings;
use actors::control_plane::plane::ControlPlaneCore;
use actors::device::DeviceBackendChoice;
use actors::engine::admin::AdminContext;
use actors::engine::event_loop::{self, LoopConfig, LoopShared};
use actors::engine::exporter::PromotingStore;
use actors::engine::factory::{build_rank, RankSpec};
use actors::frontend::health::RankHealth;
use actors::frontend::{FrontendState, RequestLimits};
use actors::l3::store::local::{LocalStore, LocalStoreConfig};
use actors::l3::store::memory::MemoryStore;
use actors::l3::store::mooncake::MooncakeStore;
use actors::l3::store::tiered::{TieredConfig, TieredStore};
use actors::l3::store::Store;
use actors::metrics::{MetricLabels, Metrics};
use actors::model::SyntheticModel;
use anyhow::{anyhow, Context, Result};
use messages::settings::StoreKind;
use messages::Namespace;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The model's cache geometry: the synthetic profile, or a model directory's (its config
/// only; the weights load when the rank is built).
fn model_geometry(s: &Settings) -> Result<SyntheticModel> {
    if s.model.dir.is_empty() {
        return SyntheticModel::by_name(&s.model.profile).map_err(|e| anyhow!("{e}"));
    }
    let (_, profile) = actors::model::checkpoint::read(
        std::path::Path::new(&s.model.dir),
        s.model.block_tokens as u64,
        s.tp.world,
    )
    .map_err(|e| anyhow!("invalid setting model.dir: {e}"))?;
    Ok(SyntheticModel::new(profile))
}

/// The HTTP side's text codec: the model directory's tokenizer and chat template, or the
/// synthetic model's bytes.
fn text_codec(
    s: &Settings,
    engine: &actors::engine::RankEngine,
) -> Result<Arc<dyn actors::frontend::TextCodec>> {
    if s.model.dir.is_empty() {
        return Ok(Arc::new(actors::frontend::ByteCodec));
    }
    let eos = engine.eos_tokens();
    let text =
        actors::frontend::model_text::ModelText::from_dir(std::path::Path::new(&s.model.dir), eos)
            .map_err(|e| anyhow!("invalid setting model.dir: {e}"))?;
    Ok(Arc::new(text))
}

/// The model's name in the API (`/v1/models`) and in logs.
pub fn model_name(s: &Settings) -> String {
    if s.model.dir.is_empty() {
        return format!("synthetic-{}", s.model.profile);
    }
    let path = std::path::Path::new(&s.model.dir);
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| s.model.dir.clone())
}

/// The rank spec and store factory from settings.
pub fn rank_spec(s: &Settings) -> Result<RankSpec> {
    let model = model_geometry(s)?;
    let groups = model.profile().groups.len().max(1) as u64;
    let host_blocks = if s.host_cache.size_bytes > 0 {
        let per_block: u64 = model
            .profile()
            .groups
            .iter()
            .map(|g| g.shard_block_bytes(s.tp.world).unwrap_or(1))
            .sum();
        (s.host_cache.size_bytes / per_block.max(1)).max(1)
    } else {
        (s.model.device_blocks as f64 * s.host_cache.ratio).ceil() as u64
    };
    let host_blocks = u32::try_from(host_blocks / groups.max(1) * groups.max(1)).map_err(|_| {
        anyhow!(
            "invalid setting {}: {host_blocks} Host blocks are more than a pool can address ({})",
            if s.host_cache.size_bytes > 0 {
                "host_cache.size_bytes"
            } else {
                "host_cache.ratio"
            },
            u32::MAX
        )
    })?;
    let device = match s.model.device.as_str() {
        "emulated" => DeviceBackendChoice::Emulated,
        "cuda" => DeviceBackendChoice::Cuda { ordinal: 0 },
        _ => DeviceBackendChoice::Auto { ordinal: 0 },
    };
    Ok(RankSpec {
        profile: s.model.profile.clone(),
        model_dir: (!s.model.dir.is_empty()).then(|| s.model.dir.clone().into()),
        block_tokens: s.model.block_tokens,
        rank: s.tp.rank,
        world: s.tp.world,
        device_blocks: s.model.device_blocks,
        host_blocks: host_blocks.max(1),
        max_running: s.model.max_running as usize,
        tail_hints: s.model.tail_hints as usize,
        checkpoint: s.model.checkpoint.clone(),
        target_weight_version: s.model.weight_version,
        draft_weight_version: u64::try_from(s.model.draft_weight_version).ok(),
        storage: (s.storage.backend != StoreKind::None)
            .then(|| (s.storage.contract.clone(), s.storage.runtime.clone())),
        device,
    })
}

/// `MemAvailable` of /proc/meminfo in bytes (None where it cannot be read).
fn memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The resident memory a rank of these settings allocates at startup: the emulated
/// Device arena (a real GPU's memory is not this machine's), the pinned Host allocation
/// and the local store's MEMORY tier with its promotion staging.
pub fn startup_memory(s: &Settings, spec: &RankSpec) -> Result<(u64, u64, u64)> {
    let (_, layout) = spec
        .layout()
        .map_err(|e| anyhow!("invalid setting model: {e}"))?;
    let emulated = s.model.device != "cuda";
    let device = if emulated {
        layout.device_slots() as u64 * layout.slot_bytes()
    } else {
        0
    };
    let tier = match s.storage.backend {
        StoreKind::Local => s.storage.local.memory_bytes + s.storage.local.staging_bytes,
        _ => 0,
    };
    Ok((device, layout.host_bytes(), tier))
}

/// Refuses, with one line naming the settings, a rank whose startup allocations cannot be
/// resident on this machine (instead of an allocation failure or the OOM killer later).
fn check_startup_memory(s: &Settings, spec: &RankSpec) -> Result<()> {
    let (device, host, tier) = startup_memory(s, spec)?;
    let Some(available) = memory_available() else {
        return Ok(());
    };
    let need = device + host + tier;
    if need > available {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        return Err(anyhow!(
            "invalid setting host_cache / model.device_blocks: profile {} needs {:.1} GiB resident (Device {:.1} GiB for model.device_blocks = {}, Host {:.1} GiB from host_cache.size_bytes = {} / host_cache.ratio = {}, MEMORY tier {:.1} GiB from storage.local.memory_bytes + staging_bytes) but this machine has {:.1} GiB available; lower them",
            s.model.profile,
            gib(need),
            gib(device),
            s.model.device_blocks,
            gib(host),
            s.host_cache.size_bytes,
            s.host_cache.ratio,
            gib(tier),
            gib(available)
        ));
    }
    Ok(())
}

/// Builds the store the settings name, on the rank's Host allocation.
pub fn make_store(
    s: &Settings,
    clock: SharedClock,
    host: &Arc<actors::host::HostCacheStorage>,
    local: &parking_lot::Mutex<Option<PromotingStore>>, // for the metrics exporter
) -> Result<Arc<dyn Store>, String> {
    match s.storage.backend {
        StoreKind::None => Err("storage is disabled".into()),
        StoreKind::Memory => Ok(Arc::new(MemoryStore::new())),
        StoreKind::Local => {
            let cfg = LocalStoreConfig::from_settings(&s.storage.local);
            std::fs::create_dir_all(&cfg.dir)
                .map_err(|e| format!("storage.local.dir {}: {e}", cfg.dir.display()))?;
            let l = Arc::new(LocalStore::open(&cfg, clock).map_err(|e| e.to_string())?);
            *local.lock() = Some(PromotingStore::Local(l.clone()));
            Ok(l)
        }
        StoreKind::Mooncake => {
            let m = MooncakeStore::connect(&s.storage.mooncake).map_err(|e| e.to_string())?;
            m.register_host(host).map_err(|e| e.to_string())?;
            let dfs_dir = &s.storage.mooncake.dfs_dir;
            if dfs_dir.is_empty() {
                return Ok(Arc::new(m));
            }
            let cfg = TieredConfig::from_settings(dfs_dir, &s.storage.local);
            let t = Arc::new(TieredStore::open(Arc::new(m), &cfg).map_err(|e| e.to_string())?);
            *local.lock() = Some(PromotingStore::Tiered(t.clone()));
            Ok(t)
        }
    }
}

/// The longest prompt every cache group can hold on the Device at once (and, for a model
/// directory, that leaves a position for output within `max_position_embeddings`).
fn limits(s: &Settings, model: &SyntheticModel) -> Result<RequestLimits> {
    let min_tokens = model
        .profile()
        .groups
        .iter()
        .map(|g| g.block_tokens * s.model.device_blocks as u64)
        .min()
        .unwrap_or(0);
    let mut max_prompt = (min_tokens as usize).saturating_sub(1).max(1);
    if !s.model.dir.is_empty() {
        let (config, _) = actors::model::checkpoint::read(
            std::path::Path::new(&s.model.dir),
            s.model.block_tokens as u64,
            s.tp.world,
        )
        .map_err(|e| anyhow!("invalid setting model.dir: {e}"))?;
        max_prompt = max_prompt.min(config.max_position_embeddings.saturating_sub(1).max(1));
    }
    Ok(RequestLimits {
        max_prompt_tokens: max_prompt,
        max_output_tokens: 4096,
        vocab_size: model.profile().vocab,
    })
}

/// Every startup validation that needs no hardware (what `check-config` runs after the
/// settings rules): the rank spec, the cache layout of the profile at this TP size, and the
/// resident memory of the startup allocations on this machine.
pub fn preflight(settings: &Settings) -> Result<RankSpec> {
    let spec = rank_spec(settings)?;
    check_startup_memory(settings, &spec)?;
    Ok(spec)
}

/// The ControlPlane mesh of this rank (a world of one binds an ephemeral loopback port).
fn mesh_settings(settings: &Settings, namespace: Namespace) -> MeshSettings {
    let secret = if settings.tp.secret.is_empty() {
        b"tsl3-single-rank".to_vec()
    } else {
        settings.tp.secret.expose().as_bytes().to_vec()
    };
    let peers = if settings.tp.world == 1 {
        vec!["127.0.0.1:0".to_string()]
    } else {
        settings.tp.peers.clone()
    };
    let mut mesh = MeshSettings::new(settings.tp.rank, peers, namespace, secret);
    mesh.connect_deadline = Duration::from_millis(settings.tp.connect_deadline_ms);
    mesh.round_deadline = Duration::from_millis(settings.tp.round_deadline_ms);
    mesh
}

pub fn run(settings: Settings) -> Result<()> {
    // SIGTERM/SIGINT are taken over first, long before this rank joins the mesh: from then
    // on a stop is a drain, never the default action that would kill the rank mid-round
    // (and fail its peers). The streams belong to the HTTP thread's runtime, which waits
    // on them; one that arrives before it does is kept.
    let http = actix_web::rt::System::new();
    let signals = http.block_on(async { StopSignals::install() })?;
    let clock: SharedClock = SystemClock::shared();
    let spec = preflight(&settings)?;
    let store_holder: Arc<parking_lot::Mutex<Option<Arc<dyn Store>>>> = Arc::default();
    let holder = store_holder.clone();
    let local_store: Arc<parking_lot::Mutex<Option<PromotingStore>>> = Arc::default();
    let local2 = local_store.clone();
    let s2 = settings.clone();
    let c2 = clock.clone();
    let engine = build_rank(&spec, clock.clone(), move |host| {
        let st = make_store(&s2, c2, host, &local2)?;
        *holder.lock() = Some(st.clone());
        Ok(st)
    })
    .map_err(|e| anyhow!("startup: {e}"))?;
    let model = engine.scheduler().model().clone();
    let shared = Arc::new(LoopShared {
        metrics: Metrics::new(&MetricLabels {
            model: settings.telemetry.metrics_labels_model.clone(),
            role: settings.telemetry.role.clone(),
            dp_rank: settings.telemetry.dp_rank,
            tp_rank: settings.tp.rank,
            replica: settings.replica_label(),
        })
        .context("metrics registry")?,
        health: Arc::new(RankHealth::new(settings.server.not_ready_on_storage_outage)),
        stop: AtomicBool::new(false),
        done: AtomicBool::new(false),
        ended: Default::default(),
        local_store: local_store.lock().take(),
    });
    let (state, inbox) = {
        let m = shared.clone();
        actors::frontend::inbox(
            1024,
            limits(&settings, &model)?,
            settings.server.admin_token.expose().to_string(),
            model_name(&settings),
            text_codec(&settings, &engine)?,
            Arc::new(move || m.metrics.render()),
            shared.health.clone(),
        )
    };
    tracing::info!(
        rank = settings.tp.rank,
        world = settings.tp.world,
        store = settings.storage.backend.as_str(),
        model = %model_name(&settings),
        replica = %settings.replica_label(),
        namespace = %engine.scheduler().namespace().as_str(),
        "engine host starting"
    );
    let mesh = mesh_settings(&settings, engine.scheduler().namespace().clone());
    let cfg = LoopConfig {
        leader: settings.tp.rank == 0,
        shutdown_drain: Duration::from_millis(settings.server.shutdown_drain_ms),
        emulate_device_time: settings.model.emulate_device_time,
        admin: AdminContext {
            spec,
            store: store_holder.lock().clone(),
            reset_idle_wait_us: settings.server.reset_idle_wait_ms.saturating_mul(1000),
        },
    };
    let loop_shared = shared.clone();
    let tp = settings.tp.clone();
    let fence_deadline = Duration::from_millis(settings.tp.round_deadline_ms);
    let round_loop = std::thread::Builder::new()
        .name("tsl3-rounds".into())
        .spawn(move || {
            // The rank's executor and device engine live on this thread's arbiter as actors;
            // the event loop drives their rounds.
            let sys = actix_rt::System::new();
            sys.block_on(async move {
                let r = async {
                    let establish = ControlPlaneCore::establish(&mesh);
                    tokio::pin!(establish);
                    let formed = tokio::select! {
                        biased;
                        p = &mut establish => Some(p),
                        // Asked to stop while the mesh forms: a peer may already count it
                        // formed (its handshake ended first), and would see this rank
                        // vanish in its first round. A mesh that forms within the grace
                        // runs, and the replica stops by agreement in its first round.
                        _ = stop_requested(&loop_shared) => {
                            tokio::time::timeout(STOPPED_FORMING_GRACE, &mut establish)
                                .await
                                .ok()
                        }
                    };
                    let plane = match formed {
                        Some(Ok(plane)) => plane,
                        Some(Err(e)) if !loop_shared.stop.load(Ordering::SeqCst) => {
                            return Err(anyhow!(
                                "rank {} of {}: {e} (tp.connect_deadline_ms = {}; start every rank of tp.peers, or use `engine-host launch`)",
                                tp.rank,
                                tp.world,
                                tp.connect_deadline_ms
                            ));
                        }
                        // Stopped before the mesh formed (or while forming it failed):
                        // nothing was served, nothing is held; the rank ends cleanly.
                        _ => {
                            tracing::info!(rank = tp.rank, "stopped before the mesh formed");
                            return Ok(());
                        }
                    };
                    // A device fence gets the round's deadline: a hung device fails the
                    // replica, naming this rank, instead of hanging it.
                    let engine = engine.into_actors_with(fence_deadline);
                    event_loop::run(cfg, engine, plane, inbox, loop_shared.clone())
                        .await
                        .map_err(|e| anyhow!("{e}"))
                }
                .await;
                // However the loop ended (a mesh that never formed included), the rank
                // stops serving and exits with its result.
                if let Err(e) = &r {
                    loop_shared.health.fail(format!("{e:#}"));
                }
                loop_shared.stop.store(true, Ordering::SeqCst);
                loop_shared.done.store(true, Ordering::SeqCst);
                loop_shared.ended.notify_one();
                r
            })
        })
        .context("spawning the round loop")?;
    let result = serve_http(http, signals, &settings, state, shared.clone());
    shared.stop.store(true, Ordering::SeqCst);
    let loop_result = round_loop
        .join()
        .map_err(|_| anyhow!("the round loop panicked"))?;
    result.and(loop_result)
}

/// How long a rank asked to stop while its mesh forms still lets it form (peers already
/// connecting finish within a few of their 250 ms connect retries); one whose peers do not
/// come ends after it. Below `launch`'s 5 s stop grace.
const STOPPED_FORMING_GRACE: Duration = Duration::from_secs(2);

/// Resolves once a stop was asked for (a signal's flag; polled, as the mesh forms only
/// once).
async fn stop_requested(shared: &LoopShared) {
    while !shared.stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Seconds the HTTP connections get, after the round loop ended, to finish their answers.
const HTTP_SHUTDOWN_GRACE_S: u64 = 3;

/// One HTTP listener of a rank: its address, the setting that names it, and whether it
/// serves the API (the leader's `server.listen`) or only `/metrics` and `/health`.
struct Listener {
    addr: String,
    setting: &'static str,
    api: bool,
}

/// This rank's listeners: the leader's API (with /metrics and /health) on `server.listen`,
/// and every rank's own /metrics and /health address where that is another one.
fn listeners(settings: &Settings) -> Result<Vec<Listener>> {
    let mut v = vec![];
    if settings.tp.rank == 0 {
        v.push(Listener {
            addr: settings.server.listen.clone(),
            setting: "server.listen",
            api: true,
        });
    }
    if let Some(a) = settings.metrics_listener().map_err(|e| anyhow!("{e}"))? {
        v.push(Listener {
            addr: a.to_string(),
            setting: "server.metrics_listen",
            api: false,
        });
    }
    Ok(v)
}

/// SIGTERM and SIGINT, registered with the HTTP thread's runtime: once installed, neither
/// kills the process; each asks the round loop to drain.
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Registers both at once (inside the runtime that will wait on them).
    fn install() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    /// The first of the two to arrive.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

fn serve_http(
    sys: actix_web::rt::SystemRunner,
    mut signals: StopSignals,
    settings: &Settings,
    state: FrontendState,
    shared: Arc<LoopShared>,
) -> Result<()> {
    let listeners = listeners(settings)?;
    let rank = settings.tp.rank;
    sys.block_on(async move {
        let waker = state.loop_waker();
        let data = actix_web::web::Data::new(state);
        let mut servers = vec![];
        for l in &listeners {
            let data = data.clone();
            let api = l.api;
            let server = actix_web::HttpServer::new(move || {
                let app = actix_web::App::new().app_data(data.clone());
                if api {
                    app.configure(actors::frontend::configure)
                } else {
                    app.configure(actors::frontend::configure_observability)
                }
            })
            .workers(if api { 2 } else { 1 })
            // Shutdown is the round loop's: SIGTERM/SIGINT start its drain (every request
            // the engine holds finishes; new ones are refused), and once it ended the
            // connections get this long to write what they were answered. A connection
            // that never sent a whole request holds nothing in the engine and does not
            // delay the exit further.
            .disable_signals()
            .shutdown_timeout(HTTP_SHUTDOWN_GRACE_S)
            .bind(&l.addr)
            .with_context(|| format!("{} {} (rank {rank})", l.setting, l.addr))?
            .run();
            servers.push(server);
        }
        let handles: Vec<_> = servers.iter().map(|s| s.handle()).collect();
        let stop = shared.clone();
        actix_web::rt::spawn(async move {
            signals.recv().await;
            stop.stop.store(true, Ordering::SeqCst);
            // A quiet loop starts its drain now (and meets a dead peer in its next exchange)
            // instead of at its next tick.
            waker.notify_one();
        });
        let watcher = shared.clone();
        actix_web::rt::spawn(async move {
            // The round loop ends on a signal's drain or on its own (a failed rank).
            if !watcher.done.load(Ordering::SeqCst) {
                watcher.ended.notified().await;
            }
            for h in handles {
                h.stop(true).await;
            }
        });
        for l in &listeners {
            let line = if l.api {
                format!("engine-host: listening on http://{}\n", l.addr)
            } else {
                format!(
                    "engine-host: rank {rank} serves /metrics and /health on http://{}\n",
                    l.addr
                )
            };
            // One write per line: the ranks of a `launch` share one stderr, and a line
            // written in pieces interleaves with another rank's.
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        }
        for r in futures_join(servers).await {
            r.context("http server")?;
        }
        Ok(())
    })
}

/// Runs the servers to their ends together.
async fn futures_join(servers: Vec<actix_web::dev::Server>) -> Vec<std::io::Result<()>> {
    let tasks: Vec<_> = servers.into_iter().map(actix_web::rt::spawn).collect();
    let mut out = vec![];
    for t in tasks {
        out.push(
            t.await
                .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string()))),
        );
    }
    out
}
