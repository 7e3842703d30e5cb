// The host side of the paged KV cache: which block is free, who holds it (reference counts),
// and which full blocks hold a known prefix (the prefix cache, with LRU eviction). It never
// touches KV memory; that belongs to whoever stores the blocks (kv/block_pool.h today).
//
// Prefix cache. A full block is indexed by a chained hash of its prefix, but the hash is only
// an index: a hit counts only when the block's own token ids equal the caller's and its parent
// is the caller's verified previous block. Each published block carries a prefix id; blocks
// holding equal prefixes (verified: same parent prefix id, same tokens) share one id, and an id
// is never reused, so "same parent id" means "same whole prefix" by induction from the root.
// A forged or accidental hash collision is therefore a miss, never another request's KV.
// The hash itself is keyed (SipHash-2-4 under a random per-allocator key), so collisions
// cannot be searched for offline either. Tests inject their own hash to force collisions.
//
// Scopes (cache_salt, --prefix-cache-scope): a chain starts from a scope's root, 0 for the shared
// scope, a keyed hash of the scope's name otherwise (top bit set, so it never equals a prefix id,
// which counts up from 1). The root is the first block's parent id and its chain hash's parent:
// a block of one scope is never verified as another's, so hits (and the cached-token counts
// that reveal them) never cross scopes.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kv/siphash.h"

namespace tandem {

// hash(parent block's chain hash, the block's token ids) -> the block's chain hash.
using PrefixHashFn = std::function<uint64_t(uint64_t parent, std::span<const int32_t> tokens)>;

class BlockAllocator {
 public:
  // `hash` empty: keyed SipHash-2-4 under a fresh random key.
  BlockAllocator(int64_t n_blocks, int block_tokens, PrefixHashFn hash = {});

  int64_t n_blocks() const { return (int64_t)refs_.size(); }
  int block_tokens() const { return block_tokens_; }

  // A free block (evicting the least recently used cached prefix if needed), ref count 1;
  // -1 when every block is in use.
  int32_t allocate();
  void retain(int32_t block);
  // Drops a reference; at zero the block is free (or stays cached if it is indexed).
  void release(int32_t block);

  // The root of scope `name`: 0 for "" (the shared scope), else a keyed hash with the top bit set.
  uint64_t scope_root(std::string_view name) const;
  // The chain hash of a full block whose parent block has chain hash `parent` (the scope's
  // root at the start).
  uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens) const;
  // Records that `block` (full, its KV written) holds `tokens` after the prefix held by
  // `parent_block` (-1: the block starts the sequence, in scope `root`), under chain hash
  // `hash`. Ignored when the parent holds no verified prefix or `block` was already published.
  void publish(int32_t block, int32_t parent_block, uint64_t hash, std::span<const int32_t> tokens, uint64_t root = 0);
  // The cached block holding `tokens` right after `parent_block`'s prefix (-1: at the start of
  // scope `root`), retained for the caller; -1 on a miss, including a hash hit that fails
  // verification.
  int32_t lookup(int32_t parent_block, uint64_t hash, std::span<const int32_t> tokens, uint64_t root = 0);

  // Blocks of a pool's further layer groups (kv/block_pool.h) hold the same positions as a
  // block of group 0, for other layers. They are cached beside that block: verified by its
  // prefix id (`anchor`: ids are never reused, so equal ids mean equal whole prefixes) tagged
  // with the group (1..63; a tag no prefix id or scope root can equal), and by the tokens, as
  // for publish(); `hash` is the group's own index key.
  void publish_beside(int32_t block, int group, uint64_t anchor, uint64_t hash, std::span<const int32_t> tokens);
  // The cached block published beside `anchor` for `group`, retained for the caller (-1: none).
  int32_t lookup_beside(int group, uint64_t anchor, uint64_t hash, std::span<const int32_t> tokens);
  bool cached_beside(int group, uint64_t anchor, uint64_t hash, std::span<const int32_t> tokens) const;
  // The verified prefix id a published block carries (0: none), the anchor of blocks beside it.
  uint64_t prefix_id(int32_t block) const { return prefix_id_[(size_t)block]; }

  int64_t free_blocks() const { return (int64_t)free_.size() + (int64_t)lru_.size(); }  // allocatable now
  int64_t cached_blocks() const { return (int64_t)lru_.size(); }
  int ref_count(int32_t block) const { return refs_[(size_t)block]; }
  // Hash hits refused because the tokens or the parent differed (collisions, stale entries).
  int64_t rejected_hits() const { return rejected_hits_; }

 private:
  bool holds(int32_t block, uint64_t parent_id, std::span<const int32_t> tokens) const;
  void publish_under(int32_t block, uint64_t parent_id, uint64_t hash, std::span<const int32_t> tokens);
  int32_t find(uint64_t parent_id, uint64_t hash, std::span<const int32_t> tokens) const;
  void forget(int32_t block);    // drops its prefix (and its index entry, if it has one)
  void make_free(int32_t block);  // unreferenced: to the LRU if indexed, else to the free list

  int block_tokens_;
  PrefixHashFn hash_;
  SipKey key_{};
  std::vector<int> refs_;                             // [n_blocks]
  std::vector<uint64_t> prefix_id_;                   // [n_blocks] 0 = holds no verified prefix
  std::vector<uint64_t> parent_id_;                   // [n_blocks] prefix id of the parent, 0 = root
  std::vector<uint64_t> hash_of_;                     // [n_blocks] chain hash when published
  std::vector<int32_t> tokens_;                       // [n_blocks, block_tokens] ids when published
  std::vector<bool> indexed_;                         // [n_blocks] by_hash_ points at it
  std::vector<int32_t> free_;                         // unreferenced, not indexed
  std::list<int32_t> lru_;                            // unreferenced but indexed, oldest first
  std::vector<std::list<int32_t>::iterator> lru_at_;  // [n_blocks] position in lru_
  std::vector<bool> in_lru_;                          // [n_blocks]
  std::unordered_map<uint64_t, int32_t> by_hash_;
  uint64_t next_prefix_id_ = 1;
  int64_t rejected_hits_ = 0;
};

}  // namespace tandem
