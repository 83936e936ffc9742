//! RoundPipeline: one rank's round through its two deterministic cores, in the order of
//! DESIGN.md §3 — StorageTransferManager (agreed round → StorageReport) → Scheduler (apply,
//! plan) → StorageTransferManager (commit: tickets, credits, operations for the L3
//! executor); after the device work, Scheduler (`d2h_done` → backup candidates) →
//! StorageTransferManager (offer). One direction per step: the scheduler never holds the
//! manager, it plans against the report's StorageView.
//!
//! The round owner (`engine::round`) drives these steps for both forms of a rank (the
//! synchronous adapters and `engine-host serve`'s actors); the unit tests, the scheduler
//! benchmark and the determinism checks drive it directly. It never performs I/O.

use crate::scheduler::{AgreedInputs, Plan, Scheduler};
use crate::storage_transfer::{ClearKind, RoundInput, StorageIntent, StorageTransferManager};
use messages::{Namespace, OperationId, ProtocolError, StorageOp};

/// A committed round: the operations for the executor (in plan order) and the device work.
pub type RoundPlan = Plan<StorageOp>;

impl RoundPlan {
    /// Operation IDs of the storage operations (cancellations included).
    pub fn op_ids(&self) -> Vec<OperationId> {
        self.storage.iter().map(|o| o.id()).collect()
    }
}

/// The storage half of an agreed round, for the StorageTransferManager (the completions
/// move; the scheduler keeps the rest).
pub fn storage_input(agreed: &mut AgreedInputs) -> RoundInput {
    RoundInput {
        tick_us: agreed.tick_us,
        pressure: agreed.pressure,
        cancellations: agreed.cancellations.clone(),
        completions: std::mem::take(&mut agreed.completions),
    }
}

/// Storage intents planned while storage is disabled: a protocol error.
pub fn disabled_intents(intents: &[StorageIntent]) -> Result<(), ProtocolError> {
    if intents.is_empty() {
        Ok(())
    } else {
        Err(ProtocolError::new(
            OperationId(0),
            "storage planned while storage is disabled",
        ))
    }
}

pub struct RoundPipeline {
    scheduler: Scheduler,
    stm: Option<StorageTransferManager>,
}

impl RoundPipeline {
    /// A manager is built from the scheduler's storage contract (None: storage disabled).
    pub fn new(scheduler: Scheduler) -> Self {
        let stm = scheduler.storage_config().cloned().map(|cfg| {
            StorageTransferManager::new(cfg).with_trace_rank(scheduler.layout().shard.index)
        });
        Self { scheduler, stm }
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }
    /// The two cores, for the actors that will own them.
    pub fn into_parts(self) -> (Scheduler, Option<StorageTransferManager>) {
        (self.scheduler, self.stm)
    }
    pub fn scheduler_mut(&mut self) -> &mut Scheduler {
        &mut self.scheduler
    }
    pub fn stm(&self) -> Option<&StorageTransferManager> {
        self.stm.as_ref()
    }

    /// Applies one agreed round and plans it; returns the committed plan.
    pub fn round(&mut self, mut agreed: AgreedInputs) -> Result<RoundPlan, ProtocolError> {
        let report = match self.stm.as_mut() {
            Some(stm) => Some(stm.begin_round(storage_input(&mut agreed))?),
            None => None,
        };
        self.scheduler.apply(agreed, report)?;
        let mut plan = self.scheduler.plan();
        let intents = std::mem::take(&mut plan.storage);
        let storage = match self.stm.as_mut() {
            Some(stm) => stm.commit(intents)?,
            None => {
                disabled_intents(&intents)?;
                vec![]
            }
        };
        Ok(plan.with_storage(storage))
    }

    /// The round's D2H copies completed: Host L2 publishes; candidates go to the manager.
    pub fn d2h_done(&mut self) {
        let candidates = self.scheduler.d2h_done();
        if let Some(stm) = self.stm.as_mut() {
            stm.offer_backups(candidates);
        }
    }

    /// Applies the pending admin command (the caller checked quiescence): the manager
    /// rejects outstanding work first (a failed remote deletion refuses the clear), then the
    /// scheduler clears local caches. Returns the cancellations to submit.
    pub fn apply_admin(
        &mut self,
        kind: ClearKind,
        remote_deletion: Option<Result<(), String>>,
        new_namespace: Option<Namespace>,
    ) -> Result<Vec<StorageOp>, String> {
        let cleared = match self.stm.as_mut() {
            Some(stm) => stm
                .clear_now(kind, remote_deletion)
                .map(|(fx, ops)| (Some(fx), ops))
                .map_err(|e| e.to_string()),
            None => match remote_deletion {
                Some(Err(e)) => Err(e),
                _ => Ok((None, vec![])),
            },
        };
        let (cleared, cancels) = match cleared {
            Ok(c) => c,
            Err(e) => {
                // Refused: the command is dropped and new work resumes.
                self.scheduler.refuse_admin();
                return Err(e);
            }
        };
        self.scheduler.apply_admin(cleared, new_namespace)?;
        Ok(cancels)
    }
}
