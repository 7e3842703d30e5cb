#include "backend/cpu/cpu_backend.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include <fmt/core.h>

#include "core/huge_pages.h"
#include "core/timer.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/bounded_head.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

namespace tandem {

namespace {

// Element-wise work on up to this many rows runs on the calling thread: sharing it costs more
// than it saves (decode's RMSNorm, RoPE, residual adds are a few microseconds).
constexpr int64_t kInlineRows = 3;
// Argmax-only logit rows from this many on go through a bounded head (see logits()).
constexpr int64_t kBoundedHeadMinRows = 4;

float* f32(const Tensor& t) { return static_cast<float*>(t.data); }
const cpu::WeightMatrix& matrix(const Weight& w) { return *static_cast<const cpu::WeightMatrix*>(w.impl.get()); }

}  // namespace

bool name_has_components(std::string_view name, std::string_view pattern) {
  if (pattern.empty()) return false;
  for (size_t at = 0; at + pattern.size() <= name.size(); at = name.find('.', at) + 1) {
    const size_t end = at + pattern.size();
    if (name.compare(at, pattern.size(), pattern) == 0 && (end == name.size() || name[end] == '.')) return true;
    if (name.find('.', at) == std::string_view::npos) break;
  }
  return false;
}

std::shared_ptr<Backend> default_backend() { return std::make_shared<CpuBackend>(); }

CpuBackend::CpuBackend(const CpuBackendOptions& o)
    : kernels_(cpu::kernels_for(o.isa, o.quantized_activations)),
      exact_kernels_(cpu::kernels_for(o.isa, false)),
      exact_products_(o.quantized_activations ? o.exact_products : std::vector<std::string>{}),
      threads_(o.threads > 0 ? o.threads : omp_get_max_threads()) {}

std::string CpuBackend::describe() const {
  std::string exact;
  for (const std::string& e : exact_products_) exact += (exact.empty() ? " (f32 for " : ", ") + e;
  return fmt::format("cpu {}, {} threads, {} activations{}", cpu::isa_name(kernels_.isa), threads_,
                     kernels_.quantized_activations ? "8-bit" : "f32", exact.empty() ? "" : exact + ")");
}

Tensor CpuBackend::new_tensor(int64_t rows, int64_t cols) {
  std::shared_ptr<float[]> mem(new float[(size_t)std::max<int64_t>(1, rows * cols)]);
  return Tensor{mem.get(), rows, cols, DType::F32, std::shared_ptr<void>(mem, mem.get())};
}

Tensor CpuBackend::upload(std::span<const float> host, int64_t rows, int64_t cols) {
  Tensor t = new_tensor(rows, cols);
  std::copy(host.begin(), host.begin() + std::min<size_t>(host.size(), (size_t)(rows * cols)), f32(t));
  return t;
}

std::span<const float> CpuBackend::read(const Tensor& t) { return {f32(t), (size_t)(t.rows * t.cols)}; }

Result<KvStore> CpuBackend::new_kv_store(DType dtype, int n_layer, int block_tokens, int64_t n_blocks,
                                         size_t row_bytes) {
  auto layout = kv_store_layout(dtype, n_layer, block_tokens, n_blocks, row_bytes);
  if (!layout.ok()) return layout.error();
  KvStore kv = std::move(layout.value());
  // More than the machine has can only fail later, in the middle of serving: refuse it now.
  const uint64_t ram = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
  if (ram > 0 && kv.bytes() > ram)
    return make_error("a KV store of {} bytes does not fit in this machine's {} bytes of memory", kv.bytes(), ram);
  std::shared_ptr<uint8_t[]> mem = allocate_huge_pages(kv.bytes(), false);
  if (!mem) return make_error("cannot allocate a KV store of {} bytes", kv.bytes());
  kv.data = mem.get();
  kv.owner = std::shared_ptr<void>(mem, mem.get());
  return kv;
}

Result<Weight> CpuBackend::prepare_weight(const WeightSource& src, bool products) {
  auto w = std::make_shared<cpu::WeightMatrix>();
  w->type = src.type;
  w->data = src.data;
  w->rows = src.rows;
  w->cols = src.cols;
  w->row_bytes = src.row_bytes;
  bool exact = false;
  for (const std::string& e : exact_products_) exact |= name_has_components(src.name, e);
  const cpu::CpuKernels& k = exact ? exact_kernels_ : kernels_;
  w->dot = k.row_dot(w->type);
  w->dot_tokens = k.row_dot_tokens(w->type);
  w->qdot = k.quant_dot(w->type);
  w->qdot4 = k.quant_dot4(w->type);
  if (!src.compute_supported || !w->dot)
    return make_error("tensor {} has type {}, which tandem cannot compute with yet", src.name, dtype_name(src.type));
  if (products) {
    // Packing shares its groups out on this backend's team, whose members sleep once it is
    // done (an OpenMP team's would spin for tens of ms, into the first passes and probes).
    cpu::TeamScope scope(&team());
    w->pack_for(k);
  }
  const bool reads_source = !w->is_packed();  // products read the packed copy only
  return Weight{src.type, src.rows, src.cols, (uint64_t)w->bytes(), std::move(w), reads_source};
}

Result<Tensor> CpuBackend::prepare_vector(const WeightSource& src) {
  Tensor t = new_tensor(1, src.cols);
  if (!src.compute_supported || !cpu::dequantize_row(src.type, src.data, f32(t), src.cols))
    return make_error("tensor {} has type {}, which tandem cannot decode", src.name, dtype_name(src.type));
  return t;
}

const cpu::BoundedHead* CpuBackend::bounded_head(const cpu::WeightMatrix& w) const {
  // Made by the first step that can use it (passes run one at a time per backend); null,
  // remembered, where the scheme does not apply: 8-bit heads, f32 mode, other types.
  if (!w.bounded) w.bounded = kernels_.quantized_activations ? cpu::BoundedHead::make(w, kernels_) : nullptr;
  return w.bounded->get();
}

cpu::WorkTeam& CpuBackend::team() {
  if (!team_) team_ = std::make_unique<cpu::WorkTeam>(threads_);
  return *team_;
}

template <typename F>
void CpuBackend::few_rows(int64_t n, F f) {
  for (int64_t t = 0; t < n; t++) f(t);
}

void CpuBackend::run_pass(int64_t, const std::function<void()>& body) {
  // The body runs on this thread; the ops it shares out (products, attention, element-wise
  // work on many rows) go to the team. OpenMP regions inside (none on the hot path) take this
  // backend's count too, then the caller's again.
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads_);
  {
    cpu::TeamScope scope(&team());
    body();
  }
  omp_set_num_threads(saved);
}

