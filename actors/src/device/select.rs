//! Startup choice of the device backend: host-emulated, CUDA, or CUDA when present with the
//! emulated arena as the fallback. Called once by the binary's startup factory; it never
//! retries or switches backends later.

use super::availability::{detect_cuda, CudaAvailability};
use super::emulated::EmulatedDeviceMemory;
use super::geometry::DeviceGeometry;
use super::memory::DeviceMemory;
use super::ops::DeviceError;
use crate::host::HostCacheStorage;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceBackendChoice {
    Emulated,
    /// CUDA device `ordinal`, or an error.
    Cuda {
        ordinal: usize,
    },
    /// CUDA device `ordinal` when present, else emulated.
    Auto {
        ordinal: usize,
    },
}

/// The backend and, when CUDA was considered, what detection said.
pub fn device_memory(
    host: Arc<HostCacheStorage>,
    geometry: DeviceGeometry,
    choice: DeviceBackendChoice,
) -> Result<(Box<dyn DeviceMemory>, Option<CudaAvailability>), DeviceError> {
    let ordinal = match choice {
        DeviceBackendChoice::Emulated => {
            return Ok((Box::new(EmulatedDeviceMemory::new(host, geometry)?), None));
        }
        DeviceBackendChoice::Cuda { ordinal } | DeviceBackendChoice::Auto { ordinal } => ordinal,
    };
    let found = detect_cuda();
    match (&found, choice) {
        (CudaAvailability::Present { .. }, _) => {
            cuda_memory(host, geometry, ordinal).map(|m| (m, Some(found)))
        }
        (CudaAvailability::NoDevice(reason), DeviceBackendChoice::Cuda { .. }) => {
            Err(DeviceError::NoDevice(reason.clone()))
        }
        (CudaAvailability::NoDevice(_), _) => Ok((
            Box::new(EmulatedDeviceMemory::new(host, geometry)?),
            Some(found),
        )),
    }
}

#[cfg(feature = "cuda")]
fn cuda_memory(
    host: Arc<HostCacheStorage>,
    geometry: DeviceGeometry,
    ordinal: usize,
) -> Result<Box<dyn DeviceMemory>, DeviceError> {
    Ok(Box::new(super::cuda::CudaDeviceMemory::new(
        host, geometry, ordinal,
    )?))
}

#[cfg(not(feature = "cuda"))]
fn cuda_memory(
    _host: Arc<HostCacheStorage>,
    _geometry: DeviceGeometry,
    _ordinal: usize,
) -> Result<Box<dyn DeviceMemory>, DeviceError> {
    Err(DeviceError::NoDevice(
        "tsl3 was built without the `cuda` feature".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_falls_back_to_emulated_and_cuda_reports_why_not() {
        let host = HostCacheStorage::new(4096).unwrap();
        let g = DeviceGeometry::new(2, 64).unwrap();
        let (m, seen) = device_memory(host.clone(), g, DeviceBackendChoice::Emulated).unwrap();
        assert_eq!((m.backend(), seen), ("emulated", None));
        match detect_cuda() {
            CudaAvailability::NoDevice(_) => {
                let (m, seen) =
                    device_memory(host.clone(), g, DeviceBackendChoice::Auto { ordinal: 0 })
                        .unwrap();
                assert_eq!(m.backend(), "emulated");
                assert!(matches!(seen, Some(CudaAvailability::NoDevice(_))));
                assert!(matches!(
                    device_memory(host, g, DeviceBackendChoice::Cuda { ordinal: 0 }),
                    Err(DeviceError::NoDevice(_))
                ));
            }
            CudaAvailability::Present { .. } => {
                let (m, _) =
                    device_memory(host, g, DeviceBackendChoice::Auto { ordinal: 0 }).unwrap();
                assert_eq!(m.backend(), "cuda");
            }
        }
    }
}
