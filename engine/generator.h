// Runs one request end to end: prefill the prompt, then decode token by token until a stop,
// timing each phase (TTFT, TPOT) and accounting the KV cache's bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"
#include "kv/kv_cache.h"
#include "model/llama_model.h"

namespace tandem {

struct GenerationConfig {
  int max_new_tokens = 128;
  bool use_kv_cache = true;  // false: naive mode, every step recomputes the whole sequence
  DType kv_dtype = DType::F16;
  bool stop_at_eog = true;
  std::vector<int32_t> stop_tokens;  // end-of-generation ids (from the vocabulary)
  SamplingParams sampling;
};

struct GenerationStats {
  int n_prompt = 0;
  int n_generated = 0;
  int n_reused = 0;          // prompt tokens already in the cache (multi-turn chat)
  double prefill_s = 0.0;    // time of the prefill forward pass
  double ttft_s = 0.0;       // time to first token: prefill plus the first sample
  double decode_s = 0.0;     // total time of the decode steps
  int n_decode_steps = 0;    // forward passes after the first token
  uint64_t kv_bytes = 0;     // bytes allocated for the KV cache (0 in naive mode)
  bool stopped_by_eog = false;

  double tpot_s() const { return n_decode_steps ? decode_s / n_decode_steps : 0.0; }
  double prefill_tok_s() const { return prefill_s > 0 ? (n_prompt - n_reused) / prefill_s : 0.0; }
  double decode_tok_s() const { return decode_s > 0 ? n_decode_steps / decode_s : 0.0; }
};

// Called with each generated token; return false to stop.
using TokenCallback = std::function<bool(int32_t token)>;

class Generator {
 public:
  explicit Generator(LlamaModel& model) : model_(model) {}

  // One-shot generation from a prompt (a fresh KV cache sized prompt + max_new_tokens).
  Result<GenerationStats> generate(const std::vector<int32_t>& prompt, const GenerationConfig& cfg,
                                   const TokenCallback& on_token);

  // Continues in a caller-owned cache (multi-turn chat): positions whose tokens equal the
  // cache's history are kept, the rest of the prompt is prefilled. `history` holds the
  // tokens in the cache and is updated with the prompt and the generated tokens.
  Result<GenerationStats> generate_in(KvCache& kv, std::vector<int32_t>& history, const std::vector<int32_t>& prompt,
                                      const GenerationConfig& cfg, const TokenCallback& on_token);

 private:
  Result<GenerationStats> generate_no_cache(const std::vector<int32_t>& prompt, const GenerationConfig& cfg,
                                            const TokenCallback& on_token);
  LlamaModel& model_;
};

}  // namespace tandem