template <typename F>
void CpuBackend::each_row(int64_t n, F f) {
  if (n <= kInlineRows) return few_rows(n, f);
  cpu::parallel_for(n, cpu::Split{1, 4}, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; t++) f(t);
  });
}

void CpuBackend::embed(const Weight& table, const ForwardBatch& b, const Tensor& out, float scale) {
  const cpu::WeightMatrix& e = matrix(table);
  const std::span<const int32_t> tokens = b.tokens();
  few_rows((int64_t)tokens.size(), [&](int64_t t) {
    float* row = f32(out) + t * out.cols;
    cpu::dequantize_row(e.type, e.row(tokens[(size_t)t]), row, out.cols);
    if (scale != 1.0f) cpu::scale_inplace(row, scale, out.cols);
  });
}

void CpuBackend::embed_shard(const Weight& table, int64_t first_row, const ForwardBatch& b, const Tensor& out,
                             float scale) {
  const cpu::WeightMatrix& e = matrix(table);
  const std::span<const int32_t> tokens = b.tokens();
  few_rows((int64_t)tokens.size(), [&](int64_t t) {
    float* row = f32(out) + t * out.cols;
    const int64_t r = tokens[(size_t)t] - first_row;
    if (r < 0 || r >= e.rows) return (void)std::fill(row, row + out.cols, 0.0f);
    cpu::dequantize_row(e.type, e.row(r), row, out.cols);
    if (scale != 1.0f) cpu::scale_inplace(row, scale, out.cols);
  });
}

void CpuBackend::gather_columns(const Tensor& part, const Tensor& out, std::span<const int64_t> cols,
                                Collectives& c) {
  const int64_t n = part.rows;
  gather_counts_.resize(cols.size());
  for (size_t r = 0; r < cols.size(); r++) gather_counts_[r] = (size_t)(n * cols[r]);
  // The gather leaves rank r's [n, cols[r]] block after the blocks of ranks before it; one
  // row's blocks are already the row.
  if (n == 1) return c.all_gather_v(f32(part), gather_counts_, f32(out));
  gathered_.resize((size_t)(n * out.cols));
  c.all_gather_v(f32(part), gather_counts_, gathered_.data());
  each_row(n, [&](int64_t t) {
    const float* block = gathered_.data();
    float* row = f32(out) + t * out.cols;
    for (const int64_t w : cols) {
      std::memcpy(row, block + t * w, (size_t)w * sizeof(float));
      row += w;
      block += n * w;
    }
  });
}

