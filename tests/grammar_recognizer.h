// A test-only recognizer for the grammar IR: a plain Earley parser, independent of the engine's
// matcher, so the front ends' tests can ask "does this grammar accept exactly these strings?".
// Slow (sets of items per byte) and meant for short strings only.
#pragma once

#include <set>
#include <string_view>
#include <tuple>
#include <vector>

#include "engine/grammar/grammar.h"

namespace tandem::test {

// Rules that derive the empty string, by a naive fixed point (not the library's algorithm).
inline std::vector<bool> naive_nullable(const grammar::Grammar& g) {
  std::vector<bool> nullable(g.rules.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < g.rules.size(); r++) {
      if (nullable[r]) continue;
      for (const auto& seq : g.rules[r].alternatives) {
        bool all = true;
        for (const auto& e : seq) all = all && e.kind == grammar::Element::Kind::Rule && nullable[e.rule];
        if (all) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  return nullable;
}

// Whether the whole of `text` is derived by the grammar's root.
inline bool earley_accepts(const grammar::Grammar& g, std::string_view text) {
  using Item = std::tuple<int32_t, uint32_t, uint32_t, uint32_t>;  // rule, alternative, dot, origin
  const std::vector<bool> nullable = naive_nullable(g);
  const size_t n = text.size();
  std::vector<std::vector<Item>> sets(n + 1);
  std::vector<std::set<Item>> seen(n + 1);
  auto add = [&](size_t i, Item item) {
    if (seen[i].insert(item).second) sets[i].push_back(item);
  };
  for (uint32_t a = 0; a < g.rules[g.root].alternatives.size(); a++) add(0, {g.root, a, 0, 0});
  for (size_t i = 0; i <= n; i++) {
    for (size_t k = 0; k < sets[i].size(); k++) {
      const auto [rule, alt, dot, origin] = sets[i][k];
      const grammar::Sequence& seq = g.rules[rule].alternatives[alt];
      if (dot == seq.size()) {  // complete: advance whoever waited for `rule` at `origin`
        for (size_t w = 0; w < sets[origin].size(); w++) {
          const auto [r2, a2, d2, o2] = sets[origin][w];
          const grammar::Sequence& s2 = g.rules[r2].alternatives[a2];
          if (d2 < s2.size() && s2[d2].kind == grammar::Element::Kind::Rule && s2[d2].rule == rule)
            add(i, {r2, a2, d2 + 1, o2});
        }
        continue;
      }
      const grammar::Element& e = seq[dot];
      if (e.kind == grammar::Element::Kind::Bytes) {
        if (i < n && e.matches(static_cast<uint8_t>(text[i]))) add(i + 1, {rule, alt, dot + 1, origin});
      } else {
        for (uint32_t a = 0; a < g.rules[e.rule].alternatives.size(); a++) add(i, {e.rule, a, 0, static_cast<uint32_t>(i)});
        if (nullable[e.rule]) add(i, {rule, alt, dot + 1, origin});
      }
    }
  }
  for (const auto& [rule, alt, dot, origin] : sets[n])
    if (rule == g.root && origin == 0 && dot == g.rules[rule].alternatives[alt].size()) return true;
  return false;
}

}  // namespace tandem::test
