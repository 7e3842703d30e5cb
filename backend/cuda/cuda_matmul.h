// The CUDA backend's matrix products and embedding lookups for every weight type tandem
// reads from GGUF. Decode (few tokens) runs matrix-vector kernels that stream each weight once
// (int8 dot products against 8-bit activations for the quantized types); prefill runs GEMMs
// (cuBLAS for F16/BF16, quantized weights dequantized per tile). All launches go to the given
// stream and allocate nothing, so a decode step can be captured in a CUDA graph once the
// workspace is reserved.
#pragma once

#include <cstdint>
#include <memory>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"

namespace tandem::cuda {

// A weight resident on the device, in the form the kernels read.
struct DeviceWeight {
  // Unique per upload in this process (never reused, unlike the object's or the memory's
  // address): what a captured graph's signature names the weight by.
  uint64_t id = 0;
  DType type = DType::F32;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;          // as stored in the file
  const void* data = nullptr;    // device memory (layout: the kernels' own; see upload_weight)
  std::shared_ptr<void> owner;   // frees the device memory with the last handle
};

// True when matmul() and embed() handle the type: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K.
bool matmul_supported(DType type);

// Copies a weight to the device (repacking it if the kernels want another layout).
// An allocation that does not fit is an error naming the bytes.
Result<DeviceWeight> upload_weight(const WeightSource& src, cudaStream_t stream);

// Scratch the products need (8-bit activations, dequantized tiles, cuBLAS's workspace and
// handle). reserve() before a graph capture; the products never grow it themselves.
class MatmulWorkspace {
 public:
  MatmulWorkspace();
  ~MatmulWorkspace();
  MatmulWorkspace(const MatmulWorkspace&) = delete;
  MatmulWorkspace& operator=(const MatmulWorkspace&) = delete;
  // Room for products of up to max_tokens rows of input, max_cols wide, into max_rows outputs.
  Status reserve(int64_t max_tokens, int64_t max_cols, int64_t max_rows, cudaStream_t stream);
  int64_t max_tokens() const { return max_tokens_; }

  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
  int64_t max_tokens_ = 0;
};

// out [n, w.rows] = in [n, w.cols] W^T, plus bias [w.rows] on every row when bias is set.
// in, out, bias: device memory, F32 row-major. n <= ws.max_tokens(). An error (nothing or part
// launched) for a product past the reserved workspace, a type with no kernel, or a cuBLAS call
// that failed: the caller keeps it as its backend's error, the process goes on.
Status matmul(const DeviceWeight& w, const float* in, int64_t n, float* out, const float* bias, MatmulWorkspace& ws,
              cudaStream_t stream);

// True when a product of n tokens runs through cuBLAS (prefill's GEMMs) rather than tandem's
// own matrix-vector kernels: the CUDA backend captures graphs only of passes without them.
bool matmul_uses_cublas(int64_t n);

// out [n, w.cols] = rows tokens[0..n) of w, dequantized to F32, times scale (tokens: device
// memory; scale 1 leaves the rows as decoded). An error for a type with no kernel.
Status embed(const DeviceWeight& w, const int32_t* tokens, int64_t n, float* out, float scale, cudaStream_t stream);

}  // namespace tandem::cuda