void CpuBackend::matmul(std::span<const Product> group, const Tensor& in) {
  // Decode calls this ~150 times a token: no heap allocation here.
  constexpr size_t kMaxGroup = 8;
  cpu::Projection proj[kMaxGroup];
  bool any_bias = false;
  for (size_t start = 0; start < group.size(); start += kMaxGroup) {
    const size_t n = std::min(kMaxGroup, group.size() - start);
    for (size_t i = 0; i < n; i++) {
      proj[i] = {&matrix(*group[start + i].w), f32(*group[start + i].out)};
      any_bias |= group[start + i].bias != nullptr;
    }
    cpu::matmul_group(std::span<const cpu::Projection>(proj, n), f32(in), in.rows, kernels_);
  }
  if (!any_bias) return;
  each_row(in.rows, [&](int64_t t) {
    for (const Product& p : group)
      if (p.bias) cpu::add_inplace(f32(*p.out) + t * p.out->cols, f32(*p.bias), p.out->cols);
  });
}

void CpuBackend::rmsnorm(const Tensor& x, const Tensor& weight, const Tensor& out, float eps, int head_dim) {
  const int64_t width = head_dim > 0 ? head_dim : x.cols, per_row = x.cols / width;
  each_row(x.rows, [&](int64_t t) {
    for (int64_t h = 0; h < per_row; h++)
      cpu::rmsnorm(f32(x) + t * x.cols + h * width, f32(weight), f32(out) + t * out.cols + h * width, width, eps);
  });
}

void CpuBackend::add_residual(const Tensor& x, const Tensor& delta, const Tensor* norm, const Tensor* out, float eps,
                              float delta_scale) {
  const int64_t d = x.cols;
  each_row(x.rows, [&](int64_t t) {
    if (delta_scale == 1.0f)
      cpu::add_inplace(f32(x) + t * d, f32(delta) + t * d, d);
    else
      cpu::add_scaled_inplace(f32(x) + t * d, f32(delta) + t * d, delta_scale, d);
    if (norm) cpu::rmsnorm(f32(x) + t * d, f32(*norm), f32(*out) + t * d, d, eps);
  });
}

void CpuBackend::rope_angles(const ForwardBatch& b, std::span<const double> inv_freq, int rope_dim, const Tensor& out) {
  const std::span<const int64_t> pos = b.positions();
  few_rows((int64_t)pos.size(),
           [&](int64_t t) { cpu::rope_angles(pos[(size_t)t], inv_freq.data(), rope_dim, f32(out) + t * out.cols); });
}

void CpuBackend::rope(const Tensor& q, const Tensor& k, const Tensor& angles, const HeadShape& h, int rope_dim,
                      RopeStyle style) {
  const auto rotate = style == RopeStyle::NeoxHalves ? cpu::rope_neox : cpu::rope;
  each_row(q.rows, [&](int64_t t) {
    const float* cs = f32(angles) + t * angles.cols;
    rotate(f32(q) + t * q.cols, h.n_head, h.head_dim, rope_dim, cs);
    rotate(f32(k) + t * k.cols, h.n_kv_head, h.head_dim, rope_dim, cs);
  });
}

cpu::SiluMulFn CpuBackend::activation_kernel(GateActivation act) const {
  if (act == GateActivation::SwigluOai) return cpu::swiglu_oai_mul;  // gpt-oss's: scalar for now
  return act == GateActivation::GeluTanh ? kernels_.gelu_tanh_mul : kernels_.silu_mul;
}

void CpuBackend::gated_activation(const Tensor& gate, const Tensor& up, GateActivation act) {
  const cpu::SiluMulFn f = activation_kernel(act);
  each_row(gate.rows, [&](int64_t t) { f(f32(gate) + t * gate.cols, f32(up) + t * up.cols, gate.cols); });
}

