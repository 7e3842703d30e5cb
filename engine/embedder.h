// Embeddings on an embedding model (ModelConfig::pooling: mean, cls or last token, from the
// GGUF's pooling_type): every input's tokens run through the model's one forward pass
// (Model::hidden_states; several inputs share a pass while they fit the token budget, a long
// one spans passes), their final hidden states after the output norm are pooled into one
// vector per input, and each vector is L2-normalised. K,V live in blocks borrowed from the
// serving pool for the inputs' passes and given back as each input ends.
//
// A job runs one pass per step(), so the serving loop interleaves it with the scheduler's
// steps: a long embeddings request delays decoding streams by one pass at a time, as a
// prefill chunk does, never by the whole request.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "model/model.h"

namespace tandem {

class EmbeddingJob {
 public:
  // Errors: a generation-only model (pooling None), an empty input.
  static Result<EmbeddingJob> start(Model& model, BlockPool& pool, std::vector<std::vector<int32_t>> inputs);

  enum class Step { Ran, NoRoom };
  // One pass over the next inputs' tokens, at most max_batch_tokens of them. NoRoom: the pool
  // has no blocks for the next input now (running requests hold them); nothing ran.
  Result<Step> step(int64_t max_batch_tokens);
  bool finished() const { return first_ == inputs_.size(); }
  // One vector of n_embd values per input, in order (once finished).
  std::vector<std::vector<float>> vectors() const;  // (its blocks go back as it ends or is destroyed)

 private:
  EmbeddingJob(Model& model, BlockPool& pool, std::vector<std::vector<int32_t>> inputs);
  Model* model_;
  BlockPool* pool_;
  std::vector<std::vector<int32_t>> inputs_;
  std::vector<std::vector<double>> sums_;  // pooled sums, per input
  std::vector<int64_t> done_;              // positions run, per input
  std::vector<BlockTable> tables_;
  size_t first_ = 0;  // the first input not yet run to its end
};

}  // namespace tandem
