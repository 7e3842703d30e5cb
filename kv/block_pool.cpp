#include "kv/block_pool.h"

#include <cstring>

#include "kv/kv_cache.h"

namespace tandem {

Result<std::unique_ptr<BlockPool>> BlockPool::create(const BlockPoolShape& s, PrefixHashFn hash) {
  if (s.n_layer <= 0 || s.n_kv_head <= 0 || s.head_dim <= 0 || s.block_tokens <= 0 || s.n_blocks <= 0)
    return make_error("bad KV block pool shape ({} layers, {} kv heads, head dim {}, {} tokens per block, {} blocks)",
                      s.n_layer, s.n_kv_head, s.head_dim, s.block_tokens, s.n_blocks);
  if (s.dtype != DType::F16 && s.dtype != DType::F32) return make_error("KV blocks hold f16 or f32");
  std::unique_ptr<BlockPool> p(new BlockPool());
  p->shape_ = s;
  const size_t elem = s.dtype == DType::F16 ? 2 : 4;
  p->row_bytes_ = (size_t)s.n_kv_head * s.head_dim * elem;
  p->block_bytes_ = 2 * (size_t)s.n_layer * s.block_tokens * p->row_bytes_;
  p->bytes_ = kv_cache_bytes(s.n_layer, s.n_kv_head, (uint64_t)s.block_tokens * s.n_blocks, s.head_dim, elem);
  p->data_.reset(new (std::nothrow) uint8_t[p->bytes_]);
  if (!p->data_) return make_error("cannot allocate a KV pool of {} bytes", p->bytes_);
  p->alloc_ = BlockAllocator(s.n_blocks, s.block_tokens, std::move(hash));
  return p;
}

int64_t BlockPool::blocks_for_bytes(const BlockPoolShape& s, uint64_t bytes) {
  const size_t elem = s.dtype == DType::F16 ? 2 : 4;
  const uint64_t per_block = kv_cache_bytes(s.n_layer, s.n_kv_head, s.block_tokens, s.head_dim, elem);
  return per_block ? (int64_t)(bytes / per_block) : 0;
}

}  // namespace tandem
