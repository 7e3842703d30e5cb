// What the matrix-products' host files (.cpp) share: the workspace's insides, device allocation
// with errors that name the bytes, validation and repacking. Host-only; tests may include it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_matmul.h"
#include "backend/cuda/cuda_matmul_kernels.cuh"

namespace tandem::cuda {

struct DeviceFree {
  void operator()(void* p) const {
    if (p) cudaFree(p);
  }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;

// cudaMalloc of bytes for `what`; when it does not fit, an error naming the bytes asked for and
// the bytes the device has free.
Result<DeviceBuffer> device_alloc(size_t bytes, std::string_view what);

// The forms of a prepared input (MatmulWorkspace::Impl::forms).
enum PreparedForm : unsigned {
  kFormQ8 = 1,    // act_q / act_ds hold the q8_1 activations
  kFormF16 = 2,   // act_16 holds the input as F16
  kFormBF16 = 4,  // act_16 holds the input as BF16
};

struct MatmulWorkspace::Impl {
  cublasHandle_t cublas = nullptr;
  cudaStream_t cublas_stream = nullptr;  // the stream cuBLAS is bound to
  bool cublas_bound = false;
  DeviceBuffer cublas_ws;  // cuBLAS's own scratch, set explicitly so graph capture is legal
  size_t cublas_ws_bytes = 0;

  DeviceBuffer act_q;    // [q_tokens, max_cols] int8 activations
  DeviceBuffer act_ds;   // [q_tokens, max_cols / 32] float2 {d, s}
  DeviceBuffer act_16;   // [max_tokens, max_cols] F16 or BF16 activations for cuBLAS
  DeviceBuffer dequant;  // [dequant_elems / cols, cols] F16: one tile of a dequantized weight
  int64_t max_tokens = 0, max_cols = 0, max_rows = 0;
  int64_t q_tokens = 0;       // tokens act_q holds: min(max_tokens, kMatvecMaxTokens)
  int64_t dequant_elems = 0;  // F16 elements of `dequant`
  // Bytes one dequantized tile may take (tests shrink it to run a product over several tiles).
  size_t dequant_tile_bytes = size_t(64) << 20;

  // The input whose prepared forms the buffers hold (see cuda_matmul_prepared.cuh).
  const float* in = nullptr;
  int64_t in_n = 0, in_cols = 0;
  unsigned forms = 0;

  ~Impl();
};

const char* cublas_status_name(cublasStatus_t s);

// Binds cuBLAS to the stream (and re-sets its workspace, which cublasSetStream resets).
Status bind_cublas(MatmulWorkspace::Impl& ws, cudaStream_t stream);

// ---- upload (cuda_matmul_upload.cu) ----
// Ok when matmul()/embed() can take the weight: a supported type, whole blocks per row, and
// row_bytes as the type says. The error names the weight.
Status validate_weight(const WeightSource& src);
// Writes the device layout of a validated quantized weight (packed_bytes() bytes) to dst, on
// the host (cuda_matmul_layout.cuh says what the layout is).
void repack_quantized(const WeightSource& src, uint8_t* dst);

// ---- (cuda_matmul_gemm.cpp) ----
// out [n, w.rows] = x W^T (+ bias) through cuBLAS; x16: the input as F16 (F16 and quantized w)
// or BF16 (BF16 w); F32 w reads x itself.
Status run_gemm(const WeightView& w, const float* x, const void* x16, int64_t n, float* out, const float* bias,
                MatmulWorkspace::Impl& ws, cudaStream_t stream);

}  // namespace tandem::cuda
