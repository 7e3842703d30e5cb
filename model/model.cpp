#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "kv/block_pool.h"
#include "model/rope_frequencies.h"

namespace tandem {

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const ModelOptions& opts) {
  auto f = GgufFile::open(path);
  if (!f.ok()) return f.error();
  return from_gguf(std::move(f.value()), opts);
}

Result<std::unique_ptr<Model>> Model::from_gguf(std::unique_ptr<GgufFile> file, const ModelOptions& opts) {
  std::unique_ptr<Model> m(new Model());
  m->opts_ = opts;
  m->backend_ = opts.backend ? opts.backend : default_backend();
  auto cfg = ModelConfig::from_gguf(*file);
  if (!cfg.ok()) return cfg.error();
  m->config_ = std::move(cfg.value());
  m->tp_ = TensorParallelPlan::whole(m->config_);
  if (opts.tensor_parallel && opts.tensor_parallel->size() > 1) {
    if (!m->backend_->runs_tensor_parallel())
      return make_error("tensor parallel: the {} backend does not run tensor parallel yet (the CPU does)",
                        m->backend_->describe());
    auto plan = TensorParallelPlan::make(m->config_, opts.tensor_parallel->rank(), opts.tensor_parallel->size());
    if (!plan.ok()) return plan.error();
    m->tp_ = plan.value();
  }
  auto w = ModelWeights::from_gguf(*file, m->config_, *m->backend_, opts.on_load_progress, &m->tp_);
  if (!w.ok()) return w.error();
  m->weights_ = std::move(w.value());
  m->file_ = std::move(file);
  if (m->tp_.split()) {
    m->comm_ = opts.tensor_parallel;  // every rank has its shard before rank 0's first step (loading may take minutes)
    const double pass_timeout = m->comm_->timeout_s;
    m->comm_->timeout_s = 300;
    int32_t loaded = 1;
    m->comm_->broadcast(&loaded, sizeof loaded, 0);
    m->comm_->timeout_s = pass_timeout;
    if (m->comm_->failed()) return make_error("{}", m->comm_->error());
    if (m->tp_.rank == 0) m->start_heartbeat();
  }

  const ModelConfig& c = m->config_;
  for (const RopeSet& set : c.spec.rope_sets) m->inv_freq_.push_back(rope_inv_freq(set, c.rope_dim, m->weights_.rope_freqs));
  return m;
}

Status Model::check_tokens(std::span<const int32_t> tokens) const {
  for (size_t i = 0; i < tokens.size(); i++)
    if (tokens[i] < 0 || tokens[i] >= config_.n_vocab)
      return make_error("token #{} has id {}, outside the vocabulary [0, {})", i, tokens[i], config_.n_vocab);
  return Status::Ok();
}

void Model::ensure_scratch(int64_t n, int64_t n_logit_rows) {
  const ModelConfig& c = config_;
  Backend& be = *backend_;
  if (n > scratch_tokens_) {
    x_ = be.new_tensor(n, c.n_embd);
    xb_ = be.new_tensor(n, c.n_embd);
    q_ = be.new_tensor(n, tp_.q_dim(c.head_dim));
    k_ = be.new_tensor(n, tp_.kv_dim(c.head_dim));
    v_ = be.new_tensor(n, tp_.kv_dim(c.head_dim));
    att_ = be.new_tensor(n, tp_.q_dim(c.head_dim));
    proj_ = be.new_tensor(n, c.n_embd);
    gate_ = be.new_tensor(n, tp_.n_ff);
    up_ = be.new_tensor(n, tp_.n_ff);
    if (c.spec.moe.active()) {
      router_ = be.new_tensor(n, c.spec.moe.routing.n_expert);
      routes_ = be.new_tensor(n, 2 * c.spec.moe.routing.n_used);
    }
    if (tp_.split()) {
      att_all_ = be.new_tensor(n, c.q_dim());
      gate_all_ = be.new_tensor(n, c.n_ff);
      proj_part_ = be.new_tensor(n, tp_.n_embd);
    }
    rope_cs_.clear();
    for (size_t i = 0; i < inv_freq_.size(); i++) rope_cs_.push_back(be.new_tensor(n, c.rope_dim));
    scratch_tokens_ = n;
  }
  if (logits_.rows < n_logit_rows) logits_ = be.new_tensor(n_logit_rows, tp_.n_vocab);
}

