#include "engine/grammar/token_mask.h"

#include <algorithm>
#include <bit>

#include "engine/grammar/lazy_dfa.h"
#include "engine/grammar/token_terminal.h"
#include "tokenizer/tokenizer.h"

namespace tandem::grammar {

namespace {

std::vector<bool> end_flags(size_t n_vocab, const std::vector<int32_t>& end_tokens) {
  std::vector<bool> is_end(n_vocab, false);
  for (int32_t t : end_tokens)
    if (t >= 0 && (size_t)t < n_vocab) is_end[t] = true;
  return is_end;
}

// The DFA's next state, filling the table on first use.
int32_t next_state(LazyDfa& dfa, int32_t s, uint8_t b) {
  const int32_t t = dfa.table()[(size_t)s * 256 + b];
  return t == LazyDfa::kUnknown ? dfa.fill(s, b) : t;
}

}  // namespace

size_t TokenMask::count() const {
  size_t n = 0;
  for (uint64_t w : bits) n += std::popcount(w);
  return n;
}

TokenMasker::TokenMasker(std::vector<std::string> token_bytes, std::vector<int32_t> end_tokens, size_t cache_entries,
                         const GrammarBudget& budget)
    : token_bytes_(std::move(token_bytes)),
      end_tokens_(std::move(end_tokens)),
      is_end_(end_flags(token_bytes_.size(), end_tokens_)),
      trie_(token_bytes_, is_end_),
      budget_(budget),
      masks_(cache_entries, budget.cache_bytes, budget.cache_bytes_per_grammar),
      walks_(cache_entries, budget.cache_bytes, budget.cache_bytes_per_grammar) {
  if (budget_.max_mask_work == 0) budget_.max_mask_work = std::max(kMinMaskWork, kMaskWorkPerVocabToken * token_bytes_.size());
  end_tokens_.erase(std::remove_if(end_tokens_.begin(), end_tokens_.end(),
                                   [&](int32_t t) { return t < 0 || (size_t)t >= token_bytes_.size(); }),
                    end_tokens_.end());
  // An end token's terminal moves out of token_bytes_: the matcher never reads an end token.
  for (int32_t t : end_tokens_) {
    std::string& bytes = token_bytes_[t];
    const bool terminal = is_token_terminal(bytes);
    end_terminals_.push_back(terminal ? bytes : std::string());
    if (terminal) bytes.clear();
  }
}

std::shared_ptr<const TokenMasker> TokenMasker::for_tokenizer(const Tokenizer& tok, std::vector<int32_t> end_tokens,
                                                               const GrammarBudget& budget) {
  const int32_t n = tok.vocab().size();
  std::vector<std::string> bytes(n);
  for (int32_t t = 0; t < n; t++) bytes[t] = grammar_token_bytes(tok, t);
  return std::make_shared<const TokenMasker>(std::move(bytes), std::move(end_tokens), 256, budget);
}

std::vector<uint64_t> TokenMasker::empty_bits() const { return std::vector<uint64_t>((token_bytes_.size() + 63) / 64 + 1, 0); }

bool TokenMasker::end_token_allowed(const Matcher& m, size_t i) const {
  return m.can_end() || (!end_terminals_[i].empty() && m.can_accept(end_terminals_[i]));
}

void TokenMasker::set_end_tokens(const Matcher& m, std::vector<uint64_t>& bits) const {
  for (size_t i = 0; i < end_tokens_.size(); i++)
    if (end_token_allowed(m, i)) bits[end_tokens_[i] / 64] |= 1ull << (end_tokens_[i] % 64);
}

void TokenMasker::walk(LazyDfa& dfa, int32_t begin, int32_t end, int32_t* at_depth, uint64_t* bits,
                       std::vector<int32_t>* uncertain) const {
  // The loop is branch-light on purpose: whether the next node is a child or a sibling, and
  // whether a node ends a token, follow no pattern a branch predictor could learn, and a
  // mispredict per node would cost more than the rest of the node's work. Nodes without a token
  // set a bit in the scratch word past the mask's end instead.
  const uint32_t scratch_slot = (uint32_t)((token_bytes_.size() + 63) / 64) * 64;
  const int32_t* table = dfa.table();
  const TokenTrie::Node* nodes = trie_.nodes();
  for (int32_t i = begin; i < end;) {
    const TokenTrie::Node node = nodes[i];
    const int32_t parent = at_depth[node.depth - 1];
    int32_t s = table[(size_t)parent * 256 + node.byte];
    if (s <= 0) [[unlikely]] {
      if (s == LazyDfa::kUnknown) {
        s = dfa.fill(parent, node.byte);
        table = dfa.table();
      }
      if (s == LazyDfa::kUncertain) {
        uncertain->push_back(i);
        i = node.end;
        continue;
      }
      if (s == LazyDfa::kDead) {  // no stack survives this prefix: nor any token under it
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
}

TokenMask TokenMasker::compute(const Matcher& m) const {
  MaskBudget budget(budget_);
  return compute(m, budget);
}

TokenMask TokenMasker::compute_shared(const Matcher& m) const {
  MaskBudget budget(budget_);
  return compute_shared(m, budget);
}

TokenMask TokenMasker::compute(const Matcher& m, MaskBudget& budget) const {
  TokenMask mask;
  mask.bits = empty_bits();
  set_end_tokens(m, mask.bits);
  LazyDfa dfa(*m.flat_grammar(), m.state(), false, m.limits(), budget);
  std::vector<int32_t> at_depth(trie_.max_depth() + 1);  // [d]: the DFA state after the path's first d bytes
  at_depth[0] = dfa.start();
  walk(dfa, 0, trie_.size(), at_depth.data(), mask.bits.data(), nullptr);
  mask.bits.pop_back();
  mask.budget_error = budget.error();
  return mask;
}

std::shared_ptr<const TokenMasker::SharedWalk> TokenMasker::shared_walk(const Matcher& m, const std::vector<int32_t>& truncated,
                                                                       MaskBudget& budget) const {
  const Grammar* g = &m.grammar();
  {
    std::lock_guard lock(mu_);
    if (auto hit = walks_.find(g, truncated)) {
      stats_.walk_hits++;
      return hit;
    }
    stats_.walk_misses++;
  }
  auto w = std::make_shared<SharedWalk>();
  w->certain = empty_bits();
  LazyDfa dfa(*m.flat_grammar(), truncated, true, m.limits(), budget);
  std::vector<int32_t> at_depth(trie_.max_depth() + 1);
  at_depth[0] = dfa.start();
  walk(dfa, 0, trie_.size(), at_depth.data(), w->certain.data(), &w->uncertain);
  if (budget.exceeded()) return nullptr;  // incomplete: not shared
  std::lock_guard lock(mu_);
  if (auto hit = walks_.find(g, truncated)) return hit;
  walks_.insert(m.flat_grammar()->source, truncated, w);
  return w;
}

TokenMask TokenMasker::compute_shared(const Matcher& m, MaskBudget& budget) const {
  const std::vector<int32_t> truncated = truncate_state(m.state());
  if (truncated.empty()) return compute(m, budget);
  const auto shared = shared_walk(m, truncated, budget);
  TokenMask mask;
  if (!shared) {
    mask.budget_error = budget.error();
    return mask;
  }
  mask.bits = shared->certain;
  set_end_tokens(m, mask.bits);
  // Each uncertain subtree is walked with the full state from its root; the states along the
  // root's path are recomputed only past the prefix it shares with the previous root's.
  LazyDfa dfa(*m.flat_grammar(), m.state(), false, m.limits(), budget);
  std::vector<int32_t> at_depth(trie_.max_depth() + 1);
  at_depth[0] = dfa.start();
  std::string_view prev_path;
  size_t known = 0;  // at_depth[0..known] hold prev_path's states
  for (int32_t root : shared->uncertain) {
    const TokenTrie::Node& node = trie_.nodes()[root];
    const std::string_view path = std::string_view(token_bytes_[*trie_.tokens_begin(root)]).substr(0, node.depth - 1);
    size_t d = 0;
    while (d < known && d < path.size() && path[d] == prev_path[d]) d++;
    bool alive = true;
    for (; d < path.size(); d++) {
      at_depth[d + 1] = next_state(dfa, at_depth[d], (uint8_t)path[d]);
      if (at_depth[d + 1] == LazyDfa::kDead) {
        alive = false;
        break;
      }
    }
    prev_path = path;
    known = d;
    if (alive) walk(dfa, root, node.end, at_depth.data(), mask.bits.data(), nullptr);
    if (budget.exceeded()) break;
  }
  mask.bits.pop_back();
  mask.budget_error = budget.error();
  return mask;
}

std::shared_ptr<const TokenMask> TokenMasker::mask(const Matcher& m) const {
  {
    std::lock_guard lock(mu_);
    if (auto hit = masks_.find(&m.grammar(), m.state())) {
      stats_.hits++;
      return hit;
    }
    stats_.misses++;
  }
  // Computed outside the lock: two threads that miss on one state both compute it, and the
  // second insert finds the first's.
  auto fresh = std::make_shared<const TokenMask>(compute_shared(m));
  if (!fresh->budget_error.empty()) return fresh;
  std::lock_guard lock(mu_);
  if (auto hit = masks_.find(&m.grammar(), m.state())) return hit;
  masks_.insert(m.flat_grammar()->source, m.state(), fresh);
  return fresh;
}

bool TokenMasker::allows(const Matcher& m, int32_t t) const {
  if (t < 0 || (size_t)t >= token_bytes_.size()) return false;
  if (is_end_[t]) {
    const size_t i = (size_t)(std::find(end_tokens_.begin(), end_tokens_.end(), t) - end_tokens_.begin());
    return end_token_allowed(m, i);
  }
  const std::string& bytes = token_bytes_[t];
  if (bytes.empty() || bytes.size() > TokenTrie::kMaxTokenBytes) return false;
  {
    std::lock_guard lock(mu_);
    if (auto hit = masks_.find(&m.grammar(), m.state())) return hit->test(t);
  }
  return m.can_accept(bytes);
}

TokenMasker::CacheStats TokenMasker::cache_stats() const {
  std::lock_guard lock(mu_);
  CacheStats s = stats_;
  s.entries = masks_.size();
  s.walk_entries = walks_.size();
  s.bytes = masks_.bytes();
  s.walk_bytes = walks_.bytes();
  return s;
}

void TokenMasker::forget(const Grammar* g) const {
  std::lock_guard lock(mu_);
  masks_.forget(g);
  walks_.forget(g);
}

Status TokenMasker::check_start(std::shared_ptr<const Grammar> g) const {
  auto m = Matcher::create(std::move(g), budget_.state);
  if (!m.ok()) return m.error();
  const auto first = mask(*m);
  if (!first->budget_error.empty()) return make_error("{} (at the start of the output)", first->budget_error);
  if (first->count() == 0)
    return make_error("grammar ({}): no token of the model's vocabulary can start its output (no token's bytes begin a sentence of it)",
                      m->grammar().source);
  return Status::Ok();
}

}  // namespace tandem::grammar
