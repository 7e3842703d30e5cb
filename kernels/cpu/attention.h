// Causal multi-head attention with grouped KV heads, reading K and V from cache rows.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace tandem::cpu {

struct CpuKernels;  // kernel_table.h

constexpr int64_t kAttentionSegmentKeys = 256;

struct AttentionShape {
  int n_head = 0;
  int n_kv_head = 0;  // n_head / n_kv_head query heads share one K,V head (GQA)
  int head_dim = 0;
  float scale = 0;     // scores = q . k * scale; 0: 1 / sqrt(head_dim)
  int64_t window = 0;  // > 0: a query at position p sees only keys p' with p - p' < window
  // Per query head (null: none): a logit that joins every softmax's denominator and has no
  // value, so a query can attend to "nothing" (gpt-oss's attention sinks).
  const float* sinks = nullptr;
};

// The keys a query at position pos attends to: [first, pos].
inline int64_t first_key(const AttentionShape& s, int64_t pos) {
  return s.window > 0 && pos >= s.window ? pos - s.window + 1 : 0;
}

// For query rows i in [0, n_q) at position pos0 + i, attends over cached positions
// [first_key(pos0 + i), pos0 + i] (causal, and within the sliding window when one is set). q: [n_q, n_head * head_dim]; k, v: [n_ctx, n_kv_head * head_dim]
// of kv_type (F32, F16, or Q8_0: each head head_dim / 32 GGML blocks); out: [n_q, n_head * head_dim]. Scores live in a per-thread
// buffer of one key segment, never as a full [n_q, n_ctx] matrix. Like matmul_group, inside
// a parallel region every thread of the team must call it (the work is shared among them).
//
// With the SIMD kernels, a row with more than kAttentionSegmentKeys keys attends to each
// segment of that many keys on its own and the segments' results are merged by their softmax
// statistics (flash-decoding): decode's few heads then split over threads by segment.
// Segments sit at absolute positions (multiples of kAttentionSegmentKeys), so where they fall
// depends only on the row's keys: a row gives the same floats alone, in a prefill batch, or
// decoded; and rows of one sequence share every segment they hold whole, sliding windows
// included.
void attention(const float* q, const void* k, const void* v, DType kv_type, int64_t n_q, int64_t pos0,
               const AttentionShape& shape, float* out, const CpuKernels& kernels);

// K and V of one sequence held in a pool of fixed-size blocks (kv/block_pool.h): position t
// lives in block table[t / block_tokens], row t % block_tokens.
struct PagedKvView {
  const uint8_t* pool = nullptr;  // the pool's storage
  size_t block_bytes = 0;         // stride between blocks
  size_t k_offset = 0;            // this layer's K rows inside a block
  size_t v_offset = 0;            // this layer's V rows inside a block
  size_t row_bytes = 0;           // one row: n_kv_head * head_dim elements
  int block_tokens = 0;
  const int32_t* table = nullptr;
};

// Attention for a batch mixing sequences: query row i belongs to sequence seq[i] at position
// pos[i] and attends over [first_key(pos[i]), pos[i]] of views[seq[i]]. The arithmetic is the same, in the same
// order, as attention() over a contiguous cache, so both paths give identical results.
void attention_paged(const float* q, int64_t n_q, const int64_t* pos, const int* seq, const PagedKvView* views,
                     DType kv_type, const AttentionShape& shape, float* out, const CpuKernels& kernels);

}  // namespace tandem::cpu
