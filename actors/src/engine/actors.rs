//! RankActors: one rank's round loop over its actors, as `engine-host serve` runs it. The
//! Scheduler, the StorageTransferManager, the L3 executor and the DeviceCopyEngine each run
//! as an actix actor on the round loop's arbiter; this driver only moves each step's
//! message to the next actor, one direction per step (DESIGN.md §3):
//!
//! ControlPlane (agreed round) → StorageTransferManager `BeginRound` → Scheduler
//! `PlanRound` → StorageTransferManager `CommitPlan` (→ L3 executor `SubmitTraced`) and
//! DeviceCopyEngine (H2D, forwards, D2H, `WaitFence`) → Scheduler `D2hDone` →
//! StorageTransferManager `OfferBackups`.
//!
//! It holds no scheduling state of its own beyond the last round's summary and the prefill
//! digests it reports at the next head; it must never decide anything an actor decides.

use super::{EngineError, LocalReport, RoundWork};
use crate::clock::SharedClock;
use crate::device::{DeviceCopyBatch, DeviceCopyEngine, RunForward, SubmitDeviceCopies, WaitFence};
use crate::l3::actor::{Close, Health, Poll, Stats};
use crate::l3::{CloseReport, ExecutorStats, L3ExecutorActor};
use crate::model::RankDigest;
use crate::pipeline::{disabled_intents, storage_input};
use crate::scheduler::actor::{
    ApplyAdmin, D2hDone, PlanRound, QueueAdmin, RefuseAdmin, RoundSummary, SchedulerActor,
    SchedulerSnapshot, SchedulerView,
};
use crate::scheduler::geometry::RankLayout;
use crate::scheduler::{AdminCommand, AgreedInputs};
use crate::storage_transfer::actor::{
    BeginRound, ClearStorage, CommitPlan, Committed, OfferBackups, StmSnapshot,
    StorageTransferManagerActor,
};
use crate::storage_transfer::{ClearKind, StmStats};
use actix::{Addr, MailboxError};
use messages::{HealthState, Namespace, PressureSnapshot, RequestId};

impl From<MailboxError> for EngineError {
    fn from(e: MailboxError) -> Self {
        EngineError::Mailbox(e.to_string())
    }
}

/// What the exporter and the health document read of a rank.
#[derive(Clone, Debug)]
pub struct RankView {
    pub scheduler: SchedulerView,
    pub stm: Option<StmStats>,
    pub executor: Option<ExecutorStats>,
    pub health: Option<HealthState>,
    pub pressure: PressureSnapshot,
}

pub struct RankActors {
    /// This rank's static layout (for a weight update's new identity).
    pub layout: RankLayout,
    pub(super) scheduler: Addr<SchedulerActor>,
    pub(super) stm: Option<Addr<StorageTransferManagerActor>>,
    pub(super) executor: Option<Addr<L3ExecutorActor>>,
    pub(super) device: Addr<DeviceCopyEngine>,
    pub(super) clock: SharedClock,
    pub(super) digests: Vec<(RequestId, RankDigest)>,
    pub(super) last_pressure: PressureSnapshot,
    pub(super) summary: RoundSummary,
    /// The profile's device-time cost model (a round's modeled time).
    pub(super) cost: crate::model::CostModel,
}

impl RankActors {
    /// The head feedback point: poll the executor (completions + pressure, validated) and
    /// collect the last forwards' digests. With storage disabled there is no poll.
    pub async fn head(&mut self) -> Result<LocalReport, EngineError> {
        let mut report = LocalReport {
            clock_us: self.clock.now_us(),
            digests: std::mem::take(&mut self.digests),
            ..LocalReport::default()
        };
        if let Some(ex) = &self.executor {
            let (done, pressure) = ex.send(Poll).await?;
            self.last_pressure = pressure;
            report.pressure = pressure.observation();
            if let Some(e) = done.iter().find_map(|d| d.validate().err()) {
                report.error = Some(e.to_string());
            }
            report.completions = done;
        }
        Ok(report)
    }

