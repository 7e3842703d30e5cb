// An architecture as data: everything the one forward pass (model.cpp) needs to know to run a
// model family, read from GGUF by one short reader per family (arch_readers.cpp). The pass
// branches on these fields, never on the family's name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace tandem {

// Where a layer's RMSNorms sit. Pre-norm (Llama and most): x += f(norm(x)). Gemma's sandwich
// adds a norm on each branch's output too: x += post_norm(f(norm(x))).
enum class NormPlacement : uint8_t { PreNorm, Sandwich };

// One set of RoPE frequencies: inv_freq[i] = base^(-2i / rope_dim) / linear_scale (divided by
// the file's rope_freqs factors when `freq_factors`). Gemma 3 has two: global and local layers.
struct RopeSet {
  double base = 10000.0;
  double linear_scale = 1.0;  // positions are divided by this ("linear" RoPE scaling)
  bool freq_factors = true;   // apply rope_freqs.weight when the file has one
  // YaRN (factor 0: none): frequencies that turn fewer than beta_slow times over the original
  // context are divided by the factor, those turning more than beta_fast times kept, a ramp
  // between (model/rope_frequencies.h).
  double yarn_factor = 0.0;
  int yarn_orig_ctx = 0;
  double yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
};

struct LayerSpec {
  int rope_set = 0;     // index into ArchSpec::rope_sets
  int64_t window = 0;   // > 0: sliding-window attention over the last `window` positions
  bool moe = false;     // the feed-forward is the routed experts (else the dense FFN)
};

// A mixture of experts: each token's feed-forward is a few of n_expert small FFNs, chosen and
// weighed by a router (backend.h's MoeRouting), plus, in some families, a shared expert every
// token runs. Read from the GGUF's expert_* keys by the family's reader (arch_readers.cpp).
struct MoeSpec {
  MoeRouting routing;       // n_expert == 0: a dense model
  int n_ff = 0;             // each expert's FFN width (expert_feed_forward_length)
  int leading_dense = 0;    // the first layers keep a dense FFN (leading_dense_block_count)
  int n_ff_shared = 0;      // > 0: a shared expert of this width beside the routed ones
  bool shared_gate = false; // the shared expert's output is scaled by sigmoid(ffn_gate_inp_shexp . x)
  bool router_bias = false; // ffn_gate_inp.bias added to the router logits (gpt-oss)
  bool expert_bias = false; // ffn_{gate,up,down}_exps.bias per expert (gpt-oss)
  bool active() const { return routing.n_expert > 0; }
};

struct ArchSpec {
  std::string family;  // the reader that filled it: llama, qwen2, qwen3, gemma3, phi3, granite
  NormPlacement norms = NormPlacement::PreNorm;
  GateActivation activation = GateActivation::Silu;
  RopeStyle rope_style = RopeStyle::AdjacentPairs;
  bool use_rope = true;        // false: no rotary embedding (Granite's rope.scaling.finetuned = false)
  bool fused_qkv = false;      // one attn_qkv matrix (q rows, k rows, v rows), split at load
  bool fused_gate_up = false;  // ffn_up holds the gate's rows, then up's (Phi-3), split at load
  bool qkv_bias = false;       // attn_{q,k,v}.bias added after the products (Qwen2)
  bool qk_norm = false;        // attn_{q,k}_norm: RMSNorm over each head of q and k before RoPE
  bool qk_norm_rows = false;   // with qk_norm: over the whole q and k rows instead (OLMoE)
  bool attn_output_bias = false;  // attn_output.bias added after the output product (gpt-oss)
  bool attn_sinks = false;        // attn_sinks.weight: one logit per head in every softmax (gpt-oss)
  std::string ffn_norm = "ffn_norm";  // the FFN's input norm tensor (gpt-oss: post_attention_norm)
  float attention_scale = 0;   // scores = q . k * attention_scale
  float embedding_scale = 1;   // the token embedding is multiplied by this
  float residual_scale = 1;    // each branch's output is multiplied by this before the add
  float logit_scale = 1;       // logits are multiplied by this (Granite: 1 / its logit_scale)
  float logit_softcap = 0;     // > 0: logits = softcap * tanh(logits / softcap)
  MoeSpec moe;
  std::vector<RopeSet> rope_sets;
  std::vector<LayerSpec> layers;

  // "gemma3: sandwich norms, GELU-tanh gate, ...": for `tandem info` and logs.
  std::string describe() const;
  // The widest sliding window (0 when no layer has one) and how many layers have one.
  int64_t max_window() const;
  int windowed_layers() const;
};

}  // namespace tandem
