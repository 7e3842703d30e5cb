#include "engine/phase_cost.h"

#include <algorithm>
#include <cmath>

namespace tandem {

PhaseCost& PhaseCost::operator+=(const PhaseCost& o) {
  flops += o.flops;
  attn_flops += o.attn_flops;
  weight_bytes += o.weight_bytes;
  kv_read_bytes += o.kv_read_bytes;
  kv_write_bytes += o.kv_write_bytes;
  return *this;
}

ModelShape ModelShape::of(const ModelConfig& c, const ModelWeights& w, double kv_elem_bytes) {
  ModelShape m;
  m.n_layer = c.n_layer;
  m.n_head = c.n_head;
  m.n_kv_head = c.n_kv_head;
  m.head_dim = c.head_dim;
  auto add = [&](const Weight& x, double share) {
    m.matmul_elements_per_token += (double)x.rows * (double)x.cols * share;
    m.matmul_bytes += (double)x.bytes * share;
    m.total_elements += (double)x.rows * (double)x.cols;
    m.total_bytes += (double)x.bytes;
  };
  m.n_expert = c.spec.moe.routing.n_expert;
  m.n_used = c.spec.moe.routing.n_used;
  for (const auto& l : w.layers) {
    for (const auto* x : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.router, &l.shexp_gate,
                          &l.shexp_up, &l.shexp_down, &l.shexp_router})
      add(*x, 1.0);
    const double share = l.gate_exps.empty() ? 0.0 : (double)m.n_used / (double)l.gate_exps.size();
    for (const auto* experts : {&l.gate_exps, &l.up_exps, &l.down_exps})
      for (const Weight& x : *experts) {
        add(x, share);
        m.expert_bytes += (double)x.bytes / (double)experts->size();
      }
  }
  add(w.output, 1.0);
  m.kv_bytes_per_position = 2.0 * c.n_layer * c.n_kv_head * c.head_dim * kv_elem_bytes;
  for (const LayerSpec& l : c.spec.layers) m.windows.push_back(l.window);
  return m;
}

double ModelShape::expected_experts(int64_t rows) const {
  if (n_expert == 0) return 0;
  return n_expert * (1.0 - std::pow(1.0 - (double)n_used / n_expert, (double)std::max<int64_t>(rows, 0)));
}

double ModelShape::weight_bytes_for(int64_t rows) const {
  // matmul_bytes counts n_used experts per routed layer: swap them for the expected distinct.
  return matmul_bytes + expert_bytes * (expected_experts(rows) - n_used);
}

double ModelShape::keys_at(int64_t p) const {
  if (windows.empty()) return (double)n_layer * (double)(p + 1);
  double k = 0;
  for (int64_t w : windows) k += (double)(w > 0 ? std::min(p + 1, w) : p + 1);
  return k;
}

double ModelShape::keys_read(int64_t first, int64_t len) const {
  if (windows.empty()) return (double)n_layer * (double)(first + len);
  double k = 0;  // a windowed layer reads from the first query's window start to the last key
  for (int64_t w : windows) k += (double)(first + len - (w > 0 ? std::max<int64_t>(0, first - w + 1) : 0));
  return k;
}

namespace {

// Attention of one token at position p over its keys, all layers: Q.K and softmax(.)V.
double attention_flops(const ModelShape& m, int64_t p) { return 4.0 * m.n_head * m.head_dim * m.keys_at(p); }

}  // namespace

PhaseCost prefill_cost(const ModelShape& m, int64_t n, int64_t pos0, int64_t chunk) {
  PhaseCost c;
  chunk = std::max<int64_t>(1, chunk);
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start), first = pos0 + start;
    c.weight_bytes += m.weight_bytes_for(len);
    c.flops += 2.0 * m.matmul_elements_per_token * (double)len;
    // attention flops summed over the chunk's positions: sum of (p + 1) per global layer
    if (m.windows.empty() || std::all_of(m.windows.begin(), m.windows.end(), [](int64_t w) { return w == 0; }))
      c.attn_flops += 4.0 * m.n_layer * m.n_head * m.head_dim * ((double)len * (double)(first + 1) + (double)len * (len - 1) / 2);
    else
      for (int64_t p = first; p < first + len; p++) c.attn_flops += attention_flops(m, p);
    // the prefix, once per chunk
    c.kv_read_bytes += m.kv_bytes_per_position / m.n_layer * m.keys_read(first, len);
    c.kv_write_bytes += m.kv_bytes_per_position * (double)len;
  }
  c.flops += c.attn_flops;
  return c;
}

PhaseCost decode_cost(const ModelShape& m, int64_t n, int64_t pos0) {
  PhaseCost c;
  for (int64_t k = 0; k < n; k++) {
    const int64_t p = pos0 + k;
    c.weight_bytes += m.matmul_bytes;
    c.attn_flops += attention_flops(m, p);
    c.flops += 2.0 * m.matmul_elements_per_token + attention_flops(m, p);
    c.kv_read_bytes += m.kv_bytes_per_position / m.n_layer * m.keys_at(p);
    c.kv_write_bytes += m.kv_bytes_per_position;
  }
  return c;
}

PhaseCost verify_cost(const ModelShape& m, int64_t steps, int k, int64_t pos0, double advance) {
  PhaseCost c;
  k = std::max(0, k);
  for (int64_t s = 0; s < steps; s++) c += prefill_cost(m, 1 + k, pos0 + (int64_t)((double)s * advance), 1 + k);
  return c;
}

PhaseCost no_cache_cost(const ModelShape& m, int64_t prompt, int64_t n, int64_t chunk) {
  PhaseCost c;
  for (int64_t k = 0; k < n; k++) c += prefill_cost(m, prompt + k, 0, chunk);
  return c;
}

}  // namespace tandem
