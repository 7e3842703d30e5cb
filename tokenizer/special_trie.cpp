#include "tokenizer/special_trie.h"

#include <algorithm>
#include <map>

namespace tandem {

SpecialTrie::SpecialTrie(const std::vector<std::string_view>& texts) {
  // Built as a map-based trie, then laid out flat: each node's children contiguous and sorted.
  struct Build {
    int32_t token = -1;
    std::map<unsigned char, int32_t> next;
  };
  std::vector<Build> b(1);
  for (size_t k = 0; k < texts.size(); k++) {
    if (texts[k].empty()) continue;
    int32_t n = 0;
    for (unsigned char c : texts[k]) {
      auto it = b[n].next.find(c);
      if (it == b[n].next.end()) {
        const int32_t fresh = (int32_t)b.size();
        b[n].next.emplace(c, fresh);
        b.emplace_back();
        n = fresh;
      } else {
        n = it->second;
      }
    }
    if (b[n].token < 0) b[n].token = (int32_t)k;  // the first of duplicate texts
  }
  nodes_.resize(b.size());
  for (size_t n = 0; n < b.size(); n++) {
    nodes_[n].token = b[n].token;
    nodes_[n].first = (uint32_t)edges_.size();
    nodes_[n].count = (uint32_t)b[n].next.size();
    for (auto [c, to] : b[n].next) edges_.emplace_back(c, to);
  }
  root_child_.assign(256, -1);
  for (auto [c, to] : b[0].next) root_child_[c] = to;
}

int32_t SpecialTrie::child(int32_t node, unsigned char byte) const {
  const Node& n = nodes_[node];
  auto begin = edges_.begin() + n.first, end = begin + n.count;
  auto it = std::lower_bound(begin, end, byte, [](const auto& e, unsigned char c) { return e.first < c; });
  return it != end && it->first == byte ? it->second : -1;
}

void SpecialTrie::mark_occurring(std::string_view text, std::vector<bool>& seen) const {
  if (nodes_.size() <= 1) return;
  for (size_t start = 0; start < text.size(); start++) {
    int32_t n = root_child_[(unsigned char)text[start]];
    for (size_t i = start + 1; n >= 0; i++) {
      if (nodes_[n].token >= 0) seen[nodes_[n].token] = true;
      if (i == text.size()) break;
      n = child(n, (unsigned char)text[i]);
    }
  }
}

}  // namespace tandem
