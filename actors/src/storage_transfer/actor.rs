//! StorageTransferManagerActor: the StorageTransferManager core behind a typed mailbox.
//! Its messages are the manager's steps of a round, in order — `BeginRound` (the agreed
//! storage facts → the StorageReport for the scheduler), `CommitPlan` (the scheduler's
//! StorageIntents → tickets, credits, and the operations sent to the L3 executor in plan
//! order), `OfferBackups` (D2H-published blocks as candidates) — plus `ClearStorage` for
//! admin work and `StmSnapshot` for the exporter. It holds the executor only as a
//! `Recipient<SubmitTraced>`; it never reads a clock and never touches Host memory.

use super::{
    BackupCandidate, ClearKind, RoundEffects, RoundInput, StmStats, StorageIntent, StorageReport,
    StorageTransferManager,
};
use crate::l3::actor::SubmitTraced;
use actix::{Actor, Context, Handler, Message, MessageResult, Recipient};
use messages::{ProtocolError, StorageOp};

/// Apply the agreed round's storage facts and report to the scheduler.
#[derive(Debug, Message)]
#[rtype(result = "Result<StorageReport, ProtocolError>")]
pub struct BeginRound(pub RoundInput);

/// Commit the plan's storage intents.
#[derive(Debug, Message)]
#[rtype(result = "Result<Committed, ProtocolError>")]
pub struct CommitPlan(pub Vec<StorageIntent>);

/// What a commit did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Committed {
    /// Operations sent to the executor (cancellations included).
    pub submitted: usize,
    /// Tickets not yet settled after the commit.
    pub outstanding_tickets: u64,
}

/// Backup candidates of the round's D2H completion.
#[derive(Debug, Message)]
#[rtype(result = "QueuedBackups")]
pub struct OfferBackups(pub Vec<BackupCandidate>);

/// What `OfferBackups` answers: backup candidates queued after the offer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueuedBackups(pub u64);

/// Reject outstanding work for a clear (a failed remote deletion refuses it); answers the
/// effects for the scheduler.
#[derive(Debug, Message)]
#[rtype(result = "Result<RoundEffects, String>")]
pub struct ClearStorage {
    pub kind: ClearKind,
    pub remote_deletion: Option<Result<(), String>>,
}

#[derive(Debug, Message)]
#[rtype(result = "StmStats")]
pub struct StmSnapshot;

pub struct StorageTransferManagerActor {
    core: StorageTransferManager,
    executor: Recipient<SubmitTraced>,
}

impl StorageTransferManagerActor {
    pub fn new(core: StorageTransferManager, executor: Recipient<SubmitTraced>) -> Self {
        Self { core, executor }
    }

    fn submit(&self, ops: Vec<StorageOp>) -> usize {
        let n = ops.len();
        if n > 0 {
            let traced = ops
                .into_iter()
                .map(|op| {
                    let span = self.core.op_span(op.id()).cloned();
                    (op, span)
                })
                .collect();
            self.executor.do_send(SubmitTraced(traced));
        }
        n
    }
}

impl Actor for StorageTransferManagerActor {
    type Context = Context<Self>;
}

impl Handler<BeginRound> for StorageTransferManagerActor {
    type Result = Result<StorageReport, ProtocolError>;
    fn handle(&mut self, m: BeginRound, _: &mut Context<Self>) -> Self::Result {
        self.core.begin_round(m.0)
    }
}

impl Handler<CommitPlan> for StorageTransferManagerActor {
    type Result = Result<Committed, ProtocolError>;
    fn handle(&mut self, m: CommitPlan, _: &mut Context<Self>) -> Self::Result {
        let ops = self.core.commit(m.0)?;
        Ok(Committed {
            submitted: self.submit(ops),
            outstanding_tickets: self.core.outstanding_tickets(),
        })
    }
}

impl Handler<OfferBackups> for StorageTransferManagerActor {
    type Result = MessageResult<OfferBackups>;
    fn handle(&mut self, m: OfferBackups, _: &mut Context<Self>) -> Self::Result {
        self.core.offer_backups(m.0);
        MessageResult(QueuedBackups(self.core.queued_candidates() as u64))
    }
}

impl Handler<ClearStorage> for StorageTransferManagerActor {
    type Result = Result<RoundEffects, String>;
    fn handle(&mut self, m: ClearStorage, _: &mut Context<Self>) -> Self::Result {
        let (fx, cancels) = self
            .core
            .clear_now(m.kind, m.remote_deletion)
            .map_err(|e| e.to_string())?;
        self.submit(cancels);
        Ok(fx)
    }
}

impl Handler<StmSnapshot> for StorageTransferManagerActor {
    type Result = MessageResult<StmSnapshot>;
    fn handle(&mut self, _: StmSnapshot, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.core.stats())
    }
}
