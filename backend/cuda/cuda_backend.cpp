#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include <fmt/core.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_kernels.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/kernel_table.h"

namespace tandem {

namespace {

float* f32(const Tensor& t) { return static_cast<float*>(t.data); }
const cuda::DeviceWeight& device_weight(const Weight& w) { return *static_cast<const cuda::DeviceWeight*>(w.impl.get()); }
uint64_t u(const void* p) { return (uint64_t)(uintptr_t)p; }
uint64_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Device memory freed with its last handle.
std::shared_ptr<void> device_owner(void* p) {
  return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
}

std::string gib(uint64_t bytes) { return fmt::format("{:.2f} GiB", (double)bytes / (1ull << 30)); }

// Passes whose capture failed, kept apart before graphs are turned off altogether.
constexpr size_t kMaxUncapturable = 8;

int kv_code(DType t) { return t == DType::F32 ? cuda::kKvF32 : t == DType::F16 ? cuda::kKvF16 : cuda::kKvQ8_0; }

cuda::KvView kv_view(const KvStore& kv, int layer) {
  return cuda::KvView{kv.data, kv.block_bytes(), kv.k_offset(layer), kv.v_offset(layer), kv.row_bytes,
                      kv.block_tokens, kv_code(kv.dtype)};
}

}  // namespace

Result<std::shared_ptr<CudaBackend>> CudaBackend::create(const CudaBackendOptions& o) {
  std::shared_ptr<CudaBackend> be(new CudaBackend(o));
  TANDEM_TRY(be->init());
  return be;
}

CudaBackend::CudaBackend(const CudaBackendOptions& o) : opts_(o), device_(o.device) {}

Status CudaBackend::init() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return make_error("no CUDA device: {}", e != cudaSuccess ? cudaGetErrorString(e) : "the driver sees no GPU");
  if (device_ < 0 || device_ >= count) return make_error("no CUDA device {} (this machine has {})", device_, count);
  TANDEM_TRY(cuda::check(cudaSetDevice(device_), "cudaSetDevice"));
  cudaDeviceProp p{};
  TANDEM_TRY(cuda::check(cudaGetDeviceProperties(&p, device_), "cudaGetDeviceProperties"));
  name_ = p.name;
  sm_count_ = p.multiProcessorCount;
  cc_major_ = p.major;
  cc_minor_ = p.minor;
  total_memory_ = p.totalGlobalMem;
  TANDEM_TRY(cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
  TANDEM_TRY(cuda::check(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming), "cudaEventCreate"));
  ws_ = std::make_unique<cuda::MatmulWorkspace>();
  return grow_staging(1 << 16);
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  clear_graphs();
  ws_.reset();
  for (auto& [_, m] : mirrors_) cudaFreeHost(m.host);
  if (staging_host_) cudaFreeHost(staging_host_);
  if (staging_dev_) cudaFree(staging_dev_);
  if (attn_scratch_) cudaFree(attn_scratch_);
  if (staged_) cudaEventDestroy(staged_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::string CudaBackend::describe() const {
  return fmt::format("cuda {} (sm_{}{}, {} SMs, {}), {}", name_, cc_major_, cc_minor_, sm_count_, gib(total_memory_),
                     opts_.graphs ? "decode as CUDA graphs" : "no graphs");
}

void CudaBackend::fail(Status s) {
  if (s.ok() || failed()) return;
  error_ = std::move(s);
  std::fprintf(stderr, "tandem: CUDA backend: %s\n", error_.error().message.c_str());
}

void CudaBackend::note(Status s) {
  if (s.ok()) return;
  if (mode_ == Mode::Capture) {
    if (capture_error_.ok()) capture_error_ = std::move(s);
  } else {
    fail(std::move(s));
  }
}

void CudaBackend::after_launch(const char* what, int kernels) {
  kernels_ += kernels;
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) note(cuda::check(e, what));
}

Status CudaBackend::synchronize() {
  fail(cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  return error_;
}

// ---- memory ----

Tensor CudaBackend::new_tensor(int64_t rows, int64_t cols) {
  const size_t bytes = sizeof(float) * (size_t)std::max<int64_t>(1, rows * cols);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail(make_error("cannot allocate a [{}, {}] tensor ({} bytes) on {}: {} of {} free ({})", rows, cols, bytes, name_,
                    gib(free_b), gib(total_b), cudaGetErrorString(e)));
    return Tensor{nullptr, rows, cols, DType::F32, {}};
  }
  return Tensor{p, rows, cols, DType::F32, device_owner(p)};
}

Tensor CudaBackend::upload(std::span<const float> host, int64_t rows, int64_t cols) {
  Tensor t = new_tensor(rows, cols);
  const size_t n = std::min<size_t>(host.size(), (size_t)(rows * cols));
  if (t.data && n) {
    fail(cuda::check(cudaMemcpyAsync(t.data, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_),
                     "upload"));
    fail(cuda::check(cudaStreamSynchronize(stream_), "upload"));
  }
  return t;
}

std::span<const float> CudaBackend::read(const Tensor& t) {
  const size_t n = (size_t)(t.rows * t.cols);
  if (mirrors_.size() > 64) {  // forget mirrors of tensors that are gone
    for (auto it = mirrors_.begin(); it != mirrors_.end();) {
      if (it->second.owner.expired()) {
        cudaFreeHost(it->second.host);
        it = mirrors_.erase(it);
      } else {
        ++it;
      }
    }
  }
  Mirror& m = mirrors_[t.data];
  if (m.floats < n) {
    if (m.host) cudaFreeHost(m.host);
    m.host = nullptr;
    m.floats = 0;
    if (cudaMallocHost(reinterpret_cast<void**>(&m.host), std::max<size_t>(1, n) * sizeof(float)) != cudaSuccess) {
      fail(make_error("cannot allocate {} bytes of pinned host memory to read a tensor", n * sizeof(float)));
      mirrors_.erase(t.data);
      return {};
    }
    m.floats = n;
  }
  m.owner = t.owner;
  if (!failed() && t.data && n) {
    fail(cuda::check(cudaMemcpyAsync(m.host, t.data, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "read"));
    fail(cuda::check(cudaStreamSynchronize(stream_), "read (a kernel before it failed)"));
  }
  if (failed()) std::fill(m.host, m.host + n, std::numeric_limits<float>::quiet_NaN());
  return {m.host, n};
}

Result<KvStore> CudaBackend::new_kv_store(DType dtype, int n_layer, int block_tokens, int64_t n_blocks,
                                          size_t row_bytes) {
  auto layout = kv_store_layout(dtype, n_layer, block_tokens, n_blocks, row_bytes);
  if (!layout.ok()) return layout.error();
  KvStore kv = std::move(layout.value());
  const uint64_t bytes = kv.bytes();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // an out-of-memory error is not sticky; leave no trace of it
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return make_error("cannot allocate a KV store of {} bytes ({}) on {}: {} of {} free", bytes, gib(bytes), name_,
                      gib(free_b), gib(total_b));
  }
  kv.data = static_cast<uint8_t*>(p);
  kv.owner = device_owner(p);
  return kv;
}

// A weight of a type with no CUDA kernel (Q5_0, Q5_1, Q5_K, MXFP4): its rows decoded on the
// host by the CPU's reference dequantizer and rounded to F16, which the device multiplies.
static Result<std::vector<uint16_t>> decode_to_f16(const WeightSource& src) {
  std::vector<uint16_t> f16((size_t)src.rows * (size_t)src.cols);
  std::vector<float> row((size_t)src.cols);
  for (int64_t r = 0; r < src.rows; r++) {
    if (!cpu::dequantize_row(src.type, src.data + (size_t)r * src.row_bytes, row.data(), src.cols))
      return make_error("tensor {} has type {}, which tandem cannot decode", src.name, dtype_name(src.type));
    cpu::f32_to_f16(row.data(), f16.data() + (size_t)r * src.cols, src.cols);
  }
  return f16;
}

Result<Weight> CudaBackend::prepare_weight(const WeightSource& src, bool products) {
  if (!src.compute_supported)
    return make_error("tensor {} has type {}, which the CUDA backend cannot compute with yet", src.name,
                      dtype_name(src.type));
  WeightSource upload_src = src;
  std::vector<uint16_t> decoded;  // [rows, cols] F16, for a type with no CUDA kernel
  if (!cuda::matmul_supported(src.type)) {
    auto f16 = decode_to_f16(src);
    if (!f16.ok()) return f16.error();
    decoded = std::move(f16.value());
    upload_src.type = DType::F16;
    upload_src.data = reinterpret_cast<const uint8_t*>(decoded.data());
    upload_src.row_bytes = (size_t)src.cols * 2;
  }
  auto w = cuda::upload_weight(upload_src, stream_);  // synchronous: decoded may go after it
  if (!w.ok()) return w.error();
  auto impl = std::make_shared<cuda::DeviceWeight>(std::move(w.value()));
  if (products) {
    max_cols_ = std::max(max_cols_, src.cols);
    max_rows_ = std::max(max_rows_, src.rows);
  }
  // The device holds its own copy: the host's pages of the file can go. Its type and bytes are
  // what products stream (F16 for a decoded weight).
  return Weight{upload_src.type, src.rows, src.cols, (uint64_t)src.rows * upload_src.row_bytes, std::move(impl), false};
}

Result<Tensor> CudaBackend::prepare_vector(const WeightSource& src) {
  std::vector<float> host((size_t)src.cols);
  if (!src.compute_supported || !cpu::dequantize_row(src.type, src.data, host.data(), src.cols))
    return make_error("tensor {} has type {}, which tandem cannot decode", src.name, dtype_name(src.type));
  Tensor t = upload(host, 1, src.cols);
  if (!t.data) return error_.error();
  return t;
}

// ---- staging the batch ----

Status CudaBackend::grow_staging(size_t bytes) {
  if (bytes <= staging_cap_) return Status::Ok();
  size_t cap = std::max<size_t>(staging_cap_, 1 << 16);
  while (cap < bytes) cap *= 2;
  // Kernels already launched may read the old buffer, and graphs hold its address.
  if (stream_) cudaStreamSynchronize(stream_);
  clear_graphs();
  if (staging_host_) cudaFreeHost(staging_host_);
  if (staging_dev_) cudaFree(staging_dev_);
  staging_host_ = nullptr;
  staging_dev_ = nullptr;
  staging_cap_ = 0;
  TANDEM_TRY(cuda::check(cudaMallocHost(reinterpret_cast<void**>(&staging_host_), cap), "pinned staging buffer"));
  TANDEM_TRY(cuda::check(cudaMalloc(reinterpret_cast<void**>(&staging_dev_), cap), "device batch buffer"));
  staging_cap_ = cap;
  uploaded_ = 0;  // everything staged so far goes again
  return Status::Ok();
}

void CudaBackend::begin_staging() {
  // The previous pass's copy must have left the pinned buffer before it is rewritten.
  fail(cuda::check(cudaEventSynchronize(staged_), "waiting for the batch copy"));
  stager_.reset();
  staged_batches_.clear();
  uploaded_ = 0;
}

void CudaBackend::flush_staging() {
  const std::span<const uint8_t> img = stager_.image();
  if (img.size() <= uploaded_) return;
  if (Status s = grow_staging(img.size()); !s.ok()) return fail(s);
  const size_t n = img.size() - uploaded_;
  std::memcpy(staging_host_ + uploaded_, img.data() + uploaded_, n);
  fail(cuda::check(cudaMemcpyAsync(staging_dev_ + uploaded_, staging_host_ + uploaded_, n, cudaMemcpyHostToDevice,
                                   stream_),
                   "copying the batch to the device"));
  fail(cuda::check(cudaEventRecord(staged_, stream_), "cudaEventRecord"));
  uploaded_ = img.size();
}

size_t CudaBackend::stage(const void* data, size_t bytes) {
  const size_t at = stager_.add(data, bytes);
  if (mode_ == Mode::Direct) flush_staging();
  return at;
}

DeviceBatch CudaBackend::device_batch(const ForwardBatch& b) {
  const BatchOffsets* o = nullptr;
  for (const auto& [ptr, offsets] : staged_batches_)
    if (ptr == &b) o = &offsets;
  if (!o) {
    staged_batches_.emplace_back(&b, stager_.add_batch(b));
    o = &staged_batches_.back().second;
    if (mode_ == Mode::Direct) flush_staging();
  }
  const uint8_t* base = staging_dev_;
  DeviceBatch d;
  d.tokens = reinterpret_cast<const int32_t*>(base + o->tokens);
  d.positions = reinterpret_cast<const int32_t*>(base + o->positions);
  d.seq_ids = reinterpret_cast<const int32_t*>(base + o->seq_ids);
  d.slots = reinterpret_cast<const int64_t*>(base + o->slots);
  d.tables = reinterpret_cast<const int32_t*>(base + o->tables);
  d.tiles = reinterpret_cast<const int32_t*>(base + o->tiles);
  d.shape = *o;
  return d;
}

// ---- the pass ----

bool CudaBackend::record(std::initializer_list<uint64_t> sig, const BatchOffsets* b) {
  if (mode_ != Mode::Record) return false;
  sig_.insert(sig_.end(), sig);
  if (b)
    sig_.insert(sig_.end(), {(uint64_t)b->tokens, (uint64_t)b->n_tokens, (uint64_t)b->n_seq, (uint64_t)b->table_stride,
                             (uint64_t)b->n_tiles, (uint64_t)b->max_seq_tokens});
  return true;
}

Status CudaBackend::reserve_workspace(int64_t n_tokens) {
  if (n_tokens <= ws_tokens_ && max_cols_ <= ws_cols_ && max_rows_ <= ws_rows_) return Status::Ok();
  // No product weight yet (a pass of element-wise ops alone): nothing to reserve; matmul()
  // reserves on its own once one exists.
  if (max_cols_ == 0 || max_rows_ == 0) return Status::Ok();
  const int64_t t = std::max(n_tokens, ws_tokens_);
  clear_graphs();  // the workspace may move
  TANDEM_TRY(ws_->reserve(t, max_cols_, max_rows_, stream_));
  ws_tokens_ = t;
  ws_cols_ = max_cols_;
  ws_rows_ = max_rows_;
  return Status::Ok();
}

float* CudaBackend::attention_scratch(size_t floats) {
  if (floats <= attn_scratch_floats_) return attn_scratch_;
  // Only outside a capture (record and direct passes size it first); graphs hold the address.
  cudaStreamSynchronize(stream_);
  clear_graphs();
  if (attn_scratch_) cudaFree(attn_scratch_);
  attn_scratch_ = nullptr;
  attn_scratch_floats_ = 0;
  if (Status s = cuda::check(cudaMalloc(reinterpret_cast<void**>(&attn_scratch_), floats * sizeof(float)),
                             "attention scratch");
      !s.ok()) {
    fail(s);
    return nullptr;
  }
  attn_scratch_floats_ = floats;
  return attn_scratch_;
}

void CudaBackend::clear_graphs() {
  for (Graph& g : graphs_) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

void CudaBackend::run_pass(int64_t n_tokens, const std::function<void()>& body) {
  if (failed()) return;
  cudaSetDevice(device_);
  if (Status s = reserve_workspace(n_tokens); !s.ok()) return fail(s);
  pass_counter_++;
  in_pass_ = true;
  kernels_ = 0;
  last_pass_ = {};
  begin_staging();
  // cuBLAS's GEMMs are never captured: a pass whose products reach them runs directly.
  if (opts_.graphs && n_tokens <= opts_.graph_max_tokens && !cuda::matmul_uses_cublas(n_tokens)) {
    run_graph(body);
  } else {
    run_direct(body);
  }
  mode_ = Mode::Direct;
  in_pass_ = false;
}

void CudaBackend::run_direct(const std::function<void()>& body) {
  mode_ = Mode::Direct;
  kernels_ = 0;
  body();
  last_pass_.kernels = kernels_;
}

namespace {
int64_t kernel_nodes(cudaGraph_t g) {
  size_t n = 0;
  if (cudaGraphGetNodes(g, nullptr, &n) != cudaSuccess) return -1;
  std::vector<cudaGraphNode_t> nodes(n);
  if (cudaGraphGetNodes(g, nodes.data(), &n) != cudaSuccess) return -1;
  int64_t k = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    if (cudaGraphNodeGetType(node, &t) == cudaSuccess && t == cudaGraphNodeTypeKernel) k++;
  }
  return k;
}
}  // namespace

void CudaBackend::run_graph(const std::function<void()>& body) {
  // 1. Record: what every op would launch, and the batch's arrays staged on the host.
  mode_ = Mode::Record;
  sig_.clear();
  sig_uses_cublas_ = false;
  body();
  mode_ = Mode::Direct;
  if (failed()) return;
  if (sig_uses_cublas_ || std::find(uncapturable_.begin(), uncapturable_.end(), sig_) != uncapturable_.end()) {
    begin_staging();  // the direct run stages and copies as it goes
    return run_direct(body);
  }
  flush_staging();  // this step's arrays to the fixed device buffer, before the graph reads them
  for (Graph& g : graphs_)
    if (g.sig == sig_) {
      g.last_used = pass_counter_;
      fail(cuda::check(cudaGraphLaunch(g.exec, stream_), "cudaGraphLaunch"));
      last_pass_ = {g.kernels, true, false};
      return;
    }

  // 2. Capture the body's launches once; the staged arrays are re-added at the same offsets.
  const size_t staged_bytes = stager_.image().size();
  stager_.reset();
  staged_batches_.clear();
  kernels_ = 0;
  capture_error_ = Status::Ok();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Status s = cuda::check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  if (s.ok()) {
    mode_ = Mode::Capture;
    body();
    mode_ = Mode::Direct;
    s = cuda::check(cudaStreamEndCapture(stream_, &graph), "capturing the decode graph");
    if (s.ok()) s = capture_error_;
    if (s.ok() && stager_.image().size() != staged_bytes) s = make_error("the pass staged different arrays twice");
    if (s.ok()) s = cuda::check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  }
  const int64_t kernels = graph ? kernel_nodes(graph) : -1;
  if (graph) cudaGraphDestroy(graph);
  if (!s.ok()) {
    // A pass that cannot be captured still runs, directly; so does every later pass of this
    // shape, while other shapes keep their graphs. A sticky fault fails the direct run too,
    // and becomes the backend's error there.
    cudaGetLastError();
    uncapturable_.push_back(sig_);
    if (uncapturable_.size() >= kMaxUncapturable) {
      std::fprintf(stderr, "tandem: CUDA backend: graphs off after %zu pass shapes failed to capture (last: %s)\n",
                   uncapturable_.size(), s.error().message.c_str());
      opts_.graphs = false;
      uncapturable_.clear();
    } else {
      std::fprintf(stderr, "tandem: CUDA backend: a pass shape runs without a graph (%s)\n",
                   s.error().message.c_str());
    }
    begin_staging();
    return run_direct(body);
  }
  if ((int)graphs_.size() >= std::max(1, opts_.graph_cache)) {
    auto lru = std::min_element(graphs_.begin(), graphs_.end(),
                                [](const Graph& a, const Graph& b) { return a.last_used < b.last_used; });
    cudaGraphExecDestroy(lru->exec);
    graphs_.erase(lru);
  }
  graphs_.push_back(Graph{sig_, exec, kernels >= 0 ? kernels : kernels_, pass_counter_});
  graphs_captured_++;
  fail(cuda::check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch"));
  last_pass_ = {graphs_.back().kernels, true, true};
}

// ---- ops ----

void CudaBackend::embed(const Weight& table, const ForwardBatch& b, const Tensor& out, float scale) {
  if (failed()) return;
  if (!in_pass_) begin_staging();
  const DeviceBatch db = device_batch(b);
  const cuda::DeviceWeight& w = device_weight(table);
  if (record({1, w.id, u(w.data), u(out.data), (uint64_t)out.cols, bits(scale)}, &db.shape)) return;
  note(cuda::embed(w, db.tokens, db.shape.n_tokens, f32(out), scale, stream_));
  after_launch("embed");
}

void CudaBackend::matmul(std::span<const Product> group, const Tensor& in) {
  if (failed()) return;
  // More input rows than the pass was reserved for (logits of rows past the pass's tokens, a
  // product outside a pass): grow now (a no-op when it fits), never inside a capture (its
  // record pass grew it).
  if (mode_ != Mode::Capture)
    if (Status s = reserve_workspace(in.rows); !s.ok()) return fail(s);
  if (mode_ == Mode::Record) {
    sig_uses_cublas_ = sig_uses_cublas_ || cuda::matmul_uses_cublas(in.rows);
    for (const Product& p : group) {
      const cuda::DeviceWeight& w = device_weight(*p.w);
      record({2, w.id, u(w.data), u(in.data), (uint64_t)in.rows, u(p.out->data), u(p.bias ? p.bias->data : nullptr)});
    }
    return;
  }
  for (const Product& p : group) {
    note(cuda::matmul(device_weight(*p.w), f32(in), in.rows, f32(*p.out), p.bias ? f32(*p.bias) : nullptr, *ws_,
                      stream_));
    after_launch("matmul");
  }
}

void CudaBackend::rmsnorm(const Tensor& x, const Tensor& weight, const Tensor& out, float eps, int head_dim) {
  if (failed()) return;
  if (record({3, u(x.data), u(weight.data), u(out.data), (uint64_t)x.rows, (uint64_t)x.cols, bits(eps),
              (uint64_t)head_dim}))
    return;
  const int64_t width = head_dim > 0 ? head_dim : x.cols;
  after_launch("rmsnorm", cuda::rmsnorm(f32(x), f32(weight), f32(out), x.rows, x.cols, width, eps, stream_));
}

void CudaBackend::add_residual(const Tensor& x, const Tensor& delta, const Tensor* norm, const Tensor* out, float eps,
                               float delta_scale) {
  if (failed()) return;
  const float* n = norm ? f32(*norm) : nullptr;
  float* o = norm && out ? f32(*out) : nullptr;
  if (record({4, u(x.data), u(delta.data), u(n), u(o), (uint64_t)x.rows, (uint64_t)x.cols, bits(eps),
              bits(delta_scale)}))
    return;
  after_launch("add_residual", cuda::add_residual(f32(x), f32(delta), delta_scale, o ? n : nullptr, o, x.rows, x.cols,
                                                  eps, stream_));
}

void CudaBackend::rope_angles(const ForwardBatch& b, std::span<const double> inv_freq, int rope_dim,
                              const Tensor& out) {
  if (failed()) return;
  if (!in_pass_) begin_staging();
  const size_t freq_at = stage(inv_freq.data(), (size_t)(rope_dim / 2) * sizeof(double));
  const DeviceBatch db = device_batch(b);
  if (record({5, freq_at, (uint64_t)rope_dim, u(out.data), (uint64_t)out.cols}, &db.shape)) return;
  const auto* freq = reinterpret_cast<const double*>(staging_dev_ + freq_at);
  after_launch("rope_angles",
               cuda::rope_angles(db.positions, freq, rope_dim, f32(out), out.cols, db.shape.n_tokens, stream_));
}

void CudaBackend::rope(const Tensor& q, const Tensor& k, const Tensor& angles, const HeadShape& h, int rope_dim,
                       RopeStyle style) {
  if (failed()) return;
  const bool neox = style == RopeStyle::NeoxHalves;
  if (record({6, u(q.data), (uint64_t)q.cols, u(k.data), (uint64_t)k.cols, u(angles.data), (uint64_t)angles.cols,
              (uint64_t)q.rows, (uint64_t)h.n_head, (uint64_t)h.n_kv_head, (uint64_t)h.head_dim, (uint64_t)rope_dim,
              (uint64_t)neox}))
    return;
  after_launch("rope", cuda::rope(f32(q), q.cols, h.n_head, f32(k), k.cols, h.n_kv_head, h.head_dim, rope_dim, neox,
                                  f32(angles), angles.cols, q.rows, stream_));
}

void CudaBackend::gated_activation(const Tensor& gate, const Tensor& up, GateActivation act) {
  if (failed()) return;
  // SwigluOai belongs to gpt-oss, a mixture of experts this backend refuses at load.
  const int code = act == GateActivation::GeluTanh ? cuda::kGateGeluTanh : cuda::kGateSilu;
  if (record({7, u(gate.data), u(up.data), (uint64_t)gate.rows, (uint64_t)gate.cols, (uint64_t)code})) return;
  after_launch("gated_activation",
               cuda::gated_activation(f32(gate), f32(up), gate.rows, gate.cols, code, stream_));
}

Status CudaBackend::check_kv(const KvStore& kv, int head_dim) {
  if (kv.dtype != DType::F32 && kv.dtype != DType::F16 && kv.dtype != DType::Q8_0)
    return make_error("the CUDA backend's KV store holds f32, f16 or q8_0, not {}", dtype_name(kv.dtype));
  if (head_dim > 0 && !cuda::attention_supported(head_dim, kv_code(kv.dtype)))
    return make_error("the CUDA attention kernels take head_dim up to 256 (a multiple of 32 for q8_0); this is {}",
                      head_dim);
  if (kv.data == checked_kv_) return Status::Ok();
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, kv.data) != cudaSuccess || a.type != cudaMemoryTypeDevice) {
    cudaGetLastError();
    return make_error("the KV store is not in GPU memory: make it with this backend's new_kv_store");
  }
  checked_kv_ = kv.data;
  return Status::Ok();
}

