// The paged KV cache: one pool of fixed-size blocks (block_tokens positions of K and V for
// every layer), handed out to sequences through per-sequence block tables, so that memory is
// committed 16 tokens at a time instead of a whole context per sequence, and full blocks can
// be shared between sequences with the same prefix.
//
// Prefix cache: a full block is identified by the hash of every token from the start of the
// sequence to its end (a chained hash, so equal hashes mean equal prefixes, not just equal
// blocks). Blocks are reference-counted; a released block that holds a hashed prefix stays
// cached until its memory is needed, then the least recently used is evicted.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

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
  static Result<std::unique_ptr<BlockPool>> create(const BlockPoolShape& shape);
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
  // Byte offsets inside a block of one layer's K and V rows.
  size_t k_offset(int layer) const { return (size_t)layer * 2 * shape_.block_tokens * row_bytes_; }
  size_t v_offset(int layer) const { return k_offset(layer) + (size_t)shape_.block_tokens * row_bytes_; }

  // ---- block manager ----
  // A free block (evicting the least recently used cached prefix if needed), ref count 1;
  // -1 when every block is in use.
  int32_t allocate();
  void retain(int32_t block);
  // Drops a reference; at zero the block is free (or stays cached if it holds a prefix).
  void release(int32_t block);
  // Records that `block` holds the full prefix whose chained hash is `hash`.
  void publish(int32_t block, uint64_t hash);
  // The cached block holding the prefix with this hash, retained for the caller; -1 if none.
  int32_t lookup(uint64_t hash);
  int64_t free_blocks() const;   // allocatable now (free + evictable cached)
  int64_t used_blocks() const { return shape_.n_blocks - free_blocks(); }
  int64_t cached_blocks() const { return (int64_t)lru_.size(); }
  int ref_count(int32_t block) const { return refs_[(size_t)block]; }

  // The chained hash of a full block: parent hash and its block_tokens token ids.
  static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens);

 private:
  BlockPool() = default;
  uint8_t* base(int32_t block, int layer) { return data_.get() + (size_t)block * block_bytes_ + k_offset(layer); }

  BlockPoolShape shape_;
  size_t row_bytes_ = 0, block_bytes_ = 0;
  uint64_t bytes_ = 0;
  std::unique_ptr<uint8_t[]> data_;
  std::vector<int> refs_;                             // [n_blocks]
  std::vector<uint64_t> hash_of_;                     // [n_blocks], 0 = none
  std::vector<int32_t> free_;                         // unreferenced, uncached
  std::list<int32_t> lru_;                            // unreferenced but cached, oldest first
  std::vector<std::list<int32_t>::iterator> lru_at_;  // [n_blocks] position in lru_
  std::vector<bool> in_lru_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace tandem
