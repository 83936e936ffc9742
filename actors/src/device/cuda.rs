//! CUDA device memory through cudarc (feature `cuda`, dynamic loading of libcuda): one
//! device buffer holding every slot, one stream, one event per fence, and the Host
//! allocation registered as pinned memory (cuMemHostRegister) when the driver allows it.
//! Every driver call that may panic when the library or a symbol is missing runs behind
//! `is_culib_present` and `catch_unwind`; failures become `DeviceError`s. It never
//! decides what to copy.

use super::availability::CudaAvailability;
use super::geometry::DeviceGeometry;
use super::memory::{DeviceMemory, ResolvedCopy};
use super::ops::{CopyDirection, DeviceError, FenceId};
use crate::host::HostCacheStorage;
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
use messages::HostRange;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

fn backend_err(message: impl Into<String>) -> DeviceError {
    DeviceError::Backend {
        backend: "cuda",
        message: message.into(),
    }
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

/// See `availability::detect_cuda`.
pub fn detect() -> CudaAvailability {
    // SAFETY: only tries to dlopen the driver library by its well-known names; no symbol
    // is called. Tested: reports NoDevice on a machine without libcuda.
    if !unsafe { sys::is_culib_present() } {
        return CudaAvailability::NoDevice(
            "libcuda (the CUDA driver library) is not present".into(),
        );
    }
    match catch_unwind(|| -> Result<i32, String> {
        result::init().map_err(|e| format!("cuInit: {e:?}"))?;
        result::device::get_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))
    }) {
        Ok(Ok(n)) if n > 0 => CudaAvailability::Present { devices: n as u32 },
        Ok(Ok(_)) => CudaAvailability::NoDevice("the CUDA driver reports no device".into()),
        Ok(Err(e)) => CudaAvailability::NoDevice(e),
        Err(p) => CudaAvailability::NoDevice(format!("CUDA driver panicked: {}", panic_text(p))),
    }
}

pub struct CudaDeviceMemory {
    host: Arc<HostCacheStorage>,
    geometry: DeviceGeometry,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arena: sys::CUdeviceptr,
    host_registered: bool,
    pending: VecDeque<(FenceId, CudaEvent)>,
}

// SAFETY: the raw device pointer is only used through this struct's methods, which bind the
// context to the calling thread first; the actor owns the struct on one thread at a time.
unsafe impl Send for CudaDeviceMemory {}

impl CudaDeviceMemory {
    /// Allocates the arena on device `ordinal`, zeroes it, and registers the Host
    /// allocation as pinned memory (best effort: an unregistered Host range still copies,
    /// only slower). Errors, never panics, without a driver or device.
    pub fn new(
        host: Arc<HostCacheStorage>,
        geometry: DeviceGeometry,
        ordinal: usize,
    ) -> Result<Self, DeviceError> {
        let total = geometry.total_bytes()?;
        if let CudaAvailability::NoDevice(reason) = detect() {
            return Err(DeviceError::NoDevice(reason));
        }
        let made = catch_unwind(AssertUnwindSafe(|| -> Result<_, DeviceError> {
            let ctx =
                CudaContext::new(ordinal).map_err(|e| backend_err(format!("context: {e:?}")))?;
            let stream = ctx
                .new_stream()
                .map_err(|e| backend_err(format!("stream: {e:?}")))?;
            ctx.bind_to_thread()
                .map_err(|e| backend_err(format!("bind: {e:?}")))?;
            // SAFETY: the context is bound to this thread; the pointer is freed in Drop.
            let arena = unsafe { result::malloc_sync(total) }
                .map_err(|e| backend_err(format!("alloc {total} bytes: {e:?}")))?;
            // SAFETY: `arena` is a live allocation of exactly `total` bytes.
            if let Err(e) = unsafe { result::memset_d8_sync(arena, 0, total) } {
                // SAFETY: freed once, here, since construction failed.
                let _ = unsafe { result::free_sync(arena) };
                return Err(backend_err(format!("memset: {e:?}")));
            }
            // SAFETY: the Host allocation lives as long as `host` (held by this struct),
            // and is unregistered in Drop before the Arc is released.
            let registered = unsafe {
                sys::cuMemHostRegister_v2(
                    host.base_ptr().cast(),
                    host.len() as usize,
                    sys::CU_MEMHOSTREGISTER_PORTABLE,
                )
            }
            .result()
            .is_ok();
            Ok((ctx, stream, arena, registered))
        }));
        let (ctx, stream, arena, host_registered) = match made {
            Ok(r) => r?,
            Err(p) => return Err(backend_err(format!("driver panicked: {}", panic_text(p)))),
        };
        Ok(Self {
            host,
            geometry,
            ctx,
            stream,
            arena,
            host_registered,
            pending: VecDeque::new(),
        })
    }

    pub fn host_registered(&self) -> bool {
        self.host_registered
    }

    fn bind(&self) -> Result<(), DeviceError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| backend_err(format!("bind: {e:?}")))
    }

    fn sync(&self) -> Result<(), DeviceError> {
        self.stream
            .synchronize()
            .map_err(|e| backend_err(format!("synchronize: {e:?}")))
    }

    fn check(&self, addr: u64, len: usize) -> Result<(), DeviceError> {
        let total = self.geometry.slots as u64 * self.geometry.slot_bytes;
        if addr < self.arena
            || (addr - self.arena)
                .checked_add(len as u64)
                .is_none_or(|e| e > total)
        {
            return Err(backend_err(format!(
                "device range {addr:#x}+{len} outside arena"
            )));
        }
        Ok(())
    }
}

