//! The admin protocol of a replica, in two agreed steps (seed 000 "Clear and weight
//! update"). A command rides the leader's report and is queued on every rank; once the
//! scheduler is quiescent (and, for a local reset, storage is idle), every rank runs its
//! preflight — a clear's synchronous remote namespace deletion — and reports the result
//! with the next round; the agreed result (Ok only when every rank's succeeded) then
//! applies or refuses the command on every rank alike. New work stays held until then.
//!
//! It owns only the step the rank is in; the round owner applies, the scheduler decides
//! quiescence. It never answers a client (the registry does, on the leader).

use super::factory::{identity, RankSpec};
use super::ports::{DevicePort, ExecutorPort};
use super::{RankEngine, RoundWork};
use crate::l3::store::Store;
use crate::scheduler::AdminCommand;
use crate::storage_transfer::ClearKind;
use std::sync::Arc;

/// What a rank's admin steps need beyond the engine: the rank's spec (a weight update's new
/// identity) and the store (a clear's remote deletion; None with storage disabled).
pub struct AdminContext {
    pub spec: RankSpec,
    pub store: Option<Arc<dyn Store>>,
    /// How long (agreed time) a local reset waits for idle storage before it is refused
    /// (`server.reset_idle_wait_ms`).
    pub reset_idle_wait_us: u64,
}

/// Where this rank is in the admin protocol.
#[derive(Debug, Default)]
pub struct AdminSteps {
    /// This rank's preflight result, to report with the next round.
    preflight: Option<Result<(), String>>,
    /// The preflight was reported; the agreed result is awaited.
    awaiting: bool,
    /// The agreed tick at which the pending command began waiting for idle storage.
    waiting_since_us: Option<u64>,
}

impl AdminSteps {
    /// The preflight result for this round's report (once).
    pub fn take_preflight(&mut self) -> Option<Result<(), String>> {
        self.preflight.take()
    }

    /// After a round: with the agreed preflight, apply (or refuse) the pending command and
    /// return its result for the client; otherwise start the preflight once the rank is
    /// quiescent. Every rank reaches each step in the same round: the state and `tick_us`
    /// (the round's agreed tick) are alike on every rank.
    pub async fn after_round<X: ExecutorPort, D: DevicePort>(
        &mut self,
        engine: &mut RankEngine<X, D>,
        agreed_preflight: Option<Result<(), String>>,
        work: &RoundWork,
        tick_us: u64,
        ctx: &AdminContext,
    ) -> Option<Result<String, String>> {
        if let Some(agreed) = agreed_preflight {
            self.awaiting = false;
            self.waiting_since_us = None;
            let (cmd, _) = engine.admin_pending()?;
            return Some(apply(engine, cmd, agreed, ctx).await);
        }
        if self.awaiting {
            return None;
        }
        if let Some((cmd, true)) = engine.admin_pending() {
            // A local reset also waits for storage to be idle (the backups in flight land
            // first), for at most `reset_idle_wait_us`: a store that keeps refusing PUTs
            // (full) never becomes idle, and held work must not wait forever. Past the
            // bound the preflight fails, so every rank refuses the reset alike.
            if !cmd.waits_for_idle_storage() || work.storage_idle() {
                self.preflight = Some(preflight(engine.namespace(), cmd, ctx));
                self.awaiting = true;
            } else {
                let since = *self.waiting_since_us.get_or_insert(tick_us);
                let waited = tick_us.saturating_sub(since);
                if waited >= ctx.reset_idle_wait_us {
                    self.preflight = Some(Err(not_idle(waited, work)));
                    self.awaiting = true;
                }
            }
        }
        None
    }
}

/// Why a local reset was refused: storage did not become idle in time.
fn not_idle(waited_us: u64, work: &RoundWork) -> String {
    format!(
        "storage did not become idle within {} ms (server.reset_idle_wait_ms): {} backup \
         candidates queued, storage operations {}; nothing was reset (a store refusing \
         PUTs for capacity keeps its backups pending: see tsl3_dfs_puts_total)",
        waited_us / 1000,
        work.backups_queued,
        if work.storage_pending {
            "outstanding"
        } else {
            "settled"
        }
    )
}

/// This rank's preflight: a clear deletes the namespace in the remote store (synchronously;
/// Ok without a store); a weight update or a local reset has nothing to delete.
fn preflight(
    ns: &messages::Namespace,
    cmd: AdminCommand,
    ctx: &AdminContext,
) -> Result<(), String> {
    match (cmd, &ctx.store) {
        (AdminCommand::ClearCache, Some(s)) => s
            .remove_namespace(ns)
            .map(|_| ())
            .map_err(|e| format!("remote namespace deletion failed: {e}")),
        _ => Ok(()),
    }
}

/// Applies (or, after a failed agreed preflight, refuses) the pending admin command.
async fn apply<X: ExecutorPort, D: DevicePort>(
    engine: &mut RankEngine<X, D>,
    cmd: AdminCommand,
    preflight: Result<(), String>,
    ctx: &AdminContext,
) -> Result<String, String> {
    let ns = engine.namespace().clone();
    match cmd {
        AdminCommand::ResetLocal { host } => {
            if let Err(e) = preflight {
                // Refused alike on every rank (storage never became idle); the refusal's
                // own reason is the answer.
                return match engine
                    .apply_admin(ClearKind::LocalReset, Some(Err(e.clone())), None)
                    .await
                {
                    Ok(()) | Err(super::AdminError::Refused(_)) => Err(e),
                    Err(other) => Err(other.to_string()),
                };
            }
            engine
                .apply_admin(ClearKind::LocalReset, Some(Ok(())), None)
                .await
                .map_err(|e| e.to_string())?;
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
                .await
                .map_err(|e| e.to_string())?;
            Ok(format!("cleared the cache of namespace {}", ns.as_str()))
        }
        AdminCommand::SetWeightVersion { target, draft } => {
            if let Err(e) = preflight {
                engine
                    .apply_admin(ClearKind::WeightUpdate, Some(Err(e.clone())), None)
                    .await
                    .map_err(|e| e.to_string())?;
                return Err(e);
            }
            let id = identity(&ctx.spec, engine.scheduler().layout())
                .with_weight_versions(target, draft);
            let new_ns = id.namespace();
            engine
                .apply_admin(ClearKind::WeightUpdate, None, Some(new_ns.clone()))
                .await
                .map_err(|e| e.to_string())?;
            Ok(format!(
                "weights {target}{}: namespace {} (was {})",
                draft.map(|d| format!("/draft {d}")).unwrap_or_default(),
                new_ns.as_str(),
                ns.as_str()
            ))
        }
    }
}
