// One sequence's KV blocks in a BlockPool: a block table per layer group (kv/layer_groups.h)
// and the prefix cache's chain hash of each full block of group 0. Every sequence whose K,V
// live in a pool holds one: the scheduler's requests, the draft model's K,V of each request,
// SequenceRunner's one sequence. It is the unit a sequence's KV moves in (disaggregated
// serving will hand these between ranks), so it is a value of its own: it holds a reference on
// each block it names, and gives them back when released, trimmed or destroyed.
//
// What it keeps true (check_reads tests it, and Model::forward checks each batch with it):
// after grow_to(upto, computed) every group names a pool block for each position a query in
// [computed, upto) reads; group 0 from position 0 (it is the whole prefix, and the prefix
// cache's chain), a window group from the first position its window still reaches, -1 before.
// The table does not count positions: how many of them hold K,V is its owner's to say.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"
#include "kv/block_pool.h"

namespace tandem {

class BlockTable {
 public:
  BlockTable() = default;  // in no pool: holds nothing and can grow to nothing
  // An empty table over `pool`; `cache_root` is its prefix-cache scope (BlockPool::scope_root).
  explicit BlockTable(BlockPool& pool, uint64_t cache_root = 0);
  ~BlockTable() { release(); }
  BlockTable(BlockTable&& o) noexcept { *this = std::move(o); }
  BlockTable& operator=(BlockTable&& o) noexcept;
  BlockTable(const BlockTable&) = delete;  // each reference is held once
  BlockTable& operator=(const BlockTable&) = delete;

  // Group g's table at g, -1 for a block no later query reads: what ForwardBatch takes.
  std::span<const std::vector<int32_t>> tables() const { return tables_; }
  int n_groups() const { return (int)tables_.size(); }
  // Positions every group's table reaches (the least of them).
  int64_t held_positions() const;
  int64_t n_blocks() const;  // pool blocks it names, all groups together

  // Blocks for every position up to upto - 1 that a query after `computed` positions reads
  // (window groups: up to window_upto instead, when it is given). False when the pool ran
  // out; the blocks taken so far stay.
  bool grow_to(int64_t upto, int64_t computed, int64_t window_upto = -1);
  // Gives back the blocks past position upto - 1 (a rollback, or a shorter sequence).
  void trim(int64_t upto);
  // Window groups give back the blocks no query after `computed` positions reads.
  void drop_out_of_window(int64_t computed);
  // Every block back to the pool.
  void release();

  // Takes the cached full blocks that hold the longest prefix of `tokens`' full blocks into
  // this (empty) table, each hit verified by the pool, in every group (cut back to the
  // prefix every group holds); returns the positions they hold.
  int64_t match_prefix(std::span<const int32_t> tokens);
  // Publishes each full block of the first `computed` positions of `tokens` (their K,V
  // written) to the prefix cache, group 0's chain first and the other groups' blocks beside it.
  void publish_full(std::span<const int32_t> tokens, int64_t computed);

  // Ok when this table names a pool block for every key that queries at [first, end) read.
  Status check_reads(int64_t first, int64_t end) const;
  // The same for every sequence of a batch over `pool` (the batch's own tables).
  static Status check_batch(const BlockPool& pool, const ForwardBatch& batch);

 private:
  static Status check_group(const BlockPool& pool, int g, std::span<const int32_t> table, int64_t first, int64_t end);
  // The first block of group g a query at position `next` reads.
  static int64_t first_kept_block(const BlockPool& pool, int g, int64_t next) {
    return pool.groups().first_kept(g, next) / pool.block_tokens();
  }
  uint64_t beside_hash(int group, int64_t k) const;
  int64_t match_beside(std::span<const int32_t> tokens);

  BlockPool* pool_ = nullptr;
  uint64_t cache_root_ = 0;
  std::vector<std::vector<int32_t>> tables_;  // [n_groups][blocks]
  std::vector<uint64_t> hashes_;              // chain hash of each full block of tables_[0] (0 = not yet)
};

}  // namespace tandem
