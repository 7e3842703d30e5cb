// ForwardBatch: everything one forward pass needs to know about its tokens, built once per step
// after scheduling and read by every layer: which token goes where in the KV store (the slot
// mapping), which blocks each sequence's keys live in (block tables), how many keys each
// sequence attends over, and which rows want logits. The one home of slot arithmetic: callers
// say "these tokens of this sequence, at these positions, in these blocks"; nothing else turns
// a position into a slot.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"

namespace tandem {

class ForwardBatch {
 public:
  // KV blocks hold block_tokens positions each. A contiguous cache of one sequence is one
  // block of its whole capacity.
  explicit ForwardBatch(int block_tokens);

  // Adds a sequence whose K,V live in the blocks of `table` (position p in table[p /
  // block_tokens]) and its tokens at positions [first_pos, first_pos + tokens.size()).
  // logits: none, the last token's, or every token's. Error when a position has no block.
  enum class Logits { None, Last, All };
  Status add_sequence(std::span<const int32_t> tokens, int64_t first_pos, std::span<const int32_t> table,
                      Logits logits);

  // The same for a pool of several layer groups (kv/layer_groups.h): `tables` holds group g's
  // table at g (-1 for blocks a window group no longer holds). Every sequence of a batch has
  // the same number of groups.
  Status add_sequence(std::span<const int32_t> tokens, int64_t first_pos, std::span<const std::vector<int32_t>> tables,
                      Logits logits);

  // The same in two steps, for batches whose tokens interleave sequences: a table (returns
  // its sequence index), then tokens one at a time.
  int add_table(std::span<const int32_t> table);
  int add_tables(std::span<const std::vector<int32_t>> tables);
  Status add_token(int seq, int32_t token, int64_t pos, bool want_logits);

  // Group g's view of the batch: the same tokens, positions and logit rows, with that group's
  // slots and block tables (group 0 is this batch itself).
  int n_groups() const { return 1 + (int)groups_.size(); }
  const ForwardBatch& group(int g) const { return g == 0 ? *this : groups_[(size_t)g - 1]; }

  int block_tokens() const { return block_tokens_; }
  int64_t n_tokens() const { return (int64_t)tokens_.size(); }
  int n_seq() const { return (int)context_lens_.size(); }
  int64_t max_blocks() const { return max_blocks_; }
  int64_t max_context() const;  // the most keys any sequence attends over

  std::span<const int32_t> tokens() const { return tokens_; }        // [n_tokens]
  std::span<const int64_t> positions() const { return positions_; }  // [n_tokens]
  std::span<const int32_t> seq_ids() const { return seq_ids_; }      // [n_tokens]
  std::span<const int64_t> slots() const { return slots_; }          // [n_tokens] block * block_tokens + row
  std::span<const int64_t> context_lens() const { return context_lens_; }  // [n_seq] keys after this pass
  std::span<const int64_t> logit_rows() const { return logit_rows_; }      // token rows, in order
  // [max_blocks] of sequence s, -1 past its last block.
  std::span<const int32_t> block_table(int s) const {
    return {block_tables_.data() + (size_t)s * (size_t)max_blocks_, (size_t)max_blocks_};
  }
  // The slot's block and row inside it.
  int32_t slot_block(int64_t slot) const { return (int32_t)(slot / block_tokens_); }
  int64_t slot_row(int64_t slot) const { return slot % block_tokens_; }

  // True when the batch is one sequence at consecutive positions (prefill or decode of a
  // single request), the case a backend may run over a contiguous cache without a table.
  bool single_run() const;

  // Every logit row is read only for its largest entry (LogitsParams::argmax_only); the
  // scheduler sets it when each row's sequence samples greedily without penalties or logprobs.
  bool argmax_logits = false;

 private:
  int block_tokens_;
  std::vector<int32_t> tokens_;
  std::vector<int64_t> positions_;
  std::vector<int32_t> seq_ids_;
  std::vector<int64_t> slots_;
  std::vector<std::vector<int32_t>> tables_;  // as added; flattened into block_tables_
  std::vector<int32_t> block_tables_;         // [n_seq, max_blocks_]
  int64_t max_blocks_ = 0;
  std::vector<int64_t> context_lens_;
  std::vector<int64_t> logit_rows_;
  std::vector<ForwardBatch> groups_;  // groups 1.. of a pool with several layer groups
};

}  // namespace tandem
