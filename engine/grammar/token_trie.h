// Every token's bytes in one byte trie, laid out in depth-first (preorder) arrays so the token
// masker walks it as a flat loop: a node's subtree is the index range [node, end), and skipping
// a subtree whose prefix the grammar rejects is one assignment.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::grammar {

class TokenTrie {
 public:
  // No vocabulary has tokens this long; one that did would be left out (never allowed).
  static constexpr size_t kMaxTokenBytes = 65535;

  // Tokens listed in `token_bytes` with non-empty bytes, except those `skip[t]` marks.
  TokenTrie(const std::vector<std::string>& token_bytes, const std::vector<bool>& skip);

  // Node i, in preorder: the byte on the edge into it, its depth (1 for the root's children),
  // the index after its subtree, and the first token whose bytes end exactly there (-1: none).
  // A node ending several tokens with equal bytes has more_tokens set; tokens_begin/end(i) list
  // them all (tokens_begin(i) is also the first token under the node, whose bytes spell its path).
  struct Node {
    uint8_t byte;
    uint8_t more_tokens;
    uint16_t depth;
    int32_t end;
    int32_t token;
  };

  int32_t size() const { return (int32_t)nodes_.size(); }
  int max_depth() const { return max_depth_; }
  const Node* nodes() const { return nodes_.data(); }
  const int32_t* tokens_begin(int32_t i) const { return order_.data() + tok_begin_[i]; }
  const int32_t* tokens_end(int32_t i) const { return order_.data() + tok_end_[i]; }

 private:
  std::vector<Node> nodes_;
  std::vector<int32_t> tok_begin_, tok_end_;  // into order_
  std::vector<int32_t> order_;               // token ids sorted by their bytes
  int max_depth_ = 0;
};

}  // namespace tandem::grammar
