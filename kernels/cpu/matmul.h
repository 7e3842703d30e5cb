// Products of a weight matrix with activations: matvec for decode (one token, bandwidth-bound)
// and matmul for prefill (many tokens, each dequantized weight row reused across all of them).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/dot.h"

namespace tandem::cpu {

// A 2-D weight [rows, cols] in GGUF layout: each row is `cols` contiguous elements of `type`.
struct WeightMatrix {
  DType type = DType::F32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  RowDotFn dot = nullptr;    // fused dequant-dot with float activations, chosen for the model's ISA
  QuantDotFn qdot = nullptr;  // dot with 8-bit activations; when set, matvec/matmul use it

  const uint8_t* row(int64_t r) const { return data + (size_t)r * row_bytes; }
  size_t bytes() const { return (size_t)rows * row_bytes; }
};

// y[rows] = W x[cols]. Threads split the rows.
void matvec(const WeightMatrix& w, const float* x, float* y, const CpuKernels& k);

// Y[n_tokens, rows] = X[n_tokens, cols] W^T. Threads split the rows. With 8-bit activations
// every token row is quantized once and each tile of weight rows meets every token; otherwise
// each thread decodes a tile of rows to float once and reuses it for every token.
void matmul(const WeightMatrix& w, const float* X, int64_t n_tokens, float* Y, const CpuKernels& k);

}  // namespace tandem::cpu
