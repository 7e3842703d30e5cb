// Optional, for a group of products that read one input (q, k, v; gate, up): prepare the input
// once (its 8-bit activations for decode, its F16/BF16 copy for a GEMM) instead of once per
// product as matmul() does. Host-only declarations.
//
//   prepare_input(x, n, cols, ws);            // names the input; launches nothing
//   matmul_prepared(wq, x, n, q, bq, ws, s);  // prepares the form wq needs, then multiplies
//   matmul_prepared(wk, x, n, k, bk, ws, s);  // reuses that form
//
// The caller promises that x's contents do not change between prepare_input and the last
// matmul_prepared of the group. matmul() is prepare_input + matmul_prepared. The bookkeeping
// is host-side and the call sequence is what a graph records, so it holds under capture.
#pragma once

#include "backend/cuda/cuda_matmul.h"

namespace tandem::cuda {

void prepare_input(const float* in, int64_t n, int64_t cols, MatmulWorkspace& ws);

// matmul() without re-preparing an input prepare_input() named (same pointer, n and cols);
// for any other input it prepares it first, as matmul() does.
Status matmul_prepared(const DeviceWeight& w, const float* in, int64_t n, float* out, const float* bias,
                       MatmulWorkspace& ws, cudaStream_t stream);

}  // namespace tandem::cuda
