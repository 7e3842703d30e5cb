// What `make_backend.h` reports about a GPU: its description and measured roofs.
#pragma once

#include "backend/make_backend.h"

namespace tandem::cuda {

Result<GpuInfo> probe_device(int device);
// Streaming read bandwidth (a 2 GiB buffer, best of 5 reads) and cuBLAS GEMM rates (8192^3,
// F16 and BF16 inputs, F32 accumulation; best of 5 after 2 warm-ups).
Result<GpuRoofs> measure_roofs(int device);

}  // namespace tandem::cuda
