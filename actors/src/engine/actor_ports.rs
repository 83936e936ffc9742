//! The actor adapters of the round's ports, as `engine-host serve` runs them: the L3
//! executor and the DeviceCopyEngine are actix actors on the round loop's arbiter, reached
//! through their mailboxes (one message per step, answered in mailbox order, so submission
//! order is execution order); the ControlPlane is the TCP mesh core. An adapter only moves a
//! step's message; it never decides anything.

use super::ports::{DevicePort, ExecutorPoll, ExecutorPort, ExecutorSnapshot, MeshPort, TracedOp};
use super::EngineError;
use crate::control_plane::plane::ControlPlaneCore;
use crate::device::actor::PoisonSlots;
use crate::device::{
    DeviceCopyBatch, DeviceCopyEngine, DeviceSlot, FenceId, ForwardOutcome, ForwardStep,
    PollFences, RunForward, SubmitDeviceCopies, WaitFence,
};
use crate::l3::actor::{Close, Poll, Snapshot, SubmitTraced};
use crate::l3::{CloseReport, L3ExecutorActor};
use actix::{Addr, MailboxError};
use messages::{AgreedRound, ControlError, RoundReport};

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

impl DevicePort for Addr<DeviceCopyEngine> {
    async fn poison(&mut self, slots: Vec<DeviceSlot>) -> Result<(), EngineError> {
        Ok(self.send(PoisonSlots(slots)).await??)
    }
    async fn copy(&mut self, batch: DeviceCopyBatch) -> Result<FenceId, EngineError> {
        Ok(self.send(SubmitDeviceCopies(batch)).await??)
    }
    async fn forward(&mut self, step: ForwardStep) -> Result<ForwardOutcome, EngineError> {
        Ok(self.send(RunForward(step)).await??)
    }
    async fn wait_fence(&mut self, fence: FenceId) -> Result<(), EngineError> {
        Ok(self.send(WaitFence(fence)).await??)
    }
    async fn poll_fences(&mut self) -> Result<(), EngineError> {
        self.send(PollFences).await??;
        Ok(())
    }
}

impl MeshPort for ControlPlaneCore {
    async fn exchange(&mut self, report: RoundReport) -> Result<AgreedRound, ControlError> {
        self.exchange_round(report).await
    }
}
