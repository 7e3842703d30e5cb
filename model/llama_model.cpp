#include "model/llama_model.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

namespace tandem {

Result<std::unique_ptr<LlamaModel>> LlamaModel::load(const std::string& path, const ModelOptions& opts) {
  auto f = GgufFile::open(path);
  if (!f.ok()) return f.error();
  return from_gguf(std::move(f.value()), opts);
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::from_gguf(std::unique_ptr<GgufFile> file, const ModelOptions& opts) {
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  m->opts_ = opts;
  m->kernels_ = cpu::CpuKernels::for_isa(opts.isa, opts.quantized_activations);
  auto cfg = LlamaConfig::from_gguf(*file);
  if (!cfg.ok()) return cfg.error();
  m->config_ = std::move(cfg.value());
  auto w = LlamaWeights::from_gguf(*file, m->config_, m->kernels_);
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
  if (n > scratch_tokens_) {
    x_.resize(n * c.n_embd);
    xb_.resize(n * c.n_embd);
    q_.resize(n * c.q_dim());
    k_.resize(n * c.kv_dim());
    v_.resize(n * c.kv_dim());
    att_.resize(n * c.q_dim());
    proj_.resize(n * c.n_embd);
    gate_.resize(n * c.n_ff);
    up_.resize(n * c.n_ff);
    scratch_tokens_ = n;
  }
  if ((int64_t)logits_.size() < n_logit_rows * c.n_vocab) logits_.resize(n_logit_rows * c.n_vocab);
}

void LlamaModel::embed(std::span<const int32_t> tokens) {
  const cpu::WeightMatrix& e = weights_.token_embd;
  for (size_t t = 0; t < tokens.size(); t++)
    cpu::dequantize_row(e.type, e.row(tokens[t]), x_.data() + t * config_.n_embd, config_.n_embd);
}

// Prefill multiplies every weight by a block of n tokens (matrix-matrix); decode, with n == 1,
// by a single vector (matrix-vector: matmul_group then splits rows finely and uses the fused
// dots). Weights that read the same input run as one group.
void LlamaModel::project(std::initializer_list<cpu::Projection> group, const float* in, int64_t n) const {
  cpu::matmul_group(std::span<const cpu::Projection>(group.begin(), group.size()), in, n, kernels_);
}

namespace {

constexpr int64_t kParallelTokens = 4;

// One sequence's contiguous cache, the tokens in flight at [pos0, pos0 + n).
class ContiguousKv : public LayerKv {
 public:
  ContiguousKv(KvCache& kv, int64_t pos0, const cpu::AttentionShape& shape, const cpu::CpuKernels& k)
      : kv_(kv), pos0_(pos0), shape_(shape), kernels_(k) {}
  void store(int layer, const float* k, const float* v, int64_t n) override { kv_.store(layer, pos0_, k, v, n); }
  void attend(int layer, const float* q, int64_t n, float* out) override {
    cpu::attention(q, kv_.k(layer), kv_.v(layer), kv_.shape().dtype, n, pos0_, shape_, out, kernels_);
  }

 private:
  KvCache& kv_;
  int64_t pos0_;
  cpu::AttentionShape shape_;
  const cpu::CpuKernels& kernels_;
};

}  // namespace

void LlamaModel::run_layers(KvCache& kv, int64_t n, int64_t pos0) {
  const LlamaConfig& c = config_;
  ContiguousKv backend(kv, pos0, {c.n_head, c.n_kv_head, c.head_dim}, kernels_);
  std::vector<int64_t> pos((size_t)n);
  for (int64_t t = 0; t < n; t++) pos[(size_t)t] = pos0 + t;
  run_layers(backend, n, pos.data());
  kv.advance(n);
}

void LlamaModel::run_layers(LayerKv& kv, int64_t n, const int64_t* pos) {
  const LlamaConfig& c = config_;
  // Each position's RoPE angles once for all layers and heads.
  rope_cs_.resize((size_t)(n * c.rope_dim));
  for (int64_t t = 0; t < n; t++) cpu::rope_angles(pos[t], inv_freq_.data(), c.rope_dim, &rope_cs_[t * c.rope_dim]);
  if (n >= kParallelTokens) return layer_pass(kv, n, false);
  // Decode: one thread team for the whole pass. Its ~150 products and attentions then share
  // work out inside the region (matmul_group and attention join a team they are called in)
  // and meet at barriers, instead of starting and ending a region each (~1 us apiece here).
#pragma omp parallel
  layer_pass(kv, n, true);
}

// team: every thread of a region runs this; the per-token element-wise work goes to one of
// them (it is too small to split), and the rest wait at the end of that `single`. Otherwise
// the calling thread runs it and element-wise work splits over threads by token.
void LlamaModel::layer_pass(LayerKv& kv, int64_t n, bool team) {
  const LlamaConfig& c = config_;
  const int64_t d = c.n_embd;
  auto each_token = [&](auto f) {
    if (team) {
#pragma omp single
      for (int64_t t = 0; t < n; t++) f(t);
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < n; t++) f(t);
    }
  };
  each_token([&](int64_t t) { cpu::rmsnorm(&x_[t * d], weights_.layers[0].attn_norm.data(), &xb_[t * d], d, c.rms_eps); });
  for (int li = 0; li < c.n_layer; li++) {
    const LlamaLayerWeights& L = weights_.layers[li];
    // Attention sub-block: x += Wo * attention(rope(Wq xb), cache(rope(Wk xb), Wv xb)).
    project({{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}}, xb_.data(), n);
    auto rope_token = [&](int64_t t) {
      cpu::rope(&q_[t * c.q_dim()], c.n_head, c.head_dim, c.rope_dim, &rope_cs_[t * c.rope_dim]);
      cpu::rope(&k_[t * c.kv_dim()], c.n_kv_head, c.head_dim, c.rope_dim, &rope_cs_[t * c.rope_dim]);
    };
    if (team) {  // RoPE and the cache store in one `single`: one barrier, not two
#pragma omp single
      {
        for (int64_t t = 0; t < n; t++) rope_token(t);
        kv.store(li, k_.data(), v_.data(), n);
      }
    } else {
      each_token(rope_token);
      kv.store(li, k_.data(), v_.data(), n);
    }
    kv.attend(li, q_.data(), n, att_.data());
    project({{&L.wo, proj_.data()}}, att_.data(), n);
    each_token([&](int64_t t) {
      cpu::add_inplace(&x_[t * d], &proj_[t * d], d);
      cpu::rmsnorm(&x_[t * d], L.ffn_norm.data(), &xb_[t * d], d, c.rms_eps);
    });

    // Feed-forward sub-block (SwiGLU): x += W_down (silu(W_gate xb) * W_up xb).
    project({{&L.w_gate, gate_.data()}, {&L.w_up, up_.data()}}, xb_.data(), n);
    each_token([&](int64_t t) { kernels_.silu_mul(&gate_[t * c.n_ff], &up_[t * c.n_ff], c.n_ff); });
    project({{&L.w_down, proj_.data()}}, gate_.data(), n);
    // The residual add, fused with the next layer's attention norm.
    const float* next_norm = li + 1 < c.n_layer ? weights_.layers[li + 1].attn_norm.data() : nullptr;
    each_token([&](int64_t t) {
      cpu::add_inplace(&x_[t * d], &proj_[t * d], d);
      if (next_norm) cpu::rmsnorm(&x_[t * d], next_norm, &xb_[t * d], d, c.rms_eps);
    });
  }
}

void LlamaModel::compute_logits(int64_t first_row, int64_t n_rows, float* out) {
  std::vector<int64_t> rows((size_t)n_rows);
  for (int64_t r = 0; r < n_rows; r++) rows[(size_t)r] = first_row + r;
  compute_logits_rows(rows, out);
}

void LlamaModel::compute_logits_rows(std::span<const int64_t> rows, float* out) {
  const int64_t d = config_.n_embd;
  for (size_t r = 0; r < rows.size(); r++)
    cpu::rmsnorm(&x_[rows[r] * d], weights_.output_norm.data(), &xb_[r * d], d, config_.rms_eps);
  project({{&weights_.output, out}}, xb_.data(), (int64_t)rows.size());
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
  for (int64_t start = 0; start < n_total; start += chunk) {
    const int64_t n = std::min(chunk, n_total - start);
    embed(tokens.subspan(start, n));
    run_layers(kv, n, kv.size());
    if (all_logits)
      compute_logits(0, n, logits_.data() + start * V);
    else if (start + n == n_total)
      compute_logits(n - 1, 1, logits_.data());
  }
  return std::span<const float>(logits_.data(), (all_logits ? n_total : 1) * V);
}

Result<std::span<const float>> LlamaModel::decode(KvCache& kv, int32_t token) {
  TANDEM_TRY(check_tokens(std::span<const int32_t>(&token, 1)));
  if (kv.size() >= kv.capacity())
    return make_error("context full: the KV cache holds {} positions and all are used", kv.capacity());
  ensure_scratch(1, 1);
  embed(std::span<const int32_t>(&token, 1));
  run_layers(kv, 1, kv.size());
  compute_logits(0, 1, logits_.data());
  return std::span<const float>(logits_.data(), config_.n_vocab);
}

Result<std::span<const float>> LlamaModel::forward_no_cache(std::span<const int32_t> tokens, DType kv_dtype) {
  if (tokens.empty()) return make_error("the no-cache forward pass needs at least one token");
  auto scratch = new_kv_cache((int64_t)tokens.size(), kv_dtype);
  if (!scratch.ok()) return scratch.error();
  return prefill(scratch.value(), tokens, false);
}

}  // namespace tandem
