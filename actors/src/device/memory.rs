//! `DeviceMemory`: what a device backend provides to the DeviceCopyEngine. A backend owns
//! its device arena, one ordered stream of copies, and fences; it receives only copies the
//! engine already resolved and bounds-checked. It never decides what to copy.

use super::geometry::DeviceGeometry;
use super::ops::{CopyDirection, DeviceError, FenceId};
use super::unit_hashes::UnitHashes;
use crate::host::HostCacheStorage;
use std::sync::Arc;

/// A copy resolved through the address table: a device address and a Host offset, both
/// already checked against the arena and the Host allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedCopy {
    pub direction: CopyDirection,
    pub device_addr: u64,
    pub host_offset: u64,
    pub len: u64,
}

/// A host-addressable device arena and its unit-hash records: whoever writes `arena`
/// through this view records or invalidates the slots it wrote in `units` first.
pub struct HostView<'a> {
    pub arena: &'a mut [u8],
    pub units: &'a mut UnitHashes,
}

pub trait DeviceMemory: Send {
    fn backend(&self) -> &'static str;
    fn geometry(&self) -> DeviceGeometry;
    /// Device address of a slot's first byte (used once, to build the address table).
    fn slot_address(&self, slot: u32) -> u64;
    /// The Host allocation this backend is bound to (and, for CUDA, registered).
    fn host(&self) -> &Arc<HostCacheStorage>;
    /// Enqueues copies on the ordered stream, after all earlier work.
    fn enqueue(&mut self, copies: &[ResolvedCopy]) -> Result<(), DeviceError>;
    /// Records a fence after all work enqueued so far.
    fn record_fence(&mut self, fence: FenceId) -> Result<(), DeviceError>;
    /// Fences completed since the last call, in recording order. Never blocks.
    fn completed(&mut self) -> Result<Vec<FenceId>, DeviceError>;
    /// Reads device bytes after all enqueued work (stream-ordered; waits for it).
    fn read(&mut self, device_addr: u64, out: &mut [u8]) -> Result<(), DeviceError>;
    /// Writes device bytes after all enqueued work (stream-ordered; waits for it).
    fn write(&mut self, device_addr: u64, data: &[u8]) -> Result<(), DeviceError>;
    /// The whole device arena as host-addressable bytes, after all enqueued work, where
    /// the backend has such an arena (the emulated device: the forward then reads and
    /// writes KV in place, as attention does on a GPU); None where it has not (CUDA goes
    /// through `read` and `write`).
    fn host_view(&mut self) -> Result<Option<HostView<'_>>, DeviceError> {
        Ok(None)
    }
    /// The forward backend's digest unit (`SyntheticModel::digest_unit`; 0: none), for a
    /// backend that records unit hashes as bytes land (the emulated device).
    fn set_digest_unit(&mut self, _unit: usize) {}
}

impl DeviceMemory for Box<dyn DeviceMemory> {
    fn backend(&self) -> &'static str {
        (**self).backend()
    }
    fn geometry(&self) -> DeviceGeometry {
        (**self).geometry()
    }
    fn slot_address(&self, slot: u32) -> u64 {
        (**self).slot_address(slot)
    }
    fn host(&self) -> &Arc<HostCacheStorage> {
        (**self).host()
    }
    fn enqueue(&mut self, copies: &[ResolvedCopy]) -> Result<(), DeviceError> {
        (**self).enqueue(copies)
    }
    fn record_fence(&mut self, fence: FenceId) -> Result<(), DeviceError> {
        (**self).record_fence(fence)
    }
    fn completed(&mut self) -> Result<Vec<FenceId>, DeviceError> {
        (**self).completed()
    }
    fn read(&mut self, device_addr: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        (**self).read(device_addr, out)
    }
    fn write(&mut self, device_addr: u64, data: &[u8]) -> Result<(), DeviceError> {
        (**self).write(device_addr, data)
    }
    fn host_view(&mut self) -> Result<Option<HostView<'_>>, DeviceError> {
        (**self).host_view()
    }
    fn set_digest_unit(&mut self, unit: usize) {
        (**self).set_digest_unit(unit)
    }
}
