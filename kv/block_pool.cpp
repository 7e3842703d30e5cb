#include "kv/block_pool.h"

#include <cstring>

#include "kv/kv_cache.h"

namespace tandem {

Result<std::unique_ptr<BlockPool>> BlockPool::create(const BlockPoolShape& s) {
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
  p->refs_.assign((size_t)s.n_blocks, 0);
  p->hash_of_.assign((size_t)s.n_blocks, 0);
  p->lru_at_.resize((size_t)s.n_blocks);
  p->in_lru_.assign((size_t)s.n_blocks, false);
  for (int64_t b = s.n_blocks - 1; b >= 0; b--) p->free_.push_back((int32_t)b);
  return p;
}

int64_t BlockPool::blocks_for_bytes(const BlockPoolShape& s, uint64_t bytes) {
  const size_t elem = s.dtype == DType::F16 ? 2 : 4;
  const uint64_t per_block = kv_cache_bytes(s.n_layer, s.n_kv_head, s.block_tokens, s.head_dim, elem);
  return per_block ? (int64_t)(bytes / per_block) : 0;
}

int32_t BlockPool::allocate() {
  int32_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {  // evict the least recently used cached prefix
    b = lru_.front();
    lru_.pop_front();
    in_lru_[(size_t)b] = false;
    by_hash_.erase(hash_of_[(size_t)b]);
    hash_of_[(size_t)b] = 0;
  } else {
    return -1;
  }
  refs_[(size_t)b] = 1;
  return b;
}

void BlockPool::retain(int32_t b) {
  if (refs_[(size_t)b]++ == 0 && in_lru_[(size_t)b]) {  // a cached block comes back into use
    lru_.erase(lru_at_[(size_t)b]);
    in_lru_[(size_t)b] = false;
  }
}

void BlockPool::release(int32_t b) {
  if (refs_[(size_t)b] <= 0) return;
  if (--refs_[(size_t)b] > 0) return;
  if (hash_of_[(size_t)b] != 0) {
    lru_at_[(size_t)b] = lru_.insert(lru_.end(), b);
    in_lru_[(size_t)b] = true;
  } else {
    free_.push_back(b);
  }
}

void BlockPool::publish(int32_t b, uint64_t hash) {
  if (hash == 0 || hash_of_[(size_t)b] == hash) return;
  auto it = by_hash_.find(hash);
  if (it != by_hash_.end() && it->second != b) return;  // another block already holds this prefix
  if (hash_of_[(size_t)b] != 0) by_hash_.erase(hash_of_[(size_t)b]);
  hash_of_[(size_t)b] = hash;
  by_hash_[hash] = b;
}

int32_t BlockPool::lookup(uint64_t hash) {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  retain(it->second);
  return it->second;
}

int64_t BlockPool::free_blocks() const { return (int64_t)free_.size() + (int64_t)lru_.size(); }

uint64_t BlockPool::chain_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = parent ^ 0x9E3779B97F4A7C15ull;  // FNV-1a over the ids, seeded by the parent
  for (int32_t t : tokens) {
    for (int k = 0; k < 4; k++) {
      h ^= (uint64_t)((uint32_t)t >> (8 * k)) & 0xFF;
      h *= 0x100000001B3ull;
    }
  }
  return h == 0 ? 1 : h;  // 0 means "no hash"
}

}  // namespace tandem
