// Constrained decoding, as the scheduler applies it: the grammar's mask for a sequence's next
// token, sampling under it (a greedy fast path checks one token instead), and cutting a draft
// at the first token the grammar refuses.
#include "core/timer.h"
#include "engine/scheduler_seq.h"

namespace tandem {

std::span<const uint64_t> Scheduler::allowed_tokens(Seq& s, std::shared_ptr<const grammar::TokenMask>& keep) {
  if (!s.matcher) return {};
  Timer t;
  keep = opts_.masker->mask(*s.matcher);
  stats_.masks++;
  stats_.mask_s += t.seconds();
  if (!keep->budget_error.empty()) {
    opts_.masker->forget(&s.matcher->grammar());  // its states are done with
    s.over_budget = true;
    finish(s, FinishReason::Error, keep->budget_error);
    return {};
  }
  if (keep->count() == 0) {
    finish(s, FinishReason::Error, "the grammar allows no token of the vocabulary here");
    return {};
  }
  return keep->bits;
}

int32_t Scheduler::sample_next(Seq& s, std::span<const float> row) {
  if (!s.matcher) return s.sampler.sample(row, s.tokens);
  if (s.params.sampling.temperature <= 0.0f) {
    // Greedy: when the unconstrained choice (after the repetition penalty) is allowed it is
    // also the best allowed token, so one token's check replaces the whole mask.
    Timer t;
    const int32_t tok = s.sampler.sample(row, s.tokens);
    const bool ok = opts_.masker->allows(*s.matcher, tok);
    stats_.mask_s += t.seconds();
    if (ok) return tok;
  }
  std::shared_ptr<const grammar::TokenMask> keep;
  const std::span<const uint64_t> allowed = allowed_tokens(s, keep);
  if (s.finished) return -1;
  return s.sampler.sample(row, s.tokens, allowed);
}

void Scheduler::prune_draft_to_grammar(const Seq& s, std::vector<int32_t>& draft) {
  // A drafted token the grammar refuses would be rejected anyway: cut the draft before it, so
  // the pass does not compute positions that cannot be kept.
  if (!s.matcher || draft.empty()) return;
  Timer t;
  grammar::Matcher m = *s.matcher;
  size_t keep = 0;
  while (keep < draft.size() && m.accept(opts_.masker->token_bytes(draft[keep]))) {
    keep++;
    if (m.must_end()) break;  // the sentence is complete: the sequence stops there
  }
  draft.resize(keep);
  stats_.mask_s += t.seconds();
}

}  // namespace tandem
