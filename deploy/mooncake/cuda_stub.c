/* A no-driver libcuda.so.1 for machines without an NVIDIA driver. install.sh builds it only
 * when no real libcuda.so.1 exists (ldconfig -p, nvidia-smi); it must never shadow a real
 * driver. The CUDA build of libmooncake_store.so links libcuda.so.1 for its GPU-memory paths;
 * with this stub the library loads, every driver entry point reports CUDA_ERROR_NO_DEVICE
 * (100), and the store keeps to host memory. The error-string functions fill their output
 * so that a caller formatting an error message never reads garbage. */
#include <stddef.h>

#define CUDA_ERROR_NO_DEVICE 100

static const char kName[] = "CUDA_ERROR_NO_DEVICE";
static const char kText[] = "no CUDA-capable device is detected (tsl3 no-driver stub)";

int cuGetErrorName(int err, const char **out) {
  (void)err;
  if (out) *out = kName;
  return 0;
}

int cuGetErrorString(int err, const char **out) {
  (void)err;
  if (out) *out = kText;
  return 0;
}

int cuDriverGetVersion(int *version) {
  if (version) *version = 0;
  return CUDA_ERROR_NO_DEVICE;
}

int cuDeviceGetCount(int *count) {
  if (count) *count = 0;
  return CUDA_ERROR_NO_DEVICE;
}

int cuGetProcAddress(const char *symbol, void **pfn, ...) {
  (void)symbol;
  if (pfn) *pfn = NULL;
  return CUDA_ERROR_NO_DEVICE;
}

int cuGetProcAddress_v2(const char *symbol, void **pfn, ...) {
  (void)symbol;
  if (pfn) *pfn = NULL;
  return CUDA_ERROR_NO_DEVICE;
}

/* Every other entry point the library imports: no device, no side effect. */
#define NO_DEVICE(name) \
  int name(void) { return CUDA_ERROR_NO_DEVICE; }

NO_DEVICE(cuInit)
NO_DEVICE(cuCtxGetDevice)
NO_DEVICE(cuCtxSetCurrent)
NO_DEVICE(cuDeviceGet)
NO_DEVICE(cuDeviceGetAttribute)
NO_DEVICE(cuDevicePrimaryCtxRelease_v2)
NO_DEVICE(cuDevicePrimaryCtxRetain)
NO_DEVICE(cuMemAddressFree)
NO_DEVICE(cuMemAddressReserve)
NO_DEVICE(cuMemCreate)
NO_DEVICE(cuMemExportToShareableHandle)
NO_DEVICE(cuMemGetAddressRange_v2)
NO_DEVICE(cuMemGetAllocationGranularity)
NO_DEVICE(cuMemGetHandleForAddressRange)
NO_DEVICE(cuMemImportFromShareableHandle)
NO_DEVICE(cuMemMap)
NO_DEVICE(cuMemRelease)
NO_DEVICE(cuMemRetainAllocationHandle)
NO_DEVICE(cuMemSetAccess)
NO_DEVICE(cuMemUnmap)
NO_DEVICE(cuPointerGetAttribute)
NO_DEVICE(cuPointerSetAttribute)
