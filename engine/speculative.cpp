#include "engine/speculative.h"

#include <algorithm>

namespace tandem {

const char* speculative_mode_name(SpeculativeMode m) {
  return m == SpeculativeMode::Lookup ? "lookup" : m == SpeculativeMode::Draft ? "draft" : "off";
}

Result<SpeculativeMode> parse_speculative_mode(const std::string& name) {
  if (name == "off" || name == "none" || name.empty()) return SpeculativeMode::Off;
  if (name == "lookup") return SpeculativeMode::Lookup;
  if (name == "draft") return SpeculativeMode::Draft;
  return make_error("unknown speculative mode '{}' (expected off, lookup or draft)", name);
}

void DraftBackoff::verified(int drafted, int accepted, double min_rate) {
  if (drafted <= 0) return;
  cap_ = accepted >= drafted ? std::min(max_, std::max(1, cap_) * 2) : std::min(max_, accepted + 1);
  const bool paid = accepted >= drafted || (accepted > 0 && (double)accepted >= min_rate * drafted);
  ledger_ = kLedgerDecay * ledger_ + (double)accepted - min_rate * drafted;
  // A draft model whose recent drafts, on balance, are accepted below the rate that pays for
  // them is not paying even when this one does (a lucky token of a poor draft model).
  if (paid && (!draft_model_ || ledger_ >= 0.0)) {
    misses_ = draft_model_ ? std::max(0, misses_ - 1) : 0;
    missed_at_cap_ = 0;
    return;
  }
  declined();  // rejected whole (or not paying): a miss
}

void DraftBackoff::declined() {
  if (++misses_ < 2) return;
  const int doublings = (misses_ - 1) * (draft_model_ ? 2 : 1);  // a draft model's pause quadruples
  pause_ = std::min(max_pause_, 1 << std::min(doublings, 20));
  if (draft_model_ && pause_ == max_pause_ && ++missed_at_cap_ > kGiveUpAtCap) gave_up_ = true;
}

}  // namespace tandem
