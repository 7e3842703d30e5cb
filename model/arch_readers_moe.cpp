// The experts of a mixture-of-experts family (arch.expert_* keys, as llama.cpp's converters
// write them), shared by the readers of those families (arch_readers.cpp).
#include <algorithm>
#include <cmath>

#include "model/arch_readers.h"

namespace tandem {

namespace {

// An unsigned key in [low, high], or `fallback` when absent.
Result<int> bounded_uint(const GgufFile& f, const std::string& key, int fallback, uint64_t low, uint64_t high) {
  auto v = f.get_uint(key);
  if (!v.ok()) return v.error();
  if (!v->has_value()) return fallback;
  if (**v < low || **v > high) return make_error("metadata '{}' = {} is out of range [{}, {}]", key, **v, low, high);
  return (int)**v;
}

}  // namespace

// llama.cpp's limit (LLAMA_MAX_EXPERTS): no released model comes near it.
constexpr int kMaxExperts = 512;

Status read_experts(const GgufFile& f, const ModelConfig& c, const ExpertDefaults& d, ArchSpec& s) {
  const std::string p = c.arch + ".";
  MoeSpec& m = s.moe;
  auto n_expert = bounded_uint(f, p + "expert_count", 0, 0, kMaxExperts);
  if (!n_expert.ok()) return n_expert.error();
  if (*n_expert == 0) return make_error("metadata '{}expert_count' is missing or 0: {} is a mixture of experts", p, c.arch);
  auto n_used = bounded_uint(f, p + "expert_used_count", 0, 0, kMaxExperts);
  if (!n_used.ok()) return n_used.error();
  if (*n_used == 0 || *n_used > *n_expert)
    return make_error("metadata '{}expert_used_count' = {} must be between 1 and expert_count ({})", p, *n_used, *n_expert);
  // Families that do not read the width (OLMoE, Mixtral) give their experts the FFN's.
  auto n_ff = d.read_width ? bounded_uint(f, p + "expert_feed_forward_length", c.n_ff / *n_used, 1, 1u << 20)
                           : Result<int>(c.n_ff);
  auto n_ff_shared = d.shared_expert ? bounded_uint(f, p + "expert_shared_feed_forward_length", c.n_ff, 1, 1u << 20)
                                     : Result<int>(0);
  auto dense = bounded_uint(f, p + "leading_dense_block_count", 0, 0, (uint64_t)c.n_layer);
  for (auto* r : {&n_ff, &n_ff_shared, &dense})
    if (!r->ok()) return r->error();
  auto scale = f.get_float(p + "expert_weights_scale");  // absent or 0: none (llama.cpp's reading)
  if (!scale.ok()) return scale.error();
  float weights_scale = 1.0f;
  if (scale->has_value() && **scale != 0.0) {
    if (!std::isfinite(**scale) || !(**scale > 0.0) || **scale > 1e6)
      return make_error("metadata '{}expert_weights_scale' = {:g} is out of range", p, **scale);
    weights_scale = (float)**scale;
  }
  // Whether the kept weights are renormalised is the family's (llama.cpp fixes it per
  // architecture and reads no key for these families).
  m.routing = MoeRouting{*n_expert, *n_used, ExpertGating::Softmax, d.softmax_over_top_k, d.normalize, weights_scale};
  m.n_ff = *n_ff;
  m.n_ff_shared = *n_ff_shared;
  m.shared_gate = d.shared_expert;
  m.leading_dense = *dense;
  for (int i = m.leading_dense; i < c.n_layer; i++) s.layers[(size_t)i].moe = true;
  return Status::Ok();
}

}  // namespace tandem
