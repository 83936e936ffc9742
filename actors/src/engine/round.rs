//! One round, written once, over the ports (DESIGN.md §4): `head` (step 1, this rank's
//! report), `run_round` (steps 3-6 on the agreed round: apply, plan — the manager deciding
//! storage admission — dispatch in plan order, tail) and `apply_admin` (the second admin
//! step). The synchronous adapters run
//! it through the `*_now` methods, `engine-host serve` through the actor adapters
//! (`ActorRank`); both execute these same lines.
//!
//! It owns the round's cores (through `RoundPipeline`) and the prefill digests it reports at
//! the next head. It never talks to another rank and never performs storage I/O itself.

use super::actor_ports::DeviceActorPort;
use super::pipeline::{RoundPipeline, RoundPlan};
use super::ports::{DevicePort, ExecutorPort, TracedOp};
use super::sync_ports::{now, Loopback, SyncDevice};
use super::EngineError;
use crate::clock::SharedClock;
use crate::device::{
    DeviceCopyBatch, DeviceCopyEngine, DeviceCopyEngineCore, DeviceMemory, ForwardBackend,
};
use crate::host::HostCacheStorage;
use crate::l3::{CloseReport, ExecutorStats, L3Executor, L3ExecutorActor};
use crate::model::{CostModel, RankDigest, SyntheticModel};
use crate::scheduler::{
    AdminCommand, AgreedInputs, NewRequest, RequestEvent, Scheduler, SchedulerStats,
};
use crate::storage_transfer::{ClearKind, ClearRefused, StmStats, StorageTransferManager};
use actix::Addr;
use messages::{
    AgreedRound, ControlError, FrontendMessage, HealthState, Namespace, PrefillDigest,
    PressureSnapshot, RequestId, RoundReport,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Why an admin command did not apply on this rank.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The agreed preflight failed (every rank refuses alike; nothing was cleared).
    #[error(transparent)]
    Refused(#[from] ClearRefused),
    /// The cancellations of the rejected operations could not reach the executor.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// What a round did, for the event loop (idle pause, drain, device-time emulation).
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
    /// The agreed round carried the leader's Shutdown: every rank stops after it.
    pub shutdown: bool,
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

/// The scheduler's counters and identity, as the exporter reads them.
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

/// One consistent read of a rank, for the exporter and the health document.
#[derive(Clone, Debug)]
pub struct RankView {
    pub scheduler: SchedulerView,
    pub stm: Option<StmStats>,
    pub executor: Option<ExecutorStats>,
    pub health: Option<HealthState>,
    pub pressure: PressureSnapshot,
}

/// One rank's round owner over an executor port `X` and a device port `D`. The defaults
/// are the synchronous adapters (the cores themselves).
pub struct RankEngine<X = L3Executor, D = SyncDevice> {
    pipeline: RoundPipeline,
    /// None: storage disabled (no executor, no store client, no storage poll).
    executor: Option<X>,
    device: D,
    host: Arc<HostCacheStorage>,
    model: Arc<SyntheticModel>,
    cost: CostModel,
    clock: SharedClock,
    /// This rank's attention-TP index and the last round it reported.
    rank: u32,
    round: u64,
    /// Prefill digests of the last round's forwards, reported at the next head.
    digests: Vec<PrefillDigest>,
    last_pressure: PressureSnapshot,
    /// The executor's completion wake (None: storage disabled), kept across `map_ports`.
    storage_wake: Option<Arc<tokio::sync::Notify>>,
}

/// The serving form: the executor and the device engine as actors on the loop's arbiter.
pub type ActorRank = RankEngine<Addr<L3ExecutorActor>, DeviceActorPort>;

/// The fence deadline of `into_actors` (serve passes `tp.round_deadline_ms`).
pub const DEFAULT_FENCE_DEADLINE: Duration = Duration::from_secs(5);

impl<X, D> RankEngine<X, D> {
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
    pub fn executor(&self) -> Option<&X> {
        self.executor.as_ref()
    }
    pub fn host(&self) -> &Arc<HostCacheStorage> {
        &self.host
    }
    pub fn model(&self) -> &Arc<SyntheticModel> {
        &self.model
    }
    /// The last pressure snapshot the head polled.
    pub fn pressure(&self) -> PressureSnapshot {
        self.last_pressure
    }
    /// The last round this rank reported (0 before the first head).
    pub fn round(&self) -> u64 {
        self.round
    }
    pub fn namespace(&self) -> &Namespace {
        self.pipeline.scheduler().namespace()
    }
    /// Request events of the rounds since the last call (tokens, finishes, aborts).
    pub fn drain_events(&mut self) -> Vec<RequestEvent> {
        self.pipeline.scheduler_mut().drain_events()
    }
    /// The admin command waiting for quiescence, and whether the scheduler is quiescent
    /// (scanned only while a command waits).
    pub fn admin_pending(&self) -> Option<(AdminCommand, bool)> {
        let s = self.pipeline.scheduler();
        s.admin_pending().map(|cmd| (cmd, s.quiescent()))
    }

    /// The same round owner over other ports (the actor adapters, or a wrapper that
    /// records what crosses a port): the cores and the round's state move unchanged.
    pub fn map_ports<X2, D2>(
        self,
        executor: impl FnOnce(X) -> X2,
        device: impl FnOnce(D) -> D2,
    ) -> RankEngine<X2, D2> {
        RankEngine {
            pipeline: self.pipeline,
            executor: self.executor.map(executor),
            device: device(self.device),
            host: self.host,
            model: self.model,
            cost: self.cost,
            clock: self.clock,
            rank: self.rank,
            round: self.round,
            digests: self.digests,
            last_pressure: self.last_pressure,
            storage_wake: self.storage_wake,
        }
    }

    /// Notified when a storage completion awaits the next head (None: storage disabled).
    pub fn storage_wake(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.storage_wake.clone()
    }
}

impl<X: ExecutorPort, D: DevicePort> RankEngine<X, D> {
    /// Step 1, the head feedback point: this rank's report of the next round — its clock,
    /// the executor's new completion records and pressure, and the last forwards' digests.
    /// With storage disabled there is no poll. The caller adds frontend messages and the
    /// admin preflight, then exchanges it through the mesh port, which validates the records
    /// inside the round's error boundary (`seal_local_report`: the first invalid record
    /// turns the report into an error report) — once, for both adapters.
    pub async fn head(&mut self) -> Result<RoundReport, EngineError> {
        self.round += 1;
        let mut report = RoundReport::idle(self.rank, self.round, self.clock.now_us());
        report.digests = std::mem::take(&mut self.digests);
        if let Some(ex) = self.executor.as_mut() {
            let (done, pressure) = ex.poll().await?;
            self.last_pressure = pressure;
            report.pressure = pressure.observation();
            report.completions = done;
        }
        Ok(report)
    }

    /// Steps 3-6 on the agreed round: the admin commands it carries are queued, then apply
    /// → plan (the manager deciding every storage operation), dispatch in plan order and the
    /// tail.
    pub async fn run_round(&mut self, agreed: AgreedRound) -> Result<RoundWork, EngineError> {
        let (inputs, admin, shutdown) = agreed_inputs(agreed);
        for cmd in admin {
            self.pipeline.scheduler_mut().admin(cmd);
        }
        let plan = self.pipeline.round(inputs)?;
        let mut work = self.dispatch(plan).await?;
        work.shutdown = shutdown;
        Ok(work)
    }

    /// Step 5 and the tail: storage to the executor in plan order (each operation inside its
    /// span), then the device — freed slots poisoned (debug builds), H2D, each forward
    /// (ordered after the copies), D2H and its fence — then Host L2 publication and the
    /// backup offers.
    async fn dispatch(&mut self, mut plan: RoundPlan) -> Result<RoundWork, EngineError> {
        let mut work = RoundWork {
            storage_ops: plan.storage.len(),
            device_time_us: plan.device_time_us(&self.cost),
            ..RoundWork::default()
        };
        let ops = std::mem::take(&mut plan.storage);
        self.submit(ops).await?;
        let device_start = std::time::Instant::now();
        if !plan.poison.is_empty() {
            self.device.poison(std::mem::take(&mut plan.poison)).await?;
        }
        if !plan.h2d.is_empty() {
            let batch = DeviceCopyBatch::new(std::mem::take(&mut plan.h2d));
            self.device.copy(batch).await?;
        }
        let shard = self.pipeline.scheduler().layout().shard;
        for (id, step) in plan.forwards {
            let out = self.device.forward(id, step).await?;
            work.forwards += 1;
            debug_assert_eq!(shard, out.digest.shard);
            self.digests.push(PrefillDigest {
                request: id,
                digest: out.digest,
                logprobs: out.logprobs,
            });
        }
        for (id, step) in plan.decodes {
            let out = self.device.decode(id, step).await?;
            self.digests.push(PrefillDigest {
                request: id,
                digest: out.digest,
                logprobs: out.logprobs,
            });
        }
        if !plan.released.is_empty() {
            self.device.release(plan.released).await?;
        }
        if !plan.d2h.is_empty() {
            let fence = self.device.copy(DeviceCopyBatch::new(plan.d2h)).await?;
            // Host L2 publication waits for the D2H fence on this rank; every rank does the
            // same in the same round, so publication stays agreed.
            self.device.wait_fence(fence).await?;
        } else {
            self.device.poll_fences().await?;
        }
        work.device_work_us = device_start.elapsed().as_micros() as u64;
        self.pipeline.d2h_done();
        work.storage_pending = self.stm().is_some_and(|s| s.outstanding_tickets() > 0);
        work.backups_queued = self.stm().map_or(0, |s| s.queued_candidates() as u64);
        Ok(work)
    }

    /// Storage operations to the executor in order, each inside its operation's span. With
    /// storage disabled an operation is a protocol error.
    async fn submit(&mut self, ops: Vec<messages::StorageOp>) -> Result<(), EngineError> {
        let Some(first) = ops.first() else {
            return Ok(());
        };
        let Some(ex) = self.executor.as_mut() else {
            return Err(EngineError::Protocol(messages::ProtocolError::new(
                first.id(),
                "storage op planned while storage is disabled",
            )));
        };
        let stm = self.pipeline.stm();
        let traced: Vec<TracedOp> = ops
            .into_iter()
            .map(|op| {
                let span = stm.and_then(|s| s.op_span(op.id())).cloned();
                (op, span)
            })
            .collect();
        ex.submit(traced).await
    }

    /// The second admin step, once the scheduler is quiescent and the preflight agreed: the
    /// manager rejects outstanding work first (a failed remote deletion refuses the command
    /// and nothing is cleared locally), the rejected operations' cancellations go to the
    /// executor, then the scheduler clears its caches (and rotates the namespace of a
    /// weight update).
    pub async fn apply_admin(
        &mut self,
        kind: ClearKind,
        remote_deletion: Option<Result<(), String>>,
        new_namespace: Option<Namespace>,
    ) -> Result<(), AdminError> {
        let cancels = self
            .pipeline
            .apply_admin(kind, remote_deletion, new_namespace)?;
        Ok(self.submit(cancels).await?)
    }

    /// A consistent read of the rank's counters (for the exporter).
    pub async fn view(&mut self) -> Result<RankView, EngineError> {
        let (executor, health) = match self.executor.as_mut() {
            Some(e) => {
                let s = e.snapshot().await?;
                (s.stats, Some(s.health))
            }
            None => (None, None),
        };
        Ok(RankView {
            scheduler: SchedulerView::of(self.pipeline.scheduler()),
            stm: self.pipeline.stm().map(|s| s.stats()),
            executor,
            health,
            pressure: self.last_pressure,
        })
    }

    /// Closes the L3 executor (before the device engine's cleanup).
    pub async fn close(self) -> Option<CloseReport> {
        match self.executor {
            Some(e) => e.close().await,
            None => None,
        }
    }
}

/// The synchronous form: the same round on the cores, driven to its end on this thread.
impl RankEngine<L3Executor, SyncDevice> {
    /// A round owner whose device runs the scheduler's synthetic model.
    pub fn new(
        scheduler: Scheduler,
        executor: Option<L3Executor>,
        device: DeviceCopyEngineCore<Box<dyn DeviceMemory>>,
        host: Arc<HostCacheStorage>,
        clock: SharedClock,
    ) -> Self {
        let model = Arc::new(scheduler.model().clone());
        Self::with_backend(scheduler, executor, device, model.into(), host, clock)
    }

    /// A round owner whose device runs `backend`; a backend that draws tokens on the device
    /// makes the scheduler plan a device decode step per token.
    pub fn with_backend(
        mut scheduler: Scheduler,
        executor: Option<L3Executor>,
        mut device: DeviceCopyEngineCore<Box<dyn DeviceMemory>>,
        backend: ForwardBackend,
        host: Arc<HostCacheStorage>,
        clock: SharedClock,
    ) -> Self {
        device.set_digest_unit(backend.digest_unit());
        if backend.draws_on_device() {
            scheduler = scheduler.with_device_draws();
        }
        let model = Arc::new(scheduler.model().clone());
        let cost = model.profile().cost;
        let rank = scheduler.layout().shard.index;
        let storage_wake = executor.as_ref().map(L3Executor::completion_wake);
        Self {
            pipeline: RoundPipeline::new(scheduler),
            executor,
            device: SyncDevice {
                core: device,
                backend,
            },
            host,
            model,
            cost,
            clock,
            rank,
            round: 0,
            digests: vec![],
            last_pressure: PressureSnapshot::default(),
            storage_wake,
        }
    }

    pub fn head_now(&mut self) -> RoundReport {
        // The executor core's poll cannot fail.
        now(self.head()).unwrap_or_else(|e| {
            let mut r = RoundReport::idle(self.rank, self.round, self.clock.now_us());
            r.error = Some(e.to_string());
            r
        })
    }
    pub fn run_round_now(&mut self, agreed: AgreedRound) -> Result<RoundWork, EngineError> {
        now(self.run_round(agreed))
    }
    pub fn apply_admin_now(
        &mut self,
        kind: ClearKind,
        remote_deletion: Option<Result<(), String>>,
        new_namespace: Option<Namespace>,
    ) -> Result<(), AdminError> {
        now(self.apply_admin(kind, remote_deletion, new_namespace))
    }
    pub fn view_now(&mut self) -> Result<RankView, EngineError> {
        now(self.view())
    }
    pub fn close_now(self) -> Option<CloseReport> {
        now(self.close())
    }
    pub fn health(&self) -> Option<HealthState> {
        self.executor.as_ref().map(|e| e.health())
    }
    /// The forward backend's end-of-sequence tokens (a model directory's; none for the
    /// synthetic model).
    pub fn eos_tokens(&self) -> Vec<u32> {
        self.device.backend.eos_tokens()
    }

    /// One round of a world of one through the loopback ControlPlane: head, agree (with
    /// these frontend messages), run. For tests and tools.
    pub fn step_now(
        &mut self,
        mesh: &mut Loopback,
        frontend: Vec<FrontendMessage>,
    ) -> Result<RoundWork, EngineError> {
        let mut report = self.head_now();
        report.frontend = frontend;
        let agreed = mesh.agree(report)?;
        self.run_round_now(agreed)
    }

    /// Starts the executor and the device engine as actors on the current actix arbiter
    /// (the round loop's thread): the serving form of this engine.
    pub fn into_actors(self) -> ActorRank {
        self.into_actors_with(DEFAULT_FENCE_DEADLINE)
    }

    /// `into_actors` with the deadline a device fence gets before the round fails.
    pub fn into_actors_with(self, fence_deadline: Duration) -> ActorRank {
        use actix::Actor;
        let rank = self.rank;
        self.map_ports(
            |e| L3ExecutorActor::new(e).start(),
            |d| DeviceActorPort {
                addr: DeviceCopyEngine::from_core(d.core, d.backend).start(),
                rank,
                fence_deadline,
            },
        )
    }
}

/// The scheduler's view of an agreed round: its inputs, the admin commands to queue (in
/// arrival order) and whether the leader's Shutdown rides it.
fn agreed_inputs(agreed: AgreedRound) -> (AgreedInputs, Vec<AdminCommand>, bool) {
    let mut inputs = AgreedInputs {
        tick_us: agreed.tick_us,
        pressure: agreed.pressure,
        completions: agreed.completions,
        ..AgreedInputs::default()
    };
    let mut admin = vec![];
    let mut shutdown = false;
    for m in agreed.frontend {
        match m {
            FrontendMessage::NewRequest {
                id,
                prompt,
                max_tokens,
                sampling,
            } => inputs.new_requests.push(NewRequest {
                id,
                prompt,
                max_tokens,
                sampling,
            }),
            FrontendMessage::Cancel { id } => inputs.cancellations.push(id),
            FrontendMessage::Admin(a) => admin.push(a),
            FrontendMessage::Shutdown => shutdown = true,
        }
    }
    let mut by_req: BTreeMap<RequestId, Vec<RankDigest>> = BTreeMap::new();
    for d in agreed.digests {
        by_req.entry(d.request).or_default().push(d.digest);
        if let Some(lp) = d.logprobs {
            // One rank's report suffices (every rank drew the same token from the same
            // logits; the digests check the token).
            if inputs.logprobs.last().map(|(id, _)| *id) != Some(d.request) {
                inputs.logprobs.push((d.request, lp));
            }
        }
    }
    inputs.digests = by_req.into_iter().collect();
    (inputs, admin, shutdown)
}

/// Agreement of a world of one without a mesh, for tests that hand a round its new
/// requests and cancellations directly: the report (with these frontend messages) agreed
/// by the loopback ControlPlane's reduction.
pub fn agree_single(
    mut report: RoundReport,
    new_requests: Vec<(RequestId, Vec<u32>, u32)>,
    cancellations: Vec<RequestId>,
) -> Result<AgreedRound, ControlError> {
    report
        .frontend
        .extend(new_requests.into_iter().map(|(id, prompt, max_tokens)| {
            FrontendMessage::NewRequest {
                id,
                prompt,
                max_tokens,
                sampling: messages::SamplingParams::GREEDY,
            }
        }));
    report.frontend.extend(
        cancellations
            .into_iter()
            .map(|id| FrontendMessage::Cancel { id }),
    );
    Loopback::default().agree(report)
}
