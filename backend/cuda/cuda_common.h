// Shared by the CUDA backend's files: CUDA errors as tandem errors, and the device-side views
// the kernels take. Included by .cu and .cpp files alike (no device code here).
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace tandem::cuda {

// The error of a CUDA runtime call, naming what was being done; Ok on cudaSuccess.
inline Status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return make_error("CUDA: {} failed: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

}  // namespace tandem::cuda
