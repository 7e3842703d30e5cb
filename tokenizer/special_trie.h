// Which special tokens occur in a text, found in one pass however many there are (Gemma 3 has
// 6,414: <unused0>...<unused6241>, runs of spaces, tabs and newlines, HTML tags). The tokenizer
// then splits the text on only those, in its usual longest-first order, instead of searching
// the text once per special token.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

class SpecialTrie {
 public:
  SpecialTrie() = default;
  // texts[k] is special token number k (the caller's own numbering); empty texts never match.
  explicit SpecialTrie(const std::vector<std::string_view>& texts);

  // Sets seen[k] for every token k that occurs somewhere in `text` (overlapping occurrences
  // included); `seen` has one entry per token.
  void mark_occurring(std::string_view text, std::vector<bool>& seen) const;

 private:
  struct Node {
    int32_t token = -1;    // the token ending here, or -1
    uint32_t first = 0;    // its children: edges_[first, first + count), sorted by byte
    uint32_t count = 0;
  };
  int32_t child(int32_t node, unsigned char byte) const;

  std::vector<Node> nodes_;                          // nodes_[0] is the root
  std::vector<std::pair<unsigned char, int32_t>> edges_;  // (byte, child node)
  std::vector<int32_t> root_child_;                  // [256]: the root's children, -1 when none
};

}  // namespace tandem
