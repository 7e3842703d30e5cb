#include "engine/sequence_runner.h"

#include <algorithm>

namespace tandem {

SequenceRunner::SequenceRunner(Model& model, BlockPool& pool, int64_t max_chunk)
    : model_(model), pool_(pool), max_chunk_(std::max<int64_t>(1, max_chunk)) {}

SequenceRunner::~SequenceRunner() { clear(); }

void SequenceRunner::truncate(int64_t n) {
  n_ = std::min(n_, std::max<int64_t>(0, n));
  const size_t keep = (size_t)((n_ + pool_.block_tokens() - 1) / pool_.block_tokens());
  while (blocks_.size() > keep) {
    pool_.release(blocks_.back());
    blocks_.pop_back();
  }
}

Result<std::span<const float>> SequenceRunner::run(std::span<const int32_t> tokens, bool all_logits) {
  if (tokens.empty()) return make_error("nothing to run: no tokens");
  const int64_t total = (int64_t)tokens.size(), B = pool_.block_tokens(), V = model_.config().n_vocab;
  while ((int64_t)blocks_.size() * B < n_ + total) {
    const int32_t b = pool_.allocate();
    if (b < 0)
      return make_error("{} tokens at position {} do not fit: the KV pool's {} blocks of {} tokens are all in use",
                        total, n_, pool_.n_blocks(), B);
    blocks_.push_back(b);
  }
  const bool several = total > max_chunk_;
  if (all_logits && several) all_.resize((size_t)(total * V));
  std::span<const float> last;
  for (int64_t start = 0; start < total; start += max_chunk_) {
    const int64_t n = std::min(max_chunk_, total - start);
    using L = ForwardBatch::Logits;
    const L want = all_logits ? L::All : start + n == total ? L::Last : L::None;
    ForwardBatch b((int)B);
    TANDEM_TRY(b.add_sequence(tokens.subspan((size_t)start, (size_t)n), n_, blocks_, want));
    auto r = model_.forward(pool_, b);
    if (!r.ok()) return r.error();
    n_ += n;
    last = r.value();
    if (all_logits && several) std::copy(last.begin(), last.end(), all_.begin() + start * V);
  }
  if (all_logits && several) return std::span<const float>(all_);
  return last;
}

}  // namespace tandem
