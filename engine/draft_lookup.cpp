#include "engine/draft_lookup.h"

#include <algorithm>

namespace tandem {

std::vector<int32_t> lookup_draft(std::span<const int32_t> tokens, const LookupDraftParams& p, int max_tokens) {
  std::vector<int32_t> draft;
  const int64_t size = (int64_t)tokens.size();
  if (max_tokens <= 0 || size < 2) return draft;
  const int64_t lo = std::max(1, p.ngram_min);
  const int64_t hi = std::min<int64_t>(p.ngram_max, size - 1);
  for (int64_t n = hi; n >= lo; n--) {
    const std::span<const int32_t> suffix = tokens.subspan((size_t)(size - n));
    // Most recent occurrence first: the nearest context predicts best. The suffix itself (at
    // size - n) is not an earlier occurrence.
    for (int64_t i = size - n - 1; i >= 0; i--) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) continue;
      // Read on from i + n through the tokens, then through the draft itself: past the end
      // the continuation is the draft's own start again, one period (size - n - i) back.
      for (int64_t j = 0; j < max_tokens; j++) {
        const int64_t at = i + n + j;
        draft.push_back(at < size ? tokens[(size_t)at] : draft[(size_t)(at - size)]);
      }
      return draft;
    }
  }
  return draft;
}

}  // namespace tandem
