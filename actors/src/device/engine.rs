//! DeviceCopyEngineCore: the DeviceCopyEngine's logic without a runtime. It executes the
//! Device subset of plan.cache in order: each batch is validated whole (slots, slot ranges,
//! Host ranges) against the immutable geometry and the address table built in `new`, then
//! enqueued on the backend's one ordered stream, then fenced. `poll_fences` returns
//! completed fences in submission order.
//!
//! It never decides what to copy, never touches a Host range outside a submitted copy, and
//! never reports storage facts. A storage completion (a GET landing in Host memory) never
//! substitutes for an H2D fence: the engine host waits on this engine's fence before the
//! forward reads a device block, and keeps the Host source referenced until then.
//!
//! A backend error while enqueuing (the CUDA stream refused a copy) may leave part of a
//! batch enqueued without a fence: the engine host treats any `DeviceError::Backend` as
//! fatal for the rank (collective error), never as a per-request failure.

use super::geometry::{AddressTable, DeviceGeometry};
use super::memory::{DeviceMemory, HostView, ResolvedCopy};
use super::ops::{CopyDirection, DeviceCopyBatch, DeviceError, DeviceSlot, FenceId};
use std::collections::VecDeque;

pub struct DeviceCopyEngineCore<M: DeviceMemory> {
    memory: M,
    geometry: DeviceGeometry,
    addresses: AddressTable,
    next_fence: u64,
    outstanding: VecDeque<FenceId>,
}

impl<M: DeviceMemory> DeviceCopyEngineCore<M> {
    /// Binds the geometry and the address table of every slot now: no first-use setup
    /// happens on a serving submission.
    pub fn new(memory: M) -> Self {
        let geometry = memory.geometry();
        let addresses = AddressTable::build(geometry, |s| memory.slot_address(s));
        Self {
            memory,
            geometry,
            addresses,
            next_fence: 1,
            outstanding: VecDeque::new(),
        }
    }

    pub fn geometry(&self) -> DeviceGeometry {
        self.geometry
    }

    /// Binds the forward backend's digest unit (see `DeviceMemory::set_digest_unit`).
    pub fn set_digest_unit(&mut self, unit: usize) {
        self.memory.set_digest_unit(unit);
    }

