// A bounded LRU map from a matcher state (its grammar and flat stacks) to a value the token
// masker computed for it. Not thread-safe: the masker holds its mutex around every call.
#pragma once

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
  explicit StateCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

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

  // Adds a value (the caller found none), evicting the least recently used past the capacity.
  // Holding the grammar keeps its address from being reused by another while cached.
  void insert(std::shared_ptr<const Grammar> g, std::span<const int32_t> state, std::shared_ptr<const Value> v) {
    const uint64_t k = key(g.get(), state);
    lru_.push_front(Entry{std::move(g), std::vector<int32_t>(state.begin(), state.end()), k, std::move(v)});
    index_.emplace(k, lru_.begin());
    while (lru_.size() > capacity_) {
      auto last = std::prev(lru_.end());
      auto [lo, hi] = index_.equal_range(last->key);
      for (auto it = lo; it != hi; ++it)
        if (it->second == last) {
          index_.erase(it);
          break;
        }
      lru_.pop_back();
    }
  }

  size_t size() const { return lru_.size(); }

 private:
  struct Entry {
    std::shared_ptr<const Grammar> grammar;
    std::vector<int32_t> state;
    uint64_t key;
    std::shared_ptr<const Value> value;
  };
  using Lru = std::list<Entry>;  // most recently used first

  static uint64_t key(const Grammar* g, std::span<const int32_t> state) {
    return hash_state(state) ^ (std::hash<const void*>{}(g) * 0x9E3779B97F4A7C15ull);
  }

  size_t capacity_;
  Lru lru_;
  std::unordered_multimap<uint64_t, typename Lru::iterator> index_;
};

}  // namespace tandem::grammar
