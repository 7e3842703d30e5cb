// The scheduler's paging: a sequence's block tables in the pool (one per layer group; window
// groups hold only what a later query reads), admission through the prefix cache, blocks as it
// grows, preemption when the pool runs out, and publishing full blocks.
#include <algorithm>

#include "engine/scheduler_seq.h"

namespace tandem {

bool Scheduler::admit(Seq& s) {
  // Reuse cached full blocks of the prefix; at least one token stays to compute, for logits.
  // Each hit is verified by the pool (token ids and parent), so a hash collision is a miss.
  const int64_t B = pool_.block_tokens();
  std::vector<int32_t>& blocks = s.tables[0];
  uint64_t parent = s.cache_root;
  const int64_t reusable = opts_.no_kv_cache ? 0 : ((int64_t)s.tokens.size() - 1) / B;
  for (int64_t k = 0; k < reusable; k++) {
    const std::span<const int32_t> block(s.tokens.data() + k * B, (size_t)B);
    const uint64_t h = pool_.chain_hash(parent, block);
    const int32_t b = pool_.lookup(k ? blocks.back() : -1, h, block, s.cache_root);
    if (b < 0) break;
    blocks.push_back(b);
    s.hashes.push_back(h);
    parent = h;
  }
  if (pool_.groups().n_groups() > 1) lookup_beside(s);
  s.n_computed = (int64_t)blocks.size() * B;
  s.n_cached_now = s.n_computed;
  const bool first_time = !s.admitted;
  if (first_time) s.n_cached = (int)s.n_computed;
  // Blocks for every token it holds: a sequence admitted with room for one chunk would take the
  // rest by preempting others mid-prefill, and be preempted in turn. Window groups reuse their
  // blocks as prefill moves on: the first chunk's are enough.
  const int64_t n = (int64_t)s.tokens.size();
  if (!ensure_blocks(s, n, std::min(n, s.n_computed + opts_.max_batch_tokens))) {
    release_blocks(s);
    s.n_computed = 0;
    if (first_time) s.n_cached = 0;
    return false;
  }
  if (first_time) {
    stats_.prompt_tokens += s.n_prompt;
    stats_.cached_prompt_tokens += s.n_cached;
  }
  s.admitted = true;
  return true;
}

uint64_t Scheduler::beside_hash(const Seq& s, int group, int64_t k) const {
  const int32_t g = group;
  return pool_.chain_hash(s.hashes[(size_t)k], std::span<const int32_t>(&g, 1));
}

void Scheduler::lookup_beside(Seq& s) {
  // Each group's blocks are cached (and evicted) on their own, beside group 0's block of the
  // same positions. A hit of m blocks needs, in a full group, all m; in a window group, those
  // of the window before position m x B (the first query to compute). The hit is cut back to
  // the longest prefix every group can serve; a cut that leaves less than a window's worth of
  // a window group's blocks cached before it is cut further, down to no hit.
  const KvLayerGroups& groups = pool_.groups();
  const int64_t B = pool_.block_tokens();
  std::vector<int32_t>& blocks = s.tables[0];
  int64_t m = (int64_t)blocks.size();
  auto block_tokens = [&](int64_t k) { return std::span<const int32_t>(s.tokens.data() + k * B, (size_t)B); };
  // run[g][k]: how many of group g's blocks up to k it holds in a row.
  std::vector<std::vector<int64_t>> run((size_t)groups.n_groups(), std::vector<int64_t>((size_t)m));
  for (int g = 1; g < groups.n_groups(); g++)
    for (int64_t k = 0; k < m; k++) {
      const bool held = pool_.cached_beside(g, pool_.prefix_id(blocks[(size_t)k]), beside_hash(s, g, k), block_tokens(k));
      run[(size_t)g][(size_t)k] = held ? (k ? run[(size_t)g][(size_t)k - 1] : 0) + 1 : 0;
    }
  // A cut for one group moves another's window back: repeat until every group agrees.
  for (bool cut = true; cut;) {
    cut = false;
    for (int g = 1; g < groups.n_groups(); g++)
      while (m > 0 && run[(size_t)g][(size_t)m - 1] < m - groups.first_kept(g, m * B) / B) m--, cut = true;
  }
  while ((int64_t)blocks.size() > m) {
    pool_.release(blocks.back());
    blocks.pop_back();
    s.hashes.pop_back();
  }
  for (int g = 1; g < groups.n_groups(); g++) {
    std::vector<int32_t>& table = s.tables[(size_t)g];
    table.assign((size_t)m, -1);
    for (int64_t k = groups.first_kept(g, m * B) / B; k < m; k++)
      table[(size_t)k] = pool_.lookup_beside(g, pool_.prefix_id(blocks[(size_t)k]), beside_hash(s, g, k), block_tokens(k));
  }
}

bool Scheduler::ensure_blocks(Seq& s, int64_t upto, int64_t window_upto) {
  const int64_t B = pool_.block_tokens();
  const KvLayerGroups& groups = pool_.groups();
  std::vector<int32_t>& blocks = s.tables[0];
  while ((int64_t)blocks.size() * B < upto) {
    const int32_t b = pool_.allocate();
    if (b < 0) return false;
    blocks.push_back(b);
    s.hashes.push_back(0);
  }
  for (int g = 1; g < groups.n_groups(); g++) {
    const bool window = groups.window[(size_t)g] > 0;
    const int64_t end = ((window && window_upto >= 0 ? window_upto : upto) + B - 1) / B;
    std::vector<int32_t>& table = s.tables[(size_t)g];
    // Blocks the next query no longer reads stay -1 (naive mode recomputes from 0: it keeps all).
    for (int64_t k = window ? groups.first_kept(g, s.n_computed) / B : 0; k < end; k++) {
      if (k < (int64_t)table.size() && table[(size_t)k] >= 0) continue;
      const int32_t b = pool_.allocate();
      if (b < 0) return false;
      if (k >= (int64_t)table.size()) table.resize((size_t)k + 1, -1);
      table[(size_t)k] = b;
    }
  }
  return true;
}

void Scheduler::drop_out_of_window(Seq& s) {
  const KvLayerGroups& groups = pool_.groups();
  for (int g = 1; g < groups.n_groups(); g++) {
    if (groups.window[(size_t)g] <= 0) continue;
    std::vector<int32_t>& table = s.tables[(size_t)g];
    const size_t first = std::min(table.size(), (size_t)(groups.first_kept(g, s.n_computed) / pool_.block_tokens()));
    for (size_t k = 0; k < first; k++)
      if (table[k] >= 0) pool_.release(table[k]), table[k] = -1;
  }
}

int64_t Scheduler::held_positions(const Seq& s) const {
  size_t n = s.tables[0].size();
  for (const auto& t : s.tables) n = std::min(n, t.size());
  return (int64_t)n * pool_.block_tokens();
}

int64_t Scheduler::blocks_for_tokens(int64_t n_tokens) const {
  const KvLayerGroups& groups = pool_.groups();
  const int64_t B = pool_.block_tokens(), all = (n_tokens + B - 1) / B;
  int64_t n = 0;
  for (int64_t w : groups.window)  // a window group: the window before a chunk, and the chunk
    n += w > 0 ? std::min(all, (w - 1 + opts_.max_batch_tokens + B - 1) / B + 1) : all;
  return n;
}

void Scheduler::preempt(Seq& s) {
  // Free everything; the sequence restarts from its tokens so far (prompt + generated). Only a
  // sequence that loses computed K,V counts: one admitted this step loses nothing.
  if (s.n_computed > s.n_cached_now) stats_.preemptions++, s.n_preemptions++;
  release_blocks(s);
  s.n_computed = 0;
  s.generated_at_preemption = s.n_generated;
}

void Scheduler::release_blocks(Seq& s) {
  // Last block first: the LRU then evicts a cached prefix from its end, and what stays cached
  // is still a prefix that a later request can reach from the start.
  for (std::vector<int32_t>& table : s.tables) {
    for (auto it = table.rbegin(); it != table.rend(); ++it)
      if (*it >= 0) pool_.release(*it);
    table.clear();
  }
  s.hashes.clear();
  trim_draft_blocks(s, 0);
  s.draft_computed = 0;
}

void Scheduler::publish_full_blocks(Seq& s) {
  // Group 0's chain first; the other groups' blocks of the same positions beside it.
  const int64_t B = pool_.block_tokens();
  const std::vector<int32_t>& blocks = s.tables[0];
  const int64_t full = s.n_computed / B;
  for (int64_t k = 0; k < full && k < (int64_t)blocks.size(); k++) {
    if (s.hashes[(size_t)k] != 0) continue;
    const uint64_t parent = k ? s.hashes[(size_t)k - 1] : s.cache_root;
    const std::span<const int32_t> block(s.tokens.data() + k * B, (size_t)B);
    s.hashes[(size_t)k] = pool_.chain_hash(parent, block);
    pool_.publish(blocks[(size_t)k], k ? blocks[(size_t)k - 1] : -1, s.hashes[(size_t)k], block, s.cache_root);
    const uint64_t anchor = pool_.prefix_id(blocks[(size_t)k]);
    for (int g = 1; g < (int)s.tables.size(); g++) {
      const std::vector<int32_t>& table = s.tables[(size_t)g];
      if (k < (int64_t)table.size() && table[(size_t)k] >= 0)
        pool_.publish_beside(table[(size_t)k], g, anchor, beside_hash(s, g, k), block);
    }
  }
}

void Scheduler::trim_blocks(Seq& s, int64_t upto) {
  const int64_t B = pool_.block_tokens();
  const size_t keep = (size_t)((upto + B - 1) / B);
  for (std::vector<int32_t>& table : s.tables)
    while (table.size() > keep) {
      if (table.back() >= 0) pool_.release(table.back());
      table.pop_back();
    }
  s.hashes.resize(std::min(s.hashes.size(), keep));
}

}  // namespace tandem
