// A model's weights, bound by their GGUF names as the family's ArchSpec asks, prepared by the backend from the mapped GGUF file (the backend
// decides their form: the CPU's repack products' matrices into 16-row groups; the small norm
// vectors are decoded to float). A matrix the backend copied no longer needs the file's pages:
// they are released, so the model is not resident twice (mapped and repacked).
#pragma once

#include <functional>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "gguf/gguf_file.h"
#include "model/model_config.h"
#include "model/tensor_parallel.h"

namespace tandem {

// Tensors an ArchSpec does not ask for stay empty (data == nullptr).
struct LayerWeights {
  Tensor attn_norm;       // [1, n_embd]
  Weight wq;              // [q_dim, n_embd] (rows of attn_qkv when fused)
  Weight wk;              // [kv_dim, n_embd]
  Weight wv;              // [kv_dim, n_embd]
  Tensor bq, bk, bv;      // [1, q_dim], [1, kv_dim]: qkv_bias
  Tensor q_norm, k_norm;  // [1, head_dim]: qk_norm
  Tensor bo;              // [1, n_embd]: attn_output_bias
  Tensor sinks;           // [1, n_head]: attn_sinks
  Weight wo;              // [n_embd, q_dim]
  Tensor post_attn_norm;  // [1, n_embd]: sandwich norms
  Tensor ffn_norm;        // [1, n_embd]
  Weight w_gate;          // [n_ff, n_embd] (the first n_ff rows of ffn_up when fused)
  Weight w_up;            // [n_ff, n_embd]
  Weight w_down;          // [n_embd, n_ff]
  Tensor post_ffn_norm;   // [1, n_embd]: sandwich norms
  // A routed layer (LayerSpec::moe) has these instead of w_gate, w_up, w_down: the router
  // [n_expert, n_embd] (ffn_gate_inp) and each expert's matrices, rows of the file's 3-D
  // ffn_{gate,up,down}_exps tensors ([n_ff_exp, n_embd], [n_ff_exp, n_embd], [n_embd, n_ff_exp]).
  Weight router;
  Tensor router_bias;     // [1, n_expert]: moe.router_bias
  std::vector<Weight> gate_exps, up_exps, down_exps;
  Tensor gate_exps_bias, up_exps_bias, down_exps_bias;  // [n_expert, n_ff_exp], ..., [n_expert, n_embd]: moe.expert_bias
  // The routed experts as the backend takes them (the shared expert and biases where loaded).
  ExpertWeights experts() const;
  // Qwen2-MoE's shared expert (ffn_{gate,up,down}_shexp) and its gate [1, n_embd].
  Weight shexp_gate, shexp_up, shexp_down, shexp_router;
};

struct ModelWeights {
  Weight token_embd;              // [n_vocab, n_embd]
  Tensor output_norm;             // [1, n_embd]
  Weight output;                  // [n_vocab, n_embd]; token_embd when tied
  std::vector<float> rope_freqs;  // [rope_dim / 2] frequency divisors (host), empty when absent
  std::vector<LayerWeights> layers;
  int experts_used = 0;  // experts a token routes to in a routed layer (0: dense)

  // Bytes of weights a decode step reads (every matrix once, plus the norms; of a routed
  // layer's experts, the n_used it routes a token to, on average).
  uint64_t bytes_per_token() const;
  // Bytes of every weight (the same as bytes_per_token() for a dense model).
  uint64_t total_bytes() const;

  // progress(done, total) after each layer, when set. tp: only this rank's rows of each
  // weight (model/tensor_parallel.h); the other ranks' rows are never read. Null: the whole
  // model.
  static Result<ModelWeights> from_gguf(const GgufFile& f, const ModelConfig& c, Backend& backend,
                                        const std::function<void(int, int)>& progress = {},
                                        const TensorParallelPlan* tp = nullptr);
};

}  // namespace tandem