    /// One agreed round through the actors; the summary is then `summary()`.
    pub async fn run_round(&mut self, mut agreed: AgreedInputs) -> Result<RoundWork, EngineError> {
        let report = match &self.stm {
            Some(stm) => Some(stm.send(BeginRound(storage_input(&mut agreed))).await??),
            None => None,
        };
        let mut plan = self.scheduler.send(PlanRound { agreed, report }).await??;
        let intents = std::mem::take(&mut plan.storage);
        let committed = match &self.stm {
            Some(stm) => stm.send(CommitPlan(intents)).await??,
            None => {
                disabled_intents(&intents)?;
                Committed::default()
            }
        };
        let mut work = RoundWork {
            storage_ops: committed.submitted,
            storage_pending: committed.outstanding_tickets > 0,
            device_time_us: plan.device_time_us(&self.cost),
            ..RoundWork::default()
        };
        let device_start = std::time::Instant::now();
        // Device: freed slots poisoned (debug builds), H2D, then each forward (ordered
        // after the copies), then D2H.
        if !plan.poison.is_empty() {
            let slots = std::mem::take(&mut plan.poison);
            self.device
                .send(crate::device::actor::PoisonSlots(slots))
                .await??;
        }
        if !plan.h2d.is_empty() {
            let batch = DeviceCopyBatch::new(std::mem::take(&mut plan.h2d));
            self.device.send(SubmitDeviceCopies(batch)).await??;
        }
        for (id, step) in plan.forwards {
            let out = self.device.send(RunForward(step)).await??;
            work.forwards += 1;
            self.digests.push((id, out.digest));
        }
        if !plan.d2h.is_empty() {
            let batch = DeviceCopyBatch::new(plan.d2h);
            let fence = self.device.send(SubmitDeviceCopies(batch)).await??;
            // Host L2 publication waits for the D2H fence on this rank; every rank does the
            // same in the same round, so publication stays agreed.
            self.device.send(WaitFence(fence)).await??;
        }
        work.device_work_us = device_start.elapsed().as_micros() as u64;
        let out = self.scheduler.send(D2hDone).await?;
        if let Some(stm) = &self.stm {
            work.backups_queued = stm.send(OfferBackups(out.candidates)).await?.0;
        }
        self.summary = out.summary;
        Ok(work)
    }

    /// The last round's summary (events are taken by `take_events`).
    pub fn summary(&self) -> &RoundSummary {
        &self.summary
    }
    pub fn take_events(&mut self) -> Vec<crate::scheduler::RequestEvent> {
        std::mem::take(&mut self.summary.events)
    }

    pub async fn queue_admin(&self, cmd: AdminCommand) -> Result<(), EngineError> {
        Ok(self.scheduler.send(QueueAdmin(cmd)).await?)
    }

    /// Applies the pending admin command (the caller saw the scheduler quiescent): the
    /// manager rejects outstanding work first (a failed remote deletion refuses the clear,
    /// and nothing is cleared locally), then the scheduler clears its caches.
    pub async fn apply_admin(
        &mut self,
        kind: ClearKind,
        remote_deletion: Option<Result<(), String>>,
        new_namespace: Option<Namespace>,
    ) -> Result<(), String> {
        let cleared = match &self.stm {
            Some(stm) => stm
                .send(ClearStorage {
                    kind,
                    remote_deletion,
                })
                .await
                .map_err(|e| e.to_string())?
                .map(Some),
            None => match remote_deletion {
                Some(Err(e)) => Err(e),
                _ => Ok(None),
            },
        };
        let cleared = match cleared {
            Ok(c) => c,
            Err(e) => {
                // Refused alike on every rank: the command is dropped, new work resumes.
                self.scheduler
                    .send(RefuseAdmin)
                    .await
                    .map_err(|e| e.to_string())?;
                self.summary.admin_pending = None;
                return Err(e);
            }
        };
        self.summary.admin_pending = None;
        self.scheduler
            .send(ApplyAdmin {
                cleared,
                new_namespace,
            })
            .await
            .map_err(|e| e.to_string())?
    }

    /// The scheduler's current namespace (it changes with a weight update).
    pub async fn namespace(&self) -> Result<Namespace, EngineError> {
        Ok(self.scheduler.send(SchedulerSnapshot).await?.namespace)
    }

    /// A consistent read of every actor's counters (for the exporter).
    pub async fn view(&self) -> Result<RankView, EngineError> {
        let scheduler = self.scheduler.send(SchedulerSnapshot).await?;
        let stm = match &self.stm {
            Some(s) => Some(s.send(StmSnapshot).await?),
            None => None,
        };
        let (executor, health) = match &self.executor {
            Some(e) => (e.send(Stats).await?, Some(e.send(Health).await?)),
            None => (None, None),
        };
        Ok(RankView {
            scheduler,
            stm,
            executor,
            health,
            pressure: self.last_pressure,
        })
    }

    /// Closes the L3 executor (before the device engine's cleanup).
    pub async fn close(self) -> Option<CloseReport> {
        match &self.executor {
            Some(e) => e.send(Close).await.ok().flatten(),
            None => None,
        }
    }
}
