// Mixtures of experts on the CPU: each token's router logits -> its experts and their weights,
// then the experts' products. The step's rows are bucketed by expert, so each chosen expert's
// weights are read once per call however many rows chose it (the products share the rows out
// over the team as any matmul does), and the weighted results are added back into each row.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <span>

#include "backend/cpu/cpu_backend.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/work_team.h"

namespace tandem {

namespace {

constexpr int kMaxExperts = 512;  // as the GGUF reader allows (model/arch_readers_moe.cpp)

float* f32(const Tensor& t) { return static_cast<float*>(t.data); }
const cpu::WeightMatrix& matrix(const Weight& w) { return *static_cast<const cpu::WeightMatrix*>(w.impl.get()); }

}  // namespace

namespace {

// One token's experts (ids, largest weight first) and weights from its router logits.
void route_row(const float* logits, const MoeRouting& r, float* ids, float* weights) {
  const int E = std::min(r.n_expert, kMaxExperts), k = std::min(r.n_used, E);
  // The gate's probabilities (or, softmax over the top-k, the raw logits) ...
  std::array<float, kMaxExperts> p;
  std::copy_n(logits, E, p.begin());
  const auto probs = std::span<float>(p.data(), (size_t)E);
  if (!r.softmax_over_top_k) {
    if (r.gating == ExpertGating::Sigmoid) {
      for (float& v : probs) v = 1.0f / (1.0f + std::exp(-v));
    } else {
      const float mx = *std::max_element(probs.begin(), probs.end());
      double sum = 0;
      for (float& v : probs) sum += (v = std::exp(v - mx));
      for (float& v : probs) v = (float)(v / sum);
    }
  }
  // ... the k largest, ties to the lower id ...
  std::array<int, kMaxExperts> order;
  std::iota(order.begin(), order.begin() + E, 0);
  std::partial_sort(order.begin(), order.begin() + k, order.begin() + E,
                    [&](int a, int b) { return p[(size_t)a] > p[(size_t)b] || (p[(size_t)a] == p[(size_t)b] && a < b); });
  double sum = 0;
  for (int j = 0; j < k; j++) {
    ids[j] = (float)order[(size_t)j];
    weights[j] = p[(size_t)order[(size_t)j]];
  }
  // ... and their weights: a softmax over the k, or the probabilities renormalised, then scaled.
  if (r.softmax_over_top_k) {
    const float mx = weights[0];
    for (int j = 0; j < k; j++) sum += (weights[j] = std::exp(weights[j] - mx));
  } else {
    for (int j = 0; j < k; j++) sum += weights[j];
  }
  // (llama.cpp clamps the renormalising sum at 2^-14, so a row of underflowed weights stays finite.)
  const bool divide = r.softmax_over_top_k || r.normalize;
  if (!r.softmax_over_top_k) sum = std::max(sum, 6.103515625e-5);
  for (int j = 0; j < k; j++) weights[j] = (float)((divide ? weights[j] / sum : weights[j]) * r.scale);
}

}  // namespace

void CpuBackend::moe_route(const Tensor& router_logits, const MoeRouting& r, const Tensor& routes) {
  for (int64_t t = 0; t < router_logits.rows; t++) {
    float* row = f32(routes) + t * routes.cols;
    route_row(f32(router_logits) + t * router_logits.cols, r, row, row + r.n_used);
  }
}

void CpuBackend::expert_products(ExpertBuffers& s, const float* in, int64_t m, const Weight& gate, const Weight& up,
                                 const Weight& down, GateActivation act, const Weight* gate_of_output,
                                 const ExpertBias& bias, float* out) {
  const int64_t F = gate.rows;
  s.gate.resize((size_t)(m * F));
  s.up.resize((size_t)(m * F));
  s.scale.resize((size_t)m);
  cpu::Projection first[3] = {{&matrix(gate), s.gate.data()}, {&matrix(up), s.up.data()}, {}};
  if (gate_of_output) first[2] = {&matrix(*gate_of_output), s.scale.data()};
  cpu::matmul_group(std::span<const cpu::Projection>(first, gate_of_output ? 3 : 2), in, m, kernels_);
  const cpu::SiluMulFn activate = activation_kernel(act);
  cpu::parallel_for(m, cpu::Split{1, 4}, [&](int64_t b, int64_t end, int) {
    for (int64_t i = b; i < end; i++) {
      if (bias.gate) cpu::add_inplace(s.gate.data() + i * F, bias.gate, F);
      if (bias.up) cpu::add_inplace(s.up.data() + i * F, bias.up, F);
      activate(s.gate.data() + i * F, s.up.data() + i * F, F);
    }
  });
  const cpu::Projection second[1] = {{&matrix(down), out}};
  cpu::matmul_group(second, s.gate.data(), m, kernels_);
  if (bias.down)
    for (int64_t i = 0; i < m; i++) cpu::add_inplace(out + i * down.rows, bias.down, down.rows);
}

void CpuBackend::moe_ffn(const Tensor& x, const Tensor& routes, int n_used, const ExpertWeights& e, GateActivation act,
                         const Tensor& out) {
  MoeScratch& s = moe_;
  const int64_t n = x.rows, D = x.cols;
  const size_t E = e.gate.size();
  s.rows.resize(E);
  for (auto& r : s.rows) r.clear();
  for (int64_t t = 0; t < n; t++) {
    const float* row = f32(routes) + t * routes.cols;
    for (int j = 0; j < n_used; j++) s.rows[(size_t)row[j]].push_back({t, row[n_used + j]});
  }
  // The chosen experts, and where each one's output rows start in s.ys.
  s.used.clear();
  s.first.assign(E, 0);
  int64_t total = 0;
  for (size_t ex = 0; ex < E; ex++)
    if (!s.rows[ex].empty()) s.used.push_back((int)ex), s.first[ex] = total, total += (int64_t)s.rows[ex].size();
  s.ys.resize((size_t)(total * D));
  moe_counts_.calls++;
  moe_counts_.experts += (int64_t)s.used.size();
  // One expert's products over its rows (gathered side by side; a single row is read in place).
  auto run_expert = [&](ExpertBuffers& b, size_t ex) {
    const auto& rows = s.rows[ex];
    const int64_t m = (int64_t)rows.size();
    const float* in = f32(x) + rows[0].first * D;
    if (m > 1) {
      b.in.resize((size_t)(m * D));
      for (int64_t i = 0; i < m; i++) std::copy_n(f32(x) + rows[(size_t)i].first * D, D, b.in.data() + i * D);
      in = b.in.data();
    }
    auto row_of = [&](const Tensor* t) { return t ? f32(*t) + (int64_t)ex * t->cols : nullptr; };
    expert_products(b, in, m, e.gate[ex], e.up[ex], e.down[ex], act, nullptr,
                    ExpertBias{row_of(e.gate_bias), row_of(e.up_bias), row_of(e.down_bias)}, s.ys.data() + s.first[ex] * D);
  };
  // Each expert's products are shared out over the team. (Threads running whole experts, one
  // op for the layer, measured slower on 2 cores: Qwen3-30B-A3B's shape tg128 78 vs 99 tok/s,
  // pp512 960 vs 1260: one core streaming each expert reads slower than both on its rows.)
  for (int ex : s.used) run_expert(s.buffers, (size_t)ex);
  // Each row's weighted sum, experts in id order.
  std::fill(f32(out), f32(out) + n * out.cols, 0.0f);
  for (int ex : s.used)
    for (size_t i = 0; i < s.rows[(size_t)ex].size(); i++) {
      const auto [t, w] = s.rows[(size_t)ex][i];
      float* dst = f32(out) + t * out.cols;
      const float* y = s.ys.data() + (s.first[(size_t)ex] + (int64_t)i) * D;
      for (int64_t c = 0; c < D; c++) dst[c] += w * y[c];
    }
  if (!e.shared_gate) return;
  // The shared expert runs every row, its output scaled by its gate's sigmoid.
  s.ys.resize((size_t)(n * D));
  expert_products(s.buffers, f32(x), n, *e.shared_gate, *e.shared_up, *e.shared_down, act, e.shared_router, ExpertBias{},
                  s.ys.data());
  for (int64_t t = 0; t < n; t++) {
    const float g = e.shared_router ? 1.0f / (1.0f + std::exp(-s.buffers.scale[(size_t)t])) : 1.0f;
    float* dst = f32(out) + t * out.cols;
    const float* y = s.ys.data() + t * D;
    for (int64_t c = 0; c < D; c++) dst[c] += g * y[c];
  }
}

}  // namespace tandem
