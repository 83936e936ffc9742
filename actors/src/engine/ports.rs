//! The round's ports: what the round owner (`engine::round`) needs from the L3 executor, the
//! DeviceCopyEngine and the ControlPlane, each a small trait. `engine::sync_ports` plugs in
//! the cores directly (tests, benchmarks, tools); `engine::actor_ports` plugs in the actors'
//! mailboxes (`engine-host serve`). A port carries work and results only: it never decides
//! anything the round decides, and it never reorders what it is handed.

use super::EngineError;
use crate::device::{
    DecodeStep, DeviceCopyBatch, DeviceSlot, FenceId, ForwardOutcome, ForwardStep,
};
use crate::l3::CloseReport;
pub use crate::l3::ExecutorSnapshot;
use messages::{AgreedRound, ControlError, PressureSnapshot, RequestId, RoundReport};
use messages::{StorageDone, StorageOp};
use std::future::Future;

/// A storage operation with its span (when traced): the executor's `l3_op` span is the
/// span's child.
pub type TracedOp = (StorageOp, Option<tracing::Span>);

/// What one executor poll returns: new completion records and the pressure snapshot.
pub type ExecutorPoll = (Vec<StorageDone>, PressureSnapshot);

/// The L3 executor as the round sees it: submit in plan order, poll at the head.
pub trait ExecutorPort {
    /// Submits operations in the given order (rejections surface as completions).
    fn submit(&mut self, ops: Vec<TracedOp>) -> impl Future<Output = Result<(), EngineError>>;
    /// New completion records and the pressure snapshot (the head feedback point).
    fn poll(&mut self) -> impl Future<Output = Result<ExecutorPoll, EngineError>>;
    /// Counters and health, for the exporter and the health document.
    fn snapshot(&mut self) -> impl Future<Output = Result<ExecutorSnapshot, EngineError>>;
    /// Closes the executor (None when it was already closed or cannot answer).
    fn close(self) -> impl Future<Output = Option<CloseReport>>
    where
        Self: Sized;
}

/// The DeviceCopyEngine as the round sees it: ordered copies with fences, and the forward.
pub trait DevicePort {
    /// Debug builds: fills freed Device slots with the poison pattern.
    fn poison(&mut self, slots: Vec<DeviceSlot>) -> impl Future<Output = Result<(), EngineError>>;
    /// Submits one copy batch; answers its fence.
    fn copy(
        &mut self,
        batch: DeviceCopyBatch,
    ) -> impl Future<Output = Result<FenceId, EngineError>>;
    /// Runs one request's prefill step (ordered after the copies submitted before it).
    fn forward(
        &mut self,
        id: RequestId,
        step: ForwardStep,
    ) -> impl Future<Output = Result<ForwardOutcome, EngineError>>;
    /// Runs one request's decode step (a backend that draws tokens on the device).
    fn decode(
        &mut self,
        id: RequestId,
        step: DecodeStep,
    ) -> impl Future<Output = Result<ForwardOutcome, EngineError>>;
    /// Ends the device-side decode state of finished or aborted requests.
    fn release(&mut self, ids: Vec<RequestId>) -> impl Future<Output = Result<(), EngineError>>;
    /// Waits for a fence (the round's D2H copies, before Host L2 publishes).
    fn wait_fence(&mut self, fence: FenceId) -> impl Future<Output = Result<(), EngineError>>;
    /// Retires completed fences (a round without D2H).
    fn poll_fences(&mut self) -> impl Future<Output = Result<(), EngineError>>;
}

/// The ControlPlane as the round sees it: exchange this rank's report, get the agreed round.
pub trait MeshPort {
    fn exchange(
        &mut self,
        report: RoundReport,
    ) -> impl Future<Output = Result<AgreedRound, ControlError>>;
}
