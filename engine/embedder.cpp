#include "engine/embedder.h"

#include <algorithm>
#include <cmath>

#include "kv/block_table.h"

namespace tandem {

namespace {

using Pooling = ModelConfig::Pooling;

// One input's share of a pass: its positions [from, to).
struct Part {
  size_t input;
  int64_t from, to;
};

// Adds each input's hidden rows of the pass (rows in the order of `parts`) to its pooled sum:
// every row for mean pooling, the first position's for cls, the last position's for last.
void pool_rows(std::span<const float> hidden, int n_embd, Pooling pooling, std::span<const Part> parts,
               std::span<const std::vector<int32_t>> inputs, std::vector<std::vector<double>>& sums) {
  size_t row = 0;
  for (const Part& p : parts) {
    const int64_t n = (int64_t)inputs[p.input].size();
    for (int64_t t = p.from; t < p.to; t++, row++) {
      const bool take = pooling == Pooling::Mean || (pooling == Pooling::Cls && t == 0) || (pooling == Pooling::Last && t == n - 1);
      if (!take) continue;
      const float* h = hidden.data() + row * (size_t)n_embd;  // [n_embd]
      for (int d = 0; d < n_embd; d++) sums[p.input][(size_t)d] += h[d];
    }
  }
}

// The pooled vector, L2-normalised (a zero vector stays zero).
std::vector<float> normalised(const std::vector<double>& sum) {
  double norm = 0;
  for (double v : sum) norm += v * v;
  norm = std::sqrt(norm);
  std::vector<float> out(sum.size());
  for (size_t d = 0; d < sum.size(); d++) out[d] = norm > 0 ? (float)(sum[d] / norm) : 0.0f;
  return out;
}

}  // namespace

EmbeddingJob::EmbeddingJob(Model& model, BlockPool& pool, std::vector<std::vector<int32_t>> inputs)
    : model_(&model), pool_(&pool), inputs_(std::move(inputs)) {
  sums_.assign(inputs_.size(), std::vector<double>((size_t)model.config().n_embd, 0.0));
  done_.assign(inputs_.size(), 0);
  tables_.reserve(inputs_.size());
  for (size_t i = 0; i < inputs_.size(); i++) tables_.emplace_back(pool);
}

Result<EmbeddingJob> EmbeddingJob::start(Model& model, BlockPool& pool, std::vector<std::vector<int32_t>> inputs) {
  const ModelConfig& c = model.config();
  if (c.pooling == Pooling::None)
    return make_error("this model is not an embedding model: its GGUF has no {}.pooling_type (mean, cls or last)", c.arch);
  for (size_t i = 0; i < inputs.size(); i++)
    if (inputs[i].empty()) return make_error("input {} has no tokens", i);
  return EmbeddingJob(model, pool, std::move(inputs));
}

Result<EmbeddingJob::Step> EmbeddingJob::step(int64_t max_batch_tokens) {
  ForwardBatch b(pool_->block_tokens());
  std::vector<Part> parts;
  int64_t budget = std::max<int64_t>(1, max_batch_tokens);
  for (size_t i = first_; i < inputs_.size() && budget > 0; i++) {
    const int64_t from = done_[i], to = std::min<int64_t>((int64_t)inputs_[i].size(), from + budget);
    if (!tables_[i].grow_to(to, from)) {
      if (parts.empty()) return Step::NoRoom;
      break;  // run what fits
    }
    TANDEM_TRY(b.add_sequence(std::span(inputs_[i]).subspan((size_t)from, (size_t)(to - from)), from, tables_[i].tables(),
                              ForwardBatch::Logits::None));
    parts.push_back({i, from, to});
    budget -= to - from;
  }
  auto hidden = model_->hidden_states(*pool_, b);
  if (!hidden.ok()) return hidden.error();
  const ModelConfig& c = model_->config();
  pool_rows(hidden.value(), c.n_embd, c.pooling, parts, inputs_, sums_);
  for (const Part& p : parts) {
    done_[p.input] = p.to;
    if (p.to == (int64_t)inputs_[p.input].size()) tables_[p.input].release();
  }
  while (first_ < inputs_.size() && done_[first_] == (int64_t)inputs_[first_].size()) first_++;
  return Step::Ran;
}

std::vector<std::vector<float>> EmbeddingJob::vectors() const {
  std::vector<std::vector<float>> out;
  for (const auto& sum : sums_) out.push_back(normalised(sum));  // (a mean's 1/n cancels in the norm)
  return out;
}

}  // namespace tandem
