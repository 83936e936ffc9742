//! CUDA availability, detected without panicking: a machine without libcuda or without a
//! device reports `NoDevice` with the reason, and the engine host falls back to the
//! host-emulated backend. Without the `cuda` feature, detection always reports `NoDevice`.

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaAvailability {
    Present { devices: u32 },
    NoDevice(String),
}

impl CudaAvailability {
    pub fn is_present(&self) -> bool {
        matches!(self, CudaAvailability::Present { .. })
    }
}

/// Detects CUDA devices: checks that the driver library loads before any call that would
/// panic without it, and catches a panic as a last net.
#[cfg(feature = "cuda")]
pub fn detect_cuda() -> CudaAvailability {
    super::cuda::detect()
}

/// Built without the `cuda` feature: never present.
#[cfg(not(feature = "cuda"))]
pub fn detect_cuda() -> CudaAvailability {
    CudaAvailability::NoDevice("tsl3 was built without the `cuda` feature".into())
}
