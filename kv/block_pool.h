// The paged KV cache: one pool of fixed-size blocks (block_tokens positions of K and V for
// every layer, or for one group of layers when sliding-window layers keep only their window:
// kv/layer_groups.h), handed out to sequences through per-sequence block tables, so that memory is
// committed 16 tokens at a time instead of a whole context per sequence, and full blocks can
// be shared between sequences with the same prefix. Every command's KV lives here: `serve`'s
// many sequences and `run`'s one alike.
//
// Two halves: the blocks' bookkeeping (free list, reference counts, the verified prefix cache,
// LRU) is a host-side BlockAllocator (kv/block_allocator.h); the KV memory the blocks name is
// the backend's (Backend::new_kv_store: host memory on the CPU, device memory on a GPU). This
// class holds both and forwards the bookkeeping calls so the scheduler talks to one object.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kv/block_allocator.h"
#include "kv/layer_groups.h"

namespace tandem {

struct BlockPoolShape {
  int n_layer = 0;
  int n_kv_head = 0;
  int head_dim = 0;
  int block_tokens = 16;
  int64_t n_blocks = 0;
  DType dtype = DType::F16;  // F16, F32 or Q8_0
  // Per layer: > 0 a sliding window, 0 full attention. Empty: every layer full. Window layers
  // get blocks of their own (window-only: kv/layer_groups.h) unless keep_full_window is set.
  std::vector<int64_t> layer_windows = {};
  bool keep_full_window = false;  // llama.cpp's --swa-full: window layers keep every position
};

class BlockPool {
 public:
  // Pool with n_blocks blocks in `backend`'s memory: bytes = n_blocks x block_tokens x (the
  // seed's formula per token for one group's layers, block-quantized types counting their
  // blocks), as plan_kv plans.
  // `hash`: the prefix cache's chain hash; empty (always, outside tests) for keyed SipHash-2-4.
  static Result<std::unique_ptr<BlockPool>> create(const BlockPoolShape& shape, Backend& backend,
                                                   PrefixHashFn hash = {});
  // The number of blocks that fit in `bytes` (0 for a shape the pool would refuse).
  static int64_t blocks_for_bytes(const BlockPoolShape& shape, uint64_t bytes);
  // One block's bytes: block_tokens positions of K and V of one layer group (0: refused shape).
  static uint64_t block_bytes_of(const BlockPoolShape& shape);

  const BlockPoolShape& shape() const { return shape_; }
  // Which layers a block holds: one group of all of them (the full store), or window-only
  // groups, each sequence then holding one block table per group. The store's n_layer is the
  // layers of one group, addressed by KvLayerGroups::slot_of.
  const KvLayerGroups& groups() const { return groups_; }
  const KvStore& store() const { return store_; }  // what the forward pass reads and writes
  uint64_t bytes() const { return store_.bytes(); }
  size_t block_bytes() const { return store_.block_bytes(); }
  size_t row_bytes() const { return store_.row_bytes; }  // one K or V row: kv_heads x head_dim elements
  int block_tokens() const { return shape_.block_tokens; }
  int64_t n_blocks() const { return shape_.n_blocks; }

  // ---- block manager (see BlockAllocator) ----
  int32_t allocate() { return alloc_.allocate(); }
  void retain(int32_t block) { alloc_.retain(block); }
  void release(int32_t block) { alloc_.release(block); }
  uint64_t scope_root(std::string_view name) const { return alloc_.scope_root(name); }
  uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens) const { return alloc_.chain_hash(parent, tokens); }
  void publish(int32_t block, int32_t parent_block, uint64_t hash, std::span<const int32_t> tokens, uint64_t root = 0) {
    alloc_.publish(block, parent_block, hash, tokens, root);
  }
  int32_t lookup(int32_t parent_block, uint64_t hash, std::span<const int32_t> tokens, uint64_t root = 0) {
    return alloc_.lookup(parent_block, hash, tokens, root);
  }
  void publish_beside(int32_t block, int group, uint64_t anchor, uint64_t hash, std::span<const int32_t> tokens) {
    alloc_.publish_beside(block, group, anchor, hash, tokens);
  }
  int32_t lookup_beside(int group, uint64_t anchor, uint64_t hash, std::span<const int32_t> tokens) {
    return alloc_.lookup_beside(group, anchor, hash, tokens);
  }
  bool cached_beside(int group, uint64_t anchor, uint64_t hash, std::span<const int32_t> tokens) const {
    return alloc_.cached_beside(group, anchor, hash, tokens);
  }
  uint64_t prefix_id(int32_t block) const { return alloc_.prefix_id(block); }
  int64_t free_blocks() const { return alloc_.free_blocks(); }
  int64_t used_blocks() const { return shape_.n_blocks - free_blocks(); }
  int64_t cached_blocks() const { return alloc_.cached_blocks(); }
  int ref_count(int32_t block) const { return alloc_.ref_count(block); }
  const BlockAllocator& allocator() const { return alloc_; }

 private:
  BlockPool() = default;

  BlockPoolShape shape_;
  KvLayerGroups groups_;
  KvStore store_;
  BlockAllocator alloc_{0, 1};
};

}  // namespace tandem
