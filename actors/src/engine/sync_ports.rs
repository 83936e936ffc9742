//! The synchronous adapters of the round's ports: the L3 executor core, the DeviceCopyEngine
//! core with the model, and a loopback ControlPlane for a world of one. Every future they
//! return is ready when first polled, so `now` drives a round without a runtime (tests,
//! benchmarks, tools). They hold no state of the round.

use super::ports::{DevicePort, ExecutorPoll, ExecutorPort, ExecutorSnapshot, MeshPort, TracedOp};
use super::EngineError;
use crate::control_plane::agreement::{seal_gathered, Agreement};
use crate::device::{
    DecodeStep, DeviceCopyBatch, DeviceCopyEngineCore, DeviceMemory, DeviceSlot, FenceId,
    ForwardBackend, ForwardOutcome, ForwardStep,
};
use crate::l3::{CloseReport, L3Executor};
use messages::{AgreedRound, ControlError, RequestId, RoundReport};
use std::future::Future;

/// Drives a future of a synchronous adapter to its end on this thread.
pub fn now<F: Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

impl ExecutorPort for L3Executor {
    async fn submit(&mut self, ops: Vec<TracedOp>) -> Result<(), EngineError> {
        for (op, span) in ops {
            let _entered = span.as_ref().map(|s| s.enter());
            let _ = L3Executor::submit(self, op);
        }
        Ok(())
    }
    async fn poll(&mut self) -> Result<ExecutorPoll, EngineError> {
        Ok(L3Executor::poll(self))
    }
    async fn snapshot(&mut self) -> Result<ExecutorSnapshot, EngineError> {
        Ok(ExecutorSnapshot {
            stats: Some(self.stats()),
            health: self.health(),
        })
    }
    async fn close(self) -> Option<CloseReport> {
        Some(L3Executor::close(self))
    }
}

/// The DeviceCopyEngine core and the backend its forwards run.
pub struct SyncDevice {
    pub core: DeviceCopyEngineCore<Box<dyn DeviceMemory>>,
    pub backend: ForwardBackend,
}

impl DevicePort for SyncDevice {
    async fn poison(&mut self, slots: Vec<DeviceSlot>) -> Result<(), EngineError> {
        Ok(self.core.poison_slots(&slots)?)
    }
    async fn copy(&mut self, batch: DeviceCopyBatch) -> Result<FenceId, EngineError> {
        Ok(self.core.submit(&batch)?)
    }
    async fn forward(
        &mut self,
        id: RequestId,
        step: ForwardStep,
    ) -> Result<ForwardOutcome, EngineError> {
        Ok(self.backend.forward(&mut self.core, id, &step)?)
    }
    async fn decode(
        &mut self,
        id: RequestId,
        step: DecodeStep,
    ) -> Result<ForwardOutcome, EngineError> {
        Ok(self.backend.decode(id, &step)?)
    }
    async fn release(&mut self, ids: Vec<RequestId>) -> Result<(), EngineError> {
        self.backend.release(&ids);
        Ok(())
    }
    async fn wait_fence(&mut self, fence: FenceId) -> Result<(), EngineError> {
        Ok(self.core.wait_fence(fence)?)
    }
    async fn poll_fences(&mut self) -> Result<(), EngineError> {
        self.core.poll_fences()?;
        Ok(())
    }
}

/// The ControlPlane of a world of one without a mesh: the rank's sealed report is agreed by
/// the same reduction the mesh runs. `engine-host serve` always agrees through the
/// ControlPlane (a world of one included); this is for tests, benchmarks and tools.
#[derive(Debug)]
pub struct Loopback {
    agreement: Agreement,
}

impl Default for Loopback {
    fn default() -> Self {
        Self {
            agreement: Agreement::new(1),
        }
    }
}

impl Loopback {
    /// Agrees one round now (the adapter's future is always ready).
    pub fn agree(&mut self, report: RoundReport) -> Result<AgreedRound, ControlError> {
        self.agreement.agree_gathered(vec![seal_gathered(report)])
    }
}

impl MeshPort for Loopback {
    async fn exchange(&mut self, report: RoundReport) -> Result<AgreedRound, ControlError> {
        self.agree(report)
    }
}
