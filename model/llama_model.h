// A loaded Llama-family model and its forward pass, written as the two phases of inference:
//   prefill(tokens): every prompt token in one batched pass (matrix-matrix products), writing
//                    K and V of every position into the KV cache;
//   decode(token):   one token (matrix-vector products), appending one K,V row per layer and
//                    attending over the whole cache;
// plus forward_no_cache(), the naive mode that recomputes K,V of the whole sequence each step.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/matmul.h"
#include "kv/kv_cache.h"
#include "model/llama_config.h"
#include "model/llama_weights.h"

namespace tandem {

struct ModelOptions {
  cpu::Isa isa = cpu::best_isa();
  int64_t max_prefill_chunk = 512;  // longer prompts run as several batched chunks
  // 8-bit activations for Q4_0/Q4_1/Q8_0 weights (llama.cpp's numerics, faster); false keeps
  // every product in float, which reference checks use.
  bool quantized_activations = true;
};

class BlockPool;

// Where a forward pass writes and reads K,V for one layer: a sequence's contiguous cache, or
// the blocks of a pool shared by many sequences.
class LayerKv {
 public:
  virtual ~LayerKv() = default;
  // Rows for the n tokens in flight: k, v [n, kv_dim].
  virtual void store(int layer, const float* k, const float* v, int64_t n) = 0;
  // Attention of the n tokens' queries q [n, q_dim] into out [n, q_dim].
  virtual void attend(int layer, const float* q, int64_t n, float* out) = 0;
};

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
  const cpu::CpuKernels& kernels() const { return kernels_; }

  KvCacheShape kv_shape(int64_t max_tokens, DType dtype = DType::F16) const;
  Result<KvCache> new_kv_cache(int64_t max_tokens, DType dtype = DType::F16) const;

  // Phase 1. Runs tokens at positions [kv.size(), kv.size() + n) and appends their K,V.
  // Returns the logits of the last position ([n_vocab]), or of every position
  // ([n, n_vocab]) with all_logits. The span lives until the next call.
  Result<std::span<const float>> prefill(KvCache& kv, std::span<const int32_t> tokens, bool all_logits = false);

  // Phase 2. Runs one token at position kv.size(), appends its K,V, returns [n_vocab] logits.
  Result<std::span<const float>> decode(KvCache& kv, int32_t token);

  // A serving step (continuous batching): tokens of several sequences in one pass, so every
  // weight matrix multiplies all of them at once. Token i's K,V go to the blocks of
  // tables[batch[i].seq] (which must cover its position) and its attention reads them.
  // Returns [n_logits, n_vocab]: one row per entry with logits set, in batch order.
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
  void embed(std::span<const int32_t> tokens);
  // The transformer layers over the n_tokens in flight, token t at position pos[t]: prefill
  // runs them with a block of tokens, decode with one, a serving step with tokens of many
  // sequences. `kv` says where each layer's K,V rows go and are read from.
  void run_layers(LayerKv& kv, int64_t n_tokens, const int64_t* pos);
  void layer_pass(LayerKv& kv, int64_t n_tokens, bool team);  // run_layers' body
  void run_layers(KvCache& kv, int64_t n_tokens, int64_t pos0);  // one sequence's contiguous cache
  void project(std::initializer_list<cpu::Projection> group, const float* in, int64_t n_tokens) const;
  void compute_logits(int64_t first_row, int64_t n_rows, float* out);
  void compute_logits_rows(std::span<const int64_t> rows, float* out);  // rows of x_, in order

  std::unique_ptr<GgufFile> file_;
  LlamaConfig config_;
  LlamaWeights weights_;
  cpu::CpuKernels kernels_;
  ModelOptions opts_;
  std::vector<double> inv_freq_;  // [rope_dim / 2] RoPE angle per position, per pair

  // Activations of the tokens in flight, grown on demand and reused across calls.
  int64_t scratch_tokens_ = 0;
  std::vector<float> x_;       // [n, n_embd] residual stream
  std::vector<float> xb_;      // [n, n_embd] normed input of a sub-block
  std::vector<float> q_;       // [n, q_dim]
  std::vector<float> k_;       // [n, kv_dim]
  std::vector<float> v_;       // [n, kv_dim]
  std::vector<float> att_;     // [n, q_dim] attention output
  std::vector<float> proj_;    // [n, n_embd] output of attn_output / ffn_down
  std::vector<float> gate_;    // [n, n_ff]
  std::vector<float> up_;      // [n, n_ff]
  std::vector<float> logits_;  // [n_logit_rows, n_vocab]
  std::vector<float> rope_cs_;  // [n, rope_dim] each position's RoPE cos, sin pairs
};

}  // namespace tandem
