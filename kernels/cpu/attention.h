// Causal multi-head attention with grouped KV heads, reading K and V from cache rows.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/dot.h"

namespace tandem::cpu {

struct AttentionShape {
  int n_head = 0;
  int n_kv_head = 0;  // n_head / n_kv_head query heads share one K,V head (GQA)
  int head_dim = 0;
};

// For query rows i in [0, n_q) at position pos0 + i, attends over cached positions
// [0, pos0 + i] (causal). q: [n_q, n_head * head_dim]; k, v: [n_ctx, n_kv_head * head_dim]
// of kv_type (F32 or F16); out: [n_q, n_head * head_dim]. Scores live in a per-thread
// buffer of one row, never as a full [n_q, n_ctx] matrix.
void attention(const float* q, const void* k, const void* v, DType kv_type, int64_t n_q, int64_t pos0,
               const AttentionShape& shape, float* out, const CpuKernels& kernels);

}  // namespace tandem::cpu
