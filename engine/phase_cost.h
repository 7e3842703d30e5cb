// The work each phase must do, counted from the model's shape: FLOPs, and the bytes it must
// move from memory (weights, KV cache). Their ratio, the arithmetic intensity, says which roof
// bounds the phase: prefill reuses every weight for a whole chunk of tokens (high intensity,
// compute-bound); decode reads every weight for one token (about 2 FLOPs per weight element,
// bandwidth-bound). Counts are of the matrix products and attention; norms, RoPE and the
// activation function are a fraction of a percent and left out.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_config.h"
#include "model/model_weights.h"

namespace tandem {

struct PhaseCost {
  double flops = 0;             // matmul + attention multiply-adds x 2
  double attn_flops = 0;        // of which attention's (Q.K and softmax(.)V)
  double weight_bytes = 0;      // weight bytes read
  double kv_read_bytes = 0;     // K,V bytes read by attention
  double kv_write_bytes = 0;    // K,V bytes appended
  double bytes() const { return weight_bytes + kv_read_bytes + kv_write_bytes; }
  double intensity() const { return bytes() > 0 ? flops / bytes() : 0; }
  // The two halves a long context pulls apart: the weight products (their FLOPs, the weight
  // bytes) and attention (its FLOPs, the K,V bytes read and written).
  PhaseCost products() const { return {flops - attn_flops, 0, weight_bytes, 0, 0}; }
  PhaseCost attention() const { return {attn_flops, attn_flops, 0, kv_read_bytes, kv_write_bytes}; }
  PhaseCost& operator+=(const PhaseCost& o);
};

// What the shape implies; the weights give element counts and bytes per matrix.
struct ModelShape {
  int n_layer = 0, n_head = 0, n_kv_head = 0, head_dim = 0;
  double matmul_elements_per_token = 0;  // weight elements multiplied per token (all layers + output)
  double matmul_bytes = 0;               // bytes of those weights (of a routed layer: its n_used experts)
  // A mixture of experts: of every routed layer's n_expert experts a token runs n_used, and a
  // pass of several tokens reads each expert any of them chose once.
  int n_expert = 0, n_used = 0;
  double expert_bytes = 0;       // bytes of one expert of every routed layer, summed over the layers
  double total_bytes = 0;        // every weight's bytes (the file's, less norms)
  double total_elements = 0;     // every weight's elements
  // The distinct experts of one routed layer that a pass of `rows` tokens reads on average,
  // if each token chose its n_used independently and uniformly: E (1 - (1 - k/E)^rows).
  double expected_experts(int64_t rows) const;
  // Weight bytes a pass of `rows` tokens reads: every dense weight, and the experts chosen.
  double weight_bytes_for(int64_t rows) const;
  double kv_bytes_per_position = 0;      // K and V of every layer for one position
  std::vector<int64_t> windows;          // per layer: sliding window (0: the layer sees every key)
  // Keys attended at position p, summed over the layers (p + 1 per global layer).
  double keys_at(int64_t p) const;
  // Keys a pass reads from the cache for positions [first, first + len), summed over layers.
  double keys_read(int64_t first, int64_t len) const;
  static ModelShape of(const ModelConfig& c, const ModelWeights& w, double kv_elem_bytes);
};

// Prefill of n tokens at positions [pos0, pos0 + n), in chunks of `chunk` tokens: each chunk
// reads every weight once and the KV prefix once.
PhaseCost prefill_cost(const ModelShape& m, int64_t n, int64_t pos0 = 0, int64_t chunk = 512);
// Decode of n tokens, the first at position pos0 (it attends to pos0 + 1 positions): every
// token reads every weight and the whole cache (of a windowed layer, the window).
PhaseCost decode_cost(const ModelShape& m, int64_t n, int64_t pos0);
// Speculative decoding's verify passes: `steps` passes of 1 + k tokens each (the decode token
// and k drafted ones), the first at position pos0 and each `advance` positions after the one
// before (the tokens it kept). A pass reads every weight once for all of its tokens, so its
// FLOPs grow (1 + k)-fold for about the bytes of one decode step: its intensity moves toward
// the ridge. k = 0 is decode_cost.
PhaseCost verify_cost(const ModelShape& m, int64_t steps, int k, int64_t pos0, double advance = 1.0);
// Naive mode: each of n generated tokens, after a prompt of p tokens, recomputes the whole
// sequence: step k is a prefill of p + k tokens.
PhaseCost no_cache_cost(const ModelShape& m, int64_t prompt, int64_t n, int64_t chunk = 512);

}  // namespace tandem
