#include "engine/sequence_runner.h"

#include <algorithm>

namespace tandem {

SequenceRunner::SequenceRunner(Model& model, BlockPool& pool, int64_t max_chunk)
    : model_(model), pool_(pool), max_chunk_(std::max<int64_t>(1, max_chunk)), kv_(pool) {}

void SequenceRunner::truncate(int64_t n) {
  n_ = std::min(n_, std::max<int64_t>(0, n));
  kv_.trim(n_);
}

Result<std::span<const float>> SequenceRunner::run(std::span<const int32_t> tokens, bool all_logits) {
  if (tokens.empty()) return make_error("nothing to run: no tokens");
  const int64_t total = (int64_t)tokens.size(), B = pool_.block_tokens(), V = model_.config().n_vocab;
  if (!kv_.grow_to(n_ + total, n_))
    return make_error("{} tokens at position {} do not fit: the KV pool's {} blocks of {} tokens are all in use",
                      total, n_, pool_.n_blocks(), B);
  const bool several = total > max_chunk_;
  if (all_logits && several) all_.resize((size_t)(total * V));
  std::span<const float> last;
  for (int64_t start = 0; start < total; start += max_chunk_) {
    const int64_t n = std::min(max_chunk_, total - start);
    using L = ForwardBatch::Logits;
    const L want = all_logits ? L::All : start + n == total ? L::Last : L::None;
    ForwardBatch b((int)B);
    TANDEM_TRY(b.add_sequence(tokens.subspan((size_t)start, (size_t)n), n_, kv_.tables(), want));
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
