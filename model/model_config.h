// Hyper-parameters of a decoder-only transformer, read from GGUF metadata (keys prefixed by the
// architecture name, e.g. "llama.block_count"), and its family's ArchSpec.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "model/arch_spec.h"

namespace tandem {

struct ModelConfig {
  std::string arch;        // general.architecture
  std::string name;        // general.name
  int n_vocab = 0;
  int n_ctx_train = 0;     // context length the model was trained for
  int n_embd = 0;          // hidden size
  int n_layer = 0;
  int n_head = 0;
  int n_kv_head = 0;       // < n_head with grouped-query attention
  int head_dim = 0;
  int n_ff = 0;            // feed-forward hidden size
  int rope_dim = 0;        // dims of each head that RoPE rotates
  double rope_base = 10000.0;      // rope.freq_base (the global layers' with several RoPE sets)
  double rope_linear_scale = 1.0;  // positions are divided by this ("linear" rope scaling)
  // YaRN rope scaling (rope.scaling.type = yarn; factor 0: none): low frequencies interpolated
  // by the factor, high ones kept, a ramp between (model/rope_yarn.h).
  double rope_yarn_factor = 0.0;
  int rope_yarn_orig_ctx = 0;       // rope.scaling.original_context_length
  double rope_yarn_attn_factor = 1.0;
  float rms_eps = 1e-5f;
  bool tied_output = false;  // output projection shares token_embd
  // How an embedding model pools its final hidden states into one vector (<arch>.pooling_type,
  // llama.cpp's values: 0 none, 1 mean, 2 cls, 3 last); None: a generation-only model.
  enum class Pooling { None = 0, Mean = 1, Cls = 2, Last = 3 } pooling = Pooling::None;
  ArchSpec spec;             // how the family's forward pass differs (arch_spec.h)

  int q_dim() const { return n_head * head_dim; }
  int kv_dim() const { return n_kv_head * head_dim; }
  int gqa_group() const { return n_head / n_kv_head; }

  static Result<ModelConfig> from_gguf(const GgufFile& f);
};

}  // namespace tandem
