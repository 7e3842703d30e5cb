#include "model/model_weights.h"

#include <cmath>

namespace tandem {

namespace {

std::string dims_str(const std::vector<uint64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); i++) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

WeightSource source(const GgufTensor& t, const std::string& name, int64_t rows, int64_t cols) {
  return WeightSource{name, t.dtype(), t.data, rows, cols, t.row_size(), t.type.compute_supported};
}

// `products`: the matrix multiplies activations (an untied token embedding only has rows looked
// up, so the backend need not prepare it for products). When the backend made its own copy,
// the file's pages are dropped: a tied embedding's rows that embed() still reads from the file
// fault back in one row at a time, as tokens need them. Pages are dropped at once (so
// loading never holds the whole file) and again once every tensor is prepared (`release`),
// since reading a neighbouring tensor (a norm) maps pages around it back in (fault-around).
using Ranges = std::vector<std::pair<const uint8_t*, size_t>>;
Result<const GgufTensor*> find_matrix(const GgufFile& f, const std::string& name, int64_t rows, int64_t cols) {
  const GgufTensor* t = f.find_tensor(name);
  if (!t) return make_error("missing tensor {}", name);
  if (t->dims.size() != 2 || (int64_t)t->dims[0] != cols || (int64_t)t->dims[1] != rows)
    return make_error("tensor {} has shape {}, expected [{}, {}]", name, dims_str(t->dims), cols, rows);
  return t;
}

// Rows [first, first + rows) of tensor t (all of them, or one part of a fused matrix).
Result<Weight> prepare_rows(const GgufFile& f, const GgufTensor& t, const std::string& name, int64_t first,
                            int64_t rows, int64_t cols, Backend& b, Ranges& release, bool products) {
  WeightSource src = source(t, name, rows, cols);
  src.data += (size_t)first * t.row_size();
  auto w = b.prepare_weight(src, products);
  if (w.ok() && !w->reads_source) {
    release.emplace_back(src.data, (size_t)rows * t.row_size());
    f.release_pages(src.data, release.back().second);
  }
  return w;
}

// Rows [row0, row0 + n_rows) of a matrix (0 rows: all of them): a rank's shard is always whole
// rows, so its products compute each output row as one process does.
struct Part {
  int64_t row0 = 0, n_rows = 0;
};

Result<Weight> matrix(const GgufFile& f, const std::string& name, int64_t rows, int64_t cols, Backend& b,
                      Ranges& release, bool products = true, const Part& part = {}) {
  auto t = find_matrix(f, name, rows, cols);
  if (!t.ok()) return t.error();
  return prepare_rows(f, **t, name, part.row0, part.n_rows ? part.n_rows : rows, cols, b, release, products);
}

// A matrix that stacks several products' rows (Phi-3's attn_qkv, ffn_up holding gate and up):
// one Weight per part, as if the file had them apart.
// Each part: (weight, its rows in the file, the rows [first, first + n) of them this rank owns).
struct RowsOf {
  Weight* w;
  int64_t rows, first, n;
};
Status split_matrix(const GgufFile& f, const std::string& name, int64_t cols, std::initializer_list<RowsOf> parts,
                    Backend& b, Ranges& release) {
  int64_t rows = 0;
  for (const RowsOf& p : parts) rows += p.rows;
  auto t = find_matrix(f, name, rows, cols);
  if (!t.ok()) return t.error();
  int64_t at = 0;
  for (const RowsOf& p : parts) {
    auto part = prepare_rows(f, **t, name, at + p.first, p.n, cols, b, release, true);
    if (!part.ok()) return part.error();
    *p.w = std::move(part.value());
    at += p.rows;
  }
  return Status::Ok();
}

// Elements [first, first + count) of a vector of n (count 0: all of them).
Result<Tensor> vector(const GgufFile& f, const std::string& name, int64_t n, Backend& b, int64_t first = 0,
                      int64_t count = 0) {
  const GgufTensor* t = f.find_tensor(name);
  if (!t) return make_error("missing tensor {}", name);
  if (t->n_elements() != (uint64_t)n || t->dims[0] != (uint64_t)n)
    return make_error("tensor {} has shape {}, expected [{}]", name, dims_str(t->dims), n);
  if (count == 0) return b.prepare_vector(source(*t, name, 1, n));
  const DTypeInfo info = *dtype_info((uint32_t)t->dtype());
  if (first % (int64_t)info.block_elems != 0 || count % (int64_t)info.block_elems != 0)
    return make_error("tensor {} ({}) cannot be split at {} + {}: not whole blocks", name, info.name, first, count);
  WeightSource src = source(*t, name, 1, count);
  src.data += row_bytes(info, (uint64_t)first);
  return b.prepare_vector(src);
}

// A [n, n_expert] tensor of per-expert vectors (biases) as rows: [n_expert, n].
Result<Tensor> expert_vectors(const GgufFile& f, const std::string& name, int n_expert, int64_t n, Backend& b) {
  const GgufTensor* t = f.find_tensor(name);
  if (!t) return make_error("missing tensor {}", name);
  if (t->dims.size() != 2 || (int64_t)t->dims[0] != n || (int64_t)t->dims[1] != n_expert)
    return make_error("tensor {} has shape {}, expected [{}, {}]", name, dims_str(t->dims), n, n_expert);
  auto v = b.prepare_vector(source(*t, name, 1, n * n_expert));
  if (!v.ok()) return v.error();
  v->rows = n_expert;  // the same floats, one expert a row
  v->cols = n;
  return v;
}

// A vector [cols] (or [cols, 1]) as a one-row matrix for products: a gate's weights.
Result<Weight> row_matrix(const GgufFile& f, const std::string& name, int64_t cols, Backend& b, Ranges& release) {
  const GgufTensor* t = f.find_tensor(name);
  if (!t) return make_error("missing tensor {}", name);
  if (t->dims.empty() || t->dims.size() > 2 || (int64_t)t->dims[0] != cols || (t->dims.size() == 2 && t->dims[1] != 1))
    return make_error("tensor {} has shape {}, expected [{}]", name, dims_str(t->dims), cols);
  return prepare_rows(f, *t, name, 0, 1, cols, b, release, true);
}

// Each expert's rows of a 3-D ffn_*_exps tensor (GGUF dims [cols, rows, n_expert]): expert e
// is rows [e * rows, (e + 1) * rows) of it read as one matrix, contiguous in the file.
Status expert_matrices(const GgufFile& f, const std::string& name, int n_expert, int64_t rows, int64_t cols, Backend& b,
                       Ranges& release, std::vector<Weight>& out) {
  const GgufTensor* t = f.find_tensor(name);
  if (!t) return make_error("missing tensor {}", name);
  if (t->dims.size() != 3 || (int64_t)t->dims[0] != cols || (int64_t)t->dims[1] != rows ||
      (int64_t)t->dims[2] != n_expert)
    return make_error("tensor {} has shape {}, expected [{}, {}, {}]", name, dims_str(t->dims), cols, rows, n_expert);
  out.clear();
  for (int e = 0; e < n_expert; e++) {
    auto w = prepare_rows(f, *t, name, (int64_t)e * rows, rows, cols, b, release, true);
    if (!w.ok()) return w.error();
    out.push_back(std::move(w.value()));
  }
  return Status::Ok();
}

}  // namespace

