// Which vocabulary tokens may come next under a grammar: the matcher's state turned into a bit
// per token.
//
// The masker walks a byte trie of every token (token_trie.h) depth first, advancing the
// matcher's stacks one byte per trie edge through a lazily built DFA (lazy_dfa.h) and skipping a
// subtree as soon as no stack survives, so a JSON structural position costs a few hundred
// nodes. Two caches make recurring work cheap:
// - masks by the matcher's exact state (its grammar and canonical stacks): a state that recurs
//   (inside a string at the same nesting, after a comma at the same depth) costs a hash lookup;
// - walks by the state's top (truncate_state: the stacks without the bottom frames they share):
//   a string at a new nesting, or another property's string, shares the walk of the top and
//   re-walks only the subtrees whose outcome depended on the frames cut off (tokens that close
//   the string), a few hundred nodes instead of the whole trie.
// Both caches are bounded in bytes, and every mask computation in work and time
// (GrammarBudget, budget.h): a mask past its budget comes back with budget_error set.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/grammar/budget.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/state_cache.h"
#include "engine/grammar/token_trie.h"

namespace tandem {
class Tokenizer;
}

namespace tandem::grammar {

class LazyDfa;

struct TokenMask {  // bit t set <=> token t may come next
  std::vector<uint64_t> bits;
  // Non-empty: the computation passed its budget and stopped (bits incomplete; never cached).
  std::string budget_error;
  bool test(int32_t t) const { return t >= 0 && (size_t)t / 64 < bits.size() && ((bits[t / 64] >> (t % 64)) & 1); }
  size_t count() const;
  size_t heap_bytes() const { return bits.capacity() * sizeof(uint64_t); }
};

// One per vocabulary, shared by every constrained request: mask() and allows() may run on many
// threads at once (a mutex guards the caches; the trie is immutable).
class TokenMasker {
 public:
  // token_bytes[t]: the bytes token t stands for (empty: never allowed); a control token's are
  // its token terminal (token_terminal.h), matched only where a grammar names the token.
  // end_tokens: allowed when the matcher can_end(), or when their bytes are a token terminal
  // the grammar accepts here (a grammar may end with <|call|>); token_bytes() gives such a
  // terminal as empty, since the sequence ends at an end token and the matcher never reads it.
  // cache_entries: how many masks (and as many shared walks) the LRU caches keep, within the
  // budget's bytes.
  TokenMasker(std::vector<std::string> token_bytes, std::vector<int32_t> end_tokens, size_t cache_entries = 256,
              const GrammarBudget& budget = {});
  // Token bytes from grammar_token_bytes(tok, t): a token's text, a control token's terminal.
  static std::shared_ptr<const TokenMasker> for_tokenizer(const Tokenizer& tok, std::vector<int32_t> end_tokens,
                                                          const GrammarBudget& budget = {});

  // Every allowed token; past the mask budget, a mask with budget_error set.
  std::shared_ptr<const TokenMask> mask(const Matcher& m) const;
  bool allows(const Matcher& m, int32_t t) const;  // one token, cheap (the greedy fast path)
  size_t n_vocab() const { return token_bytes_.size(); }
  const std::string& token_bytes(int32_t t) const { return token_bytes_[t]; }
  const GrammarBudget& budget() const { return budget_; }

  // A request's grammar checked before it is queued (on the caller's thread, warming the
  // cache): its start within the state limits, its first mask within the mask budget and not
  // empty. The error says which, for a 400.
  Status check_start(std::shared_ptr<const Grammar> g) const;
  // Drops the cached masks and walks of `g` (its request ended over a budget: its memory goes).
  void forget(const Grammar* g) const;

  struct CacheStats {
    uint64_t hits = 0, misses = 0;              // masks by exact state
    uint64_t walk_hits = 0, walk_misses = 0;    // walks by the state's top
    size_t entries = 0, walk_entries = 0;
    size_t bytes = 0, walk_bytes = 0;           // what each cache holds (GrammarBudget::cache_bytes)
  };
  CacheStats cache_stats() const;
  // The mask walked afresh over the whole trie, no cache used (the reference; benchmarks).
  TokenMask compute(const Matcher& m) const;
  // What mask() computes on a miss: from the shared walk of the state's top (cached or walked
  // now), re-walking the uncertain subtrees with the full state.
  TokenMask compute_shared(const Matcher& m) const;

 private:
  // The walk of a truncated state: tokens it accepts whatever the frames cut off, and the trie
  // nodes (subtree roots, in preorder) where the outcome depends on them.
  struct SharedWalk {
    std::vector<uint64_t> certain;
    std::vector<int32_t> uncertain;
    size_t heap_bytes() const { return certain.capacity() * sizeof(uint64_t) + uncertain.capacity() * sizeof(int32_t); }
  };
  // Walks trie nodes [begin, end), the state before `begin` in at_depth[depth(begin) - 1];
  // sets allowed tokens' bits in `bits` (one scratch word past the mask's end); uncertain
  // subtree roots go to `uncertain`.
  void walk(LazyDfa& dfa, int32_t begin, int32_t end, int32_t* at_depth, uint64_t* bits,
            std::vector<int32_t>* uncertain) const;
  // Null when the walk passed `budget`.
  std::shared_ptr<const SharedWalk> shared_walk(const Matcher& m, const std::vector<int32_t>& truncated,
                                                MaskBudget& budget) const;
  TokenMask compute(const Matcher& m, MaskBudget& budget) const;
  TokenMask compute_shared(const Matcher& m, MaskBudget& budget) const;
  std::vector<uint64_t> empty_bits() const;  // with the scratch word
  void set_end_tokens(const Matcher& m, std::vector<uint64_t>& bits) const;
  bool end_token_allowed(const Matcher& m, size_t i) const;  // end_tokens_[i]

  std::vector<std::string> token_bytes_;
  std::vector<int32_t> end_tokens_;
  std::vector<std::string> end_terminals_;  // [i]: end_tokens_[i]'s token terminal, or empty
  std::vector<bool> is_end_;
  TokenTrie trie_;
  GrammarBudget budget_;

  mutable std::mutex mu_;
  mutable StateCache<TokenMask> masks_;
  mutable StateCache<SharedWalk> walks_;
  mutable CacheStats stats_;
};

}  // namespace tandem::grammar
