// Prefill's products (n > 8 tokens): cuBLAS with F32 accumulation on the tensor cores. F16 and
// BF16 weights go in as they are; quantized weights are dequantized to F16 one tile of rows at
// a time into the workspace, each tile's GEMM writing its slice of the output columns.
#include <algorithm>
#include <string>

#include "backend/cuda/cublas_api.h"
#include "backend/cuda/cuda_matmul_internal.cuh"

namespace tandem::cuda {

namespace {

Status check_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return make_error("cuBLAS: {} failed: {}", what, cublas_status_name(s));
}

// Row-major out [n, ldc] (columns [0, m) written) = x [n, k] A^T, A row-major [m, k]: in
// cuBLAS's column-major terms C (m x n, ldc) = op(A) B with A stored k x m (lda = k),
// transposed, and B = x stored k x n (ldb = k).
Status gemm_ex(const CublasApi& blas, cublasHandle_t h, int64_t m, int64_t n, int64_t k, const void* a,
               cudaDataType_t ab_type, const void* x, float* out, int64_t ldc) {
  const float one = 1.0f, zero = 0.0f;
  return check_cublas(blas.gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one, a, ab_type, (int)k, x,
                                   ab_type, (int)k, &zero, out, CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx");
}

}  // namespace

Status run_gemm(const WeightView& w, const float* x, const void* x16, int64_t n, float* out, const float* bias,
                MatmulWorkspace::Impl& ws, cudaStream_t stream) {
  auto api = cublas_api();
  if (!api.ok()) return api.error();
  const CublasApi& blas = *api.value();
  TANDEM_TRY(bind_cublas(ws, stream));
  switch (w.type) {
    case DType::F32: {
      const float one = 1.0f, zero = 0.0f;
      TANDEM_TRY(check_cublas(blas.sgemm(ws.cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w.rows, (int)n, (int)w.cols, &one,
                                         reinterpret_cast<const float*>(w.quants), (int)w.cols, x, (int)w.cols, &zero,
                                         out, (int)w.rows),
                              "cublasSgemm"));
      break;
    }
    case DType::F16: TANDEM_TRY(gemm_ex(blas, ws.cublas, w.rows, n, w.cols, w.quants, CUDA_R_16F, x16, out, w.rows)); break;
    case DType::BF16: TANDEM_TRY(gemm_ex(blas, ws.cublas, w.rows, n, w.cols, w.quants, CUDA_R_16BF, x16, out, w.rows)); break;
    default: {
      // Tiles of whole rows: tile i's GEMM writes output columns [r0, r0 + rows) (ldc = w.rows).
      const int64_t tile_rows = ws.dequant_elems / w.cols;
      if (tile_rows < 1)
        return make_error("a product of {} columns past the matmul workspace's {}: reserve() first", w.cols,
                          ws.max_cols);
      for (int64_t r0 = 0; r0 < w.rows; r0 += tile_rows) {
        const int64_t rows = std::min(tile_rows, w.rows - r0);
        launch_dequantize_f16(w, r0, rows, ws.dequant.get(), stream);
        TANDEM_TRY(gemm_ex(blas, ws.cublas, rows, n, w.cols, ws.dequant.get(), CUDA_R_16F, x16, out + r0, w.rows));
      }
    }
  }
  if (bias) launch_add_bias(out, bias, n, w.rows, stream);
  return Status::Ok();
}

}  // namespace tandem::cuda
