//! SchedulerActor: the Scheduler core behind a typed mailbox. Its messages are the
//! scheduler's steps of a round, in order — `PlanRound` (the agreed inputs and the
//! StorageTransferManager's report → the plan), `D2hDone` (→ the backup candidates for the
//! manager and the round's summary) — plus the admin steps (`QueueAdmin`, `ApplyAdmin`) and
//! a `SchedulerSnapshot` for the exporter. It owns the request FSM and the
//! CacheCoordinator; it never holds another actor's type and never performs I/O, so every
//! rank's actor makes the same decisions from the same messages.

use super::{AdminCommand, AgreedInputs, Plan, RequestEvent, Scheduler, SchedulerStats};
use crate::storage_transfer::{BackupCandidate, RoundEffects, StorageReport};
use actix::{Actor, Context, Handler, Message, MessageResult};
use messages::{Namespace, ProtocolError};

/// Apply the agreed round (with the manager's report; None with storage disabled) and plan.
#[derive(Debug, Message)]
#[rtype(result = "Result<Plan, ProtocolError>")]
pub struct PlanRound {
    pub agreed: AgreedInputs,
    pub report: Option<StorageReport>,
}

/// The round's D2H copies completed on this rank: publish Host L2.
#[derive(Debug, Message)]
#[rtype(result = "D2hOutcome")]
pub struct D2hDone;

/// What a round leaves for the round loop.
#[derive(Clone, Debug, Default)]
pub struct RoundSummary {
    pub events: Vec<RequestEvent>,
    pub live_requests: usize,
    /// The admin command waiting for quiescence, and whether the scheduler is quiescent
    /// (false while no command waits).
    pub admin_pending: Option<AdminCommand>,
    pub quiescent: bool,
}

#[derive(Debug, Default)]
pub struct D2hOutcome {
    /// New backup candidates, for the StorageTransferManager.
    pub candidates: Vec<BackupCandidate>,
    pub summary: RoundSummary,
}

/// Queue an admin command (applied when quiescent).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct QueueAdmin(pub AdminCommand);

/// Apply the pending admin command after the manager rejected outstanding work.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), String>")]
pub struct ApplyAdmin {
    pub cleared: Option<RoundEffects>,
    pub new_namespace: Option<Namespace>,
}

/// The agreed preflight refused the pending admin command: drop it (new work resumes).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RefuseAdmin;

impl Handler<RefuseAdmin> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, _: RefuseAdmin, _: &mut Context<Self>) {
        self.core.refuse_admin();
    }
}

/// What the exporter and the health document read.
#[derive(Clone, Debug, Message)]
#[rtype(result = "SchedulerView")]
pub struct SchedulerSnapshot;

#[derive(Clone, Debug)]
pub struct SchedulerView {
    pub stats: SchedulerStats,
    pub namespace: Namespace,
    pub live_requests: usize,
    pub l3_enabled: bool,
}

impl SchedulerView {
    pub fn of(s: &Scheduler) -> Self {
        Self {
            stats: s.stats().clone(),
            namespace: s.namespace().clone(),
            live_requests: s.live_requests(),
            l3_enabled: s.l3_enabled(),
        }
    }
}

pub struct SchedulerActor {
    core: Scheduler,
}

impl SchedulerActor {
    pub fn new(core: Scheduler) -> Self {
        Self { core }
    }
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;
}

impl Handler<PlanRound> for SchedulerActor {
    type Result = Result<Plan, ProtocolError>;
    fn handle(&mut self, m: PlanRound, _: &mut Context<Self>) -> Self::Result {
        self.core.apply(m.agreed, m.report)?;
        Ok(self.core.plan())
    }
}

impl Handler<D2hDone> for SchedulerActor {
    type Result = MessageResult<D2hDone>;
    fn handle(&mut self, _: D2hDone, _: &mut Context<Self>) -> Self::Result {
        let candidates = self.core.d2h_done();
        let admin_pending = self.core.admin_pending();
        MessageResult(D2hOutcome {
            candidates,
            summary: RoundSummary {
                events: self.core.drain_events(),
                live_requests: self.core.live_requests(),
                admin_pending,
                // Scanned only while an admin command waits for it.
                quiescent: admin_pending.is_some() && self.core.quiescent(),
            },
        })
    }
}

impl Handler<QueueAdmin> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, m: QueueAdmin, _: &mut Context<Self>) {
        self.core.admin(m.0);
    }
}

impl Handler<ApplyAdmin> for SchedulerActor {
    type Result = Result<(), String>;
    fn handle(&mut self, m: ApplyAdmin, _: &mut Context<Self>) -> Self::Result {
        self.core.apply_admin(m.cleared, m.new_namespace)
    }
}

impl Handler<SchedulerSnapshot> for SchedulerActor {
    type Result = MessageResult<SchedulerSnapshot>;
    fn handle(&mut self, _: SchedulerSnapshot, _: &mut Context<Self>) -> Self::Result {
        MessageResult(SchedulerView::of(&self.core))
    }
}
