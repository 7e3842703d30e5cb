// KV memory planning before anything is allocated: the seed's formula
// 2 x layers x kv_heads x seq_len x head_dim x bytes_per_element x batch, per token, per
// sequence and per batch, for any element type (block-quantized types count their blocks),
// and how many sequences of a given length fit in a memory budget beside the weights.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

// The seed's formula with a whole number of bytes per element:
// 2 x layers x kv_heads x seq_len x head_dim x bytes_per_element x batch.
constexpr uint64_t kv_cache_bytes(uint64_t n_layer, uint64_t n_kv_head, uint64_t seq_len, uint64_t head_dim,
                                  uint64_t bytes_per_element, uint64_t batch = 1) {
  return 2 * n_layer * n_kv_head * seq_len * head_dim * bytes_per_element * batch;
}

struct KvPlanInput {
  int n_layer = 0;
  int n_kv_head = 0;
  int head_dim = 0;
  int64_t ctx = 4096;         // tokens per sequence
  int64_t batch = 1;          // sequences
  DType dtype = DType::F16;   // element type of K and V
  uint64_t weights_bytes = 0; // the model's weights, which share the memory budget
  uint64_t memory_bytes = 0;  // budget for weights + KV; 0 = no fit calculation
};

struct KvPlan {
  KvPlanInput in;
  uint64_t bytes_per_token = 0;     // K and V rows of every layer for one position
  uint64_t bytes_per_sequence = 0;  // x ctx
  uint64_t bytes_batch = 0;         // x batch
  double bytes_per_element = 0;     // e.g. 2 for f16, 1.0625 for q8_0
  int64_t max_sequences = -1;       // sequences of ctx tokens that fit beside the weights (-1: no budget)
  int64_t max_tokens = -1;          // tokens of KV that fit (-1: no budget)
};

// Errors on non-positive shapes, head rows not a whole number of blocks, or overflow.
Result<KvPlan> plan_kv(const KvPlanInput& in);

// "f16", "f32", "bf16", "q8_0", "q4_0", ... -> DType.
Result<DType> dtype_from_name(std::string_view name);

}  // namespace tandem