namespace {

uint64_t bytes_of(const std::vector<Weight>& ws) {
  uint64_t b = 0;
  for (const Weight& w : ws) b += w.bytes;
  return b;
}

// Bytes of a layer's weights, counting its experts' bytes times `expert_share`.
uint64_t layer_bytes(const LayerWeights& l, double expert_share) {
  uint64_t b = l.wq.bytes + l.wk.bytes + l.wv.bytes + l.wo.bytes + l.w_gate.bytes + l.w_up.bytes + l.w_down.bytes +
               l.router.bytes + l.shexp_gate.bytes + l.shexp_up.bytes + l.shexp_down.bytes + l.shexp_router.bytes;
  for (const Tensor* v : {&l.attn_norm, &l.ffn_norm, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.post_attn_norm,
                          &l.post_ffn_norm, &l.bo, &l.sinks, &l.router_bias})
    b += (uint64_t)v->cols * 4;
  for (const Tensor* v : {&l.gate_exps_bias, &l.up_exps_bias, &l.down_exps_bias})  // one row per expert
    b += (uint64_t)((double)(v->rows * v->cols * 4) * expert_share);
  const uint64_t experts = bytes_of(l.gate_exps) + bytes_of(l.up_exps) + bytes_of(l.down_exps);
  return b + (uint64_t)((double)experts * expert_share);
}

}  // namespace

