// The paged KV cache: one pool of fixed-size blocks (block_tokens positions of K and V for
// every layer), handed out to sequences through per-sequence block tables, so that memory is
// committed 16 tokens at a time instead of a whole context per sequence, and full blocks can
// be shared between sequences with the same prefix.
//
// The blocks' bookkeeping (free list, reference counts, the verified prefix cache, LRU) is a
// BlockAllocator (kv/block_allocator.h); this class adds the KV memory the blocks name, and
// forwards the bookkeeping calls so the scheduler talks to one object.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/dtype.h"
#include "core/error.h"
#include "kv/block_allocator.h"

namespace tandem {

struct BlockPoolShape {
  int n_layer = 0;
  int n_kv_head = 0;
  int head_dim = 0;
  int block_tokens = 16;
  int64_t n_blocks = 0;
  DType dtype = DType::F16;  // F16 or F32
};

class BlockPool {
 public:
  // Pool with n_blocks blocks; bytes = n_blocks x block_tokens x (seed formula per token).
  // `hash`: the prefix cache's chain hash; empty (always, outside tests) for keyed SipHash-2-4.
  static Result<std::unique_ptr<BlockPool>> create(const BlockPoolShape& shape, PrefixHashFn hash = {});
  // The number of blocks that fit in `bytes`.
  static int64_t blocks_for_bytes(const BlockPoolShape& shape, uint64_t bytes);

  const BlockPoolShape& shape() const { return shape_; }
  uint64_t bytes() const { return bytes_; }
  size_t block_bytes() const { return block_bytes_; }
  size_t row_bytes() const { return row_bytes_; }  // one K or V row: kv_heads x head_dim elements
  int block_tokens() const { return shape_.block_tokens; }

  // [block_tokens, kv_dim] K (or V) rows of one layer in one block.
  uint8_t* k(int32_t block, int layer) { return base(block, layer); }
  uint8_t* v(int32_t block, int layer) { return base(block, layer) + (size_t)shape_.block_tokens * row_bytes_; }
  const uint8_t* data() const { return data_.get(); }
  uint8_t* data() { return data_.get(); }
  // Byte offsets inside a block of one layer's K and V rows.
  size_t k_offset(int layer) const { return (size_t)layer * 2 * shape_.block_tokens * row_bytes_; }
  size_t v_offset(int layer) const { return k_offset(layer) + (size_t)shape_.block_tokens * row_bytes_; }

  // ---- block manager (see BlockAllocator) ----
  int32_t allocate() { return alloc_.allocate(); }
  void retain(int32_t block) { alloc_.retain(block); }
  void release(int32_t block) { alloc_.release(block); }
  uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens) const { return alloc_.chain_hash(parent, tokens); }
  void publish(int32_t block, int32_t parent_block, uint64_t hash, std::span<const int32_t> tokens) {
    alloc_.publish(block, parent_block, hash, tokens);
  }
  int32_t lookup(int32_t parent_block, uint64_t hash, std::span<const int32_t> tokens) {
    return alloc_.lookup(parent_block, hash, tokens);
  }
  int64_t free_blocks() const { return alloc_.free_blocks(); }
  int64_t used_blocks() const { return shape_.n_blocks - free_blocks(); }
  int64_t cached_blocks() const { return alloc_.cached_blocks(); }
  int ref_count(int32_t block) const { return alloc_.ref_count(block); }
  const BlockAllocator& allocator() const { return alloc_; }

 private:
  BlockPool() = default;
  uint8_t* base(int32_t block, int layer) { return data_.get() + (size_t)block * block_bytes_ + k_offset(layer); }

  BlockPoolShape shape_;
  size_t row_bytes_ = 0, block_bytes_ = 0;
  uint64_t bytes_ = 0;
  std::unique_ptr<uint8_t[]> data_;
  BlockAllocator alloc_{0, 1};
};

}  // namespace tandem
