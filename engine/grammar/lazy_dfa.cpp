#include "engine/grammar/lazy_dfa.h"

#include <algorithm>

namespace tandem::grammar {

LazyDfa::LazyDfa(const FlatGrammar& g, std::span<const int32_t> flat_state, bool truncated)
    : arena_(g), truncated_(truncated) {
  if (truncated) arena_.set_limits(kMaxStacks / kTruncatedMargin, kMaxSettleWork / kTruncatedMargin);
  sets_.emplace_back();  // kDead
  escaped_.push_back(0);
  next_.assign(256, kDead);
  std::vector<int32_t> tops;
  arena_.unflatten(flat_state, tops);
  start_ = tops.empty() ? kDead : id_of(tops, false);
}

int32_t LazyDfa::fill(int32_t id, uint8_t b) {
  const bool ok = arena_.step(sets_[id], b, scratch_);
  // Past the (lowered) bounds a truncated walk cannot tell: the full state decides.
  const bool escaped = escaped_[id] || (truncated_ && (arena_.escaped() || !ok));
  int32_t next = kDead;
  if (ok && !scratch_.empty()) {
    next = id_of(scratch_, escaped);
  } else if (escaped) {
    next = kUncertain;
  }
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
