#include "kv/block_table.h"

#include <algorithm>
#include <climits>
#include <utility>

namespace tandem {

BlockTable::BlockTable(BlockPool& pool, uint64_t cache_root)
    : pool_(&pool), cache_root_(cache_root), tables_((size_t)pool.groups().n_groups()) {}

BlockTable& BlockTable::operator=(BlockTable&& o) noexcept {
  if (this == &o) return *this;
  release();
  pool_ = std::exchange(o.pool_, nullptr);
  cache_root_ = o.cache_root_;
  tables_ = std::move(o.tables_);
  hashes_ = std::move(o.hashes_);
  o.tables_.clear();
  o.hashes_.clear();
  return *this;
}

int64_t BlockTable::held_positions() const {
  if (tables_.empty()) return 0;
  size_t n = tables_[0].size();
  for (const auto& t : tables_) n = std::min(n, t.size());
  return (int64_t)n * pool_->block_tokens();
}

int64_t BlockTable::n_blocks() const {
  int64_t n = 0;
  for (const auto& t : tables_) n += std::count_if(t.begin(), t.end(), [](int32_t b) { return b >= 0; });
  return n;
}

bool BlockTable::grow_to(int64_t upto, int64_t computed, int64_t window_upto) {
  if (!pool_) return upto <= 0;
  const int64_t B = pool_->block_tokens();
  const KvLayerGroups& groups = pool_->groups();
  std::vector<int32_t>& blocks = tables_[0];
  while ((int64_t)blocks.size() * B < upto) {
    const int32_t b = pool_->allocate();
    if (b < 0) return false;
    blocks.push_back(b);
    hashes_.push_back(0);
  }
  for (int g = 1; g < groups.n_groups(); g++) {
    const bool window = groups.window[(size_t)g] > 0;
    const int64_t end = ((window && window_upto >= 0 ? window_upto : upto) + B - 1) / B;
    std::vector<int32_t>& table = tables_[(size_t)g];
    // Blocks no query after `computed` reads stay -1 (recomputing from 0 reads them all).
    for (int64_t k = window ? first_kept_block(*pool_, g, computed) : 0; k < end; k++) {
      if (k < (int64_t)table.size() && table[(size_t)k] >= 0) continue;
      const int32_t b = pool_->allocate();
      if (b < 0) return false;
      if (k >= (int64_t)table.size()) table.resize((size_t)k + 1, -1);
      table[(size_t)k] = b;
    }
  }
  return true;
}

void BlockTable::trim(int64_t upto) {
  if (!pool_) return;
  const int64_t B = pool_->block_tokens();
  const size_t keep = (size_t)((std::max<int64_t>(0, upto) + B - 1) / B);
  for (std::vector<int32_t>& table : tables_)
    while (table.size() > keep) {
      if (table.back() >= 0) pool_->release(table.back());
      table.pop_back();
    }
  hashes_.resize(std::min(hashes_.size(), keep));
}

void BlockTable::drop_out_of_window(int64_t computed) {
  if (!pool_) return;
  const KvLayerGroups& groups = pool_->groups();
  for (int g = 1; g < groups.n_groups(); g++) {
    if (groups.window[(size_t)g] <= 0) continue;
    std::vector<int32_t>& table = tables_[(size_t)g];
    const size_t first = std::min(table.size(), (size_t)first_kept_block(*pool_, g, computed));
    for (size_t k = 0; k < first; k++)
      if (table[k] >= 0) pool_->release(table[k]), table[k] = -1;
  }
}

void BlockTable::release() {
  // Last block first: the LRU then evicts a cached prefix from its end, and what stays cached
  // is still a prefix that a later request can reach from the start.
  for (std::vector<int32_t>& table : tables_) {
    for (auto it = table.rbegin(); it != table.rend(); ++it)
      if (*it >= 0) pool_->release(*it);
    table.clear();
  }
  hashes_.clear();
}

int64_t BlockTable::match_prefix(std::span<const int32_t> tokens) {
  // Each hit is verified by the pool (token ids and parent), so a hash collision is a miss.
  if (!pool_ || !tables_[0].empty()) return 0;
  const int64_t B = pool_->block_tokens();
  std::vector<int32_t>& blocks = tables_[0];
  uint64_t parent = cache_root_;
  for (int64_t k = 0; k < (int64_t)tokens.size() / B; k++) {
    const std::span<const int32_t> block = tokens.subspan((size_t)(k * B), (size_t)B);
    const uint64_t h = pool_->chain_hash(parent, block);
    const int32_t b = pool_->lookup(k ? blocks.back() : -1, h, block, cache_root_);
    if (b < 0) break;
    blocks.push_back(b);
    hashes_.push_back(h);
    parent = h;
  }
  if (n_groups() > 1) return match_beside(tokens);
  return (int64_t)blocks.size() * B;
}

uint64_t BlockTable::beside_hash(int group, int64_t k) const {
  const int32_t g = group;
  return pool_->chain_hash(hashes_[(size_t)k], std::span<const int32_t>(&g, 1));
}

int64_t BlockTable::match_beside(std::span<const int32_t> tokens) {
  // Each group's blocks are cached (and evicted) on their own, beside group 0's block of the
  // same positions. A hit of m blocks needs, in a full group, all m; in a window group, those
  // of the window before position m x B (the first query to compute). The hit is cut back to
  // the longest prefix every group can serve; a cut that leaves less than a window's worth of
  // a window group's blocks cached before it is cut further, down to no hit.
  const KvLayerGroups& groups = pool_->groups();
  const int64_t B = pool_->block_tokens();
  std::vector<int32_t>& blocks = tables_[0];
  int64_t m = (int64_t)blocks.size();
  auto block_tokens = [&](int64_t k) { return tokens.subspan((size_t)(k * B), (size_t)B); };
  // run[g][k]: how many of group g's blocks up to k it holds in a row.
  std::vector<std::vector<int64_t>> run((size_t)groups.n_groups(), std::vector<int64_t>((size_t)m));
  for (int g = 1; g < groups.n_groups(); g++)
    for (int64_t k = 0; k < m; k++) {
      const bool held = pool_->cached_beside(g, pool_->prefix_id(blocks[(size_t)k]), beside_hash(g, k), block_tokens(k));
      run[(size_t)g][(size_t)k] = held ? (k ? run[(size_t)g][(size_t)k - 1] : 0) + 1 : 0;
    }
  // A cut for one group moves another's window back: repeat until every group agrees.
  for (bool cut = true; cut;) {
    cut = false;
    for (int g = 1; g < groups.n_groups(); g++)
      while (m > 0 && run[(size_t)g][(size_t)m - 1] < m - first_kept_block(*pool_, g, m * B)) m--, cut = true;
  }
  trim(m * B);
  for (int g = 1; g < groups.n_groups(); g++) {
    std::vector<int32_t>& table = tables_[(size_t)g];
    table.assign((size_t)m, -1);
    for (int64_t k = first_kept_block(*pool_, g, m * B); k < m; k++)
      table[(size_t)k] = pool_->lookup_beside(g, pool_->prefix_id(blocks[(size_t)k]), beside_hash(g, k), block_tokens(k));
  }
  return m * B;
}

void BlockTable::publish_full(std::span<const int32_t> tokens, int64_t computed) {
  if (!pool_) return;
  const int64_t B = pool_->block_tokens();
  const std::vector<int32_t>& blocks = tables_[0];
  const int64_t full = std::min<int64_t>(computed, (int64_t)tokens.size()) / B;
  for (int64_t k = 0; k < full && k < (int64_t)blocks.size(); k++) {
    if (hashes_[(size_t)k] != 0) continue;
    const uint64_t parent = k ? hashes_[(size_t)k - 1] : cache_root_;
    const std::span<const int32_t> block = tokens.subspan((size_t)(k * B), (size_t)B);
    hashes_[(size_t)k] = pool_->chain_hash(parent, block);
    pool_->publish(blocks[(size_t)k], k ? blocks[(size_t)k - 1] : -1, hashes_[(size_t)k], block, cache_root_);
    const uint64_t anchor = pool_->prefix_id(blocks[(size_t)k]);
    for (int g = 1; g < n_groups(); g++) {
      const std::vector<int32_t>& table = tables_[(size_t)g];
      if (k < (int64_t)table.size() && table[(size_t)k] >= 0)
        pool_->publish_beside(table[(size_t)k], g, anchor, beside_hash(g, k), block);
    }
  }
}

Status BlockTable::check_group(const BlockPool& pool, int g, std::span<const int32_t> table, int64_t first, int64_t end) {
  // Every block a query at [first, end) reads must be one of the pool's: in a window group,
  // from the first key its earliest query reads.
  const int64_t B = pool.block_tokens(), used = (end + B - 1) / B;
  for (int64_t i = first_kept_block(pool, g, first); i < used; i++) {
    const int32_t b = i < (int64_t)table.size() ? table[(size_t)i] : -1;
    if (b < 0 || b >= pool.n_blocks())
      return make_error("block {} of its table{} is {}, not a block of the pool's {}", i,
                        g ? fmt::format(" for layer group {}", g) : "", b, pool.n_blocks());
  }
  return Status::Ok();
}

Status BlockTable::check_reads(int64_t first, int64_t end) const {
  if (!pool_) return end <= first ? Status::Ok() : make_error("a block table in no pool holds no positions");
  for (int g = 0; g < n_groups(); g++) TANDEM_TRY(check_group(*pool_, g, tables_[(size_t)g], first, end));
  return Status::Ok();
}

Status BlockTable::check_batch(const BlockPool& pool, const ForwardBatch& b) {
  if (b.block_tokens() != pool.block_tokens())
    return make_error("the batch counts {} tokens per KV block; the pool holds {}", b.block_tokens(), pool.block_tokens());
  if (b.n_groups() != pool.groups().n_groups())
    return make_error("the batch has block tables for {} layer groups; the KV pool has {}", b.n_groups(), pool.groups().n_groups());
  std::vector<int64_t> first_pos((size_t)b.n_seq(), INT64_MAX);  // each sequence's earliest query
  for (int64_t t = 0; t < b.n_tokens(); t++) {
    int64_t& f = first_pos[(size_t)b.seq_ids()[(size_t)t]];
    f = std::min(f, b.positions()[(size_t)t]);
  }
  for (int s = 0; s < b.n_seq(); s++) {
    if (first_pos[(size_t)s] == INT64_MAX) continue;  // no query: it reads nothing
    for (int g = 0; g < b.n_groups(); g++)
      if (Status st = check_group(pool, g, b.group(g).block_table(s), first_pos[(size_t)s], b.context_lens()[(size_t)s]); !st.ok())
        return make_error("sequence {}: {}", s, st.error().message);
  }
  return Status::Ok();
}

}  // namespace tandem
