// The scheduler's paging: a sequence's block table in the pool, admission through the prefix
// cache, blocks as it grows, preemption when the pool runs out, and publishing full blocks.
#include <algorithm>

#include "engine/scheduler_seq.h"

namespace tandem {

bool Scheduler::admit(Seq& s) {
  // Reuse cached full blocks of the prefix; at least one token stays to compute, for logits.
  // Each hit is verified by the pool (token ids and parent), so a hash collision is a miss.
  const int64_t B = pool_.block_tokens();
  uint64_t parent = s.cache_root;
  const int64_t reusable = opts_.no_kv_cache ? 0 : ((int64_t)s.tokens.size() - 1) / B;
  for (int64_t k = 0; k < reusable; k++) {
    const std::span<const int32_t> block(s.tokens.data() + k * B, (size_t)B);
    const uint64_t h = pool_.chain_hash(parent, block);
    const int32_t b = pool_.lookup(k ? s.blocks.back() : -1, h, block, s.cache_root);
    if (b < 0) break;
    s.blocks.push_back(b);
    s.hashes.push_back(h);
    parent = h;
  }
  s.n_computed = (int64_t)s.blocks.size() * B;
  s.n_cached_now = s.n_computed;
  const bool first_time = !s.admitted;
  if (first_time) s.n_cached = (int)s.n_computed;
  // Blocks for every token it holds: a sequence admitted with room for one chunk would take the
  // rest by preempting others mid-prefill, and be preempted in turn.
  if (!ensure_blocks(s, (int64_t)s.tokens.size())) {
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

bool Scheduler::ensure_blocks(Seq& s, int64_t upto) {
  const int64_t B = pool_.block_tokens();
  while ((int64_t)s.blocks.size() * B < upto) {
    const int32_t b = pool_.allocate();
    if (b < 0) return false;
    s.blocks.push_back(b);
    s.hashes.push_back(0);
  }
  return true;
}

void Scheduler::preempt(Seq& s) {
  // Free everything; the sequence restarts from its tokens so far (prompt + generated). Only a
  // sequence that loses computed K,V counts: one admitted this step loses nothing.
  if (s.n_computed > s.n_cached_now) stats_.preemptions++, s.n_preemptions++;
  release_blocks(s);
  s.n_computed = 0;
  s.generated_at_preemption = s.n_generated;
}

Scheduler::Seq* Scheduler::preemption_victim() {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it)
    if ((*it)->n_generated > (*it)->generated_at_preemption) return it->get();
  return nullptr;
}

void Scheduler::release_blocks(Seq& s) {
  // Last block first: the LRU then evicts a cached prefix from its end, and what stays cached
  // is still a prefix that a later request can reach from the start.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) pool_.release(*it);
  s.blocks.clear();
  s.hashes.clear();
  trim_draft_blocks(s, 0);
  s.draft_computed = 0;
}

void Scheduler::publish_full_blocks(Seq& s) {
  const int64_t B = pool_.block_tokens();
  const int64_t full = s.n_computed / B;
  for (int64_t k = 0; k < full && k < (int64_t)s.blocks.size(); k++) {
    if (s.hashes[(size_t)k] != 0) continue;
    const uint64_t parent = k ? s.hashes[(size_t)k - 1] : s.cache_root;
    const std::span<const int32_t> block(s.tokens.data() + k * B, (size_t)B);
    s.hashes[(size_t)k] = pool_.chain_hash(parent, block);
    pool_.publish(s.blocks[(size_t)k], k ? s.blocks[(size_t)k - 1] : -1, s.hashes[(size_t)k], block, s.cache_root);
  }
}

void Scheduler::trim_blocks(Seq& s, int64_t upto) {
  const int64_t B = pool_.block_tokens();
  const size_t keep = (size_t)((upto + B - 1) / B);
  while (s.blocks.size() > keep) {
    pool_.release(s.blocks.back());
    s.blocks.pop_back();
    s.hashes.pop_back();
  }
}

}  // namespace tandem
