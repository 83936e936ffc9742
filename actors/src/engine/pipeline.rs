//! RoundPipeline: one rank's round through its two deterministic cores, in the order of
//! DESIGN.md §3 — Scheduler `apply` (the StorageTransferManager applies the agreed round and
//! reports) and `plan` (cache and FSM updated, plan made; every storage operation decided
//! once, by the manager the scheduler asks directly, which returns the operations for the
//! L3 executor when the plan ends); after the device work, Scheduler (`d2h_done_each`: each
//! backup candidate as it is made) → StorageTransferManager (`backup_offers`). The pipeline
//! owns both cores and lends the manager to the scheduler for each step.
//!
//! The round owner (`engine::round`) drives these steps for both forms of a rank (the
//! synchronous adapters and `engine-host serve`'s actors); the unit tests, the scheduler
//! benchmark and the determinism checks drive it directly. It never performs I/O.

use crate::scheduler::{AgreedInputs, Plan, Scheduler};
use crate::storage_transfer::{ClearKind, ClearRefused, StorageTransferManager};
use messages::{Namespace, OperationId, ProtocolError, StorageOp};

/// A committed round: the operations for the executor (in plan order) and the device work.
pub type RoundPlan = Plan<StorageOp>;

impl RoundPlan {
    /// Operation IDs of the storage operations (cancellations included).
    pub fn op_ids(&self) -> Vec<OperationId> {
        self.storage.iter().map(|o| o.id()).collect()
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
    pub fn round(&mut self, agreed: AgreedInputs) -> Result<RoundPlan, ProtocolError> {
        self.scheduler.apply(agreed, self.stm.as_mut())?;
        Ok(self.scheduler.plan(self.stm.as_mut()))
    }

    /// The round's D2H copies completed: Host L2 publishes; candidates go to the manager.
    pub fn d2h_done(&mut self) {
        match self.stm.as_mut() {
            Some(stm) => {
                let mut offers = stm.backup_offers();
                offers.reserve(self.scheduler.d2h_pending_blocks());
                self.scheduler.d2h_done_each(|c| {
                    let _ = offers.offer(c);
                });
            }
            None => self.scheduler.d2h_done_each(|_| {}),
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
    ) -> Result<Vec<StorageOp>, ClearRefused> {
        let cleared = match self.stm.as_mut() {
            Some(stm) => stm
                .clear_now(kind, remote_deletion)
                .map(|(fx, ops)| (Some(fx), ops)),
            None => match remote_deletion {
                Some(Err(e)) => Err(ClearRefused::DeletionFailed(e)),
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
        self.scheduler.apply_admin(cleared, new_namespace);
        Ok(cancels)
    }
}
