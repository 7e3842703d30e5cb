#include "engine/grammar/token_mask.h"

#include <algorithm>
#include <bit>
#include <map>

#include "tokenizer/tokenizer.h"

namespace tandem::grammar {

namespace {

std::vector<bool> end_flags(size_t n_vocab, const std::vector<int32_t>& end_tokens) {
  std::vector<bool> is_end(n_vocab, false);
  for (int32_t t : end_tokens)
    if (t >= 0 && (size_t)t < n_vocab) is_end[t] = true;
  return is_end;
}

uint64_t cache_key(const Matcher& m) {
  return m.state_hash() ^ (std::hash<const void*>{}(&m.grammar()) * 0x9E3779B97F4A7C15ull);
}

// The grammar as a DFA over sets of stacks, built as far as one trie walk needs it. State 0 is
// the dead set (no stack).
class LazyDfa {
 public:
  LazyDfa(const FlatGrammar& g, std::span<const int32_t> flat_state) : arena_(g) {
    sets_.emplace_back();
    next_.assign(256, 0);
    std::vector<int32_t> tops;
    arena_.unflatten(flat_state, tops);
    start_ = id_of(std::move(tops));
  }
  int32_t start() const { return start_; }

  // [state * 256 + byte]: the next state, -1 while not yet known (then fill() it). Valid until
  // the next fill().
  const int32_t* table() const { return next_.data(); }
  int32_t fill(int32_t s, uint8_t b) {
    int32_t t = 0;
    if (arena_.step(sets_[s], b, scratch_) && !scratch_.empty()) t = id_of(scratch_);
    next_[(size_t)s * 256 + b] = t;
    return t;
  }

 private:
  int32_t id_of(const std::vector<int32_t>& tops) {
    auto [it, fresh] = ids_.try_emplace(tops, (int32_t)sets_.size());
    if (fresh) {
      sets_.push_back(tops);
      next_.resize(next_.size() + 256, -1);
    }
    return it->second;
  }

