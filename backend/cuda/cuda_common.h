// Shared by the CUDA backend's files: CUDA errors as tandem errors, and the device-side views
// the kernels take. Included by .cu and .cpp files alike (no device code here).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace tandem::cuda {

// The error of a CUDA runtime call, naming what was being done; Ok on cudaSuccess.
inline Status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return make_error("CUDA: {} failed: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

// Empty when this process has a CUDA device, working or not; else why it has none (no GPU, no
// driver): the one case in which a GPU test may skip. A device that is there but broken (a
// sticky fault from an earlier test, a context that cannot be made) counts as present, so the
// error of opening it fails the test instead of hiding as "no GPU".
inline std::string no_cuda_device() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess) return count == 0 ? "the driver sees no GPU" : "";
  const bool absent = e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary ||
                      e == cudaErrorSystemDriverMismatch || e == cudaErrorCompatNotSupportedOnDevice;
  return absent ? std::string(cudaGetErrorString(e)) + " (" + cudaGetErrorName(e) + ")" : "";
}

}  // namespace tandem::cuda
