// Views of a Llama model's weights inside the mapped GGUF file (matrices are not copied;
// the small norm vectors are decoded to float once).
#pragma once

#include <vector>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "kernels/cpu/matmul.h"
#include "model/llama_config.h"

namespace tandem {

struct LlamaLayerWeights {
  std::vector<float> attn_norm;  // [n_embd]
  cpu::WeightMatrix wq;          // [q_dim, n_embd]
  cpu::WeightMatrix wk;          // [kv_dim, n_embd]
  cpu::WeightMatrix wv;          // [kv_dim, n_embd]
  cpu::WeightMatrix wo;          // [n_embd, q_dim]
  std::vector<float> ffn_norm;   // [n_embd]
  cpu::WeightMatrix w_gate;      // [n_ff, n_embd]
  cpu::WeightMatrix w_up;        // [n_ff, n_embd]
  cpu::WeightMatrix w_down;      // [n_embd, n_ff]
};

struct LlamaWeights {
  cpu::WeightMatrix token_embd;   // [n_vocab, n_embd]
  std::vector<float> output_norm;  // [n_embd]
  cpu::WeightMatrix output;        // [n_vocab, n_embd]; token_embd when tied
  std::vector<float> rope_freqs;   // [rope_dim / 2] frequency divisors, empty when absent
  std::vector<LlamaLayerWeights> layers;

  // Bytes of weights a decode step reads (every matrix once, plus the norms).
  uint64_t bytes_per_token() const;

  static Result<LlamaWeights> from_gguf(const GgufFile& f, const LlamaConfig& c, const cpu::CpuKernels& k);
};

}  // namespace tandem
