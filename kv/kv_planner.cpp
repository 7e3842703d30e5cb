#include "kv/kv_planner.h"

#include <string>

namespace tandem {

Result<DType> dtype_from_name(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = (char)std::tolower((unsigned char)c);
  for (uint32_t id = 0; id <= 40; id++) {
    auto info = dtype_info(id);
    if (!info) continue;
    std::string n(info->name);
    for (char& c : n) c = (char)std::tolower((unsigned char)c);
    if (n == lower) return (DType)id;
  }
  return make_error("unknown element type '{}' (f32, f16, bf16, q8_0, q4_0, q4_1, ...)", name);
}

Result<KvPlan> plan_kv(const KvPlanInput& in) {
  if (in.n_layer <= 0 || in.n_kv_head <= 0 || in.head_dim <= 0)
    return make_error("layers, kv heads and head dim must be positive (got {}, {}, {})", in.n_layer, in.n_kv_head,
                      in.head_dim);
  if (in.ctx <= 0 || in.batch <= 0) return make_error("context and batch must be positive (got {}, {})", in.ctx, in.batch);
  const auto info = dtype_info((uint32_t)in.dtype);
  if (!info) return make_error("unknown KV element type");
  const uint64_t row = (uint64_t)in.n_kv_head * (uint64_t)in.head_dim;  // one head-row set of one layer
  if (row % info->block_elems != 0)
    return make_error("kv_heads x head_dim = {} is not a whole number of {} blocks of {}", row, info->name,
                      info->block_elems);
  KvPlan p;
  p.in = in;
  p.bytes_per_element = (double)info->block_bytes / info->block_elems;
  // 2 (K and V) x layers x (kv_heads x head_dim elements, as blocks).
  p.bytes_per_token = 2ull * (uint64_t)in.n_layer * (row / info->block_elems) * info->block_bytes;
  const long double seq = (long double)p.bytes_per_token * in.ctx, batch = seq * in.batch;
  if (batch > 1.8e19L) return make_error("the KV cache would exceed 2^64 bytes");
  p.bytes_per_sequence = p.bytes_per_token * (uint64_t)in.ctx;
  p.bytes_batch = p.bytes_per_sequence * (uint64_t)in.batch;
  if (in.memory_bytes > 0) {
    const uint64_t free = in.memory_bytes > in.weights_bytes ? in.memory_bytes - in.weights_bytes : 0;
    p.max_sequences = (int64_t)(free / p.bytes_per_sequence);
    p.max_tokens = (int64_t)(free / p.bytes_per_token);
  }
  return p;
}

}  // namespace tandem
