// Runs one request end to end for `run`, `chat` and `explain`: a Scheduler with one request,
// over a paged KV pool, the same loop `serve` runs for many (prefill in chunks, then decode
// token by token until a stop), timing each phase (TTFT, TPOT) and accounting the KV pool's
// bytes. The naive mode (no KV cache) is the scheduler's option of the same loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/error.h"
#include "engine/draft_model.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/token_mask.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "kv/block_pool.h"
#include "model/model.h"

namespace tandem {

struct GenerationConfig {
  int max_new_tokens = 128;
  bool use_kv_cache = true;  // false: naive mode, every step recomputes the whole sequence
  DType kv_dtype = DType::F16;
  bool stop_at_eog = true;
  std::vector<int32_t> stop_tokens;  // end-of-generation ids (from the vocabulary)
  SamplingParams sampling;
  int64_t max_batch_tokens = 512;  // prefill runs in chunks of at most this many tokens
  SpeculativeParams speculative;   // mode Off: one token per decode step
  // Constrained decoding (run --json-schema / --grammar): the output follows this grammar;
  // the masker is the vocabulary's (TokenMasker::for_tokenizer).
  std::shared_ptr<const grammar::Grammar> grammar;
  std::shared_ptr<const grammar::TokenMasker> masker;
  // Mode Draft: the draft model (same vocabulary: checked), its K,V in the generator's second
  // pool, as many positions as the model's.
  Model* draft_model = nullptr;
};

struct GenerationStats {
  int n_prompt = 0;
  int n_generated = 0;       // tokens sampled, the end-of-generation token included
  int n_reused = 0;          // prompt tokens already in the KV pool (an earlier turn's blocks)
  double prefill_s = 0.0;    // time of the prefill forward passes
  double ttft_s = 0.0;       // time to first token: prefill plus the first sample
  double decode_s = 0.0;     // total time of the decode steps
  // Of prefill_s and decode_s, the time in attention (-1: the backend does not measure it, or
  // a draft model shares its passes' time).
  double prefill_attention_s = -1, decode_attention_s = -1;
  int n_decode_steps = 0;    // steps after the first token
  int n_decode_tokens = 0;   // tokens those steps produced (more than the steps when drafts are accepted)
  int64_t n_drafted = 0;     // speculative decoding: tokens proposed,
  int64_t n_accepted = 0;    //   proposed tokens the model accepted,
  int64_t n_verify_steps = 0;  //   and decode steps that verified a draft
  int64_t n_draft_passes = 0;  // the draft model's forward passes in decode steps,
  double draft_s = 0.0;        //   and their time (part of decode_s);
  int64_t n_draft_prefill_passes = 0;  // its passes over the prompt, in prefill steps,
  double draft_prefill_s = 0.0;        //   and their time (part of ttft_s)
  uint64_t kv_bytes = 0;     // bytes of the KV pool (naive mode: its scratch blocks)
  int64_t kv_tokens = 0;     // positions the pool holds
  bool stopped_by_eog = false;   // ended by a stop token (not by max tokens or a complete grammar sentence)
  bool grammar_complete = false; // constrained: ended because the grammar's sentence was complete
  int64_t n_masks = 0;           // constrained: full token masks computed,
  double mask_s = 0.0;           //   and the time masks and matching took

  double tpot_s() const { return n_decode_tokens ? decode_s / n_decode_tokens : 0.0; }
  double prefill_tok_s() const { return prefill_s > 0 ? (n_prompt - n_reused) / prefill_s : 0.0; }
  double decode_tok_s() const { return decode_s > 0 ? n_decode_tokens / decode_s : 0.0; }
  double acceptance_rate() const { return n_drafted ? (double)n_accepted / (double)n_drafted : 0.0; }
};

// Called with each generated token; return false to stop.
using TokenCallback = std::function<bool(int32_t token)>;

class Generator {
 public:
  // context_tokens: the KV pool's size in positions, kept across generate() calls so a chat's
  // next turn finds the earlier turns' full blocks in the prefix cache; 0 sizes the pool per
  // request (prompt + max_new_tokens).
  explicit Generator(Model& model, int64_t context_tokens = 0);
  ~Generator();

  Result<GenerationStats> generate(const std::vector<int32_t>& prompt, const GenerationConfig& cfg,
                                   const TokenCallback& on_token);

 private:
  Status ensure_pool(int64_t tokens, DType dtype);
  // Mode Draft: the draft model with its pool (kept across calls); otherwise none.
  Result<DraftModel> ensure_draft_pool(const GenerationConfig& cfg);

  Model& model_;
  int64_t context_tokens_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<BlockPool> draft_pool_;  // for GenerationConfig::draft_model
  const Model* draft_pool_model_ = nullptr;
};

}  // namespace tandem
