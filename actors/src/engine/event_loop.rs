//! The event loop of one rank (`engine-host serve` runs it on its round thread): round after
//! round, the head report (with the leader's frontend messages and the admin preflight) goes
//! through the mesh port, the agreed round runs on the round owner, the leader answers its
//! clients, the exporter publishes the rank's counters, and an emulated device step lasts
//! its modeled time. It also owns shutdown: a stop request drains (the leader sends the
//! agreed Shutdown once every request finished and the queued backups landed, or the drain
//! deadline passed), and a failed round fails every client with a JSON-able cause.
//!
//! It decides nothing the scheduler or the manager decides; it never touches the cache.

use super::admin::{AdminContext, AdminSteps};
use super::exporter::{Exporter, PromotingStore};
use super::ports::{DevicePort, ExecutorPort, MeshPort};
use super::{RankEngine, RoundWork};
use crate::frontend::clients::{Clients, RequestIds};
use crate::frontend::health::RankHealth;
use crate::frontend::FrontendInbox;
use crate::metrics::Metrics;
use messages::FrontendMessage;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a rank stopped alone (not by the leader's agreed Shutdown) keeps rounding
/// beyond the drain deadline before it gives up (the others then see it leave).
const STOPPED_ALONE_GRACE: Duration = Duration::from_secs(30);

/// The longest a quiet replica goes without a round: no live request, no outstanding
/// storage operation, no queued backup and no admin command, so no soft deadline, Ready
/// hold or backoff can come due; the leader then waits for its inbox (a request or an admin
/// command wakes it at once) or this tick, and the followers wait inside the exchange for
/// the leader's report. The agreed tick is still delivered with every round.
pub const QUIET_TICK: Duration = Duration::from_millis(500);

/// The longest pause of a rank that waits on storage (or is idle with storage work pending)
/// before it rounds again without a completion: the lateness bound of a soft deadline,
/// a Ready expiry or a backoff.
pub const WAIT_TICK_MAX: Duration = Duration::from_millis(4);

/// Waits for this rank's next storage completion, a client message (`inbox`, the leader)
/// or `pause` (at most [`WAIT_TICK_MAX`]), whichever comes first.
async fn wait_for_work(
    storage: Option<&tokio::sync::Notify>,
    inbox: Option<&FrontendInbox>,
    pause: Duration,
) {
    let completed = async {
        match storage {
            Some(n) => n.notified().await,
            None => std::future::pending().await,
        }
    };
    let message = async {
        match inbox {
            Some(i) => i.wake.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = completed => {}
        _ = message => {}
        _ = tokio::time::sleep(pause.min(WAIT_TICK_MAX)) => {}
    }
}

/// The longest an emulated device step is waited (a bound on a mis-modeled round).
const MAX_EMULATED_WAIT: Duration = Duration::from_secs(5);

/// What the loop is configured with.
pub struct LoopConfig {
    /// This rank is the leader (rank 0): it holds the frontend and sends Shutdown.
    pub leader: bool,
    /// The longest the leader waits, once the last request finished, for queued backups to
    /// land before it shuts down (`server.shutdown_drain_ms`).
    pub shutdown_drain: Duration,
    /// Wait the modeled device time of every round (`model.emulate_device_time`).
    pub emulate_device_time: bool,
    pub admin: AdminContext,
}

/// What the loop shares with the HTTP side.
pub struct LoopShared {
    pub metrics: Metrics,
    pub health: Arc<RankHealth>,
    /// Set by a signal (or the HTTP side): drain and stop.
    pub stop: AtomicBool,
    /// The loop ended (drained, failed or never started its mesh).
    pub done: AtomicBool,
    /// Notified once `done` is set (the HTTP side then stops its listeners).
    pub ended: tokio::sync::Notify,
    /// The store whose promotion statistics the exporter reads.
    pub local_store: Option<PromotingStore>,
}

/// A round failed on this rank (every rank fails it alike).
#[derive(Debug, thiserror::Error)]
#[error("round {round}: {cause}")]
pub struct RoundFailure {
    pub round: u64,
    pub cause: String,
}

/// Runs the rank's rounds until the agreed Shutdown (or a failure), then closes the
/// executor. Every client the leader holds is answered before it returns.
pub async fn run<X, D, M>(
    cfg: LoopConfig,
    mut engine: RankEngine<X, D>,
    mut mesh: M,
    inbox: FrontendInbox,
    shared: Arc<LoopShared>,
) -> Result<(), RoundFailure>
where
    X: ExecutorPort,
    D: DevicePort,
    M: MeshPort,
{
    let mut clients = Clients::new(RequestIds::new());
    let mut exporter = Exporter::with_local(shared.local_store.clone());
    let mut admin = AdminSteps::default();
    let mut stopping_since: Option<Instant> = None;
    let mut idle_rounds: u32 = 0;
    // Shutdown drain (leader): when the last request finished, and what the last round saw.
    let mut drain_since: Option<Instant> = None;
    let mut last = RoundWork::default();
    let storage_wake = engine.storage_wake();
    loop {
        let stopping = shared.stop.load(Ordering::SeqCst);
        if stopping && stopping_since.is_none() {
            stopping_since = Some(Instant::now());
            shared.health.stopping();
        }
        // Step 1: the head feedback point, plus the leader's frontend messages.
        let mut report = match engine.head().await {
            Ok(r) => r,
            Err(e) => return Err(fail(&mut clients, &inbox, &shared, engine, &e).await),
        };
        report.admin_preflight = admin.take_preflight();
        if cfg.leader {
            report.frontend = clients.collect(&inbox, stopping);
            if stopping
                && engine.scheduler().live_requests() == 0
                && report.frontend.is_empty()
                && drained(&mut drain_since, cfg.shutdown_drain, &last)
            {
                report.frontend.push(FrontendMessage::Shutdown);
            }
        }
        // Step 2: agreement.
        let mut agreed = match mesh.exchange(report).await {
            Ok(a) => a,
            Err(e) => return Err(fail(&mut clients, &inbox, &shared, engine, &e).await),
        };
        if cfg.leader {
            clients.refuse_stopping();
        }
        let agreed_preflight = agreed.admin_preflight.take();
        let tick_us = agreed.tick_us;
        // Steps 3-6.
        let work = match engine.run_round(agreed).await {
            Ok(w) => w,
            Err(e) => return Err(fail(&mut clients, &inbox, &shared, engine, &e).await),
        };
        if let Some(result) = admin
            .after_round(&mut engine, agreed_preflight, &work, tick_us, &cfg.admin)
            .await
        {
            if cfg.leader {
                clients.answer_admin(result);
            }
        }
        last = work;
        let events = engine.drain_events();
        if cfg.leader {
            clients.deliver(events, &shared.metrics);
        }
        if exporter.due(work.storage_pending) {
            match engine.view().await {
                Ok(view) => exporter.export(&shared.metrics, &view, &shared.health, engine.round()),
                Err(e) => tracing::warn!("metrics export skipped: {e}"),
            }
        }
        // An emulated device step lasts max(modeled time, the emulator's own work): the
        // work already ran, so only the difference is waited.
        let wait = Duration::from_micros(work.emulated_wait_us());
        if cfg.emulate_device_time && !wait.is_zero() {
            tokio::time::sleep(wait.min(MAX_EMULATED_WAIT)).await;
        }
        if work.shutdown {
            // Agreed: every rank stops after this round.
            shared.stop.store(true, Ordering::SeqCst);
            break;
        }
        let overdue =
            stopping_since.is_some_and(|t| t.elapsed() > STOPPED_ALONE_GRACE + cfg.shutdown_drain);
        if overdue {
            break;
        }
        let live = engine.scheduler().live_requests() > 0;
        // Every live request waits on a QUERY or GET of the executor: a round now would
        // find nothing to do until a completion lands.
        let waiting = live
            && work.storage_ops == 0
            && work.forwards == 0
            && engine.scheduler().waits_only_on_storage();
        if (live && !waiting) || work.storage_ops > 0 {
            idle_rounds = 0;
        } else if !live && !stopping && work.storage_idle() && engine.admin_pending().is_none() {
            // Quiet: nothing can come due until a client sends something.
            idle_rounds = 0;
            if cfg.leader {
                tokio::select! {
                    _ = inbox.wake.notified() => {}
                    _ = tokio::time::sleep(QUIET_TICK) => {}
                }
            }
        } else {
            // Waiting on storage, or idle with storage work or a drain pending: the next
            // round comes with this rank's next storage completion or (leader) a client
            // message, and at the latest after a pause that keeps soft deadlines, Ready
            // expiry and backoffs on time. The pause grows from 1 ms to WAIT_TICK_MAX over
            // a quiet stretch and resets on any work.
            // A follower that waits on storage goes straight into the exchange, where it
            // waits for the leader's report (the leader paces the round).
            idle_rounds = idle_rounds.saturating_add(1);
            let pause = Duration::from_millis(1u64 << (idle_rounds / 64).min(2));
            if cfg.leader || !waiting {
                wait_for_work(storage_wake.as_deref(), cfg.leader.then_some(&inbox), pause).await;
            }
        }
    }
    clients.fail_all("the engine host is shutting down", None);
    if let Some(report) = engine.close().await {
        if report.restart_required {
            tracing::error!("L3 native retirement is unproven: the store and Host allocation are kept; restart the process to reclaim them");
        }
    }
    Ok(())
}

/// The leader's drain, once no request is live: queued backups land first, within the drain
/// deadline of the last request finishing; what is left then is dropped and reported.
fn drained(since: &mut Option<Instant>, limit: Duration, last: &RoundWork) -> bool {
    let expired = since.get_or_insert_with(Instant::now).elapsed() >= limit;
    if last.storage_idle() {
        tracing::info!("shutdown: every queued backup landed");
        true
    } else if expired {
        tracing::warn!(
            drain_ms = limit.as_millis() as u64,
            "shutdown: the drain deadline passed; {} queued backup keys are dropped (storage operations in flight retire before exit)",
            last.backups_queued
        );
        true
    } else {
        false
    }
}

/// A round failed on this rank (every rank fails it alike): from now on every waiting and
/// every new request is answered 503 with the cause (the health document says failed; the
/// HTTP side checks it before queueing), the requests held and those still queued fail now,
/// and the executor closes.
async fn fail<X: ExecutorPort, D: DevicePort>(
    clients: &mut Clients,
    inbox: &FrontendInbox,
    shared: &LoopShared,
    engine: RankEngine<X, D>,
    e: &dyn std::fmt::Display,
) -> RoundFailure {
    let round = engine.round();
    shared.health.fail(format!("round {round}: {e}"));
    clients.fail_all(
        &format!("the replica failed in round {round}: {e}"),
        Some(inbox),
    );
    let _ = engine.close().await;
    RoundFailure {
        round,
        cause: e.to_string(),
    }
}