void CpuBackend::store_kv(const Tensor& k, const Tensor& v, const KvStore& kv, int layer, const ForwardBatch& b) {
  const int64_t row = k.cols;
  const std::span<const int64_t> slots = b.slots();
  few_rows(k.rows, [&](int64_t i) {
    const int64_t slot = slots[(size_t)i];
    uint8_t* block = kv.data + (size_t)b.slot_block(slot) * kv.block_bytes() + (size_t)b.slot_row(slot) * kv.row_bytes;
    const float* ks = f32(k) + i * row;
    const float* vs = f32(v) + i * row;
    if (kv.dtype == DType::F16) {
      cpu::f32_to_f16(ks, reinterpret_cast<uint16_t*>(block + kv.k_offset(layer)), row);
      cpu::f32_to_f16(vs, reinterpret_cast<uint16_t*>(block + kv.v_offset(layer)), row);
    } else if (kv.dtype == DType::Q8_0) {  // row / 32 GGML blocks; head_dim % 32 == 0, so heads start on a block
      cpu::quantize_q8_0(ks, block + kv.k_offset(layer), row);
      cpu::quantize_q8_0(vs, block + kv.v_offset(layer), row);
    } else {
      std::memcpy(block + kv.k_offset(layer), ks, (size_t)row * sizeof(float));
      std::memcpy(block + kv.v_offset(layer), vs, (size_t)row * sizeof(float));
    }
  });
}

void CpuBackend::attention(const Tensor& q, const KvStore& kv, int layer, const ForwardBatch& b, const HeadShape& h,
                           const AttentionParams& p, const Tensor& out) {
  const cpu::AttentionShape shape{h.n_head, h.n_kv_head, h.head_dim, p.scale, p.window, p.sinks ? f32(*p.sinks) : nullptr};
  const Timer timer;
  if (kv.n_blocks == 1 && b.single_run()) {
    // One block holding the whole context: the contiguous kernel, without a table lookup per
    // key (the same floats: both kernels share one body).
    cpu::attention(f32(q), kv.data + kv.k_offset(layer), kv.data + kv.v_offset(layer), kv.dtype, q.rows,
                   b.positions()[0], shape, f32(out), kernels_);
    attention_s_ += timer.seconds();
    return;
  }
  std::vector<cpu::PagedKvView> views((size_t)b.n_seq());
  for (int s = 0; s < b.n_seq(); s++)
    views[(size_t)s] = {kv.data,         kv.block_bytes(), kv.k_offset(layer), kv.v_offset(layer),
                        kv.row_bytes,    kv.block_tokens,  b.block_table(s).data()};
  cpu::attention_paged(f32(q), q.rows, b.positions().data(), b.seq_ids().data(), views.data(), kv.dtype, shape,
                       f32(out), kernels_);
  attention_s_ += timer.seconds();
}

void CpuBackend::logits(const Tensor& x, std::span<const int64_t> rows, const Tensor& norm, float eps, const Weight& w,
                        const Tensor& scratch, const Tensor& out, const LogitsParams& lp) {
  const int64_t d = x.cols;
  few_rows((int64_t)rows.size(),
           [&](int64_t r) { cpu::rmsnorm(f32(x) + rows[(size_t)r] * d, f32(norm), f32(scratch) + r * d, d, eps); });
  const Tensor normed = scratch.rows_view(0, (int64_t)rows.size());
  // Rows read only for their argmax, from an f32-activation head: the 8-bit twin and a bound
  // give the same argmax for a quarter of the work. Decode's single row reads the weights at
  // memory speed either way, so it keeps the plain head.
  if (lp.argmax_only && lp.scale == 1.0f && lp.softcap == 0.0f && (int64_t)rows.size() >= kBoundedHeadMinRows)
    if (const cpu::BoundedHead* head = bounded_head(matrix(w))) {
      cpu::bounded_head_logits(matrix(w), *head, f32(normed), (int64_t)rows.size(), f32(out), kernels_);
      return;
    }
  const Product p{&w, &out};
  matmul({&p, 1}, normed);
  if (lp.scale == 1.0f && lp.softcap == 0.0f) return;
  each_row((int64_t)rows.size(), [&](int64_t r) {
    float* row = f32(out) + r * out.cols;
    if (lp.scale != 1.0f) cpu::scale_inplace(row, lp.scale, out.cols);
    if (lp.softcap > 0.0f) cpu::softcap_inplace(row, lp.softcap, out.cols);
  });
}

}  // namespace tandem
