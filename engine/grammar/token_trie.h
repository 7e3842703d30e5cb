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

  int32_t size() const { return (int32_t)byte_.size(); }
  int max_depth() const { return max_depth_; }

  // Node i, in preorder: the byte on the edge into it, its depth (1 for the root's children),
  // the index after its subtree, and the tokens whose bytes end exactly there.
  uint8_t byte(int32_t i) const { return byte_[i]; }
  int depth(int32_t i) const { return depth_[i]; }
  int32_t subtree_end(int32_t i) const { return end_[i]; }
  const int32_t* tokens_begin(int32_t i) const { return order_.data() + tok_begin_[i]; }
  const int32_t* tokens_end(int32_t i) const { return order_.data() + tok_end_[i]; }

 private:
  std::vector<uint8_t> byte_;
  std::vector<uint16_t> depth_;
  std::vector<int32_t> end_;
  std::vector<int32_t> tok_begin_, tok_end_;  // into order_
  std::vector<int32_t> order_;               // token ids sorted by their bytes
  int max_depth_ = 0;
};

}  // namespace tandem::grammar
