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

Result<std::vector<std::vector<float>>> embed_sequences(Model& model, BlockPool& pool, std::span<const std::vector<int32_t>> inputs,
                                                        int64_t max_batch_tokens) {
  const ModelConfig& c = model.config();
  if (c.pooling == Pooling::None)
    return make_error("this model is not an embedding model: its GGUF has no {}.pooling_type (mean, cls or last)", c.arch);
  for (size_t i = 0; i < inputs.size(); i++)
    if (inputs[i].empty()) return make_error("input {} has no tokens", i);
  const int n_embd = c.n_embd;
  std::vector<std::vector<double>> sums(inputs.size(), std::vector<double>((size_t)n_embd, 0.0));
  std::vector<int64_t> done(inputs.size(), 0);  // positions run, per input
  std::vector<BlockTable> tables;
  tables.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); i++) tables.emplace_back(pool);
  size_t first = 0;  // the first input not yet run to its end
  while (first < inputs.size()) {
    ForwardBatch b(pool.block_tokens());
    std::vector<Part> parts;
    int64_t budget = std::max<int64_t>(1, max_batch_tokens);
    for (size_t i = first; i < inputs.size() && budget > 0; i++) {
      const int64_t from = done[i], to = std::min<int64_t>((int64_t)inputs[i].size(), from + budget);
      if (!tables[i].grow_to(to, from))
        return make_error("the KV pool has no room for this input's {} tokens now (running requests hold it); retry", inputs[i].size());
      TANDEM_TRY(b.add_sequence(std::span(inputs[i]).subspan((size_t)from, (size_t)(to - from)), from, tables[i].tables(),
                                ForwardBatch::Logits::None));
      parts.push_back({i, from, to});
      budget -= to - from;
    }
    auto hidden = model.hidden_states(pool, b);
    if (!hidden.ok()) return hidden.error();
    pool_rows(hidden.value(), n_embd, c.pooling, parts, inputs, sums);
    for (const Part& p : parts) {
      done[p.input] = p.to;
      if (p.to == (int64_t)inputs[p.input].size()) tables[p.input].release();
    }
    while (first < inputs.size() && done[first] == (int64_t)inputs[first].size()) first++;
  }
  std::vector<std::vector<float>> out;
  for (const auto& sum : sums) out.push_back(normalised(sum));  // (a mean's 1/n cancels in the norm)
  return out;
}

}  // namespace tandem