  StackArena arena_;
  std::vector<std::vector<int32_t>> sets_;  // id -> sorted stack tops
  std::map<std::vector<int32_t>, int32_t> ids_;
  std::vector<int32_t> next_;  // [id * 256 + byte]: the next id, -1 not yet known
  std::vector<int32_t> scratch_;
  int32_t start_ = 0;
};

}  // namespace

size_t TokenMask::count() const {
  size_t n = 0;
  for (uint64_t w : bits) n += std::popcount(w);
  return n;
}

TokenMasker::TokenMasker(std::vector<std::string> token_bytes, std::vector<int32_t> end_tokens, size_t cache_entries)
    : token_bytes_(std::move(token_bytes)),
      end_tokens_(std::move(end_tokens)),
      is_end_(end_flags(token_bytes_.size(), end_tokens_)),
      trie_(token_bytes_, is_end_),
      cache_entries_(std::max<size_t>(cache_entries, 1)) {
  end_tokens_.erase(std::remove_if(end_tokens_.begin(), end_tokens_.end(),
                                   [&](int32_t t) { return t < 0 || (size_t)t >= token_bytes_.size(); }),
                    end_tokens_.end());
}

std::shared_ptr<const TokenMasker> TokenMasker::for_tokenizer(const Tokenizer& tok, std::vector<int32_t> end_tokens) {
  const int32_t n = tok.vocab().size();
  std::vector<std::string> bytes(n);
  for (int32_t t = 0; t < n; t++) bytes[t] = tok.token_to_piece(t, false);
  return std::make_shared<const TokenMasker>(std::move(bytes), std::move(end_tokens));
}

TokenMask TokenMasker::compute(const Matcher& m) const {
  TokenMask mask;
  mask.bits.assign((token_bytes_.size() + 63) / 64, 0);
  if (m.can_end())
    for (int32_t t : end_tokens_) mask.bits[t / 64] |= 1ull << (t % 64);
  LazyDfa dfa(*m.flat_grammar(), m.state());
  const int32_t* table = dfa.table();
  // The walk is branch-light on purpose: whether the next node is a child or a sibling, and
  // whether a node ends a token, follow no pattern a branch predictor could learn, and a
  // mispredict per node would cost more than the rest of the node's work. Nodes without a token
  // set a bit in a scratch word past the mask's end instead.
  const size_t n_words = mask.bits.size();
  mask.bits.push_back(0);
  uint64_t* bits = mask.bits.data();
  const uint32_t scratch_slot = (uint32_t)n_words * 64;
  std::vector<int32_t> at_depth(trie_.max_depth() + 1);  // [d]: the DFA state after the path's first d bytes
  at_depth[0] = dfa.start();
  const TokenTrie::Node* nodes = trie_.nodes();
  for (int32_t i = 0, n = trie_.size(); i < n;) {
    const TokenTrie::Node node = nodes[i];
    const int32_t parent = at_depth[node.depth - 1];
    int32_t s = table[(size_t)parent * 256 + node.byte];
    if (s <= 0) [[unlikely]] {
      if (s < 0) {
        s = dfa.fill(parent, node.byte);
        table = dfa.table();
      }
      if (s == 0) {  // no stack survives this prefix: nor any token under it
        i = node.end;
        continue;
      }
    }
    at_depth[node.depth] = s;
    const uint32_t slot = node.token >= 0 ? (uint32_t)node.token : scratch_slot;
    bits[slot / 64] |= 1ull << (slot % 64);
    if (node.more_tokens) [[unlikely]]
      for (const int32_t* t = trie_.tokens_begin(i); t != trie_.tokens_end(i); t++) bits[*t / 64] |= 1ull << (*t % 64);
    i++;
  }
  mask.bits.pop_back();
  return mask;
}

std::shared_ptr<const TokenMask> TokenMasker::cached(const Matcher& m, uint64_t key) const {
  auto [lo, hi] = index_.equal_range(key);
  for (auto it = lo; it != hi; ++it) {
    const Entry& e = *it->second;
    if (e.grammar.get() != &m.grammar() || !std::equal(e.state.begin(), e.state.end(), m.state().begin(), m.state().end()))
      continue;
    lru_.splice(lru_.begin(), lru_, it->second);  // most recently used
    return e.mask;
  }
  return nullptr;
}

std::shared_ptr<const TokenMask> TokenMasker::mask(const Matcher& m) const {
  const uint64_t key = cache_key(m);
  {
    std::lock_guard lock(mu_);
    if (auto hit = cached(m, key)) {
      stats_.hits++;
      return hit;
    }
    stats_.misses++;
  }
  // Computed outside the lock: two threads that miss on one state both compute it, and the
  // second insert finds the first's.
  auto fresh = std::make_shared<const TokenMask>(compute(m));
  std::lock_guard lock(mu_);
  if (auto hit = cached(m, key)) return hit;
  lru_.push_front(Entry{m.flat_grammar()->source, std::vector<int32_t>(m.state().begin(), m.state().end()), key, fresh});
  index_.emplace(key, lru_.begin());
  while (lru_.size() > cache_entries_) {
    auto last = std::prev(lru_.end());
    auto [lo, hi] = index_.equal_range(last->key);
    for (auto it = lo; it != hi; ++it)
      if (it->second == last) {
        index_.erase(it);
        break;
      }
    lru_.pop_back();
  }
  return fresh;
}

bool TokenMasker::allows(const Matcher& m, int32_t t) const {
  if (t < 0 || (size_t)t >= token_bytes_.size()) return false;
  if (is_end_[t]) return m.can_end();
  const std::string& bytes = token_bytes_[t];
  if (bytes.empty() || bytes.size() > TokenTrie::kMaxTokenBytes) return false;
  {
    std::lock_guard lock(mu_);
    if (auto hit = cached(m, cache_key(m))) return hit->test(t);
  }
  return m.can_accept(bytes);
}

TokenMasker::CacheStats TokenMasker::cache_stats() const {
  std::lock_guard lock(mu_);
  CacheStats s = stats_;
  s.entries = lru_.size();
  return s;
}

}  // namespace tandem::grammar
