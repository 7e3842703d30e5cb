// Model::forward: one pass over tokens of one or many sequences whose K,V live in a
// block pool (the paged KV cache), after checking the batch against the pool and the model.
#include <algorithm>

#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "model/model.h"

namespace tandem {

// The batch against the pool and the model: shapes, positions, blocks and token ids.
Status Model::check_batch(BlockPool& pool, const ForwardBatch& b) const {
  const ModelConfig& c = config_;
  if (b.n_tokens() == 0) return make_error("empty batch");
  const BlockPoolShape& ps = pool.shape();
  if (ps.n_layer != c.n_layer || ps.n_kv_head != tp_.n_kv_head || ps.head_dim != c.head_dim)
    return make_error("the KV block pool's shape does not match the model");
  for (int64_t pos : b.positions())
    if (pos >= c.n_ctx_train) return make_error("position {} is outside the model's context of {}", pos, c.n_ctx_train);
  TANDEM_TRY(BlockTable::check_batch(pool, b));  // every block a query reads is one of the pool's
  return check_tokens(b.tokens());
}

Result<std::span<const float>> Model::forward(BlockPool& pool, const ForwardBatch& b) {
  const ModelConfig& c = config_;
  TANDEM_TRY(check_batch(pool, b));
  const KvLayerGroups& groups = pool.groups();
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

Result<std::span<const float>> Model::hidden_states(BlockPool& pool, const ForwardBatch& b) {
  if (collectives()) return make_error("embeddings are not computed under tensor parallelism");
  if (!b.logit_rows().empty()) return make_error("a hidden-state pass computes no logits");
  TANDEM_TRY(check_batch(pool, b));
  ensure_scratch(b.n_tokens(), 1);
  pass(pool.store(), pool.groups(), b, 0, true);
  const std::span<const float> xb = backend_->read(xb_);  // waits for the pass: its faults show now
  if (Status s = backend_->error(); !s.ok()) return make_error("the forward pass failed: {}", s.error().message);
  return xb.subspan(0, (size_t)b.n_tokens() * (size_t)config_.n_embd);
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