// x = the batch's token embeddings. Under tensor parallelism each rank has its vocabulary rows;
// the others' tokens are zero rows until the sum over the ranks (exact).
void Model::embed_tokens(const ForwardBatch& b, const Tensor& x) {
  const float scale = config_.spec.embedding_scale;
  if (Collectives* ranks = collectives()) {
    backend_->embed_shard(weights_.token_embd, tp_.vocab0, b, x, scale);
    backend_->all_reduce(x, *ranks);
  } else {
    backend_->embed(weights_.token_embd, b, x, scale);
  }
}

// A routed layer's feed-forward: proj = the sum over each token's experts (the router's top-k)
// of its weight times the expert's gated FFN of xb.
void Model::routed_ffn(const LayerWeights& L, const Tensor& xb, const Tensor& proj) {
  const MoeSpec& moe = config_.spec.moe;
  const Tensor router = router_.rows_view(0, xb.rows), routes = routes_.rows_view(0, xb.rows);
  const Product p{&L.router, &router, L.router_bias.data ? &L.router_bias : nullptr};
  backend_->matmul({&p, 1}, xb);
  backend_->moe_route(router, moe.routing, routes);
  backend_->moe_ffn(xb, routes, moe.routing.n_used, L.experts(), config_.spec.activation, proj);
}

