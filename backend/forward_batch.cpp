#include "backend/forward_batch.h"

#include <algorithm>

namespace tandem {

ForwardBatch::ForwardBatch(int block_tokens) : block_tokens_(std::max(1, block_tokens)) {}

int ForwardBatch::add_table(std::span<const int32_t> table) {
  const int s = (int)tables_.size();
  tables_.emplace_back(table.begin(), table.end());
  context_lens_.push_back(0);
  if ((int64_t)table.size() > max_blocks_) {
    // Widen every row: the flat table is [n_seq, max_blocks] with -1 past a sequence's blocks.
    max_blocks_ = (int64_t)table.size();
    block_tables_.assign(tables_.size() * (size_t)max_blocks_, -1);
    for (size_t i = 0; i < tables_.size(); i++)
      std::copy(tables_[i].begin(), tables_[i].end(), block_tables_.begin() + (ptrdiff_t)(i * (size_t)max_blocks_));
  } else {
    block_tables_.resize(tables_.size() * (size_t)max_blocks_, -1);
    std::copy(table.begin(), table.end(), block_tables_.begin() + (ptrdiff_t)((size_t)s * (size_t)max_blocks_));
  }
  return s;
}

int ForwardBatch::add_tables(std::span<const std::vector<int32_t>> tables) {
  if (tables.empty()) return add_table({});
  if (n_seq() == 0) groups_.assign(tables.size() - 1, ForwardBatch(block_tokens_));
  for (size_t g = 1; g < tables.size() && g <= groups_.size(); g++) groups_[g - 1].add_table(tables[g]);
  return add_table(tables[0]);
}

Status ForwardBatch::add_token(int seq, int32_t token, int64_t pos, bool want_logits) {
  if (seq < 0 || seq >= n_seq()) return make_error("batch token names sequence {} of {}", seq, n_seq());
  if (pos < 0) return make_error("sequence {}: position {} is negative", seq, pos);
  for (size_t g = 0; g < groups_.size(); g++) {
    if (groups_[g].n_seq() != n_seq()) return make_error("sequence {} has no block table for layer group {}", seq, g + 1);
    TANDEM_TRY(groups_[g].add_token(seq, token, pos, want_logits));
  }
  const std::vector<int32_t>& table = tables_[(size_t)seq];
  const int64_t b = pos / block_tokens_;
  if (b >= (int64_t)table.size() || table[(size_t)b] < 0)
    return make_error("sequence {} has no KV block for position {}", seq, pos);
  if (want_logits) logit_rows_.push_back(n_tokens());
  tokens_.push_back(token);
  positions_.push_back(pos);
  seq_ids_.push_back(seq);
  slots_.push_back((int64_t)table[(size_t)b] * block_tokens_ + pos % block_tokens_);
  context_lens_[(size_t)seq] = std::max(context_lens_[(size_t)seq], pos + 1);
  return Status::Ok();
}

Status ForwardBatch::add_sequence(std::span<const int32_t> tokens, int64_t first_pos, std::span<const int32_t> table,
                                  Logits logits) {
  const int s = add_table(table);
  for (size_t i = 0; i < tokens.size(); i++) {
    const bool want = logits == Logits::All || (logits == Logits::Last && i + 1 == tokens.size());
    TANDEM_TRY(add_token(s, tokens[i], first_pos + (int64_t)i, want));
  }
  return Status::Ok();
}

Status ForwardBatch::add_sequence(std::span<const int32_t> tokens, int64_t first_pos,
                                  std::span<const std::vector<int32_t>> tables, Logits logits) {
  if (n_seq() > 0 && tables.size() != (size_t)n_groups())
    return make_error("a sequence with {} block tables in a batch of {} layer groups", tables.size(), n_groups());
  const int s = add_tables(tables);
  for (size_t i = 0; i < tokens.size(); i++) {
    const bool want = logits == Logits::All || (logits == Logits::Last && i + 1 == tokens.size());
    TANDEM_TRY(add_token(s, tokens[i], first_pos + (int64_t)i, want));
  }
  return Status::Ok();
}

int64_t ForwardBatch::max_context() const {
  int64_t m = 0;
  for (int64_t c : context_lens_) m = std::max(m, c);
  return m;
}

bool ForwardBatch::single_run() const {
  if (n_seq() != 1 || tokens_.empty()) return false;
  for (size_t i = 1; i < positions_.size(); i++)
    if (positions_[i] != positions_[0] + (int64_t)i) return false;
  return true;
}

}  // namespace tandem
