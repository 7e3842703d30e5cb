#include "model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

namespace tandem {

namespace {

// A sequence's contiguous cache is a store of one block holding its whole capacity.
KvStore store_of(KvCache& kv) {
  const KvCacheShape& s = kv.shape();
  return KvStore{static_cast<uint8_t*>(kv.k(0)), s.dtype, s.n_layer, (int)s.max_tokens, 1,
                 (size_t)kv.row_elems() * kv.elem_bytes()};
}

}  // namespace

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
  auto w = LlamaWeights::from_gguf(*file, m->config_, *m->backend_);
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

KvCacheShape LlamaModel::kv_shape(int64_t max_tokens, DType dtype) const {
  return KvCacheShape{config_.n_layer, config_.n_kv_head, config_.head_dim, max_tokens, dtype};
}

Result<KvCache> LlamaModel::new_kv_cache(int64_t max_tokens, DType dtype) const {
  return KvCache::create(kv_shape(max_tokens, dtype));
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

Result<std::span<const float>> LlamaModel::prefill(KvCache& kv, std::span<const int32_t> tokens, bool all_logits) {
  if (tokens.empty()) return make_error("prefill needs at least one token");
  TANDEM_TRY(check_tokens(tokens));
  const int64_t n_total = (int64_t)tokens.size();
  if (kv.size() + n_total > kv.capacity())
    return make_error("prompt of {} tokens does not fit: the KV cache holds {} and has {} of {} positions used",
                      n_total, kv.capacity(), kv.size(), kv.capacity());
  const int64_t V = config_.n_vocab;
  const int64_t chunk = std::max<int64_t>(1, opts_.max_prefill_chunk);
  ensure_scratch(std::min(chunk, n_total), all_logits ? n_total : 1);
  const KvStore store = store_of(kv);
  const int32_t table[1] = {0};
  for (int64_t start = 0; start < n_total; start += chunk) {
    const int64_t n = std::min(chunk, n_total - start);
    ForwardBatch b((int)kv.capacity());
    using L = ForwardBatch::Logits;
    const L want = all_logits ? L::All : start + n == n_total ? L::Last : L::None;
    TANDEM_TRY(b.add_sequence(tokens.subspan(start, n), kv.size(), table, want));
    pass(store, b, all_logits ? start : 0);
    kv.advance(n);
  }
  return backend_->read(logits_).subspan(0, (all_logits ? n_total : 1) * V);
}

Result<std::span<const float>> LlamaModel::decode(KvCache& kv, int32_t token) {
  const std::span<const int32_t> tokens(&token, 1);
  TANDEM_TRY(check_tokens(tokens));
  if (kv.size() >= kv.capacity())
    return make_error("context full: the KV cache holds {} positions and all are used", kv.capacity());
  ensure_scratch(1, 1);
  ForwardBatch b((int)kv.capacity());
  const int32_t table[1] = {0};
  TANDEM_TRY(b.add_sequence(tokens, kv.size(), table, ForwardBatch::Logits::Last));
  pass(store_of(kv), b, 0);
  kv.advance(1);
  return backend_->read(logits_).subspan(0, config_.n_vocab);
}

Result<std::span<const float>> LlamaModel::forward_no_cache(std::span<const int32_t> tokens, DType kv_dtype) {
  if (tokens.empty()) return make_error("the no-cache forward pass needs at least one token");
  auto scratch = new_kv_cache((int64_t)tokens.size(), kv_dtype);
  if (!scratch.ok()) return scratch.error();
  return prefill(scratch.value(), tokens, false);
}

}  // namespace tandem
