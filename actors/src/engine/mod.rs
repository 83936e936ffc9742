//! RankEngine: one rank's round executor for tests and benchmarks, synchronous. It owns
//! the RoundPipeline (Scheduler and StorageTransferManager cores), the L3 executor (when
//! storage is enabled), the DeviceCopyEngine core and the synthetic model's forward, and
//! runs the two feedback points of a round: the head (poll the executor and fences into a
//! local report) and, once the report is agreed, the pipeline (apply → plan → commit) and
//! dispatch (storage to the executor in plan order; H2D, forward and D2H to the device
//! engine). `engine-host serve` runs the same steps through the actors (`engine::actors`).
//! It never talks to other ranks: the caller exchanges reports and hands back the agreed
//! inputs.

pub mod actors;
pub mod factory;
#[cfg(test)]
mod tests;

use crate::clock::SharedClock;
use crate::device::{
    DeviceCopyBatch, DeviceCopyEngineCore, DeviceError, DeviceMemory, ForwardOutcome,
};
use crate::host::HostCacheStorage;
use crate::l3::{CloseReport, L3Executor};
use crate::model::{RankDigest, SyntheticModel};
use crate::pipeline::{RoundPipeline, RoundPlan};
use crate::scheduler::{AgreedInputs, RequestEvent, Scheduler};
use crate::storage_transfer::{ClearKind, StorageTransferManager};
use messages::{
    HealthState, PressureObservation, PressureSnapshot, RequestId, StorageDone, StorageOp,
};
use std::sync::Arc;

