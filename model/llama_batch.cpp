// LlamaModel::forward_batch: one serving step over tokens of many sequences whose K,V live in
// a block pool (the paged KV cache).
#include <algorithm>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/dot.h"
#include "kv/block_pool.h"
#include "model/llama_model.h"

namespace tandem {

namespace {

class PagedKv : public LayerKv {
 public:
  PagedKv(BlockPool& pool, std::span<const BatchEntry> batch, std::span<const std::vector<int32_t>> tables,
          const cpu::AttentionShape& shape, const cpu::CpuKernels& k)
      : pool_(pool), batch_(batch), shape_(shape), kernels_(k) {
    for (const auto& t : tables) views_.push_back({pool.data(), pool.block_bytes(), 0, 0, pool.row_bytes(), pool.block_tokens(), t.data()});
    for (const BatchEntry& e : batch) {
      pos_.push_back(e.pos);
      seq_.push_back(e.seq);
    }
  }

  void store(int layer, const float* k, const float* v, int64_t n) override {
    const int64_t row = (int64_t)shape_.n_kv_head * shape_.head_dim;
    const bool f16 = pool_.shape().dtype == DType::F16;
    for (int64_t i = 0; i < n; i++) {
      const BatchEntry& e = batch_[(size_t)i];
      const int32_t block = views_[(size_t)e.seq].table[e.pos / pool_.block_tokens()];
      const size_t at = (size_t)(e.pos % pool_.block_tokens()) * pool_.row_bytes();
      uint8_t* kd = pool_.k(block, layer) + at;
      uint8_t* vd = pool_.v(block, layer) + at;
      const float* ks = k + i * row;
      const float* vs = v + i * row;
      if (f16) {
        auto* k16 = reinterpret_cast<uint16_t*>(kd);
        auto* v16 = reinterpret_cast<uint16_t*>(vd);
        cpu::f32_to_f16(ks, k16, row);
        cpu::f32_to_f16(vs, v16, row);
      } else {
        std::copy(ks, ks + row, reinterpret_cast<float*>(kd));
        std::copy(vs, vs + row, reinterpret_cast<float*>(vd));
      }
    }
  }

  void attend(int layer, const float* q, int64_t n, float* out) override {
    // A copy per call: at decode every thread of the pass's team calls in at once.
    std::vector<cpu::PagedKvView> views = views_;
    for (auto& v : views) v.k_offset = pool_.k_offset(layer), v.v_offset = pool_.v_offset(layer);
    cpu::attention_paged(q, n, pos_.data(), seq_.data(), views.data(), pool_.shape().dtype, shape_, out, kernels_);
  }

 private:
  BlockPool& pool_;
  std::span<const BatchEntry> batch_;
  cpu::AttentionShape shape_;
  const cpu::CpuKernels& kernels_;
  std::vector<cpu::PagedKvView> views_;  // [n_seq]
  std::vector<int64_t> pos_;             // [n_tokens]
  std::vector<int> seq_;                 // [n_tokens]
};

}  // namespace

Result<std::span<const float>> LlamaModel::forward_batch(BlockPool& pool, std::span<const BatchEntry> batch,
                                                         std::span<const std::vector<int32_t>> tables) {
  const LlamaConfig& c = config_;
  if (batch.empty()) return make_error("empty batch");
  const BlockPoolShape& ps = pool.shape();
  if (ps.n_layer != c.n_layer || ps.n_kv_head != c.n_kv_head || ps.head_dim != c.head_dim)
    return make_error("the KV block pool's shape does not match the model");
  std::vector<int32_t> tokens;
  std::vector<int64_t> logit_rows;
  for (size_t i = 0; i < batch.size(); i++) {
    const BatchEntry& e = batch[i];
    if (e.seq < 0 || (size_t)e.seq >= tables.size()) return make_error("batch entry {} names sequence {} of {}", i, e.seq, tables.size());
    if (e.pos < 0 || e.pos >= c.n_ctx_train) return make_error("position {} is outside the model's context of {}", e.pos, c.n_ctx_train);
    if (e.pos / ps.block_tokens >= (int64_t)tables[(size_t)e.seq].size())
      return make_error("sequence {} has no KV block for position {}", e.seq, e.pos);
    tokens.push_back(e.token);
    if (e.logits) logit_rows.push_back((int64_t)i);
  }
  TANDEM_TRY(check_tokens(tokens));
  const int64_t n = (int64_t)batch.size();
  ensure_scratch(n, std::max<int64_t>(1, (int64_t)logit_rows.size()));
  embed(tokens);
  PagedKv kv(pool, batch, tables, {c.n_head, c.n_kv_head, c.head_dim}, kernels_);
  std::vector<int64_t> pos((size_t)n);
  for (int64_t i = 0; i < n; i++) pos[(size_t)i] = batch[(size_t)i].pos;
  run_layers(kv, n, pos.data());
  if (!logit_rows.empty()) compute_logits_rows(logit_rows, logits_.data());
  return std::span<const float>(logits_.data(), logit_rows.size() * (size_t)c.n_vocab);
}

}  // namespace tandem
