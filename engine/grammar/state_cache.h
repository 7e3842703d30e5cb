// A bounded LRU map from a matcher state (its grammar and flat stacks) to a value the token
// masker computed for it. Not thread-safe: the masker holds its mutex around every call.
//
// Bounded three ways: entries, bytes (the state, the value's heap_bytes() and the bookkeeping),
// and bytes of any one grammar, so that one request whose states grow with every byte evicts
// only its own entries and the cache's memory stays within its budget whatever it holds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/grammar/grammar.h"
#include "engine/grammar/matcher.h"

namespace tandem::grammar {

template <typename Value>
class StateCache {
 public:
  StateCache(size_t capacity, size_t max_bytes, size_t max_bytes_per_grammar)
      : capacity_(capacity < 1 ? 1 : capacity), max_bytes_(max_bytes), max_bytes_per_grammar_(std::min(max_bytes, max_bytes_per_grammar)) {}

  // The value for `state` of grammar `g`, marked most recently used; null when absent.
  std::shared_ptr<const Value> find(const Grammar* g, std::span<const int32_t> state) {
    auto [lo, hi] = index_.equal_range(key(g, state));
    for (auto it = lo; it != hi; ++it) {
      const Entry& e = *it->second;
      if (e.grammar.get() != g || !std::equal(e.state.begin(), e.state.end(), state.begin(), state.end())) continue;
      lru_.splice(lru_.begin(), lru_, it->second);
      return e.value;
    }
    return nullptr;
  }

  // Adds a value (the caller found none), evicting the least recently used past the bounds
  // (past its grammar's share: that grammar's least recently used). A value larger than a
  // grammar's share is not kept. Holding the grammar keeps its address from being reused by
  // another while cached.
  void insert(std::shared_ptr<const Grammar> g, std::span<const int32_t> state, std::shared_ptr<const Value> v) {
    const size_t bytes = entry_bytes(state, *v);
    if (bytes > max_bytes_per_grammar_) return;
    const Grammar* gp = g.get();
    const uint64_t k = key(gp, state);
    lru_.push_front(Entry{std::move(g), std::vector<int32_t>(state.begin(), state.end()), k, bytes, std::move(v)});
    index_.emplace(k, lru_.begin());
    bytes_ += bytes;
    size_t& mine = by_grammar_[gp];
    mine += bytes;
    while (mine > max_bytes_per_grammar_) {
      auto it = std::find_if(lru_.rbegin(), lru_.rend(), [&](const Entry& e) { return e.grammar.get() == gp; });
      erase(std::prev(it.base()));
    }
    while (lru_.size() > capacity_ || bytes_ > max_bytes_) erase(std::prev(lru_.end()));
  }

  // Drops every entry of grammar `g` (a request that ended: its states will not recur).
  void forget(const Grammar* g) {
    if (!by_grammar_.count(g)) return;
    for (auto it = lru_.begin(); it != lru_.end();) {
      auto next = std::next(it);
      if (it->grammar.get() == g) erase(it);
      it = next;
    }
  }

  size_t size() const { return lru_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Entry {
    std::shared_ptr<const Grammar> grammar;
    std::vector<int32_t> state;
    uint64_t key;
    size_t bytes;
    std::shared_ptr<const Value> value;
  };
  using Lru = std::list<Entry>;  // most recently used first
  // An entry's list and index nodes, the value's control block: what a cache entry costs past
  // its state and value.
  static constexpr size_t kEntryOverhead = 160;

  static size_t entry_bytes(std::span<const int32_t> state, const Value& v) {
    return kEntryOverhead + state.size() * sizeof(int32_t) + v.heap_bytes();
  }

  static uint64_t key(const Grammar* g, std::span<const int32_t> state) {
    return hash_state(state) ^ (std::hash<const void*>{}(g) * 0x9E3779B97F4A7C15ull);
  }

  void erase(typename Lru::iterator victim) {
    auto [lo, hi] = index_.equal_range(victim->key);
    for (auto it = lo; it != hi; ++it)
      if (it->second == victim) {
        index_.erase(it);
        break;
      }
    bytes_ -= victim->bytes;
    auto g = by_grammar_.find(victim->grammar.get());
    g->second -= victim->bytes;
    if (g->second == 0) by_grammar_.erase(g);
    lru_.erase(victim);
  }

  size_t capacity_, max_bytes_, max_bytes_per_grammar_;
  size_t bytes_ = 0;
  std::unordered_map<const Grammar*, size_t> by_grammar_;  // bytes of each grammar's entries
  Lru lru_;
  std::unordered_multimap<uint64_t, typename Lru::iterator> index_;
};

}  // namespace tandem::grammar
