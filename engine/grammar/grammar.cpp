// validate(): the checks every front end's grammar passes before a matcher runs it, and
// utf8_class_sequences(): code point ranges as UTF-8 byte-set sequences.
#include "engine/grammar/grammar.h"

#include <algorithm>
#include <utility>

namespace tandem::grammar {

std::vector<bool> nullable_rules(const Grammar& g) {
  // Horn-clause propagation, linear in the grammar's size: an alternative is nullable once all
  // its elements are references to nullable rules. `pending[a]` counts the references of
  // alternative a not yet known nullable; a byte element makes an alternative never nullable.
  struct AltRef {
    int32_t rule;
    size_t alt;
  };
  const size_t n = g.rules.size();
  std::vector<bool> nullable(n, false);
  std::vector<std::vector<size_t>> users(n);  // rule -> flat alternative ids referencing it (once per reference)
  std::vector<AltRef> alts;
  std::vector<size_t> pending;
  std::vector<int32_t> ready;
  for (size_t r = 0; r < n; r++) {
    for (size_t a = 0; a < g.rules[r].alternatives.size(); a++) {
      const Sequence& seq = g.rules[r].alternatives[a];
      const size_t id = alts.size();
      alts.push_back({static_cast<int32_t>(r), a});
      bool has_bytes = false;
      size_t refs = 0;
      for (const Element& e : seq) {
        if (e.kind == Element::Kind::Bytes) has_bytes = true;
        else if (e.rule >= 0 && static_cast<size_t>(e.rule) < n) refs++;
        else has_bytes = true;  // an out-of-range reference never matches anything
      }
      pending.push_back(has_bytes ? SIZE_MAX : refs);
      if (has_bytes) continue;
      for (const Element& e : seq) users[e.rule].push_back(id);
      if (refs == 0 && !nullable[r]) {
        nullable[r] = true;
        ready.push_back(static_cast<int32_t>(r));
      }
    }
  }
  while (!ready.empty()) {
    const int32_t r = ready.back();
    ready.pop_back();
    for (size_t id : users[r]) {
      if (pending[id] == SIZE_MAX || pending[id] == 0) continue;
      if (--pending[id] == 0 && !nullable[alts[id].rule]) {
        nullable[alts[id].rule] = true;
        ready.push_back(alts[id].rule);
      }
    }
  }
  return nullable;
}

std::vector<int32_t> left_recursion_cycle(const Grammar& g) {
  // Edge a -> b: rule a can call rule b before consuming a byte (b stands after a nullable
  // prefix of one of a's alternatives). A cycle in this graph is left recursion.
  const size_t n = g.rules.size();
  const std::vector<bool> nullable = nullable_rules(g);
  std::vector<std::vector<int32_t>> edges(n);
  for (size_t r = 0; r < n; r++) {
    for (const Sequence& seq : g.rules[r].alternatives) {
      for (const Element& e : seq) {
        if (e.kind == Element::Kind::Bytes || e.rule < 0 || static_cast<size_t>(e.rule) >= n) break;
        edges[r].push_back(e.rule);
        if (!nullable[e.rule]) break;
      }
    }
  }
  // Iterative depth-first search (a chain of 20,000 rules must not overflow the stack).
  enum Color : uint8_t { White, Grey, Black };
  std::vector<Color> color(n, White);
  std::vector<std::pair<int32_t, size_t>> stack;  // (rule, next edge)
  for (size_t start = 0; start < n; start++) {
    if (color[start] != White) continue;
    stack.push_back({static_cast<int32_t>(start), 0});
    color[start] = Grey;
    while (!stack.empty()) {
      auto& [r, next] = stack.back();
      if (next == edges[r].size()) {
        color[r] = Black;
        stack.pop_back();
        continue;
      }
      const int32_t to = edges[r][next++];
      if (color[to] == Grey) {
        std::vector<int32_t> cycle;
        size_t i = stack.size();
        while (i > 0 && stack[i - 1].first != to) i--;
        for (size_t k = i - 1; k < stack.size(); k++) cycle.push_back(stack[k].first);
        cycle.push_back(to);
        return cycle;
      }
      if (color[to] == White) {
        color[to] = Grey;
        stack.push_back({to, 0});
      }
    }
  }
  return {};
}

std::string describe_cycle(const Grammar& g, const std::vector<int32_t>& cycle) {
  std::string out;
  for (size_t i = 0; i < cycle.size(); i++) {
    if (i) out += " -> ";
    out += g.rules[cycle[i]].name;
  }
  return out;
}

Status validate(const Grammar& g, const GrammarLimits& limits) {
  const size_t n = g.rules.size();
  if (n == 0) return make_error("{} grammar: no rules", g.source);
  if (n > limits.max_rules) return make_error("{} grammar: {} rules, more than the limit of {}", g.source, n, limits.max_rules);
  if (g.root < 0 || static_cast<size_t>(g.root) >= n)
    return make_error("{} grammar: root rule {} out of range (there are {} rules)", g.source, g.root, n);
  size_t elements = 0;
  for (const Rule& rule : g.rules) {
    if (rule.alternatives.empty()) return make_error("{} grammar: rule '{}' has no alternative", g.source, rule.name);
    for (const Sequence& seq : rule.alternatives) {
      elements += seq.size();
      for (const Element& e : seq) {
        if (e.kind == Element::Kind::Rule && (e.rule < 0 || static_cast<size_t>(e.rule) >= n))
          return make_error("{} grammar: rule '{}' refers to rule {}, out of range (there are {} rules)", g.source,
                            rule.name, e.rule, n);
      }
    }
  }
  if (elements > limits.max_elements)
    return make_error("{} grammar: {} elements, more than the limit of {}", g.source, elements, limits.max_elements);
  const std::vector<int32_t> cycle = left_recursion_cycle(g);
  if (!cycle.empty())
    return make_error("{} grammar: rule '{}' is left-recursive ({}): it can reach itself without consuming a byte",
                      g.source, g.rules[cycle.front()].name, describe_cycle(g, cycle));
  return Status::Ok();
}

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void encode(uint32_t cp, int len, uint8_t* out) {
  switch (len) {
    case 1: out[0] = static_cast<uint8_t>(cp); break;
    case 2:
      out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    case 3:
      out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    default:
      out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  }
}

// [lo, hi] with one encoded length: split until, at every continuation position, the range
// covers either one value of the bits above it or whole blocks of 64, so the set is the product
// of per-byte ranges (the classic construction, e.g. RE2's and Rust regex's).
void split_same_length(uint32_t lo, uint32_t hi, int len, std::vector<Sequence>& out) {
  std::vector<std::pair<uint32_t, uint32_t>> work{{lo, hi}};
  while (!work.empty()) {
    auto [a, b] = work.back();
    work.pop_back();
    bool split = false;
    for (int i = 1; i < len && !split; i++) {
      const uint32_t m = (1u << (6 * i)) - 1;
      if ((a & ~m) == (b & ~m)) continue;
      if ((a & m) != 0) {
        work.push_back({(a | m) + 1, b});
        work.push_back({a, a | m});
        split = true;
      } else if ((b & m) != m) {
        work.push_back({b & ~m, b});
        work.push_back({a, (b & ~m) - 1});
        split = true;
      }
    }
    if (split) continue;
    uint8_t ea[4], eb[4];
    encode(a, len, ea);
    encode(b, len, eb);
    Sequence seq;
    for (int i = 0; i < len; i++) seq.push_back(Element::byte_range(ea[i], eb[i]));
    out.push_back(std::move(seq));
  }
}

void split_lengths(uint32_t lo, uint32_t hi, std::vector<Sequence>& out) {
  static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  for (uint32_t end : kLengthEnds) {
    if (lo > hi) return;
    if (lo > end) continue;
    const uint32_t top = std::min(hi, end);
    split_same_length(lo, top, utf8_length(lo), out);
    lo = top + 1;
  }
}

}  // namespace

std::vector<Sequence> utf8_class_sequences(uint32_t lo, uint32_t hi) {
  std::vector<Sequence> out;
  hi = std::min(hi, kMaxCodePoint);
  if (lo > hi) return out;
  // Surrogates (U+D800..U+DFFF) are not characters; UTF-8 never encodes them.
  if (lo < 0xD800) split_lengths(lo, std::min(hi, 0xD7FFu), out);
  if (hi > 0xDFFF) split_lengths(std::max(lo, 0xE000u), hi, out);
  return out;
}

}  // namespace tandem::grammar
