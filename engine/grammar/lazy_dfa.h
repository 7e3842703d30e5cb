// The grammar run as a DFA over sets of stacks, built as far as one walk of the token trie needs
// it: each distinct set of stacks gets a small id and a 256-entry row of next ids, filled the
// first time a byte is tried, so most trie nodes cost one table lookup.
//
// A truncated DFA starts from a state whose stacks lost the bottom frames they all share
// (truncate_state): the token masker walks it once and shares the result among every state
// with the same top, e.g. every string of a JSON Schema whatever property it belongs to, or a
// string at any nesting of "any JSON". A parse that pops below the kept frames "escapes": its
// outcome depends on the frames cut off.
// The DFA then marks the path: an id carries whether an escape happened on the way to it, and a
// prefix on which every parse died after an escape is kUncertain rather than dead, since the
// full state may still read it.
//
// Every fill is charged to the mask's MaskBudget (its settle steps, the stack ints it stores, a
// new row), and a state bound passed on a full (not truncated) state ends the mask with an error:
// an ambiguous grammar stops at the budget instead of walking the trie for seconds.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "engine/grammar/stack_arena.h"

namespace tandem::grammar {

class LazyDfa {
 public:
  static constexpr int32_t kUnknown = -1;    // table entry not yet filled
  static constexpr int32_t kDead = 0;        // no parse reads this prefix
  static constexpr int32_t kUncertain = -2;  // truncated: decided by the full state

  // flat_state: Matcher::state(), or truncate_state() of it with truncated = true; limits: the
  // matcher's (a truncated DFA runs under a fraction of them). `budget` outlives the DFA.
  LazyDfa(const FlatGrammar& g, std::span<const int32_t> flat_state, bool truncated, const StateLimits& limits,
          MaskBudget& budget);
  int32_t start() const { return start_; }

  // [id * 256 + byte]: the next id, or kUnknown (then fill() it), kDead, kUncertain. Valid until
  // the next fill(). Once the budget is exceeded every fill answers kDead: the walk ends soon,
  // and its caller reads budget().exceeded().
  const int32_t* table() const { return next_.data(); }
  int32_t fill(int32_t id, uint8_t b);
  const MaskBudget& budget() const { return budget_; }

 private:
  int32_t id_of(const std::vector<int32_t>& tops, bool escaped);

  StackArena arena_;
  bool truncated_;
  MaskBudget& budget_;
  std::vector<std::vector<int32_t>> sets_;  // id -> sorted stack tops
  std::vector<uint8_t> escaped_;            // id -> an escape happened on the way
  std::map<std::pair<std::vector<int32_t>, bool>, int32_t> ids_;
  std::vector<int32_t> next_;
  std::vector<int32_t> scratch_;
  int32_t start_ = kDead;
};

// The truncated DFA runs under 1/kTruncatedMargin of the matcher's bounds (stacks, settle work,
// state ints), leaving the full state room for what the cut-off frames add; past them it says
// kUncertain.
inline constexpr size_t kTruncatedMargin = 8;

// The flat state without the bottom frames all its stacks share, each stack keeping at least its
// top frame, over StackArena::kBottomMark; in canonical form. Empty when nothing can be cut (a
// stack is empty, or the stacks share no bottom frame).
std::vector<int32_t> truncate_state(std::span<const int32_t> flat_state);

}  // namespace tandem::grammar