void CudaBackend::store_kv(const Tensor& k, const Tensor& v, const KvStore& kv, int layer, const ForwardBatch& b) {
  if (failed()) return;
  if (mode_ != Mode::Capture)
    if (Status s = check_kv(kv, 0); !s.ok()) return fail(s);
  if (!in_pass_) begin_staging();
  const DeviceBatch db = device_batch(b);
  const cuda::KvView view = kv_view(kv, layer);
  if (record({8, u(k.data), u(v.data), (uint64_t)k.cols, (uint64_t)k.rows, u(kv.data), (uint64_t)view.kv_dtype,
              view.block_bytes, view.k_offset, view.v_offset, view.row_bytes, (uint64_t)view.block_tokens},
             &db.shape))
    return;
  after_launch("store_kv", cuda::store_kv(f32(k), f32(v), k.cols, k.rows, db.slots, view, stream_));
}

void CudaBackend::attention(const Tensor& q, const KvStore& kv, int layer, const ForwardBatch& b, const HeadShape& h,
                            const AttentionParams& p, const Tensor& out) {
  if (failed()) return;
  if (mode_ != Mode::Capture)
    if (Status s = check_kv(kv, h.head_dim); !s.ok()) return fail(s);
  if (!in_pass_) begin_staging();
  const DeviceBatch db = device_batch(b);
  cuda::AttentionArgs a;
  a.q = f32(q);
  a.out = f32(out);
  a.kv = kv_view(kv, layer);
  a.positions = db.positions;
  a.seq_ids = db.seq_ids;
  a.tables = db.tables;
  a.table_stride = db.shape.table_stride;
  a.tiles = db.tiles;
  a.n_tiles = db.shape.n_tiles;
  a.n_tokens = db.shape.n_tokens;
  a.n_head = h.n_head;
  a.n_kv_head = h.n_kv_head;
  a.head_dim = h.head_dim;
  // 0: the usual 1 / sqrt(head_dim), as the CPU's kernels read it.
  a.scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt((float)h.head_dim);
  // Positions are int32: a window wider than any of them is no window.
  a.window = p.window > 0 && p.window < std::numeric_limits<int32_t>::max() ? (int)p.window : 0;
  const bool decode = db.shape.decode();
  const int n_split = decode ? cuda::decode_splits(a.n_tokens, h.n_head, h.n_kv_head, sm_count_) : 1;
  float* scratch = nullptr;
  if (decode && n_split > 1 && mode_ != Mode::Capture) {
    // Sized in the record or direct pass, never inside a capture.
    scratch = attention_scratch(cuda::decode_scratch_floats(a.n_tokens, h.n_head, h.head_dim, n_split));
    if (!scratch) return;
  }
  if (mode_ == Mode::Capture) scratch = attn_scratch_;
  if (record({9, u(q.data), u(out.data), u(kv.data), (uint64_t)a.kv.kv_dtype, a.kv.block_bytes, a.kv.k_offset,
              a.kv.v_offset, a.kv.row_bytes, (uint64_t)a.kv.block_tokens, (uint64_t)h.n_head, (uint64_t)h.n_kv_head,
              (uint64_t)h.head_dim, (uint64_t)n_split, bits(a.scale), (uint64_t)a.window},
             &db.shape))
    return;
  const int k = decode ? cuda::attention_decode(a, n_split, scratch, stream_) : cuda::attention_prefill(a, stream_);
  after_launch("attention", k);
}

