//! The actor adapters of the round's ports, as `engine-host serve` runs them: the L3
//! executor and the DeviceCopyEngine are actix actors on the round loop's arbiter, reached
//! through their mailboxes (one message per step, answered in mailbox order, so submission
//! order is execution order); the ControlPlane is the TCP mesh core. An adapter only moves a
//! step's message; it never decides anything.

use super::ports::{DevicePort, ExecutorPoll, ExecutorPort, ExecutorSnapshot, MeshPort, TracedOp};
use super::EngineError;
use crate::control_plane::plane::ControlPlaneCore;
use crate::device::actor::{FenceDone, PoisonSlots};
use crate::device::{
    DecodeStep, DeviceCopyBatch, DeviceCopyEngine, DeviceSlot, FenceId, ForwardOutcome,
    ForwardStep, PollFences, ReleaseSteps, RunDecode, RunForward, SubmitDeviceCopies,
};
use crate::l3::actor::{Close, Poll, Snapshot, SubmitTraced};
use crate::l3::{CloseReport, L3ExecutorActor};
use actix::{Addr, MailboxError};
use messages::{AgreedRound, ControlError, RequestId, RoundReport};
use std::time::{Duration, Instant};

impl From<MailboxError> for EngineError {
    fn from(e: MailboxError) -> Self {
        EngineError::Mailbox(e)
    }
}

impl ExecutorPort for Addr<L3ExecutorActor> {
    async fn submit(&mut self, ops: Vec<TracedOp>) -> Result<(), EngineError> {
        if !ops.is_empty() {
            self.send(SubmitTraced(ops)).await?;
        }
        Ok(())
    }
    async fn poll(&mut self) -> Result<ExecutorPoll, EngineError> {
        Ok(self.send(Poll).await?)
    }
    async fn snapshot(&mut self) -> Result<ExecutorSnapshot, EngineError> {
        Ok(self.send(Snapshot).await?)
    }
    async fn close(self) -> Option<CloseReport> {
        self.send(Close).await.ok().flatten()
    }
}

/// The DeviceCopyEngine actor as the round's device port. A fence wait never blocks the
/// round thread: it asks the actor whether the fence completed (a non-blocking poll),
/// yielding between asks for the first millisecond and sleeping a millisecond after, and
/// fails the round — naming the rank — once `fence_deadline` passed.
pub struct DeviceActorPort {
    pub addr: Addr<DeviceCopyEngine>,
    pub rank: u32,
    pub fence_deadline: Duration,
}

/// How long a fence wait only yields before it sleeps between polls.
const FENCE_SPIN: Duration = Duration::from_millis(1);

impl DevicePort for DeviceActorPort {
    async fn poison(&mut self, slots: Vec<DeviceSlot>) -> Result<(), EngineError> {
        Ok(self.addr.send(PoisonSlots(slots)).await??)
    }
    async fn copy(&mut self, batch: DeviceCopyBatch) -> Result<FenceId, EngineError> {
        Ok(self.addr.send(SubmitDeviceCopies(batch)).await??)
    }
    async fn forward(
        &mut self,
        id: RequestId,
        step: ForwardStep,
    ) -> Result<ForwardOutcome, EngineError> {
        Ok(self.addr.send(RunForward(id, step)).await??)
    }
    async fn decode(
        &mut self,
        id: RequestId,
        step: DecodeStep,
    ) -> Result<ForwardOutcome, EngineError> {
        Ok(self.addr.send(RunDecode(id, step)).await??)
    }
    async fn release(&mut self, ids: Vec<RequestId>) -> Result<(), EngineError> {
        Ok(self.addr.send(ReleaseSteps(ids)).await?)
    }
    async fn wait_fence(&mut self, fence: FenceId) -> Result<(), EngineError> {
        let start = Instant::now();
        loop {
            if self.addr.send(FenceDone(fence)).await?? {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= self.fence_deadline {
                return Err(EngineError::FenceTimeout {
                    rank: self.rank,
                    fence: fence.0,
                    deadline_ms: self.fence_deadline.as_millis() as u64,
                });
            }
            if waited < FENCE_SPIN {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
    async fn poll_fences(&mut self) -> Result<(), EngineError> {
        self.addr.send(PollFences).await??;
        Ok(())
    }
}

impl MeshPort for ControlPlaneCore {
    async fn exchange(&mut self, report: RoundReport) -> Result<AgreedRound, ControlError> {
        self.exchange_round(report).await
    }
}
