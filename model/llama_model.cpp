#include "model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

namespace tandem {

Result<std::unique_ptr<LlamaModel>> LlamaModel::load(const std::string& path, const ModelOptions& opts) {
  auto f = GgufFile::open(path);
  if (!f.ok()) return f.error();
  return from_gguf(std::move(f.value()), opts);
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::from_gguf(std::unique_ptr<GgufFile> file, const ModelOptions& opts) {
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  m->opts_ = opts;
  m->backend_ = opts.backend ? opts.backend : default_backend();
  auto cfg = LlamaConfig::from_gguf(*file);
  if (!cfg.ok()) return cfg.error();
  m->config_ = std::move(cfg.value());
  auto w = LlamaWeights::from_gguf(*file, m->config_, *m->backend_, opts.on_load_progress);
  if (!w.ok()) return w.error();
  m->weights_ = std::move(w.value());
  m->file_ = std::move(file);

  const LlamaConfig& c = m->config_;
  m->inv_freq_.resize(c.rope_dim / 2);
  for (int i = 0; i < c.rope_dim / 2; i++) {
    double f = std::pow(c.rope_base, -2.0 * i / c.rope_dim) / c.rope_linear_scale;
    if (!m->weights_.rope_freqs.empty()) f /= m->weights_.rope_freqs[i];
    m->inv_freq_[i] = f;
  }
  return m;
}

Status LlamaModel::check_tokens(std::span<const int32_t> tokens) const {
  for (size_t i = 0; i < tokens.size(); i++)
    if (tokens[i] < 0 || tokens[i] >= config_.n_vocab)
      return make_error("token #{} has id {}, outside the vocabulary [0, {})", i, tokens[i], config_.n_vocab);
  return Status::Ok();
}

void LlamaModel::ensure_scratch(int64_t n, int64_t n_logit_rows) {
  const LlamaConfig& c = config_;
  Backend& be = *backend_;
  if (n > scratch_tokens_) {
    x_ = be.new_tensor(n, c.n_embd);
    xb_ = be.new_tensor(n, c.n_embd);
    q_ = be.new_tensor(n, c.q_dim());
    k_ = be.new_tensor(n, c.kv_dim());
    v_ = be.new_tensor(n, c.kv_dim());
    att_ = be.new_tensor(n, c.q_dim());
    proj_ = be.new_tensor(n, c.n_embd);
    gate_ = be.new_tensor(n, c.n_ff);
    up_ = be.new_tensor(n, c.n_ff);
    rope_cs_ = be.new_tensor(n, c.rope_dim);
    scratch_tokens_ = n;
  }
  if (logits_.rows < n_logit_rows) logits_ = be.new_tensor(n_logit_rows, c.n_vocab);
}

// Prefill multiplies every weight by a block of n tokens (matrix-matrix); decode, with n == 1,
// by a single vector (matrix-vector). Weights that read the same input run as one group.
void LlamaModel::pass(const KvStore& kv, const ForwardBatch& b, int64_t logits_at) {
  const LlamaConfig& c = config_;
  const int64_t n = b.n_tokens();
  const float eps = c.rms_eps;
  const HeadShape heads{c.n_head, c.n_kv_head, c.head_dim};
  Backend& be = *backend_;
  const Tensor x = x_.rows_view(0, n), xb = xb_.rows_view(0, n), q = q_.rows_view(0, n), k = k_.rows_view(0, n),
               v = v_.rows_view(0, n), att = att_.rows_view(0, n), proj = proj_.rows_view(0, n),
               gate = gate_.rows_view(0, n), up = up_.rows_view(0, n), angles = rope_cs_.rows_view(0, n);
  const std::span<const int64_t> logit_rows = b.logit_rows();
  const Tensor logits = logits_.rows_view(logits_at, (int64_t)logit_rows.size());
  auto matmul = [&](std::initializer_list<Product> group, const Tensor& in) {
    be.matmul(std::span<const Product>(group.begin(), group.size()), in);
  };
  be.run_pass(n, [&] {
    be.embed(weights_.token_embd, b, x);
    be.rope_angles(b, inv_freq_, c.rope_dim, angles);  // once for every layer and head
    be.rmsnorm(x, weights_.layers[0].attn_norm, xb, eps);
    for (int li = 0; li < c.n_layer; li++) {
      const LlamaLayerWeights& L = weights_.layers[li];
      // Attention sub-block: x += Wo * attention(rope(Wq xb), cache(rope(Wk xb), Wv xb)).
      matmul({{&L.wq, &q}, {&L.wk, &k}, {&L.wv, &v}}, xb);
      be.rope(q, k, angles, heads, c.rope_dim);
      be.store_kv(k, v, kv, li, b);
      be.attention(q, kv, li, b, heads, att);
      matmul({{&L.wo, &proj}}, att);
      be.add_residual(x, proj, &L.ffn_norm, &xb, eps);
      // Feed-forward sub-block (SwiGLU): x += W_down (silu(W_gate xb) * W_up xb).
      matmul({{&L.w_gate, &gate}, {&L.w_up, &up}}, xb);
      be.swiglu(gate, up);
      matmul({{&L.w_down, &proj}}, gate);
      // The residual add, fused with the next layer's attention norm.
      const Tensor* next_norm = li + 1 < c.n_layer ? &weights_.layers[li + 1].attn_norm : nullptr;
      be.add_residual(x, proj, next_norm, next_norm ? &xb : nullptr, eps);
    }
    if (!logit_rows.empty()) be.logits(x, logit_rows, weights_.output_norm, eps, weights_.output, xb_, logits);
  });
}

}  // namespace tandem