ExpertWeights LayerWeights::experts() const {
  auto loaded = [](const Weight& w) { return w.impl ? &w : nullptr; };
  auto tensor = [](const Tensor& t) { return t.data ? &t : nullptr; };
  return ExpertWeights{gate_exps,          up_exps,           down_exps,
                       loaded(shexp_gate), loaded(shexp_up),  loaded(shexp_down),
                       loaded(shexp_router), tensor(gate_exps_bias), tensor(up_exps_bias),
                       tensor(down_exps_bias)};
}

uint64_t ModelWeights::bytes_per_token() const {
  uint64_t b = output.bytes + (uint64_t)output_norm.cols * 4;
  for (const auto& l : layers)
    b += layer_bytes(l, l.gate_exps.empty() ? 0.0 : (double)experts_used / (double)l.gate_exps.size());
  return b;
}

uint64_t ModelWeights::total_bytes() const {
  uint64_t b = output.bytes + (uint64_t)output_norm.cols * 4;
  for (const auto& l : layers) b += layer_bytes(l, 1.0);
  return b;
}

#define TANDEM_ASSIGN(dst, expr)          \
  do {                                    \
    auto r_ = (expr);                     \
    if (!r_.ok()) return r_.error();      \
    dst = std::move(r_.value());          \
  } while (0)

