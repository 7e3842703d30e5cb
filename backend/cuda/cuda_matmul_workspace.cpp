// The products' scratch: allocated by reserve() (before any graph capture), never by a product.
#include <algorithm>

#include "backend/cuda/cublas_api.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_matmul_internal.cuh"

namespace tandem::cuda {

namespace {

// cuBLAS's recommended workspace on Hopper.
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

}  // namespace

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
  }
}

MatmulWorkspace::Impl::~Impl() {
  if (cublas) cublas_api().value()->destroy(cublas);  // a handle exists only once the API loaded
}

MatmulWorkspace::MatmulWorkspace() : impl_(std::make_unique<Impl>()) {}
MatmulWorkspace::~MatmulWorkspace() = default;

Status MatmulWorkspace::reserve(int64_t max_tokens, int64_t max_cols, int64_t max_rows, cudaStream_t stream) {
  if (max_tokens <= 0 || max_cols <= 0 || max_rows <= 0)
    return make_error("CUDA matmul workspace: bad size {} tokens x {} cols x {} rows", max_tokens, max_cols, max_rows);
  Impl& w = *impl_;
  if (!w.cublas) {
    auto api = cublas_api();
    if (!api.ok()) return api.error();
    const cublasStatus_t s = api.value()->create(&w.cublas);
    if (s != CUBLAS_STATUS_SUCCESS) {
      w.cublas = nullptr;
      return make_error("cuBLAS: cannot create a handle: {}", cublas_status_name(s));
    }
    auto ws = device_alloc(kCublasWorkspaceBytes, "cuBLAS's workspace");
    if (!ws) return ws.error();
    w.cublas_ws = std::move(*ws);
    w.cublas_ws_bytes = kCublasWorkspaceBytes;
    w.cublas_bound = false;
  }
  // Grow only: every dimension keeps the largest size asked for so far.
  max_tokens = std::max(max_tokens, w.max_tokens);
  max_cols = std::max((max_cols + 31) / 32 * 32, w.max_cols);
  max_rows = std::max(max_rows, w.max_rows);
  if (max_tokens == w.max_tokens && max_cols == w.max_cols && max_rows == w.max_rows) return Status::Ok();
  // Buffers in use by queued work are freed only after it has run.
  TANDEM_TRY(check(cudaStreamSynchronize(stream), "waiting before growing the matmul workspace"));
  w.act_q.reset();
  w.act_ds.reset();
  w.act_16.reset();
  w.dequant.reset();
  w.max_tokens = w.max_cols = w.max_rows = w.q_tokens = w.dequant_elems = 0;
  w.forms = 0;
  w.in = nullptr;
  max_tokens_ = 0;

  const int64_t q_tokens = std::min(max_tokens, kMatvecMaxTokens);
  auto q = device_alloc((size_t)(q_tokens * max_cols), "the matmul workspace's 8-bit activations");
  if (!q) return q.error();
  auto ds = device_alloc((size_t)(q_tokens * max_cols / 32) * sizeof(float2), "the matmul workspace's activation scales");
  if (!ds) return ds.error();
  w.act_q = std::move(*q);
  w.act_ds = std::move(*ds);
  if (max_tokens > kMatvecMaxTokens) {
    auto a16 = device_alloc((size_t)(max_tokens * max_cols) * 2, "the matmul workspace's 16-bit activations");
    if (!a16) return a16.error();
    // One tile of a dequantized weight: as many whole rows as the tile bytes allow (at least one).
    const int64_t tile_rows = std::clamp<int64_t>((int64_t)(w.dequant_tile_bytes / (2 * (size_t)max_cols)), 1, max_rows);
    auto dq = device_alloc((size_t)(tile_rows * max_cols) * 2, "the matmul workspace's dequantized weight tile");
    if (!dq) return dq.error();
    w.act_16 = std::move(*a16);
    w.dequant = std::move(*dq);
    w.dequant_elems = tile_rows * max_cols;
  }
  w.max_tokens = max_tokens;
  w.max_cols = max_cols;
  w.max_rows = max_rows;
  w.q_tokens = q_tokens;
  max_tokens_ = max_tokens;
  return Status::Ok();
}

Status bind_cublas(MatmulWorkspace::Impl& ws, cudaStream_t stream) {
  if (ws.cublas_bound && ws.cublas_stream == stream) return Status::Ok();
  if (!ws.cublas) return make_error("cuBLAS: no handle: reserve() the matmul workspace first");
  const CublasApi& blas = *cublas_api().value();  // loaded by reserve(), which made the handle
  cublasStatus_t s = blas.set_stream(ws.cublas, stream);
  // cublasSetStream resets the workspace to cuBLAS's own pool, which allocates: set ours again.
  if (s == CUBLAS_STATUS_SUCCESS) s = blas.set_workspace(ws.cublas, ws.cublas_ws.get(), ws.cublas_ws_bytes);
  if (s != CUBLAS_STATUS_SUCCESS) return make_error("cuBLAS: binding to a stream failed: {}", cublas_status_name(s));
  ws.cublas_stream = stream;
  ws.cublas_bound = true;
  return Status::Ok();
}

}  // namespace tandem::cuda
