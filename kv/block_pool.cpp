#include "kv/block_pool.h"

namespace tandem {

Result<std::unique_ptr<BlockPool>> BlockPool::create(const BlockPoolShape& s, Backend& backend, PrefixHashFn hash) {
  if (s.n_layer <= 0 || s.n_kv_head <= 0 || s.head_dim <= 0 || s.block_tokens <= 0 || s.n_blocks <= 0)
    return make_error("bad KV block pool shape ({} layers, {} kv heads, head dim {}, {} tokens per block, {} blocks)",
                      s.n_layer, s.n_kv_head, s.head_dim, s.block_tokens, s.n_blocks);
  auto row = kv_row_bytes(s.dtype, s.n_kv_head, s.head_dim);
  if (!row.ok()) return row.error();
  if (!s.layer_windows.empty() && (int)s.layer_windows.size() != s.n_layer)
    return make_error("the KV block pool has {} layers but {} layer windows", s.n_layer, s.layer_windows.size());
  KvLayerGroups groups = KvLayerGroups::plan(s.n_layer, s.layer_windows, s.keep_full_window);
  if (groups.n_groups() > 1 && !backend.kv_layer_groups())
    return make_error("the {} backend keeps no window-only KV blocks: keep the full store", backend.describe());
  auto store = backend.new_kv_store(s.dtype, groups.group_layers, s.block_tokens, s.n_blocks, row.value());
  if (!store.ok()) return store.error();
  std::unique_ptr<BlockPool> p(new BlockPool());
  p->shape_ = s;
  p->groups_ = std::move(groups);
  p->store_ = std::move(store.value());
  p->alloc_ = BlockAllocator(s.n_blocks, s.block_tokens, std::move(hash));
  return p;
}

uint64_t BlockPool::block_bytes_of(const BlockPoolShape& s) {
  auto row = kv_row_bytes(s.dtype, s.n_kv_head, s.head_dim);
  if (!row.ok()) return 0;
  const int layers = KvLayerGroups::plan(s.n_layer, s.layer_windows, s.keep_full_window).group_layers;
  auto one = kv_store_layout(s.dtype, layers, s.block_tokens, 1, row.value());  // a block's bytes, as a store lays it out
  return one.ok() ? one->block_bytes() : 0;
}

int64_t BlockPool::blocks_for_bytes(const BlockPoolShape& s, uint64_t bytes) {
  const uint64_t one = block_bytes_of(s);
  return one ? (int64_t)(bytes / one) : 0;
}

}  // namespace tandem