// Prefill multiplies every weight by a block of n tokens (matrix-matrix); decode, with n == 1,
// by a single vector (matrix-vector). Weights that read the same input run as one group. The
// family's differences are the spec's fields, read here and nowhere else.
void Model::pass(const KvStore& kv, const KvLayerGroups& groups, const ForwardBatch& b, int64_t logits_at, bool hidden) {
  const ModelConfig& c = config_;
  const ArchSpec& a = c.spec;
  const int64_t n = b.n_tokens();
  const float eps = c.rms_eps;
  // tp_ is the tensor-parallel plan (this rank's shares: heads, rows, columns); ranks is the
  // exchange with the other ranks, null when this process holds the whole model.
  const HeadShape heads{tp_.n_q_head, tp_.n_kv_head, c.head_dim};  // this rank's heads
  Collectives* ranks = collectives();
  const bool sandwich = a.norms == NormPlacement::Sandwich;
  Backend& be = *backend_;
  const Tensor x = x_.rows_view(0, n), xb = xb_.rows_view(0, n), q = q_.rows_view(0, n), k = k_.rows_view(0, n),
               v = v_.rows_view(0, n), att = att_.rows_view(0, n), proj = proj_.rows_view(0, n),
               gate = gate_.rows_view(0, n), up = up_.rows_view(0, n);
  std::vector<Tensor> angles;  // per RoPE set
  for (const Tensor& t : rope_cs_) angles.push_back(t.rows_view(0, n));
  const std::span<const int64_t> logit_rows = b.logit_rows();
  const Tensor logits = logits_.rows_view(logits_at, (int64_t)logit_rows.size());
  auto matmul = [&](std::initializer_list<Product> group, const Tensor& in) {
    be.matmul(std::span<const Product>(group.begin(), group.size()), in);
  };
  auto bias = [](const Tensor& t) { return t.data ? &t : nullptr; };
  // proj = W in for attn_output and ffn_down. Split, W is this rank's rows: the ranks' columns
  // of `in` are gathered first (in_all), and the ranks' rows of the output after, so each
  // element is one process's dot product of the same input row.
  const Tensor att_all = ranks ? att_all_.rows_view(0, n) : Tensor{},
               gate_all = ranks ? gate_all_.rows_view(0, n) : Tensor{},
               proj_part = ranks ? proj_part_.rows_view(0, n) : Tensor{};
  auto row_parallel = [&](const Weight& w, const Tensor& in, const Tensor& in_all, std::span<const int64_t> in_cols) {
    if (!ranks) return matmul({{&w, &proj}}, in);
    be.gather_columns(in, in_all, in_cols, *ranks);
    matmul({{&w, &proj_part}}, in_all);
    be.gather_columns(proj_part, proj, tp_.embd_cols, *ranks);
  };
  be.run_pass(n, [&] {
    embed_tokens(b, x);
    for (size_t i = 0; i < inv_freq_.size(); i++)  // once for every layer and head
      be.rope_angles(b, inv_freq_[i], c.rope_dim, angles[i]);
    be.rmsnorm(x, weights_.layers[0].attn_norm, xb, eps);
    for (int li = 0; li < c.n_layer; li++) {
      const LayerWeights& L = weights_.layers[li];
      const LayerSpec& ls = a.layers[li];
      // Attention sub-block: x += Wo * attention(rope(Wq xb), cache(rope(Wk xb), Wv xb)).
      matmul({{&L.wq, &q, bias(L.bq)}, {&L.wk, &k, bias(L.bk)}, {&L.wv, &v, bias(L.bv)}}, xb);
      if (a.qk_norm) {
        be.rmsnorm(q, L.q_norm, q, eps, a.qk_norm_rows ? 0 : c.head_dim);
        be.rmsnorm(k, L.k_norm, k, eps, a.qk_norm_rows ? 0 : c.head_dim);
      }
      if (a.use_rope) be.rope(q, k, angles[ls.rope_set], heads, c.rope_dim, a.rope_style);
      // K,V in the blocks of the layer's group (kv/layer_groups.h), at its place in them.
      const int group = groups.group_of[(size_t)li], slot = groups.slot_of[(size_t)li];
      be.store_kv(k, v, kv, slot, b.group(group));
      be.attention(q, kv, slot, b.group(group), heads,
                   AttentionParams{a.attention_scale, ls.window, a.attn_sinks ? &L.sinks : nullptr}, att);
      if (a.attn_output_bias)  // (the families with one are not split by tensor parallelism)
        matmul({{&L.wo, &proj, &L.bo}}, att);
      else
        row_parallel(L.wo, att, att_all, tp_.q_cols);
      if (sandwich) be.rmsnorm(proj, L.post_attn_norm, proj, eps);
      be.add_residual(x, proj, &L.ffn_norm, &xb, eps, a.residual_scale);
      if (ls.moe) {  // routed: x += the sum over each token's experts of weight * expert(xb)
        routed_ffn(L, xb, proj);
      } else {  // feed-forward sub-block (gated): x += W_down (act(W_gate xb) * W_up xb)
        matmul({{&L.w_gate, &gate}, {&L.w_up, &up}}, xb);
        be.gated_activation(gate, up, a.activation);
        row_parallel(L.w_down, gate, gate_all, tp_.ff_cols);
      }
      if (sandwich) be.rmsnorm(proj, L.post_ffn_norm, proj, eps);
      // The residual add, fused with the next layer's attention norm.
      const Tensor* next_norm = li + 1 < c.n_layer ? &weights_.layers[li + 1].attn_norm : nullptr;
      be.add_residual(x, proj, next_norm, next_norm ? &xb : nullptr, eps, a.residual_scale);
    }
    if (hidden) be.rmsnorm(x, weights_.output_norm, xb, eps);
    if (!logit_rows.empty())
      be.logits(x, logit_rows, weights_.output_norm, eps, weights_.output, xb_, logits,
                LogitsParams{a.logit_scale, a.logit_softcap, b.argmax_logits && !ranks});
  });
}

}  // namespace tandem