namespace {

// Layer i's attention weights (this rank's rows of them).
Status read_attention(const GgufFile& f, const ModelConfig& c, const TensorParallelPlan& tp, Backend& k, Ranges& release,
                      const std::string& p, LayerWeights& l) {
  const ArchSpec& a = c.spec;
  const int64_t hd = c.head_dim;
  const int64_t q0 = tp.q_head0 * hd, nq = tp.n_q_head * hd, kv0 = tp.kv_head0 * hd, nkv = tp.n_kv_head * hd;
  const Part q_rows{q0, nq}, kv_rows{kv0, nkv}, embd_rows{tp.embd0, tp.n_embd};
  TANDEM_ASSIGN(l.attn_norm, vector(f, p + "attn_norm.weight", c.n_embd, k));
  if (a.fused_qkv) {
    TANDEM_TRY(split_matrix(f, p + "attn_qkv.weight", c.n_embd,
                            {{&l.wq, c.q_dim(), q0, nq}, {&l.wk, c.kv_dim(), kv0, nkv}, {&l.wv, c.kv_dim(), kv0, nkv}},
                            k, release));
  } else {
    TANDEM_ASSIGN(l.wq, matrix(f, p + "attn_q.weight", c.q_dim(), c.n_embd, k, release, true, q_rows));
    TANDEM_ASSIGN(l.wk, matrix(f, p + "attn_k.weight", c.kv_dim(), c.n_embd, k, release, true, kv_rows));
    TANDEM_ASSIGN(l.wv, matrix(f, p + "attn_v.weight", c.kv_dim(), c.n_embd, k, release, true, kv_rows));
  }
  if (a.qkv_bias) {
    TANDEM_ASSIGN(l.bq, vector(f, p + "attn_q.bias", c.q_dim(), k, q0, nq));
    TANDEM_ASSIGN(l.bk, vector(f, p + "attn_k.bias", c.kv_dim(), k, kv0, nkv));
    TANDEM_ASSIGN(l.bv, vector(f, p + "attn_v.bias", c.kv_dim(), k, kv0, nkv));
  }
  if (a.qk_norm) {  // over each head, or (OLMoE) over the whole q and k rows
    TANDEM_ASSIGN(l.q_norm, vector(f, p + "attn_q_norm.weight", a.qk_norm_rows ? c.q_dim() : c.head_dim, k));
    TANDEM_ASSIGN(l.k_norm, vector(f, p + "attn_k_norm.weight", a.qk_norm_rows ? c.kv_dim() : c.head_dim, k));
  }
  TANDEM_ASSIGN(l.wo, matrix(f, p + "attn_output.weight", c.n_embd, c.q_dim(), k, release, true, embd_rows));
  if (a.attn_output_bias) TANDEM_ASSIGN(l.bo, vector(f, p + "attn_output.bias", c.n_embd, k));
  if (a.attn_sinks) TANDEM_ASSIGN(l.sinks, vector(f, p + "attn_sinks.weight", c.n_head, k));
  if (a.norms == NormPlacement::Sandwich)
    TANDEM_ASSIGN(l.post_attn_norm, vector(f, p + "post_attention_norm.weight", c.n_embd, k));
  return Status::Ok();
}

// Layer i's feed-forward: the dense FFN (this rank's rows), or the router and the experts.
Status read_ffn(const GgufFile& f, const ModelConfig& c, const TensorParallelPlan& tp, Backend& k, Ranges& release,
                const std::string& p, bool routed, LayerWeights& l) {
  const ArchSpec& a = c.spec;
  TANDEM_ASSIGN(l.ffn_norm, vector(f, p + a.ffn_norm + ".weight", c.n_embd, k));
  if (routed) {
    const int n_expert = a.moe.routing.n_expert;
    const int64_t ff = a.moe.n_ff;
    TANDEM_ASSIGN(l.router, matrix(f, p + "ffn_gate_inp.weight", n_expert, c.n_embd, k, release));
    if (a.moe.router_bias) TANDEM_ASSIGN(l.router_bias, vector(f, p + "ffn_gate_inp.bias", n_expert, k));
    if (a.moe.expert_bias) {
      TANDEM_ASSIGN(l.gate_exps_bias, expert_vectors(f, p + "ffn_gate_exps.bias", n_expert, ff, k));
      TANDEM_ASSIGN(l.up_exps_bias, expert_vectors(f, p + "ffn_up_exps.bias", n_expert, ff, k));
      TANDEM_ASSIGN(l.down_exps_bias, expert_vectors(f, p + "ffn_down_exps.bias", n_expert, c.n_embd, k));
    }
    TANDEM_TRY(expert_matrices(f, p + "ffn_gate_exps.weight", n_expert, ff, c.n_embd, k, release, l.gate_exps));
    TANDEM_TRY(expert_matrices(f, p + "ffn_up_exps.weight", n_expert, ff, c.n_embd, k, release, l.up_exps));
    TANDEM_TRY(expert_matrices(f, p + "ffn_down_exps.weight", n_expert, c.n_embd, ff, k, release, l.down_exps));
    if (const int64_t sff = a.moe.n_ff_shared; sff > 0) {
      TANDEM_ASSIGN(l.shexp_gate, matrix(f, p + "ffn_gate_shexp.weight", sff, c.n_embd, k, release));
      TANDEM_ASSIGN(l.shexp_up, matrix(f, p + "ffn_up_shexp.weight", sff, c.n_embd, k, release));
      TANDEM_ASSIGN(l.shexp_down, matrix(f, p + "ffn_down_shexp.weight", c.n_embd, sff, k, release));
      TANDEM_ASSIGN(l.shexp_router, row_matrix(f, p + "ffn_gate_inp_shexp.weight", c.n_embd, k, release));
    }
  } else if (a.fused_gate_up) {
    TANDEM_TRY(split_matrix(f, p + "ffn_up.weight", c.n_embd,
                            {{&l.w_gate, c.n_ff, tp.ff0, tp.n_ff}, {&l.w_up, c.n_ff, tp.ff0, tp.n_ff}}, k, release));
  } else {
    const Part ff_rows{tp.ff0, tp.n_ff};
    TANDEM_ASSIGN(l.w_gate, matrix(f, p + "ffn_gate.weight", c.n_ff, c.n_embd, k, release, true, ff_rows));
    TANDEM_ASSIGN(l.w_up, matrix(f, p + "ffn_up.weight", c.n_ff, c.n_embd, k, release, true, ff_rows));
  }
  if (!routed)
    TANDEM_ASSIGN(l.w_down, matrix(f, p + "ffn_down.weight", c.n_embd, c.n_ff, k, release, true, Part{tp.embd0, tp.n_embd}));
  if (a.norms == NormPlacement::Sandwich)
    TANDEM_ASSIGN(l.post_ffn_norm, vector(f, p + "post_ffw_norm.weight", c.n_embd, k));
  return Status::Ok();
}

}  // namespace

