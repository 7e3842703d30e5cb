// Model::forward: one pass over tokens of one or many sequences whose K,V live in a
// block pool (the paged KV cache), after checking the batch against the pool and the model.
#include <algorithm>
#include <climits>

#include "kv/block_pool.h"
#include "model/model.h"

namespace tandem {

Result<std::span<const float>> Model::forward(BlockPool& pool, const ForwardBatch& b) {
  const ModelConfig& c = config_;
  if (b.n_tokens() == 0) return make_error("empty batch");
  const BlockPoolShape& ps = pool.shape();
  if (ps.n_layer != c.n_layer || ps.n_kv_head != tp_.n_kv_head || ps.head_dim != c.head_dim)
    return make_error("the KV block pool's shape does not match the model");
  if (b.block_tokens() != ps.block_tokens)
    return make_error("the batch counts {} tokens per KV block; the pool holds {}", b.block_tokens(), ps.block_tokens);
  for (int64_t pos : b.positions())
    if (pos >= c.n_ctx_train) return make_error("position {} is outside the model's context of {}", pos, c.n_ctx_train);
  const KvLayerGroups& groups = pool.groups();
  if (b.n_groups() != groups.n_groups())
    return make_error("the batch has block tables for {} layer groups; the KV pool has {}", b.n_groups(), groups.n_groups());
  // Every block a sequence's attention reads must be one of the pool's: in a window group,
  // from the first key its earliest query reads.
  std::vector<int64_t> first_pos((size_t)b.n_seq(), INT64_MAX);
  for (int64_t t = 0; t < b.n_tokens(); t++) {
    int64_t& f = first_pos[(size_t)b.seq_ids()[(size_t)t]];
    f = std::min(f, b.positions()[(size_t)t]);
  }
  for (int g = 0; g < groups.n_groups(); g++)
    for (int s = 0; s < b.n_seq(); s++) {
      const std::span<const int32_t> table = b.group(g).block_table(s);
      const int64_t used = (b.context_lens()[(size_t)s] + ps.block_tokens - 1) / ps.block_tokens;
      const int64_t first = first_pos[(size_t)s] == INT64_MAX ? used : groups.first_kept(g, first_pos[(size_t)s]) / ps.block_tokens;
      for (int64_t i = first; i < used; i++)
        if (table[(size_t)i] < 0 || table[(size_t)i] >= ps.n_blocks)
          return make_error("sequence {}: block {} of its table{} is {}, not a block of the pool's {}", s, i,
                            g ? fmt::format(" for layer group {}", g) : "", table[(size_t)i], ps.n_blocks);
    }
  TANDEM_TRY(check_tokens(b.tokens()));
  const int64_t n_logits = (int64_t)b.logit_rows().size();
  ensure_scratch(b.n_tokens(), std::max<int64_t>(1, n_logits));
  if (collectives()) {  // ranks exchange one block table per sequence: the full store only
    if (groups.n_groups() > 1) return make_error("tensor parallelism keeps the full KV store (no window-only layer groups)");
    return parallel_pass(pool.store(), b);
  }
  pass(pool.store(), groups, b, 0);
  const std::span<const float> logits = backend_->read(logits_);  // waits for the pass: its faults show now
  if (Status s = backend_->error(); !s.ok()) return make_error("the forward pass failed: {}", s.error().message);
  return logits.subspan(0, (size_t)n_logits * (size_t)c.n_vocab);
}

BlockPoolShape Model::kv_pool_shape(int64_t n_blocks, DType dtype, int block_tokens, bool window_only) const {
  BlockPoolShape s{config_.n_layer, tp_.n_kv_head, config_.head_dim, block_tokens, n_blocks, dtype};  // this rank's heads
  for (const LayerSpec& l : config_.spec.layers) s.layer_windows.push_back(l.window);
  s.keep_full_window = !window_only || !backend_->kv_layer_groups() || collectives();
  return s;
}

Result<std::unique_ptr<BlockPool>> Model::new_kv_pool(int64_t n_blocks, DType dtype, int block_tokens,
                                                           PrefixHashFn hash) const {
  // This rank's K,V heads only (all of them in a process of its own).
  const BlockPoolShape s{config_.n_layer, tp_.n_kv_head, config_.head_dim, block_tokens, n_blocks, dtype};
  return BlockPool::create(s, *backend_, std::move(hash));
}

Result<std::span<const float>> Model::forward_batch(BlockPool& pool, std::span<const BatchEntry> batch,
                                                         std::span<const std::vector<int32_t>> tables) {
  ForwardBatch b(pool.block_tokens());
  for (const auto& t : tables) b.add_table(t);
  for (const BatchEntry& e : batch) TANDEM_TRY(b.add_token(e.seq, e.token, e.pos, e.logits));
  return forward(pool, b);
}

}  // namespace tandem
