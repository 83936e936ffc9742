//! The Device subset of plan.cache as the DeviceCopyEngine receives it: ordered D2H/H2D
//! copies between device block slots and ranges of the shared Host allocation, grouped in
//! batches (the per-operation block table) that each complete with one fence. Plain data;
//! no memory is touched here.

use crate::model::ModelError;
use messages::HostRange;

/// Completion fence of one submitted batch. Fences increase by one per batch, from 1, and
/// complete in submission order.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct FenceId(pub u64);

/// A device block slot: a fixed-size region of device memory holding one block.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct DeviceSlot(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum CopyDirection {
    /// Device block -> Host range (backup source, L2 publication).
    D2H,
    /// Host range -> device block (admission of a Host hit).
    H2D,
}

/// One copy: `host.len` bytes between `slot` at `slot_offset` and the Host range `host`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct DeviceCopy {
    pub direction: CopyDirection,
    pub slot: DeviceSlot,
    pub slot_offset: u64,
    pub host: HostRange,
}

impl DeviceCopy {
    pub fn d2h(slot: DeviceSlot, slot_offset: u64, host: HostRange) -> Self {
        Self {
            direction: CopyDirection::D2H,
            slot,
            slot_offset,
            host,
        }
    }

    pub fn h2d(host: HostRange, slot: DeviceSlot, slot_offset: u64) -> Self {
        Self {
            direction: CopyDirection::H2D,
            slot,
            slot_offset,
            host,
        }
    }
}

/// A batch of copies executed in order, completing with one fence.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceCopyBatch {
    pub copies: Vec<DeviceCopy>,
}

impl DeviceCopyBatch {
    pub fn new(copies: Vec<DeviceCopy>) -> Self {
        Self { copies }
    }
}

/// Why the engine refused or failed work. Validation errors reject a whole batch before any
/// of it is enqueued.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("invalid device geometry: {0}")]
    Geometry(String),
    #[error("copy {index}: slot {slot} is outside the {slots} device slots")]
    SlotOutOfRange { index: usize, slot: u32, slots: u32 },
    #[error("copy {index}: bytes {offset}+{len} exceed the {slot_bytes}-byte slot")]
    SlotRangeOutOfBounds {
        index: usize,
        offset: u64,
        len: u64,
        slot_bytes: u64,
    },
    #[error("copy {index}: zero-length copy")]
    EmptyCopy { index: usize },
    /// Debug builds: an H2D copy's Host source is a freed (poisoned) block.
    #[error("copy {index}: {reason}")]
    PoisonRead { index: usize, reason: String },
    #[error("copy {index}: host range {offset}+{len} is outside the {size}-byte allocation")]
    HostRangeOutOfBounds {
        index: usize,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("forward: {0}")]
    Forward(String),
    #[error("model: {0}")]
    Model(#[from] ModelError),
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    #[error("device backend {backend}: {message}")]
    Backend {
        backend: &'static str,
        message: String,
    },
}