/// What this rank contributes to the relay exchange of a round.
#[derive(Clone, Debug, Default)]
pub struct LocalReport {
    pub clock_us: u64,
    pub pressure: PressureObservation,
    /// Newly completed storage records, each sent once (validated).
    pub completions: Vec<StorageDone>,
    /// Prefill digests of the last round's forwards.
    pub digests: Vec<(RequestId, RankDigest)>,
    /// Set when this rank's poll was invalid: every rank then raises a protocol error.
    pub error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("protocol error: {0}")]
    Protocol(#[from] messages::ProtocolError),
    #[error("device: {0}")]
    Device(#[from] DeviceError),
    #[error("an actor's mailbox closed: {0}")]
    Mailbox(String),
}

/// Device time of the last round's forwards (the cost model), for an optional emulation.
#[derive(Clone, Copy, Debug, Default)]
pub struct RoundWork {
    pub forwards: usize,
    pub device_time_us: u64,
    pub storage_ops: usize,
    /// Storage tickets remain outstanding after the round.
    pub storage_pending: bool,
    /// Backup candidates queued for a later PUT after the round.
    pub backups_queued: u64,
    /// Wall time the emulator itself spent on the round's device work (copies and
    /// forwards), microseconds: an emulated step lasts max(modeled, this), so the engine
    /// waits only `device_time_us - device_work_us`.
    pub device_work_us: u64,
}

impl RoundWork {
    /// No storage operation outstanding and no backup candidate waiting.
    pub fn storage_idle(&self) -> bool {
        !self.storage_pending && self.backups_queued == 0
    }

    /// What the engine still waits for an emulated device step to last its modeled time.
    pub fn emulated_wait_us(&self) -> u64 {
        self.device_time_us.saturating_sub(self.device_work_us)
    }
}

pub struct RankEngine {
    pipeline: RoundPipeline,
    executor: Option<L3Executor>,
    device: DeviceCopyEngineCore<Box<dyn DeviceMemory>>,
    host: Arc<HostCacheStorage>,
    model: SyntheticModel,
    clock: SharedClock,
    digests: Vec<(RequestId, RankDigest)>,
    last_pressure: PressureSnapshot,
}

impl RankEngine {
    pub fn new(
        scheduler: Scheduler,
        executor: Option<L3Executor>,
        device: DeviceCopyEngineCore<Box<dyn DeviceMemory>>,
        host: Arc<HostCacheStorage>,
        clock: SharedClock,
    ) -> Self {
        let model = scheduler.model().clone();
        Self {
            pipeline: RoundPipeline::new(scheduler),
            executor,
            device,
            host,
            model,
            clock,
            digests: vec![],
            last_pressure: PressureSnapshot::default(),
        }
    }

    pub fn scheduler(&self) -> &Scheduler {
        self.pipeline.scheduler()
    }
    pub fn scheduler_mut(&mut self) -> &mut Scheduler {
        self.pipeline.scheduler_mut()
    }
    /// The StorageTransferManager (None: storage disabled).
    pub fn stm(&self) -> Option<&StorageTransferManager> {
        self.pipeline.stm()
    }
    pub fn executor(&self) -> Option<&L3Executor> {
        self.executor.as_ref()
    }
    pub fn host(&self) -> &Arc<HostCacheStorage> {
        &self.host
    }
    pub fn health(&self) -> Option<HealthState> {
        self.executor.as_ref().map(|e| e.health())
    }
    pub fn pressure(&self) -> PressureSnapshot {
        self.last_pressure
    }

    /// The head feedback point: poll the executor (completions + pressure, validated) and
    /// collect the last forwards' digests. With storage disabled there is no poll.
    pub fn head(&mut self) -> LocalReport {
        let mut report = LocalReport {
            clock_us: self.clock.now_us(),
            digests: std::mem::take(&mut self.digests),
            ..LocalReport::default()
        };
        if let Some(ex) = self.executor.as_ref() {
            let (done, pressure) = ex.poll();
            self.last_pressure = pressure;
            report.pressure = pressure.observation();
            for d in &done {
                if let Err(e) = d.validate() {
                    report.error = Some(e.to_string());
                }
            }
            report.completions = done;
        }
        report
    }

    /// Applies the agreed round, plans, and dispatches the plan.
    pub fn run_round(&mut self, agreed: AgreedInputs) -> Result<RoundWork, EngineError> {
        let plan = self.pipeline.round(agreed)?;
        self.dispatch(plan)
    }

    fn dispatch(&mut self, plan: RoundPlan) -> Result<RoundWork, EngineError> {
        let mut work = RoundWork {
            storage_ops: plan.storage.len(),
            device_time_us: plan.device_time_us(&self.model.profile().cost),
            ..RoundWork::default()
        };
        // Storage in plan order; the executor depends on tickets, not on the device.
        if let Some(ex) = self.executor.as_ref() {
            for op in plan.storage {
                // Inside the operation's span, the executor's `l3_op` span is its child.
                let span = self
                    .pipeline
                    .stm()
                    .and_then(|s| s.op_span(op.id()))
                    .cloned();
                let _entered = span.as_ref().map(|s| s.enter());
                let _ = ex.submit(op);
            }
        } else if let Some(op) = plan.storage.first() {
            return Err(EngineError::Protocol(messages::ProtocolError::new(
                op.id(),
                "storage op planned while storage is disabled",
            )));
        }
        let device_start = std::time::Instant::now();
        // Device: freed slots poisoned (debug builds), H2D, then each forward (ordered
        // after the copies), then D2H.
        self.device.poison_slots(&plan.poison)?;
        if !plan.h2d.is_empty() {
            self.device.submit(&DeviceCopyBatch::new(plan.h2d))?;
        }
        for (id, step) in &plan.forwards {
            let ForwardOutcome { digest, .. } = self.device.forward(&self.model, step)?;
            work.forwards += 1;
            self.digests.push((*id, digest));
        }
        if !plan.d2h.is_empty() {
            let fence = self.device.submit(&DeviceCopyBatch::new(plan.d2h))?;
            // Host L2 publication waits for the D2H fence on this rank; every rank does the
            // same in the same round, so publication stays agreed.
            self.device.wait_fence(fence)?;
        } else {
            self.device.poll_fences()?;
        }
        work.device_work_us = device_start.elapsed().as_micros() as u64;
        self.pipeline.d2h_done();
        work.storage_pending = self.stm().is_some_and(|s| s.outstanding_tickets() > 0);
        work.backups_queued = self.stm().map_or(0, |s| s.queued_candidates() as u64);
        Ok(work)
    }

    pub fn drain_events(&mut self) -> Vec<RequestEvent> {
        self.pipeline.scheduler_mut().drain_events()
    }

    /// Applies the pending admin command (see `RoundPipeline::apply_admin`) and submits the
    /// cancellations of the rejected operations.
    pub fn apply_admin(
        &mut self,
        kind: ClearKind,
        remote_deletion: Option<Result<(), String>>,
        new_namespace: Option<messages::Namespace>,
    ) -> Result<(), String> {
        let cancels = self
            .pipeline
            .apply_admin(kind, remote_deletion, new_namespace)?;
        for op in cancels {
            self.submit_storage(op);
        }
        Ok(())
    }

    /// Submits storage ops directly (admin paths and tests).
    pub fn submit_storage(&self, op: StorageOp) {
        if let Some(ex) = self.executor.as_ref() {
            let _ = ex.submit(op);
        }
    }

    /// Starts the rank's actors on the current actix arbiter (the round loop's thread) and
    /// hands each its core: the engine host's serving form of this engine.
    pub fn into_actors(self) -> actors::RankActors {
        use crate::device::DeviceCopyEngine;
        use crate::l3::L3ExecutorActor;
        use crate::scheduler::actor::SchedulerActor;
        use crate::storage_transfer::actor::StorageTransferManagerActor;
        use actix::Actor;
        let (scheduler, stm) = self.pipeline.into_parts();
        let layout = scheduler.layout().clone();
        let cost_model = self.model.profile().cost;
        let executor = self.executor.map(|e| L3ExecutorActor::new(e).start());
        let stm = match (stm, &executor) {
            (Some(core), Some(ex)) => {
                Some(StorageTransferManagerActor::new(core, ex.clone().recipient()).start())
            }
            _ => None,
        };
        actors::RankActors {
            layout,
            scheduler: SchedulerActor::new(scheduler).start(),
            stm,
            executor,
            device: DeviceCopyEngine::from_core(self.device, Arc::new(self.model)).start(),
            clock: self.clock,
            digests: self.digests,
            last_pressure: self.last_pressure,
            summary: Default::default(),
            cost: cost_model,
        }
    }

    /// Closes the L3 executor (before the device engine's cleanup).
    pub fn close(self) -> Option<CloseReport> {
        self.executor.map(|e| e.close())
    }
}

/// Agreement of a world of one without a mesh: the local report is the agreed round. For
/// tests and benchmarks that drive one rank directly; `engine-host serve` always agrees
/// through the ControlPlane, a world of one included.
pub fn agree_single(
    report: LocalReport,
    frontend: Vec<(RequestId, Vec<u32>, u32)>,
    cancellations: Vec<RequestId>,
) -> Result<AgreedInputs, messages::ProtocolError> {
    if let Some(e) = report.error {
        return Err(messages::ProtocolError::new(messages::OperationId(0), e));
    }
    Ok(AgreedInputs {
        tick_us: report.clock_us,
        pressure: report.pressure,
        new_requests: frontend,
        cancellations,
        completions: report.completions,
        digests: report
            .digests
            .into_iter()
            .map(|(id, d)| (id, vec![d]))
            .collect(),
    })
}