void CudaBackend::logits(const Tensor& x, std::span<const int64_t> rows, const Tensor& norm, float eps, const Weight& w,
                         const Tensor& scratch, const Tensor& out, const LogitsParams& lp) {
  if (failed() || rows.empty()) return;
  if (!in_pass_) begin_staging();
  std::vector<int32_t> r32(rows.begin(), rows.end());
  const size_t rows_at = stage(r32.data(), r32.size() * sizeof(int32_t));
  if (!record({10, u(x.data), (uint64_t)x.cols, rows_at, (uint64_t)rows.size(), u(norm.data), bits(eps),
               u(scratch.data)})) {
    const auto* d_rows = reinterpret_cast<const int32_t*>(staging_dev_ + rows_at);
    after_launch("logits norm", cuda::gather_rmsnorm(f32(x), d_rows, (int64_t)rows.size(), f32(norm), f32(scratch),
                                                     x.cols, eps, stream_));
  }
  const Tensor normed = scratch.rows_view(0, (int64_t)rows.size());
  const Product p{&w, &out};
  matmul({&p, 1}, normed);
  if (failed() || (lp.scale == 1.0f && lp.softcap <= 0.0f)) return;
  const int64_t n = (int64_t)rows.size() * out.cols;
  if (record({11, u(out.data), (uint64_t)n, bits(lp.scale), bits(lp.softcap)})) return;
  after_launch("logits scale", cuda::scale_softcap(f32(out), n, lp.scale, lp.softcap, stream_));
}

}  // namespace tandem
