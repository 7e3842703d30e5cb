// A loaded Llama-family model and its forward pass, written as the two phases of inference:
//   prefill(tokens): every prompt token in one batched pass (matrix-matrix products), writing
//                    K and V of every position into the KV cache;
//   decode(token):   one token (matrix-vector products), appending one K,V row per layer and
//                    attending over the whole cache;
// plus forward_no_cache(), the naive mode that recomputes K,V of the whole sequence each step,
// and forward(), a serving step over tokens of many sequences in a block pool. All of them run
// the one pass (LlamaModel::pass) over a ForwardBatch, as calls to the backend (backend/).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/forward_batch.h"
#include "core/error.h"
#include "gguf/gguf_file.h"
#include "kv/kv_cache.h"
#include "model/llama_config.h"
#include "model/llama_weights.h"

namespace tandem {

struct ModelOptions {
  std::shared_ptr<Backend> backend;  // null: default_backend() (the CPU, every core)
  int64_t max_prefill_chunk = 512;   // longer prompts run as several batched chunks
};

class BlockPool;

// One token of a serving step: which sequence it belongs to, its position, whether its
// logits are wanted (the last prompt token, or a decode token).
struct BatchEntry {
  int32_t token = 0;
  int64_t pos = 0;
  int seq = 0;
  bool logits = false;
};

class LlamaModel {
 public:
  static Result<std::unique_ptr<LlamaModel>> load(const std::string& path, const ModelOptions& opts = {});
  static Result<std::unique_ptr<LlamaModel>> from_gguf(std::unique_ptr<GgufFile> file, const ModelOptions& opts = {});

  const LlamaConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }
  const GgufFile& gguf() const { return *file_; }
  Backend& backend() const { return *backend_; }

  KvCacheShape kv_shape(int64_t max_tokens, DType dtype = DType::F16) const;
  Result<KvCache> new_kv_cache(int64_t max_tokens, DType dtype = DType::F16) const;

  // Phase 1. Runs tokens at positions [kv.size(), kv.size() + n) and appends their K,V.
  // Returns the logits of the last position ([n_vocab]), or of every position
  // ([n, n_vocab]) with all_logits. The span lives until the next call.
  Result<std::span<const float>> prefill(KvCache& kv, std::span<const int32_t> tokens, bool all_logits = false);

  // Phase 2. Runs one token at position kv.size(), appends its K,V, returns [n_vocab] logits.
  Result<std::span<const float>> decode(KvCache& kv, int32_t token);

  // A serving step (continuous batching): the batch's tokens of several sequences in one pass,
  // so every weight matrix multiplies all of them at once; their K,V go to the pool's blocks at
  // the batch's slots. Returns [n_logits, n_vocab]: one row per logit row of the batch, in order.
  Result<std::span<const float>> forward(BlockPool& pool, const ForwardBatch& batch);
  // The same from entries and per-sequence block tables (entry.seq indexes `tables`).
  Result<std::span<const float>> forward_batch(BlockPool& pool, std::span<const BatchEntry> batch,
                                               std::span<const std::vector<int32_t>> tables);

  // Naive mode: no persistent cache. Recomputes K,V for the whole sequence in one pass over a
  // scratch cache that is discarded, returning the logits of the last position. K,V are
  // rounded to kv_dtype as the cached path rounds them, so both paths compute the same thing.
  Result<std::span<const float>> forward_no_cache(std::span<const int32_t> tokens, DType kv_dtype = DType::F16);

 private:
  LlamaModel() = default;
  Status check_tokens(std::span<const int32_t> tokens) const;
  void ensure_scratch(int64_t n_tokens, int64_t n_logit_rows);
  // The one forward pass: embed the batch's tokens, run every layer (K,V through `kv`), and
  // write the logits of its logit rows to rows [logits_at, ...) of logits_.
  void pass(const KvStore& kv, const ForwardBatch& b, int64_t logits_at);

  std::unique_ptr<GgufFile> file_;
  std::shared_ptr<Backend> backend_;
  LlamaConfig config_;
  LlamaWeights weights_;
  ModelOptions opts_;
  std::vector<double> inv_freq_;  // [rope_dim / 2] RoPE angle per position, per pair

  // Activations of the tokens in flight (backend memory), grown on demand and reused.
  int64_t scratch_tokens_ = 0;
  Tensor x_;        // [n, n_embd] residual stream
  Tensor xb_;       // [n, n_embd] normed input of a sub-block
  Tensor q_;        // [n, q_dim]
  Tensor k_;        // [n, kv_dim]
  Tensor v_;        // [n, kv_dim]
  Tensor att_;      // [n, q_dim] attention output
  Tensor proj_;     // [n, n_embd] output of attn_output / ffn_down
  Tensor gate_;     // [n, n_ff]
  Tensor up_;       // [n, n_ff]
  Tensor rope_cs_;  // [n, rope_dim] each position's RoPE cos, sin pairs
  Tensor logits_;   // [n_logit_rows, n_vocab]
};

}  // namespace tandem
