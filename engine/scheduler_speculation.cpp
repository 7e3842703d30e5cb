// Speculative rounds in the scheduler: after a step's blocks are planned, decoding sequences
// propose drafts (prompt lookup here, the draft model in scheduler_draft_model.cpp) into free
// blocks only; the target's pass computes them; verify_draft() keeps the accepted prefix and
// rolls back the rest.
#include <algorithm>

#include "engine/draft_lookup.h"
#include "engine/scheduler_seq.h"

namespace tandem {

void Scheduler::propose_drafts(std::vector<Planned>& plan, int64_t budget) {
  // Drafts come last: in a pass that also prefills, the budget left is what prefill did not
  // need, and a draft only takes KV blocks that are free now (it never preempts).
  if (opts_.no_kv_cache) return;
  std::vector<Planned> jobs;  // sequences the draft model drafts for, and how many tokens each may
  for (Planned& p : plan) {
    Seq& s = *p.seq;
    s.draft.clear();
    s.draft_q.clear();
    const bool decoding = p.n == 1 && s.n_computed + 1 == (int64_t)s.tokens.size();
    if (!decoding || s.spec.mode == SpeculativeMode::Off) continue;
    if (s.backoff.allowed() == 0) {
      s.backoff.step_without_draft();
      continue;
    }
    // At most one token short of max_tokens: the step adds the target's own token after them.
    const int64_t k = std::min<int64_t>({s.backoff.allowed(), s.params.max_tokens - s.n_generated - 1, budget});
    if (k <= 0) continue;
    if (s.spec.mode == SpeculativeMode::Draft) {
      // The target's blocks first: draft passes for tokens the verify pass has no room for
      // would be wasted.
      const int64_t fits = fit_draft(s, k);
      if (fits > 0) jobs.push_back({&s, fits}), budget -= fits;
      continue;
    }
    s.draft = lookup_draft(s.tokens, s.spec.lookup, (int)k);
    prune_draft_to_grammar(s);
    s.draft.resize((size_t)fit_draft(s, (int64_t)s.draft.size()));
    budget -= (int64_t)s.draft.size();
  }
  if (!jobs.empty()) {
    draft_with_model(jobs);
    // Blocks reserved for draft tokens the draft model did not propose go back.
    for (const Planned& j : jobs) j.seq->kv.trim(j.seq->n_computed + 1 + (int64_t)j.seq->draft.size());
  }
  for (Planned& p : plan) p.n += (int64_t)p.seq->draft.size();
}

int64_t Scheduler::fit_draft(Seq& s, int64_t k) {
  if (k <= 0 || s.kv.grow_to(s.n_computed + 1 + k, s.n_computed)) return std::max<int64_t>(0, k);
  const int64_t room = s.kv.held_positions() - s.n_computed - 1;
  return std::max<int64_t>(0, room);
}

void Scheduler::verify_draft(Seq& s, std::span<const float> rows, std::vector<Seq*>& done) {
  // Row j holds the target's logits after draft[0..j) (row 0: after the decode token). Walk the
  // draft while the target accepts it; the first rejection's replacement, or after a draft
  // accepted whole the last row's own sample, ends the step.
  const std::vector<int32_t> draft = std::move(s.draft);
  const std::vector<std::vector<TokenProb>> draft_q = std::move(s.draft_q);
  s.draft.clear();
  s.draft_q.clear();
  const size_t V = (size_t)model_.config().n_vocab;
  int accepted = 0;
  bool alive = true;
  for (size_t j = 0; j <= draft.size() && alive; j++) {
    const std::span<const float> row = rows.subspan(j * V, V);
    if (j == draft.size()) {
      const int32_t tok = sample_next(s, row);
      alive = tok >= 0 && emit(s, tok, row, done);
      break;
    }
    std::shared_ptr<const grammar::TokenMask> keep;
    const std::span<const uint64_t> allowed = allowed_tokens(s, keep);
    if (s.finished) {
      alive = false;
      break;
    }
    const Sampler::Verdict v = draft_q.empty() ? s.sampler.verify(row, s.tokens, draft[j], allowed)
                                               : s.sampler.verify(row, s.tokens, draft[j], draft_q[j], allowed);
    if (!v.accepted) {
      alive = emit(s, v.token, row, done);
      break;
    }
    accepted++;
    alive = emit(s, draft[j], row, done);
  }
  stats_.drafted_tokens += (int64_t)draft.size();
  stats_.accepted_tokens += accepted;
  stats_.verify_steps++;
  s.backoff.verified((int)draft.size(), accepted, s.spec.mode == SpeculativeMode::Draft ? draft_cost_ : 0.0);
  if (!alive) return;  // finished (its blocks are gone) or about to be
  // The accepted drafts' K,V were computed from accepted tokens only: they stay. Positions
  // past them are rolled back: beyond the context length nothing reads them, and the blocks
  // that only they used go back to the pool (the next step takes what it needs, as after a
  // plain decode step).
  s.n_computed += accepted;
  s.kv.trim(s.n_computed);
  s.kv.publish_full(s.tokens, s.n_computed);
  s.kv.drop_out_of_window(s.n_computed);
  // The draft model ran the accepted drafts but the last (it only proposed that one) and the
  // rejected ones: it keeps the accepted positions it holds; the next step's catch-up runs
  // what it has not seen (the last accepted draft, the target's own token).
  s.draft_computed = std::min(s.draft_computed, s.n_computed);
  s.draft_kv.trim(s.draft_computed);
}

}  // namespace tandem