    pub fn backend(&self) -> &'static str {
        self.memory.backend()
    }

    pub fn memory(&self) -> &M {
        &self.memory
    }

    pub fn memory_mut(&mut self) -> &mut M {
        &mut self.memory
    }

    /// Fences submitted and not yet reported complete.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    fn slot_address(
        &self,
        index: usize,
        slot: DeviceSlot,
        offset: u64,
        len: u64,
    ) -> Result<u64, DeviceError> {
        let base = self
            .addresses
            .get(slot.0)
            .ok_or(DeviceError::SlotOutOfRange {
                index,
                slot: slot.0,
                slots: self.geometry.slots,
            })?;
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.geometry.slot_bytes)
        {
            return Err(DeviceError::SlotRangeOutOfBounds {
                index,
                offset,
                len,
                slot_bytes: self.geometry.slot_bytes,
            });
        }
        Ok(base + offset)
    }

    /// Validates and resolves a whole batch (the per-operation block table); nothing is
    /// enqueued if any copy is invalid.
    pub fn resolve(&self, batch: &DeviceCopyBatch) -> Result<Vec<ResolvedCopy>, DeviceError> {
        let host = self.memory.host();
        batch
            .copies
            .iter()
            .enumerate()
            .map(|(index, c)| {
                if c.host.len == 0 {
                    return Err(DeviceError::EmptyCopy { index });
                }
                host.check(c.host)
                    .map_err(|_| DeviceError::HostRangeOutOfBounds {
                        index,
                        offset: c.host.offset,
                        len: c.host.len,
                        size: host.len(),
                    })?;
                let device_addr = self.slot_address(index, c.slot, c.slot_offset, c.host.len)?;
                if crate::host::poison::enabled() && c.direction == CopyDirection::H2D {
                    // SAFETY: the range was bounds-checked just above, and the H2D ticket
                    // holds a reference on its Host block until the copy's fence, so no
                    // writer touches these bytes while they are read here.
                    if let Ok(src) = unsafe { host.range(c.host) } {
                        crate::host::poison::check("an H2D restore", c.host.offset, src).map_err(
                            |e| DeviceError::PoisonRead {
                                index,
                                reason: e.to_string(),
                            },
                        )?;
                    }
                }
                Ok(ResolvedCopy {
                    direction: c.direction,
                    device_addr,
                    host_offset: c.host.offset,
                    len: c.host.len,
                })
            })
            .collect()
    }

    /// Submits a batch in order after all earlier batches; returns its fence.
    pub fn submit(&mut self, batch: &DeviceCopyBatch) -> Result<FenceId, DeviceError> {
        let resolved = self.resolve(batch)?;
        self.memory.enqueue(&resolved)?;
        let fence = FenceId(self.next_fence);
        self.memory.record_fence(fence)?;
        self.next_fence += 1;
        self.outstanding.push_back(fence);
        Ok(fence)
    }

    /// Fences completed since the last poll, in submission order. Never blocks.
    pub fn poll_fences(&mut self) -> Result<Vec<FenceId>, DeviceError> {
        let done = self.memory.completed()?;
        for f in &done {
            if self.outstanding.front() != Some(f) {
                return Err(DeviceError::Backend {
                    backend: self.memory.backend(),
                    message: format!("fence {} completed out of order", f.0),
                });
            }
            self.outstanding.pop_front();
        }
        Ok(done)
    }

    /// Whether `fence` (and so every fence before it) completed, polling the backend once.
    /// Never blocks.
    pub fn fence_done(&mut self, fence: FenceId) -> Result<bool, DeviceError> {
        self.poll_fences()?;
        Ok(self.outstanding.front().is_none_or(|f| *f > fence))
    }

    /// Waits until `fence` (and every fence before it) completed, polling the backend.
    /// Used for the round's D2H copies, whose completion publishes Host L2 (the synchronous
    /// form; `engine-host serve` polls `fence_done` through the actor with a deadline).
    pub fn wait_fence(&mut self, fence: FenceId) -> Result<(), DeviceError> {
        while !self.fence_done(fence)? {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Whether a slot exists.
    pub fn check_slot(&self, slot: DeviceSlot) -> Result<(), DeviceError> {
        self.slot_address(0, slot, 0, 0).map(|_| ())
    }

    /// The device address of `len` bytes of a slot (bounds-checked), for the forward.
    pub(super) fn slot_range(&self, slot: DeviceSlot, len: u64) -> Result<u64, DeviceError> {
        self.slot_address(0, slot, 0, len)
    }

    /// The backend's host-addressable arena after all submitted work (see
    /// `DeviceMemory::host_view`).
    pub(super) fn host_view(&mut self) -> Result<Option<HostView<'_>>, DeviceError> {
        self.memory.host_view()
    }

    /// Reads `len` bytes of a slot from `offset`, after all submitted work.
    pub fn read_slot(
        &mut self,
        slot: DeviceSlot,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, DeviceError> {
        let addr = self.slot_address(0, slot, offset, len)?;
        let mut out = vec![0u8; len as usize];
        self.memory.read(addr, &mut out)?;
        Ok(out)
    }

    /// Debug builds: fills freed slots with the poison pattern (the plan's `poison` list,
    /// applied before the round's device work), after all submitted work.
    pub fn poison_slots(&mut self, slots: &[DeviceSlot]) -> Result<(), DeviceError> {
        if !crate::host::poison::enabled() || slots.is_empty() {
            return Ok(());
        }
        let mut block = vec![0u8; self.geometry().slot_bytes as usize];
        crate::host::poison::fill(&mut block);
        for s in slots {
            self.write_slot(*s, 0, &block)?;
        }
        Ok(())
    }

    /// Debug builds: a slot the forward reads as context must not be a poisoned (freed,
    /// never rewritten) block; its first page is checked.
    pub(super) fn check_context(&mut self, slot: DeviceSlot) -> Result<(), DeviceError> {
        if !crate::host::poison::enabled() {
            return Ok(());
        }
        let len = self.geometry().slot_bytes.min(4096);
        let bytes = self.read_slot(slot, 0, len)?;
        if crate::host::poison::is_poison(&bytes) {
            return Err(DeviceError::PoisonRead {
                index: slot.0 as usize,
                reason: format!(
                    "poisoned-memory checker: a forward read device slot {} as context, but it is a freed block",
                    slot.0
                ),
            });
        }
        Ok(())
    }

    /// Whole-slot copies on the Device (copy-on-write of partial history blocks), after
    /// all submitted work, in order; every slot is validated first.
    pub fn copy_slots(&mut self, copies: &[super::forward::SlotCopy]) -> Result<(), DeviceError> {
        for c in copies {
            self.check_slot(c.from)?;
            self.check_slot(c.to)?;
            if c.from == c.to {
                return Err(DeviceError::Forward(format!(
                    "copy-on-write of device slot {} onto itself",
                    c.from.0
                )));
            }
        }
        let len = self.geometry().slot_bytes;
        for c in copies {
            let from = self.slot_range(c.from, len)? as usize;
            let to = self.slot_range(c.to, len)? as usize;
            match self.host_view()? {
                Some(view) => {
                    view.arena.copy_within(from..from + len as usize, to);
                    view.units.copy_record(from, to);
                }
                None => {
                    let bytes = self.read_slot(c.from, 0, len)?;
                    self.write_slot(c.to, 0, &bytes)?;
                }
            }
        }
        Ok(())
    }

    /// Writes bytes into a slot from `offset`, after all submitted work.
    pub fn write_slot(
        &mut self,
        slot: DeviceSlot,
        offset: u64,
        data: &[u8],
    ) -> Result<(), DeviceError> {
        let addr = self.slot_address(0, slot, offset, data.len() as u64)?;
        self.memory.write(addr, data)
    }
}
