// Token text -> id for a whole vocabulary, built in a few milliseconds even for 262,144 tokens
// (Gemma 3): an open-addressing table of ids over one buffer holding every token's bytes.
// A std::unordered_map<std::string, int> of the same vocabulary costs a node allocation per
// token to build and as much again to free, ~100 ms for Gemma's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class TokenIndex {
 public:
  TokenIndex() = default;
  explicit TokenIndex(const std::vector<std::string>& tokens);  // id i is tokens[i]; first of duplicates wins

  int32_t find(std::string_view text) const;  // -1 when absent
  // Adds `text` as token `id` (ids need not be dense); a text already present keeps its id.
  void insert(std::string_view text, int32_t id);

 private:
  static uint64_t hash(std::string_view s);
  void insert_hashed(std::string_view text, int32_t id, uint64_t h);
  std::string_view text_of(uint32_t entry) const;
  void grow();

  std::string bytes_;                // every inserted text, back to back
  std::vector<size_t> starts_;       // entry e's text is bytes_[starts_[e], starts_[e + 1])
  std::vector<int32_t> ids_;         // entry e's token id
  struct Slot {
    uint32_t entry_plus_1 = 0;  // 0: empty
    uint32_t hash_hi = 0;       // the upper 32 bits of the text's hash (skips most compares)
  };
  std::vector<Slot> slots_;  // a power of two, at most half full; one cache line per probe
};

}  // namespace tandem
