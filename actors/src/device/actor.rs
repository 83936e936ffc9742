//! The DeviceCopyEngine actor: a thin actix shell around `DeviceCopyEngineCore` over any
//! backend. It handles copy batches, fence polls and forward steps, one at a time in
//! mailbox order, so submission order is execution order. No message blocks on a fence (a
//! wait is the caller's repeated `FenceDone`). It holds no other actor's type.

use super::backend::ForwardBackend;
use super::engine::DeviceCopyEngineCore;
use super::forward::{DecodeStep, ForwardOutcome, ForwardStep};
use super::memory::DeviceMemory;
use super::ops::{DeviceCopyBatch, DeviceError, FenceId};
use actix::prelude::*;
use messages::RequestId;

pub struct DeviceCopyEngine {
    core: DeviceCopyEngineCore<Box<dyn DeviceMemory>>,
    backend: ForwardBackend,
}

impl DeviceCopyEngine {
    pub fn new(memory: Box<dyn DeviceMemory>, backend: impl Into<ForwardBackend>) -> Self {
        Self::from_core(DeviceCopyEngineCore::new(memory), backend)
    }
    /// An actor around an engine core the startup factory already built.
    pub fn from_core(
        mut core: DeviceCopyEngineCore<Box<dyn DeviceMemory>>,
        backend: impl Into<ForwardBackend>,
    ) -> Self {
        let backend = backend.into();
        core.set_digest_unit(backend.digest_unit());
        Self { core, backend }
    }
}

impl Actor for DeviceCopyEngine {
    type Context = Context<Self>;
}

/// Submit one batch of the plan's Device subset; answers its fence.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<FenceId, DeviceError>")]
pub struct SubmitDeviceCopies(pub DeviceCopyBatch);

/// Poll completed fences (in order).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Result<Vec<FenceId>, DeviceError>")]
pub struct PollFences;

/// Whether a fence completed (polls the backend once; never blocks the actor).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Result<bool, DeviceError>")]
pub struct FenceDone(pub FenceId);

impl Handler<FenceDone> for DeviceCopyEngine {
    type Result = Result<bool, DeviceError>;
    fn handle(&mut self, msg: FenceDone, _: &mut Self::Context) -> Self::Result {
        self.core.fence_done(msg.0)
    }
}

/// Debug builds: poison freed slots before the round's device work (`Plan::poison`).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), DeviceError>")]
pub struct PoisonSlots(pub Vec<super::ops::DeviceSlot>);

impl Handler<PoisonSlots> for DeviceCopyEngine {
    type Result = Result<(), DeviceError>;
    fn handle(&mut self, msg: PoisonSlots, _: &mut Self::Context) -> Self::Result {
        self.core.poison_slots(&msg.0)
    }
}

/// Run a request's prefill step over device blocks.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<ForwardOutcome, DeviceError>")]
pub struct RunForward(pub RequestId, pub ForwardStep);

/// Run a request's decode step (a backend that draws on the device).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<ForwardOutcome, DeviceError>")]
pub struct RunDecode(pub RequestId, pub DecodeStep);

/// The device-side decode state of these requests ends.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct ReleaseSteps(pub Vec<RequestId>);

impl Handler<SubmitDeviceCopies> for DeviceCopyEngine {
    type Result = Result<FenceId, DeviceError>;
    fn handle(&mut self, msg: SubmitDeviceCopies, _: &mut Self::Context) -> Self::Result {
        self.core.submit(&msg.0)
    }
}

impl Handler<PollFences> for DeviceCopyEngine {
    type Result = Result<Vec<FenceId>, DeviceError>;
    fn handle(&mut self, _: PollFences, _: &mut Self::Context) -> Self::Result {
        self.core.poll_fences()
    }
}

impl Handler<RunForward> for DeviceCopyEngine {
    type Result = Result<ForwardOutcome, DeviceError>;
    fn handle(&mut self, msg: RunForward, _: &mut Self::Context) -> Self::Result {
        self.backend.forward(&mut self.core, msg.0, &msg.1)
    }
}

impl Handler<RunDecode> for DeviceCopyEngine {
    type Result = Result<ForwardOutcome, DeviceError>;
    fn handle(&mut self, msg: RunDecode, _: &mut Self::Context) -> Self::Result {
        self.backend.decode(msg.0, &msg.1)
    }
}

impl Handler<ReleaseSteps> for DeviceCopyEngine {
    type Result = ();
    fn handle(&mut self, msg: ReleaseSteps, _: &mut Self::Context) {
        self.backend.release(&msg.0)
    }
}
