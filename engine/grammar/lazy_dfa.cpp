#include "engine/grammar/lazy_dfa.h"

#include <algorithm>

namespace tandem::grammar {

namespace {
StateLimits truncated_limits(StateLimits l) {
  l.max_stacks /= kTruncatedMargin;
  l.max_settle_work /= kTruncatedMargin;
  l.max_state_ints /= kTruncatedMargin;
  return l;
}
}  // namespace

LazyDfa::LazyDfa(const FlatGrammar& g, std::span<const int32_t> flat_state, bool truncated, const StateLimits& limits,
                 MaskBudget& budget)
    : arena_(g, truncated ? truncated_limits(limits) : limits), truncated_(truncated), budget_(budget) {
  sets_.emplace_back();  // kDead
  escaped_.push_back(0);
  next_.assign(256, kDead);
  std::vector<int32_t> tops;
  arena_.unflatten(flat_state, tops);
  start_ = tops.empty() ? kDead : id_of(tops, false);
}

int32_t LazyDfa::fill(int32_t id, uint8_t b) {
  if (budget_.exceeded()) return kDead;  // not stored: the table stays true to the grammar
  const bool ok = arena_.step(sets_[id], b, scratch_);
  if (!ok && !truncated_)
    budget_.fail(fmt::format("grammar budget: a token here would leave {}", describe(arena_.overflow(), arena_.limits())));
  const size_t rows = sets_.size();
  // Past the (lowered) bounds a truncated walk cannot tell: the full state decides.
  const bool escaped = escaped_[id] || (truncated_ && (arena_.escaped() || !ok));
  int32_t next = kDead;
  if (ok && !scratch_.empty()) {
    next = id_of(scratch_, escaped);
  } else if (escaped) {
    next = kUncertain;
  }
  // Sorting the new set and finding it in ids_ cost ~8 steps per stack (measured on issue 34's
  // probe: ~20 ns per stack and fill); a new row costs its table entries and its stack set
  // (kept twice: sets_ and ids_).
  const size_t stored = sets_.size() > rows ? 256 + 2 * scratch_.size() : 0;
  if (!budget_.charge(arena_.last_work() + 8 * scratch_.size() + stored)) return kDead;
  next_[(size_t)id * 256 + b] = next;
  return next;
}

int32_t LazyDfa::id_of(const std::vector<int32_t>& tops, bool escaped) {
  auto [it, fresh] = ids_.try_emplace(std::make_pair(tops, escaped), (int32_t)sets_.size());
  if (fresh) {
    sets_.push_back(tops);
    escaped_.push_back(escaped);
    next_.resize(next_.size() + 256, kUnknown);
  }
  return it->second;
}

std::vector<int32_t> truncate_state(std::span<const int32_t> flat_state) {
  std::vector<std::span<const int32_t>> stacks;  // positions bottom to top
  for (size_t i = 0; i < flat_state.size(); i += 1 + flat_state[i]) stacks.push_back(flat_state.subspan(i + 1, flat_state[i]));
  if (stacks.empty()) return {};
  size_t cut = stacks[0].size();
  for (const auto& s : stacks) {
    cut = std::min(cut, s.empty() ? 0 : s.size() - 1);
    size_t common = 0;
    while (common < cut && s[common] == stacks[0][common]) common++;
    cut = common;
  }
  if (cut == 0) return {};
  std::vector<std::vector<int32_t>> kept;
  for (const auto& s : stacks) {
    std::vector<int32_t> k{StackArena::kBottomMark};
    k.insert(k.end(), s.begin() + (ptrdiff_t)cut, s.end());
    kept.push_back(std::move(k));
  }
  std::sort(kept.begin(), kept.end());
  std::vector<int32_t> flat;
  for (const auto& k : kept) {
    flat.push_back((int32_t)k.size());
    flat.insert(flat.end(), k.begin(), k.end());
  }
  return flat;
}

}  // namespace tandem::grammar
