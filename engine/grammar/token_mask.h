// Which vocabulary tokens may come next under a grammar: the matcher's state turned into a bit
// per token.
//
// The masker walks a byte trie of every token (token_trie.h) depth first, advancing the
// matcher's stacks one byte per trie edge and skipping a subtree as soon as no stack survives, so
// a JSON structural position costs a few hundred nodes. Within one walk the grammar is run as a
// lazily built DFA: each distinct set of stacks gets a small id and a 256-entry row of next ids,
// filled the first time a byte is tried, so most trie nodes cost one table lookup. Masks are
// cached by the matcher's exact state (its grammar and canonical stacks), so a state that recurs
// (inside a string, after a comma at the same nesting) costs a hash lookup.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/grammar/matcher.h"
#include "engine/grammar/token_trie.h"

namespace tandem {
class Tokenizer;
}

namespace tandem::grammar {

struct TokenMask {  // bit t set <=> token t may come next
  std::vector<uint64_t> bits;
  bool test(int32_t t) const { return t >= 0 && (size_t)t / 64 < bits.size() && ((bits[t / 64] >> (t % 64)) & 1); }
  size_t count() const;
};

// One per vocabulary, shared by every constrained request: mask() and allows() may run on many
// threads at once (a mutex guards the cache; the trie is immutable).
class TokenMasker {
 public:
  // token_bytes[t]: the bytes token t emits (empty: never allowed, e.g. control tokens);
  // end_tokens: allowed exactly when the matcher can_end(), whatever their bytes.
  // cache_entries: how many masks the LRU cache keeps.
  TokenMasker(std::vector<std::string> token_bytes, std::vector<int32_t> end_tokens, size_t cache_entries = 512);
  // Token bytes from tok.token_to_piece(t, false): control tokens emit nothing.
  static std::shared_ptr<const TokenMasker> for_tokenizer(const Tokenizer& tok, std::vector<int32_t> end_tokens);

  std::shared_ptr<const TokenMask> mask(const Matcher& m) const;  // every allowed token
  bool allows(const Matcher& m, int32_t t) const;                 // one token, cheap (the greedy fast path)
  size_t n_vocab() const { return token_bytes_.size(); }
  const std::string& token_bytes(int32_t t) const { return token_bytes_[t]; }

  struct CacheStats {
    uint64_t hits = 0, misses = 0;
    size_t entries = 0;
  };
  CacheStats cache_stats() const;
  // The mask computed afresh, bypassing the cache (benchmarks, tests).
  TokenMask compute(const Matcher& m) const;

 private:
  struct Entry {
    std::shared_ptr<const Grammar> grammar;  // held, so its address is not reused while cached
    std::vector<int32_t> state;
    uint64_t key;
    std::shared_ptr<const TokenMask> mask;
  };
  using Lru = std::list<Entry>;  // most recently used first
  std::shared_ptr<const TokenMask> cached(const Matcher& m, uint64_t key) const;  // under mu_

  std::vector<std::string> token_bytes_;
  std::vector<int32_t> end_tokens_;
  std::vector<bool> is_end_;
  TokenTrie trie_;
  size_t cache_entries_;

  mutable std::mutex mu_;
  mutable Lru lru_;
  mutable std::unordered_multimap<uint64_t, Lru::iterator> index_;
  mutable CacheStats stats_;
};

}  // namespace tandem::grammar
