#include "engine/grammar/token_trie.h"

#include <algorithm>
#include <string_view>

namespace tandem::grammar {

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes, const std::vector<bool>& skip) {
  for (int32_t t = 0; t < (int32_t)token_bytes.size(); t++)
    if (!token_bytes[t].empty() && token_bytes[t].size() <= kMaxTokenBytes && !(t < (int32_t)skip.size() && skip[t]))
      order_.push_back(t);
  // Sorted strings visit the trie in preorder: each one shares a prefix with the one before and
  // adds the nodes past it; tokens with equal bytes are neighbours and share a node.
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int32_t a, int32_t b) { return token_bytes[a] < token_bytes[b]; });
  std::vector<int32_t> path;  // path[d]: the node at depth d + 1 on the current string's path
  std::string_view prev;
  for (int32_t k = 0; k < (int32_t)order_.size(); k++) {
    const std::string_view s = token_bytes[order_[k]];
    size_t common = 0;
    while (common < s.size() && common < prev.size() && s[common] == prev[common]) common++;
    while (path.size() > common) {
      nodes_[path.back()].end = (int32_t)nodes_.size();
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); d++) {
      path.push_back((int32_t)nodes_.size());
      nodes_.push_back(Node{(uint8_t)s[d], 0, (uint16_t)(d + 1), 0, -1});
      tok_begin_.push_back(k);
      tok_end_.push_back(k);
    }
    // A node made for this string starts its token range at k; an equal string extends it.
    Node& last = nodes_[path.back()];
    tok_end_[path.back()] = k + 1;
    if (last.token < 0) {
      last.token = order_[k];
    } else {
      last.more_tokens = 1;
    }
    max_depth_ = std::max(max_depth_, (int)s.size());
    prev = s;
  }
  while (!path.empty()) {
    nodes_[path.back()].end = (int32_t)nodes_.size();
    path.pop_back();
  }
}

}  // namespace tandem::grammar
