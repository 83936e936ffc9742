//! The DeviceCopyEngine (seed 000: DeviceHandle / HostCacheExecutor): ordered D2H/H2D
//! copies between device block slots and the shared Host allocation, with completion
//! fences, and the forward step over device blocks.
//!
//! It owns the device arena, its immutable transfer geometry and address table (bound at
//! construction), the ordered stream and the fences. It never decides what to copy (the
//! scheduler's plan does), never calls the store or the scheduler, and never treats a
//! storage completion as a substitute for an H2D fence. Memory backends: host-emulated
//! device memory (default, CI) and CUDA through cudarc behind the `cuda` feature. Forward
//! backends (`backend.rs`): the synthetic model (`forward.rs`) and the transformer
//! (`transformer.rs`, a model directory), both over the same block tables.

pub mod actor;
pub mod availability;
pub mod backend;
pub mod bench;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod emulated;
pub mod engine;
pub mod forward;
pub mod geometry;
pub mod memory;
pub mod ops;
pub mod select;
pub mod transformer;
pub mod unit_hashes;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod transfer_tests;

pub use actor::{
    DeviceCopyEngine, FenceDone, PollFences, ReleaseSteps, RunDecode, RunForward,
    SubmitDeviceCopies,
};
pub use availability::{detect_cuda, CudaAvailability};
pub use backend::ForwardBackend;
pub use emulated::EmulatedDeviceMemory;
pub use engine::DeviceCopyEngineCore;
pub use forward::{DecodeStep, ForwardOutcome, ForwardStep, GroupBlockTable, SlotCopy};
pub use geometry::{AddressTable, DeviceGeometry};
pub use memory::{DeviceMemory, HostView, ResolvedCopy};
pub use ops::{CopyDirection, DeviceCopy, DeviceCopyBatch, DeviceError, DeviceSlot, FenceId};
pub use select::{device_memory, DeviceBackendChoice};