Result<ModelWeights> ModelWeights::from_gguf(const GgufFile& f, const ModelConfig& c, Backend& k,
                                             const std::function<void(int, int)>& progress,
                                             const TensorParallelPlan* tp_plan) {
  ModelWeights w;
  Ranges release;
  const TensorParallelPlan tp = tp_plan ? *tp_plan : TensorParallelPlan::whole(c);
  const Part vocab_rows{tp.vocab0, tp.n_vocab};
  TANDEM_ASSIGN(w.token_embd,
                matrix(f, "token_embd.weight", c.n_vocab, c.n_embd, k, release, c.tied_output, vocab_rows));
  TANDEM_ASSIGN(w.output_norm, vector(f, "output_norm.weight", c.n_embd, k));
  if (c.tied_output)
    w.output = w.token_embd;
  else
    TANDEM_ASSIGN(w.output, matrix(f, "output.weight", c.n_vocab, c.n_embd, k, release, true, vocab_rows));
  if (f.find_tensor("rope_freqs.weight")) {
    Tensor freqs;
    TANDEM_ASSIGN(freqs, vector(f, "rope_freqs.weight", c.rope_dim / 2, k));
    const std::span<const float> host = k.read(freqs);
    w.rope_freqs.assign(host.begin(), host.end());
  }
  for (size_t i = 0; i < w.rope_freqs.size(); i++)  // RoPE divides each frequency by its factor
    if (!std::isfinite(w.rope_freqs[i]) || !(w.rope_freqs[i] > 0.0f))
      return make_error("tensor rope_freqs.weight: factor {} is {}, must be finite and > 0", i, w.rope_freqs[i]);

  if (c.spec.moe.active() && !k.runs_moe())
    return make_error("the {} backend does not run mixture-of-experts layers yet (the CPU does)", k.describe());
  w.experts_used = c.spec.moe.routing.n_used;
  w.layers.resize(c.n_layer);
  for (int i = 0; i < c.n_layer; i++) {
    const std::string p = "blk." + std::to_string(i) + ".";
    TANDEM_TRY(read_attention(f, c, tp, k, release, p, w.layers[i]));
    TANDEM_TRY(read_ffn(f, c, tp, k, release, p, c.spec.layers[(size_t)i].moe, w.layers[i]));
    if (progress) progress(i + 1, c.n_layer);
  }
  for (const auto& [p, n] : release) f.release_pages(p, n);
  return w;
}
#undef TANDEM_ASSIGN

}  // namespace tandem
