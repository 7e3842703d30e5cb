// Prompt-lookup drafting (n-gram speculation without a second model): text that repeats its
// context (a paragraph rewritten with one change, code edited in place, a quoted passage)
// continues the way an earlier occurrence of its last few tokens did. The drafter finds the
// longest n-gram at the end of the tokens so far that occurred earlier and proposes the tokens
// that followed that occurrence; the target model then verifies them all in one pass.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

struct LookupDraftParams {
  // Shortest suffix worth matching. A single recurring token is weak evidence: on free text
  // its drafts are mostly rejected, so 2 by default.
  int ngram_min = 2;
  int ngram_max = 3;  // longest suffix tried first
};

// Up to `max_tokens` proposed next tokens for `tokens` (prompt and output so far): the suffix of
// length n, for n from ngram_max down to ngram_min, is searched for earlier in `tokens`; the most
// recent earlier occurrence wins, and the tokens after it are the draft. A continuation that runs
// into the suffix itself repeats periodically (a match one period back proposes the period
// again). Empty when no suffix recurs or max_tokens <= 0.
std::vector<int32_t> lookup_draft(std::span<const int32_t> tokens, const LookupDraftParams& p, int max_tokens);

}  // namespace tandem
