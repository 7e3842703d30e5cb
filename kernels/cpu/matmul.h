// Products of weight matrices with activations: matvec for decode (one token, bandwidth-bound)
// and matmul for prefill (many tokens, each weight row reused across all of them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "core/dtype.h"
#include "kernels/cpu/kernel_table.h"

namespace tandem::cpu {

// A 2-D weight [rows, cols] in GGUF layout: each row is `cols` contiguous elements of `type`.
struct BoundedHead;

struct WeightMatrix {
  DType type = DType::F32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  RowDotFn dot = nullptr;     // fused dequant-dot with float activations, chosen for the model's ISA
  QuantDotFn qdot = nullptr;  // dot with 8-bit activations; when set, products use it
  QuantDot4Fn qdot4 = nullptr;  // the same against 4 tokens at once (prefill)
  // The same rows repacked in 16-row groups (packed_quant.h); when set, products use these.
  std::shared_ptr<const uint8_t[]> packed;
  size_t packed_group_bytes = 0;
  PackedGemmFn packed_gemm = nullptr;
  // F16/BF16 rows repacked the same way for float activations (packed_float.h); when set,
  // products use these.
  PackedFloatGemmFn packed_float_gemm = nullptr;
  // Float-activation rows against several tokens at once with dot's floats (dot.h); when set,
  // passes of 2+ tokens use it, so their products equal decode's bit for bit.
  RowDotTokensFn dot_tokens = nullptr;
  // For a head on float activations: its 8-bit twin for logit rows read only for their argmax
  // (bounded_head.h). The backend makes it on first use, so commands that never batch greedy
  // rows neither pack the second copy nor hold it; null where the scheme does not apply.
  mutable std::optional<std::shared_ptr<const BoundedHead>> bounded;
  bool is_packed() const { return packed_gemm || packed_float_gemm; }

  // Repacks the rows when the kernels have a packed kernel for the type.
  void pack_for(const CpuKernels& k);

  const uint8_t* row(int64_t r) const { return data + (size_t)r * row_bytes; }
  size_t bytes() const { return (size_t)rows * row_bytes; }
};

// One weight applied to a shared input: out[n_tokens, w->rows].
struct Projection {
  const WeightMatrix* w;
  float* out;
};

// out = X W^T for every projection in the group, X: [n_tokens, cols] shared by all of them
// (same cols). One parallel pass: the input is quantized once, threads split the weights'
// row tiles, and each tile meets every token while it is in cache. Float-path rows with a
// multi-token kernel (dot_tokens) use it for 2+ tokens (decode's floats); others use the fused
// dequant-dot with few tokens and, with many, are decoded to float once per tile. Passes of up
// to kStreamMaxTokens tokens share the tiles out as decode does.
// Called inside a parallel region, it shares the work out among that region's team, so every
// thread of the team must call it (decode's one-team pass does); outside one it starts a region.
void matmul_group(std::span<const Projection> group, const float* X, int64_t n_tokens, const CpuKernels& k);

// y[rows] = W x[cols] (decode).
void matvec(const WeightMatrix& w, const float* x, float* y, const CpuKernels& k);
// Y[n_tokens, rows] = X[n_tokens, cols] W^T (prefill).
void matmul(const WeightMatrix& w, const float* X, int64_t n_tokens, float* Y, const CpuKernels& k);

}  // namespace tandem::cpu
