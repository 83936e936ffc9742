//! The forward backend a DeviceCopyEngine runs over its Device blocks: the synthetic model
//! (its digest of every context byte; the scheduler draws its tokens) or, where a model
//! directory is served, the transformer (real attention over the restored blocks; it draws
//! each token on the device and keeps each running request's decode KV).
//!
//! It owns the backend's per-request device state (the transformer's decode KV) and nothing
//! else: block tables, slots and copies stay the engine core's, and it never decides which
//! request runs.

use super::engine::DeviceCopyEngineCore;
use super::forward::{DecodeStep, ForwardOutcome, ForwardStep};
use super::memory::DeviceMemory;
use super::ops::DeviceError;
use super::transformer::TransformerBackend;
use crate::model::SyntheticModel;
use messages::RequestId;
use std::sync::Arc;

/// What runs a step's forward.
pub enum ForwardBackend {
    Synthetic(Arc<SyntheticModel>),
    Transformer(Box<TransformerBackend>),
}

impl std::fmt::Debug for ForwardBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForwardBackend::Synthetic(m) => write!(f, "Synthetic({})", m.profile().name),
            ForwardBackend::Transformer(t) => write!(f, "Transformer({})", t.model().identity()),
        }
    }
}

impl From<Arc<SyntheticModel>> for ForwardBackend {
    fn from(m: Arc<SyntheticModel>) -> Self {
        ForwardBackend::Synthetic(m)
    }
}

impl ForwardBackend {
    /// Whether this backend draws tokens on the device (the scheduler then plans a decode
    /// step per token instead of drawing it).
    pub fn draws_on_device(&self) -> bool {
        match self {
            ForwardBackend::Synthetic(_) => false,
            ForwardBackend::Transformer(_) => true,
        }
    }

    /// The unit the device records hashes of restored and produced bytes at, for this
    /// backend's forward: the synthetic model's digest unit; none for the transformer,
    /// which reads the bytes themselves.
    pub fn digest_unit(&self) -> usize {
        match self {
            ForwardBackend::Synthetic(m) => m.digest_unit(),
            ForwardBackend::Transformer(_) => 0,
        }
    }

    /// The model's end-of-sequence tokens (none for the synthetic model).
    pub fn eos_tokens(&self) -> Vec<u32> {
        match self {
            ForwardBackend::Synthetic(_) => vec![],
            ForwardBackend::Transformer(t) => t.model().generation().eos_token_ids.clone(),
        }
    }

    /// A prefill step of request `id` over the core's blocks.
    pub fn forward<M: DeviceMemory>(
        &mut self,
        core: &mut DeviceCopyEngineCore<M>,
        id: RequestId,
        step: &ForwardStep,
    ) -> Result<ForwardOutcome, DeviceError> {
        core.copy_slots(&step.copy_on_write)?;
        match self {
            ForwardBackend::Synthetic(m) => core.forward(m, step),
            ForwardBackend::Transformer(t) => t.forward(core, id, step),
        }
    }

    /// One decode step of request `id`.
    pub fn decode(
        &mut self,
        id: RequestId,
        step: &DecodeStep,
    ) -> Result<ForwardOutcome, DeviceError> {
        match self {
            ForwardBackend::Transformer(t) => t.decode(id, step),
            ForwardBackend::Synthetic(_) => Err(DeviceError::Forward(format!(
                "request {id:?}: the synthetic model draws tokens in the scheduler; it has \
                 no device decode step"
            ))),
        }
    }

    /// The device-side state of these requests ends (finished or aborted); unknown IDs are
    /// ignored.
    pub fn release(&mut self, ids: &[RequestId]) {
        match self {
            ForwardBackend::Synthetic(_) => {}
            ForwardBackend::Transformer(t) => t.release(ids),
        }
    }
}
