//! `engine-host serve`: one rank. It builds the rank (startup factory), establishes the
//! ControlPlane mesh (a world of one uses the same path), runs the round loop on its own
//! thread, and — on the leader — serves the HTTP API. Shutdown (SIGTERM, Ctrl-C) stops new
//! requests, lets in-flight ones finish, closes the L3 executor, then the device engine.

use crate::exporter::{Exporter, PromotingStore};
use crate::settings::Settings;
use actors::clock::{SharedClock, SystemClock};
use actors::control_plane::mesh::MeshSettings;
use actors::control_plane::plane::ControlPlaneCore;
use actors::device::DeviceBackendChoice;
use actors::engine::actors::RankActors;
use actors::engine::factory::{build_rank, identity, RankSpec};
use actors::engine::RoundWork;
use actors::frontend::{
    AdminCommandKind, AdminSubmission, FrontendInbox, FrontendState, PrefixUsage, RequestLimits,
    Submission, TokenEvent,
};
use actors::l3::store::local::{LocalStore, LocalStoreConfig};
use actors::l3::store::memory::MemoryStore;
use actors::l3::store::mooncake::MooncakeStore;
use actors::l3::store::tiered::{TieredConfig, TieredStore};
use actors::l3::store::Store;
use actors::metrics::{MetricLabels, Metrics};
use actors::model::SyntheticModel;
use actors::scheduler::{AdminCommand, AgreedInputs, RequestEvent};
use actors::storage_transfer::ClearKind;
use anyhow::{anyhow, Context, Result};
use messages::round::{AdminCommand as WireAdmin, FrontendMessage, PrefillDigest, RoundReport};
use messages::settings::StoreKind;
use messages::{Namespace, RequestId};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The rank spec and store factory from settings.
pub fn rank_spec(s: &Settings) -> Result<RankSpec> {
    let model = SyntheticModel::by_name(&s.model.profile).map_err(|e| anyhow!("{e}"))?;
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
        rank: s.tp.rank,
        world: s.tp.world,
        device_blocks: s.model.device_blocks,
        host_blocks: host_blocks.max(1),
        max_running: s.model.max_running as usize,
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

/// The longest prompt every cache group can hold on the Device at once.
fn limits(s: &Settings, model: &SyntheticModel) -> RequestLimits {
    let min_tokens = model
        .profile()
        .groups
        .iter()
        .map(|g| g.block_tokens * s.model.device_blocks as u64)
        .min()
        .unwrap_or(0);
    RequestLimits {
        max_prompt_tokens: (min_tokens as usize).saturating_sub(1).max(1),
        max_output_tokens: 4096,
        vocab_size: model.profile().vocab,
    }
}

/// What the round loop shares with the HTTP side.
struct Shared {
    metrics: Metrics,
    health: Arc<crate::health::RankHealth>,
    stop: AtomicBool,
    /// The round loop ended (drained, failed or never started its mesh).
    done: AtomicBool,
    local_store: Option<PromotingStore>,
}

/// Every startup validation that needs no hardware (what `check-config` runs after the
/// settings rules): the rank spec, the cache layout of the profile at this TP size, and the
/// resident memory of the startup allocations on this machine.
pub fn preflight(settings: &Settings) -> Result<RankSpec> {
    let spec = rank_spec(settings)?;
    check_startup_memory(settings, &spec)?;
    Ok(spec)
}

pub fn run(settings: Settings) -> Result<()> {
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
    let shared = Arc::new(Shared {
        metrics: Metrics::new(&MetricLabels {
            model: settings.telemetry.metrics_labels_model.clone(),
            role: settings.telemetry.role.clone(),
            dp_rank: settings.telemetry.dp_rank,
            tp_rank: settings.tp.rank,
            replica: settings.replica_label(),
        })
        .context("metrics registry")?,
        health: Arc::new(crate::health::RankHealth::new(
            settings.server.not_ready_on_storage_outage,
        )),
        stop: AtomicBool::new(false),
        done: AtomicBool::new(false),
        local_store: local_store.lock().take(),
    });
    let (state, inbox) = {
        let m = shared.clone();
        actors::frontend::inbox(
            1024,
            limits(&settings, &model),
            settings.server.admin_token.expose().to_string(),
            format!("synthetic-{}", settings.model.profile),
            Arc::new(move || m.metrics.render()),
            shared.health.clone(),
        )
    };
    tracing::info!(
        rank = settings.tp.rank,
        world = settings.tp.world,
        store = settings.storage.backend.as_str(),
        profile = %settings.model.profile,
        replica = %settings.replica_label(),
        namespace = %engine.scheduler().namespace().as_str(),
        "engine host starting"
    );
    let loop_settings = settings.clone();
    let loop_shared = shared.clone();
    let round_loop = std::thread::Builder::new()
        .name("tsl3-rounds".into())
        .spawn(move || {
            // The rank's actors live on this thread's arbiter; the loop drives their rounds.
            let sys = actix_rt::System::new();
            sys.block_on(async move {
                let engine = engine.into_actors();
                let stop = loop_shared.clone();
                let r = round_loop(
                    loop_settings,
                    engine,
                    inbox,
                    loop_shared,
                    store_holder,
                    clock,
                )
                .await;
                // However the loop ended (a mesh that never formed included), the rank
                // stops serving and exits with its result.
                if let Err(e) = &r {
                    stop.health.fail(format!("{e:#}"));
                }
                stop.stop.store(true, Ordering::SeqCst);
                stop.done.store(true, Ordering::SeqCst);
                r
            })
        })
        .context("spawning the round loop")?;
    let result = serve_http(&settings, state, shared.clone());
    shared.stop.store(true, Ordering::SeqCst);
    let loop_result = round_loop
        .join()
        .map_err(|_| anyhow!("the round loop panicked"))?;
    result.and(loop_result)
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

fn serve_http(settings: &Settings, state: FrontendState, shared: Arc<Shared>) -> Result<()> {
    let listeners = listeners(settings)?;
    let rank = settings.tp.rank;
    let sys = actix_web::rt::System::new();
    sys.block_on(async move {
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
        let signals = shared.clone();
        actix_web::rt::spawn(async move {
            let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            else {
                tracing::error!("cannot install the SIGTERM handler");
                return;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            signals.stop.store(true, Ordering::SeqCst);
        });
        let watcher = shared.clone();
        actix_web::rt::spawn(async move {
            // The round loop ends on a signal's drain or on its own (a failed rank).
            while !watcher.done.load(Ordering::SeqCst) {
                actix_web::rt::time::sleep(Duration::from_millis(50)).await;
            }
            for h in handles {
                h.stop(true).await;
            }
        });
        for l in &listeners {
            if l.api {
                eprintln!("engine-host: listening on http://{}", l.addr);
            } else {
                eprintln!(
                    "engine-host: rank {rank} serves /metrics and /health on http://{}",
                    l.addr
                );
            }
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

/// The leader's frontend bookkeeping.
struct Clients {
    next_id: u64,
    pending: BTreeMap<RequestId, flume::Sender<TokenEvent>>,
    admin: std::collections::VecDeque<flume::Sender<Result<String, String>>>,
    started: BTreeMap<RequestId, Instant>,
}

async fn round_loop(
    settings: Settings,
    mut engine: RankActors,
    inbox: FrontendInbox,
    shared: Arc<Shared>,
    store: Arc<parking_lot::Mutex<Option<Arc<dyn Store>>>>,
    _clock: SharedClock,
) -> Result<()> {
    let ns = engine.namespace().await.map_err(|e| anyhow!("{e}"))?;
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
    let mut mesh = MeshSettings::new(settings.tp.rank, peers, ns.clone(), secret);
    mesh.connect_deadline = Duration::from_millis(settings.tp.connect_deadline_ms);
    mesh.round_deadline = Duration::from_millis(settings.tp.round_deadline_ms);
    let mut plane = ControlPlaneCore::establish(&mesh).await.map_err(|e| {
        anyhow!(
            "rank {} of {}: {e} (tp.connect_deadline_ms = {}; start every rank of tp.peers, or use `engine-host launch`)",
            settings.tp.rank,
            settings.tp.world,
            settings.tp.connect_deadline_ms
        )
    })?;
    let leader = settings.tp.rank == 0;
    let mut clients = Clients {
        next_id: 1,
        pending: BTreeMap::new(),
        admin: Default::default(),
        started: BTreeMap::new(),
    };
    let mut exporter = Exporter::with_local(shared.local_store.clone());
    let mut round: u64 = 0;
    let mut stopping_since: Option<Instant> = None;
    let mut idle_rounds: u32 = 0;
    // Shutdown drain (leader): when the last request finished, and what the last round saw.
    let drain_limit = Duration::from_millis(settings.server.shutdown_drain_ms);
    let mut drain_since: Option<Instant> = None;
    let mut storage_idle = true;
    let mut backups_queued: u64 = 0;
    // The admin preflight: this rank's result, reported with the next round; set while
    // the agreed result is awaited.
    let mut preflight: Option<Result<(), String>> = None;
    let mut awaiting_preflight = false;
    loop {
        round += 1;
        let stopping = shared.stop.load(Ordering::SeqCst);
        if stopping && stopping_since.is_none() {
            stopping_since = Some(Instant::now());
            shared.health.stopping();
        }
        // Head feedback point.
        let local = match engine.head().await {
            Ok(l) => l,
            Err(e) => {
                return Err(fail_round(&mut clients, &inbox, &shared, engine, round, &e).await);
            }
        };
        let mut frontend = vec![];
        if leader {
            collect_frontend(&inbox, &mut clients, &mut frontend, stopping);
            if stopping && engine.summary().live_requests == 0 && frontend.is_empty() {
                // Drain: queued backups land first, within server.shutdown_drain_ms of the
                // last request finishing; what is left then is dropped and reported.
                let since = *drain_since.get_or_insert_with(Instant::now);
                let expired = since.elapsed() >= drain_limit;
                if storage_idle || expired {
                    if !storage_idle {
                        tracing::warn!(
                            drain_ms = drain_limit.as_millis() as u64,
                            "shutdown: the drain deadline passed; {backups_queued} queued backup keys are dropped (storage operations in flight retire before exit)"
                        );
                    } else {
                        tracing::info!("shutdown: every queued backup landed");
                    }
                    frontend.push(FrontendMessage::Shutdown);
                }
            }
        }
        let report = RoundReport {
            admin_preflight: preflight.take(),
            rank: settings.tp.rank,
            round,
            clock_us: local.clock_us,
            pressure: local.pressure,
            completions: local.completions,
            error: local.error,
            frontend,
            digests: local
                .digests
                .iter()
                .map(|(id, d)| PrefillDigest {
                    request: *id,
                    shard_index: d.shard.index,
                    shard_count: d.shard.count,
                    tokens: d.tokens,
                    value: d.value,
                })
                .collect(),
        };
        let agreed = match plane.exchange_round(report).await {
            Ok(a) => a,
            Err(e) => {
                return Err(fail_round(&mut clients, &inbox, &shared, engine, round, &e).await);
            }
        };
        // Agreed inputs for the scheduler.
        let mut inputs = AgreedInputs {
            tick_us: agreed.tick_us,
            pressure: agreed.pressure,
            completions: agreed.completions,
            ..AgreedInputs::default()
        };
        let agreed_preflight = agreed.admin_preflight;
        let mut admin_cmds = vec![];
        let mut shutdown = false;
        for m in agreed.frontend {
            match m {
                FrontendMessage::NewRequest {
                    id,
                    prompt,
                    max_tokens,
                } => inputs.new_requests.push((id, prompt, max_tokens)),
                FrontendMessage::Cancel { id } => inputs.cancellations.push(id),
                FrontendMessage::Admin(a) => admin_cmds.push(a),
                FrontendMessage::Shutdown => shutdown = true,
            }
        }
        let mut by_req: BTreeMap<RequestId, Vec<actors::model::RankDigest>> = BTreeMap::new();
        for d in agreed.digests {
            by_req
                .entry(d.request)
                .or_default()
                .push(actors::model::RankDigest {
                    shard: actors::model::Shard {
                        index: d.shard_index,
                        count: d.shard_count,
                    },
                    tokens: d.tokens,
                    value: d.value,
                });
        }
        inputs.digests = by_req.into_iter().collect();
        let mut round_result = Ok(RoundWork::default());
        for a in admin_cmds {
            let cmd = match a {
                WireAdmin::ClearCache => AdminCommand::ClearCache,
                WireAdmin::SetWeightVersion { target, draft } => {
                    AdminCommand::SetWeightVersion { target, draft }
                }
                WireAdmin::ResetLocal { host } => AdminCommand::ResetLocal { host },
            };
            if let Err(e) = engine.queue_admin(cmd).await {
                round_result = Err(e);
            }
        }
        if round_result.is_ok() {
            round_result = engine.run_round(inputs).await;
        }
        let work = match round_result {
            Ok(w) => w,
            Err(e) => {
                return Err(fail_round(&mut clients, &inbox, &shared, engine, round, &e).await);
            }
        };
        // Admin work, in two agreed steps. Once quiescent (every rank reaches this in the
        // same round), each rank runs the preflight (a clear's synchronous remote namespace
        // deletion) and reports its result with the next round; the agreed result (Ok only
        // when every rank's deletion succeeded) then applies or refuses the command on
        // every rank alike. New work stays held until then.
        if let Some(agreed_preflight) = agreed_preflight {
            awaiting_preflight = false;
            if let Some(cmd) = engine.summary().admin_pending {
                let result = apply_admin(&mut engine, cmd, agreed_preflight, &settings).await;
                // Commands apply one at a time in arrival order: the result answers the
                // client that sent this one.
                if leader {
                    if let Some(tx) = clients.admin.pop_front() {
                        let _ = tx.send(result);
                    }
                }
            }
        } else if !awaiting_preflight {
            let summary = engine.summary();
            if let (Some(cmd), true) = (summary.admin_pending, summary.quiescent) {
                // A local reset also waits for storage to be idle (the backups in flight
                // land first); every rank sees the same agreed state, so all start alike.
                if !cmd.waits_for_idle_storage() || work.storage_idle() {
                    preflight = Some(run_preflight(&engine, cmd, &store).await);
                    awaiting_preflight = true;
                }
            }
        }
        storage_idle = work.storage_idle();
        backups_queued = work.backups_queued;
        let events = engine.take_events();
        if leader {
            deliver(&mut clients, events, &shared.metrics);
        }
        if exporter.due(work.storage_pending) {
            match engine.view().await {
                Ok(view) => exporter.export(&shared.metrics, &view, &shared.health, round),
                Err(e) => tracing::warn!("metrics export skipped: {e}"),
            }
        }
        // An emulated device step lasts max(modeled time, the emulator's own work): the
        // work already ran, so only the difference is waited.
        let wait_us = work.emulated_wait_us();
        if settings.model.emulate_device_time && wait_us > 0 {
            tokio::time::sleep(Duration::from_micros(wait_us.min(5_000_000))).await;
        }
        let busy = engine.summary().live_requests > 0 || work.storage_ops > 0;
        if shutdown {
            // Agreed: every rank stops after this round.
            shared.stop.store(true, Ordering::SeqCst);
            break;
        }
        if stopping {
            // The leader drains and then sends the agreed Shutdown; a rank stopped alone
            // gives up after a grace period (the others then see it leave).
            let overdue =
                stopping_since.is_some_and(|t| t.elapsed() > Duration::from_secs(30) + drain_limit);
            if overdue {
                break;
            }
        }
        if busy {
            idle_rounds = 0;
        } else {
            // Idle: tick again shortly (the agreed tick is delivered every round); the pause
            // grows from 1 ms to 4 ms over a quiet stretch and resets on any work.
            idle_rounds = idle_rounds.saturating_add(1);
            let pause = 1u64 << (idle_rounds / 64).min(2);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }
    fail_all(&mut clients, "the engine host is shutting down");
    if let Some(report) = engine.close().await {
        if report.restart_required {
            tracing::error!("L3 native retirement is unproven: the store and Host allocation are kept; restart the process to reclaim them");
        }
    }
    let _ = plane;
    Ok(())
}

fn collect_frontend(
    inbox: &FrontendInbox,
    clients: &mut Clients,
    out: &mut Vec<FrontendMessage>,
    stopping: bool,
) {
    // Client cancellations: a client that went away.
    for (id, tx) in &clients.pending {
        if tx.is_disconnected() {
            out.push(FrontendMessage::Cancel { id: *id });
        }
    }
    for _ in 0..256 {
        let Ok(Submission {
            prompt,
            max_tokens,
            events,
        }) = inbox.submissions.try_recv()
        else {
            break;
        };
        if stopping {
            let _ = events.send(TokenEvent::Failed(
                "the engine host is shutting down".into(),
            ));
            continue;
        }
        let id = RequestId(clients.next_id);
        clients.next_id += 1;
        clients.pending.insert(id, events);
        clients.started.insert(id, Instant::now());
        out.push(FrontendMessage::NewRequest {
            id,
            prompt,
            max_tokens,
        });
    }
    while let Ok(AdminSubmission { command, reply }) = inbox.admin.try_recv() {
        clients.admin.push_back(reply);
        out.push(FrontendMessage::Admin(match command {
            AdminCommandKind::ClearCache => WireAdmin::ClearCache,
            AdminCommandKind::SetWeightVersion { target, draft } => {
                WireAdmin::SetWeightVersion { target, draft }
            }
            AdminCommandKind::ResetLocal { host } => WireAdmin::ResetLocal { host },
        }));
    }
}

fn deliver(clients: &mut Clients, events: Vec<RequestEvent>, metrics: &Metrics) {
    for ev in events {
        match ev {
            RequestEvent::Token(id, t) => {
                if let Some(start) = clients.started.remove(&id) {
                    metrics.ttft_seconds.observe(start.elapsed().as_secs_f64());
                }
                if let Some(tx) = clients.pending.get(&id) {
                    let _ = tx.send(TokenEvent::Token(t));
                }
            }
            RequestEvent::Finished {
                id,
                split,
                fallback,
            } => {
                clients.started.remove(&id);
                if let Some(tx) = clients.pending.remove(&id) {
                    let _ = tx.send(TokenEvent::Done {
                        usage: PrefixUsage {
                            device: split.device,
                            host: split.host,
                            l3: split.l3,
                            computed: split.computed,
                            fallback_reason: fallback,
                        },
                        finish_reason: "length",
                    });
                }
            }
            RequestEvent::Aborted(id, why) => {
                clients.started.remove(&id);
                if let Some(tx) = clients.pending.remove(&id) {
                    let _ = tx.send(TokenEvent::Failed(why));
                }
            }
        }
    }
}

/// A round failed on this rank (every rank fails it alike): fail every client, stop, close
/// the executor, and name the round.
async fn fail_round(
    clients: &mut Clients,
    inbox: &FrontendInbox,
    shared: &Shared,
    engine: RankActors,
    round: u64,
    e: &dyn std::fmt::Display,
) -> anyhow::Error {
    // From this moment every waiting and every new request is answered 503 with the cause:
    // the health document says failed (the HTTP side checks it before queueing), the
    // requests the engine held and those still queued in the inbox fail now.
    let why = format!("the replica failed in round {round}: {e}");
    shared.health.fail(format!("round {round}: {e}"));
    fail_all(clients, &why);
    while let Ok(sub) = inbox.submissions.try_recv() {
        let _ = sub.events.send(TokenEvent::Failed(why.clone()));
    }
    while let Ok(a) = inbox.admin.try_recv() {
        let _ = a.reply.send(Err(why.clone()));
    }
    let _ = engine.close().await;
    anyhow!("round {round}: {e}")
}

fn fail_all(clients: &mut Clients, why: &str) {
    for (_, tx) in std::mem::take(&mut clients.pending) {
        let _ = tx.send(TokenEvent::Failed(why.to_string()));
    }
    for tx in clients.admin.drain(..) {
        let _ = tx.send(Err(why.to_string()));
    }
}

/// This rank's admin preflight: a clear deletes the namespace in the remote store
/// (synchronously; Ok without a store); a weight update has nothing to delete.
async fn run_preflight(
    engine: &RankActors,
    cmd: AdminCommand,
    store: &Arc<parking_lot::Mutex<Option<Arc<dyn Store>>>>,
) -> Result<(), String> {
    match cmd {
        AdminCommand::ClearCache => {
            let ns = engine.namespace().await.map_err(|e| e.to_string())?;
            let store = store.lock().clone();
            match store {
                Some(s) => s
                    .remove_namespace(&ns)
                    .map(|_| ())
                    .map_err(|e| format!("remote namespace deletion failed: {e}")),
                None => Ok(()),
            }
        }
        AdminCommand::SetWeightVersion { .. } | AdminCommand::ResetLocal { .. } => Ok(()),
    }
}

/// Applies (or, after a failed agreed preflight, refuses) the pending admin command.
async fn apply_admin(
    engine: &mut RankActors,
    cmd: AdminCommand,
    preflight: Result<(), String>,
    settings: &Settings,
) -> Result<String, String> {
    let ns = engine.namespace().await.map_err(|e| e.to_string())?;
    match cmd {
        AdminCommand::ResetLocal { host } => {
            engine
                .apply_admin(ClearKind::LocalReset, Some(preflight), None)
                .await?;
            Ok(format!(
                "reset the local caches ({}) of namespace {}; L3 untouched",
                if host { "device and host" } else { "device" },
                ns.as_str()
            ))
        }
        AdminCommand::ClearCache => {
            // A failed deletion on any rank refuses the clear (nothing is cleared locally).
            engine
                .apply_admin(ClearKind::FullClear, Some(preflight), None)
                .await?;
            Ok(format!("cleared the cache of namespace {}", ns.as_str()))
        }
        AdminCommand::SetWeightVersion { target, draft } => {
            let spec = rank_spec(settings).map_err(|e| e.to_string())?;
            if let Err(e) = preflight {
                engine
                    .apply_admin(ClearKind::WeightUpdate, Some(Err(e.clone())), None)
                    .await?;
                return Err(e);
            }
            let mut id = identity(&spec, &engine.layout);
            id = id.with_weight_versions(target, draft);
            let new_ns: Namespace = id.namespace();
            engine
                .apply_admin(ClearKind::WeightUpdate, None, Some(new_ns.clone()))
                .await?;
            Ok(format!(
                "weights {target}{}: namespace {} (was {})",
                draft.map(|d| format!("/draft {d}")).unwrap_or_default(),
                new_ns.as_str(),
                ns.as_str()
            ))
        }
    }
}
