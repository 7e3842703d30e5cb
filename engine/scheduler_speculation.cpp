// The scheduler's side of speculative decoding (engine/speculator.h does the drafting and the
// verdicts): which sequences of a step may draft, the draft tokens joining the pass, and after
// the pass what the target kept of its own K,V.
#include <algorithm>

#include "engine/scheduler_seq.h"

namespace tandem {

void Scheduler::propose_drafts(std::vector<Planned>& plan, int64_t budget) {
  // Drafts come last and only into blocks free now: they never preempt or delay real work.
  if (opts_.no_kv_cache) return;
  std::vector<DraftRequest> reqs;
  for (Planned& p : plan) {
    Seq& s = *p.seq;
    s.spec.clear_draft();
    const bool decoding = p.n == 1 && s.n_computed + 1 == (int64_t)s.tokens.size();
    if (!decoding || s.spec.params.mode == SpeculativeMode::Off) continue;
    DraftRequest r;
    r.spec = &s.spec;
    r.tokens = s.tokens;
    r.kv = &s.kv;
    r.room = s.params.max_tokens - s.n_generated - 1;  // the step adds the target's own token after them
    if (s.matcher) r.prune = [this, &s](std::vector<int32_t>& draft) { prune_draft_to_grammar(s, draft); };
    reqs.push_back(std::move(r));
  }
  if (reqs.empty() || speculator_.propose(reqs, budget) == 0) return;
  for (Planned& p : plan) p.n += (int64_t)p.seq->spec.draft.size();
}

void Scheduler::draft_prefill(const std::vector<Planned>& plan) {
  std::vector<PrefillChunk> chunks;
  for (const Planned& p : plan) {
    Seq& s = *p.seq;
    // n_computed is the target's before this pass.
    const bool prefilling = s.spec.draft.empty() && s.n_computed + 1 < (int64_t)s.tokens.size();
    if (prefilling && s.spec.params.mode == SpeculativeMode::Draft) chunks.push_back({&s.spec, s.tokens, s.n_computed + p.n});
  }
  if (!chunks.empty()) speculator_.prefill(chunks);
}

void Scheduler::verify_draft(Seq& s, std::span<const float> rows, std::vector<Seq*>& done) {
  VerifySteps steps;
  steps.sample = [&](std::span<const float> row) { return sample_next(s, row); };
  steps.judge = [&](std::span<const float> row, int32_t draft, std::span<const TokenProb> q) -> std::optional<Sampler::Verdict> {
    std::shared_ptr<const grammar::TokenMask> keep;
    const std::span<const uint64_t> allowed = allowed_tokens(s, keep);
    if (s.finished) return std::nullopt;
    return q.empty() ? s.sampler.verify(row, s.tokens, draft, allowed) : s.sampler.verify(row, s.tokens, draft, q, allowed);
  };
  steps.emit = [&](int32_t tok, std::span<const float> row) { return emit(s, tok, row, done); };
  const Speculator::Verified v = speculator_.verify(s.spec, rows, steps);
  if (!v.alive) return;  // finished (its blocks are gone) or about to be
  // The accepted drafts' K,V were computed from accepted tokens only: they stay. Positions
  // past them are rolled back: beyond the context length nothing reads them, and the blocks
  // that only they used go back to the pool (the next step takes what it needs, as after a
  // plain decode step).
  s.n_computed += v.accepted;
  s.kv.trim(s.n_computed);
  s.kv.publish_full(s.tokens, s.n_computed);
  s.kv.drop_out_of_window(s.n_computed);
  Speculator::rollback(s.spec, s.n_computed);
}

}  // namespace tandem
