// A pushdown recognizer over bytes for a Grammar: which byte strings can continue the text so
// far, and whether the text so far is a complete sentence.
//
// The state is the set of parser stacks the text so far leaves (stack_arena.h explains them),
// kept in a canonical flat form: two matchers that reached the same state compare and hash
// equal, which is what the token masker's cache is keyed by. A copy is a checkpoint (speculative
// drafts, rollback): it shares the grammar and owns a small vector of ints.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/stack_arena.h"

namespace tandem::grammar {

class Matcher {
 public:
  // The grammar should have passed validate(). Errors: a reference out of range, a rule without
  // alternatives, or a start that passes `limits` (too many parses at once: an ambiguous
  // grammar, or left recursion).
  static Result<Matcher> create(std::shared_ptr<const Grammar> g, const StateLimits& limits = {});

  // Advances over `bytes`; false, with the state unchanged, when they cannot continue a sentence
  // or a byte would pass the state limits (then budget_error() says which, else it is empty).
  bool accept(std::string_view bytes);
  bool can_accept(std::string_view bytes) const;  // false also past the limits
  const std::string& budget_error() const { return budget_error_; }
  const StateLimits& limits() const { return limits_; }
  bool can_end() const;   // the bytes so far are a complete sentence
  bool must_end() const;  // can_end() and no byte can follow
  const Grammar& grammar() const { return *flat_->source; }

  // For the token masker: the flattened grammar, and the state in canonical form (equal states
  // of one grammar give equal spans) with its hash.
  const std::shared_ptr<const FlatGrammar>& flat_grammar() const { return flat_; }
  std::span<const int32_t> state() const { return state_; }
  uint64_t state_hash() const { return hash_; }
  size_t n_stacks() const;

 private:
  Matcher(std::shared_ptr<const FlatGrammar> flat, std::vector<int32_t> state, const StateLimits& limits);
  // The state after `bytes`; false when they cannot continue a sentence or pass the limits
  // (`overflow` says which).
  bool advance(std::string_view bytes, std::vector<int32_t>& state, Overflow& overflow) const;

  std::shared_ptr<const FlatGrammar> flat_;
  std::vector<int32_t> state_;  // StackArena::flatten's form
  uint64_t hash_ = 0;
  StateLimits limits_;
  std::string budget_error_;  // why the last accept() failed, when a limit was the reason
};

// The hash Matcher::state_hash gives a flat state.
uint64_t hash_state(std::span<const int32_t> state);

}  // namespace tandem::grammar
