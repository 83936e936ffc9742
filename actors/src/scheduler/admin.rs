//! Admin work: the queue of admin commands, refusing and applying the pending one, and
//! quiescence (no request holding cache resources). While a command is pending `plan`
//! prepares and admits nothing (plan.rs).
//!
//! It never talks to storage: the StorageTransferManager rejects outstanding operations
//! (and performs any remote deletion) before `apply_admin`, whose effects only arrive here.
//! It never checks quiescence on the caller's behalf: the caller asks `quiescent` first.

use super::request::RequestState;
use super::Scheduler;
use crate::storage_transfer::RoundEffects;
use messages::Namespace;

/// Admin work applied when no request holds cache resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminCommand {
    ClearCache,
    SetWeightVersion {
        target: u64,
        draft: Option<u64>,
    },
    /// Drop the Device (and, with `host`, the Host) cache once idle; L3 is untouched.
    ResetLocal {
        host: bool,
    },
}

impl AdminCommand {
    /// Whether the command waits for storage to be idle too (no outstanding operation, no
    /// queued backup candidate), not only for no request holding cache resources.
    pub fn waits_for_idle_storage(&self) -> bool {
        matches!(self, AdminCommand::ResetLocal { .. })
    }
}

impl Scheduler {
    /// Queues an admin command; it applies when no request holds cache resources.
    pub fn admin(&mut self, cmd: AdminCommand) {
        self.pending_admin.push_back(cmd);
    }

    /// Drops the pending admin command unapplied (its agreed preflight failed).
    pub fn refuse_admin(&mut self) {
        self.pending_admin.pop_front();
    }

    /// Whether an admin command waits for quiescence (new work is held meanwhile).
    pub fn admin_pending(&self) -> Option<AdminCommand> {
        self.pending_admin.front().copied()
    }

    /// Whether the scheduler is quiescent for admin work: no running or preparing request.
    pub fn quiescent(&self) -> bool {
        self.requests.values().all(|r| {
            matches!(r.state, RequestState::Submitted | RequestState::Admissible)
                && r.resources.ready.is_none()
        })
    }

    /// Applies the pending admin command once quiescent, after the StorageTransferManager
    /// rejected outstanding storage operations (never draining them): `cleared` is its
    /// effects (None with storage disabled). Clears local caches and, for a weight update,
    /// moves to `new_namespace`. A failed remote deletion never reaches here: it prevents
    /// local clearing.
    pub fn apply_admin(
        &mut self,
        cleared: Option<RoundEffects>,
        new_namespace: Option<Namespace>,
    ) -> Result<(), String> {
        let cmd = self.pending_admin.pop_front();
        if let Some(fx) = cleared {
            self.apply_effects(fx);
        }
        if let Some(AdminCommand::ResetLocal { host }) = cmd {
            // Local caches only: the namespace, the tail hints of L3 objects and every
            // storage record stay; blocks storage I/O still references stay (invisible)
            // until it retires.
            for r in self.requests.values_mut() {
                r.resources.ready = None;
            }
            self.cache.reset_local(host);
            return Ok(());
        }
        // Local clearing: Ready holds are gone; every unreferenced block is freed, and the
        // blocks in-flight storage I/O still references stay (invisible) until it retires.
        for r in self.requests.values_mut() {
            r.resources.ready = None;
        }
        let ns = new_namespace.unwrap_or_else(|| self.cache.namespace().clone());
        self.cache.clear(ns.clone());
        self.cfg.namespace = ns;
        Ok(())
    }
}
