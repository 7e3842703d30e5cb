// The scheduler's paging: admission through the prefix cache, blocks as a sequence grows,
// preemption when the pool runs out. A sequence's blocks themselves (one table per layer group,
// window groups holding only what a later query reads, the prefix cache's hashes) are its
// BlockTable's (kv/block_table.h).
#include <algorithm>

#include "engine/scheduler_seq.h"

namespace tandem {

bool Scheduler::admit(Seq& s) {
  // Reuse cached full blocks of the prefix; at least one token stays to compute, for logits.
  const int64_t n = (int64_t)s.tokens.size();
  s.n_computed = opts_.no_kv_cache ? 0 : s.kv.match_prefix(std::span<const int32_t>(s.tokens).first((size_t)n - 1));
  s.n_cached_now = s.n_computed;
  const bool first_time = !s.admitted;
  if (first_time) s.n_cached = (int)s.n_computed;
  // Blocks for every token it holds: a sequence admitted with room for one chunk would take the
  // rest by preempting others mid-prefill, and be preempted in turn. Window groups reuse their
  // blocks as prefill moves on: the first chunk's are enough.
  if (!s.kv.grow_to(n, s.n_computed, std::min(n, s.n_computed + opts_.max_batch_tokens))) {
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

int64_t Scheduler::blocks_for_tokens(int64_t n_tokens) const {
  return pool_.groups().blocks_per_sequence(n_tokens, pool_.block_tokens(), opts_.max_batch_tokens);
}

void Scheduler::preempt(Seq& s) {
  // Free everything; the sequence restarts from its tokens so far (prompt + generated). Only a
  // sequence that loses computed K,V counts: one admitted this step loses nothing.
  if (s.n_computed > s.n_cached_now) stats_.preemptions++, s.n_preemptions++;
  release_blocks(s);
  s.n_computed = 0;
  s.generated_at_preemption = s.n_generated;
}

void Scheduler::requeue(Seq& s, bool at_front) {
  preempt(s);
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r.get() == &s; });
  if (at_front) waiting_.push_front(std::move(*it));
  else waiting_.push_back(std::move(*it));
  running_.erase(it);
}

void Scheduler::release_blocks(Seq& s) {
  s.kv.release();
  s.spec.release();
}

}  // namespace tandem
