// Embeddings on an embedding model (ModelConfig::pooling: mean, cls or last token, from the
// GGUF's pooling_type): every input's tokens run through the model's one forward pass
// (Model::hidden_states; several inputs share a pass while they fit the token budget, a long
// one spans passes), their final hidden states after the output norm are pooled into one
// vector per input, and each vector is L2-normalised. K,V live in blocks borrowed from the
// serving pool for the inputs' passes and given back as each input ends.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"
#include "kv/block_pool.h"
#include "model/model.h"

namespace tandem {

// One vector of n_embd values per input, in order. Errors: a generation-only model (pooling
// None), an empty input, a pool without room for an input's blocks now.
Result<std::vector<std::vector<float>>> embed_sequences(Model& model, BlockPool& pool, std::span<const std::vector<int32_t>> inputs,
                                                        int64_t max_batch_tokens);

}  // namespace tandem