impl DeviceMemory for CudaDeviceMemory {
    fn backend(&self) -> &'static str {
        "cuda"
    }

    fn geometry(&self) -> DeviceGeometry {
        self.geometry
    }

    fn slot_address(&self, slot: u32) -> u64 {
        self.arena + slot as u64 * self.geometry.slot_bytes
    }

    fn host(&self) -> &Arc<HostCacheStorage> {
        &self.host
    }

    fn enqueue(&mut self, copies: &[ResolvedCopy]) -> Result<(), DeviceError> {
        self.bind()?;
        let stream = self.stream.cu_stream();
        for c in copies {
            self.check(c.device_addr, c.len as usize)?;
            let range = HostRange::new(c.host_offset, c.len);
            match c.direction {
                CopyDirection::D2H => {
                    // SAFETY: the engine owns the destination range until this batch's
                    // fence completes, the device range lies in the arena (checked), and
                    // the Host allocation outlives the stream (held by `self.host`).
                    unsafe {
                        let dst = self
                            .host
                            .range_mut(range)
                            .map_err(|e| backend_err(e.to_string()))?;
                        result::memcpy_dtoh_async(dst, c.device_addr, stream)
                    }
                    .map_err(|e| backend_err(format!("d2h: {e:?}")))?;
                }
                CopyDirection::H2D => {
                    // SAFETY: the source range is held (source reference) until the fence
                    // completes; device range checked; allocation outlives the stream.
                    unsafe {
                        let src = self
                            .host
                            .range(range)
                            .map_err(|e| backend_err(e.to_string()))?;
                        result::memcpy_htod_async(c.device_addr, src, stream)
                    }
                    .map_err(|e| backend_err(format!("h2d: {e:?}")))?;
                }
            }
        }
        Ok(())
    }

    fn record_fence(&mut self, fence: FenceId) -> Result<(), DeviceError> {
        let ev = self
            .ctx
            .new_event(None)
            .map_err(|e| backend_err(format!("event: {e:?}")))?;
        ev.record(&self.stream)
            .map_err(|e| backend_err(format!("record: {e:?}")))?;
        self.pending.push_back((fence, ev));
        Ok(())
    }

    fn completed(&mut self) -> Result<Vec<FenceId>, DeviceError> {
        self.bind()?;
        let mut done = Vec::new();
        while let Some((fence, ev)) = self.pending.front() {
            let complete = ev
                .try_is_complete()
                .map_err(|e| backend_err(format!("event query: {e:?}")))?;
            if !complete {
                break;
            }
            done.push(*fence);
            self.pending.pop_front();
        }
        Ok(done)
    }

    fn read(&mut self, device_addr: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        self.bind()?;
        self.check(device_addr, out.len())?;
        // SAFETY: device range checked; `out` lives until the synchronize below returns.
        unsafe { result::memcpy_dtoh_async(out, device_addr, self.stream.cu_stream()) }
            .map_err(|e| backend_err(format!("read: {e:?}")))?;
        self.sync()
    }

    fn write(&mut self, device_addr: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.bind()?;
        self.check(device_addr, data.len())?;
        // SAFETY: device range checked; `data` lives until the synchronize below returns.
        unsafe { result::memcpy_htod_async(device_addr, data, self.stream.cu_stream()) }
            .map_err(|e| backend_err(format!("write: {e:?}")))?;
        self.sync()
    }
}

impl Drop for CudaDeviceMemory {
    fn drop(&mut self) {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            let _ = self.bind();
            let _ = self.sync();
            self.pending.clear();
            if self.host_registered {
                // SAFETY: registered in `new` with this base pointer; all copies finished
                // (stream synchronized above).
                let _ = unsafe { sys::cuMemHostUnregister(self.host.base_ptr().cast()) };
            }
            // SAFETY: allocated in `new`, freed once here after the stream drained.
            let _ = unsafe { result::free_sync(self.arena) };
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without libcuda or a device, detection and construction report the
    /// reason instead of panicking; on a GPU machine, a copy round trip is exact.
    #[test]
    fn detection_and_construction_never_panic() {
        let host = HostCacheStorage::new(8192).unwrap();
        let geometry = DeviceGeometry::new(4, 256).unwrap();
        match detect() {
            CudaAvailability::NoDevice(reason) => {
                eprintln!("cuda detection: no device: {reason}");
                assert!(!reason.is_empty());
                assert!(matches!(
                    CudaDeviceMemory::new(host, geometry, 0),
                    Err(DeviceError::NoDevice(_))
                ));
                assert!(!super::super::detect_cuda().is_present());
            }
            CudaAvailability::Present { devices } => {
                assert!(devices > 0);
                let mem = CudaDeviceMemory::new(host.clone(), geometry, 0).unwrap();
                let mut core = crate::device::DeviceCopyEngineCore::new(mem);
                let data: Vec<u8> = (0..256u32).map(|i| (i * 7 + 1) as u8).collect();
                host.write(0, &data).unwrap();
                use crate::device::{DeviceCopy, DeviceCopyBatch, DeviceSlot};
                core.submit(&DeviceCopyBatch::new(vec![DeviceCopy::h2d(
                    HostRange::new(0, 256),
                    DeviceSlot(2),
                    0,
                )]))
                .unwrap();
                core.submit(&DeviceCopyBatch::new(vec![DeviceCopy::d2h(
                    DeviceSlot(2),
                    0,
                    HostRange::new(4096, 256),
                )]))
                .unwrap();
                assert_eq!(core.read_slot(DeviceSlot(2), 0, 256).unwrap(), data);
                let mut seen = Vec::new();
                while seen.len() < 2 {
                    seen.extend(core.poll_fences().unwrap());
                }
                assert_eq!(host.read(HostRange::new(4096, 256)).unwrap(), data);
            }
        }
    }
}
