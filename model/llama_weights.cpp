#include "model/llama_weights.h"

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
Result<Weight> matrix(const GgufFile& f, const std::string& name, int64_t rows, int64_t cols, Backend& b,
                      Ranges& release, bool products = true) {
  const GgufTensor* t = f.find_tensor(name);
  if (!t) return make_error("missing tensor {}", name);
  if (t->dims.size() != 2 || (int64_t)t->dims[0] != cols || (int64_t)t->dims[1] != rows)
    return make_error("tensor {} has shape {}, expected [{}, {}]", name, dims_str(t->dims), cols, rows);
  auto w = b.prepare_weight(source(*t, name, rows, cols), products);
  if (w.ok() && !w->reads_source) {
    release.emplace_back(t->data, (size_t)rows * t->row_size());
    f.release_pages(t->data, release.back().second);
  }
  return w;
}

Result<Tensor> vector(const GgufFile& f, const std::string& name, int64_t n, Backend& b) {
  const GgufTensor* t = f.find_tensor(name);
  if (!t) return make_error("missing tensor {}", name);
  if (t->n_elements() != (uint64_t)n || t->dims[0] != (uint64_t)n)
    return make_error("tensor {} has shape {}, expected [{}]", name, dims_str(t->dims), n);
  return b.prepare_vector(source(*t, name, 1, n));
}

}  // namespace

uint64_t LlamaWeights::bytes_per_token() const {
  uint64_t b = output.bytes + (uint64_t)output_norm.cols * 4;
  for (const auto& l : layers)
    b += l.wq.bytes + l.wk.bytes + l.wv.bytes + l.wo.bytes + l.w_gate.bytes + l.w_up.bytes + l.w_down.bytes +
         (uint64_t)(l.attn_norm.cols + l.ffn_norm.cols) * 4;
  return b;
}

Result<LlamaWeights> LlamaWeights::from_gguf(const GgufFile& f, const LlamaConfig& c, Backend& k,
                                             const std::function<void(int, int)>& progress) {
  LlamaWeights w;
  Ranges release;
#define TANDEM_ASSIGN(dst, expr)          \
  do {                                    \
    auto r_ = (expr);                     \
    if (!r_.ok()) return r_.error();      \
    dst = std::move(r_.value());          \
  } while (0)
  TANDEM_ASSIGN(w.token_embd, matrix(f, "token_embd.weight", c.n_vocab, c.n_embd, k, release, c.tied_output));
  TANDEM_ASSIGN(w.output_norm, vector(f, "output_norm.weight", c.n_embd, k));
  if (c.tied_output)
    w.output = w.token_embd;
  else
    TANDEM_ASSIGN(w.output, matrix(f, "output.weight", c.n_vocab, c.n_embd, k, release));
  if (f.find_tensor("rope_freqs.weight")) {
    Tensor freqs;
    TANDEM_ASSIGN(freqs, vector(f, "rope_freqs.weight", c.rope_dim / 2, k));
    const std::span<const float> host = k.read(freqs);
    w.rope_freqs.assign(host.begin(), host.end());
  }
  for (size_t i = 0; i < w.rope_freqs.size(); i++)  // RoPE divides each frequency by its factor
    if (!std::isfinite(w.rope_freqs[i]) || !(w.rope_freqs[i] > 0.0f))
      return make_error("tensor rope_freqs.weight: factor {} is {}, must be finite and > 0", i, w.rope_freqs[i]);

  w.layers.resize(c.n_layer);
  for (int i = 0; i < c.n_layer; i++) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LlamaLayerWeights& l = w.layers[i];
    TANDEM_ASSIGN(l.attn_norm, vector(f, p + "attn_norm.weight", c.n_embd, k));
    TANDEM_ASSIGN(l.wq, matrix(f, p + "attn_q.weight", c.q_dim(), c.n_embd, k, release));
    TANDEM_ASSIGN(l.wk, matrix(f, p + "attn_k.weight", c.kv_dim(), c.n_embd, k, release));
    TANDEM_ASSIGN(l.wv, matrix(f, p + "attn_v.weight", c.kv_dim(), c.n_embd, k, release));
    TANDEM_ASSIGN(l.wo, matrix(f, p + "attn_output.weight", c.n_embd, c.q_dim(), k, release));
    TANDEM_ASSIGN(l.ffn_norm, vector(f, p + "ffn_norm.weight", c.n_embd, k));
    TANDEM_ASSIGN(l.w_gate, matrix(f, p + "ffn_gate.weight", c.n_ff, c.n_embd, k, release));
    TANDEM_ASSIGN(l.w_up, matrix(f, p + "ffn_up.weight", c.n_ff, c.n_embd, k, release));
    TANDEM_ASSIGN(l.w_down, matrix(f, p + "ffn_down.weight", c.n_embd, c.n_ff, k, release));
    if (progress) progress(i + 1, c.n_layer);
  }
#undef TANDEM_ASSIGN
  for (const auto& [p, n] : release) f.release_pages(p, n);
  return w;
}

}  // namespace tandem
