// The GEMM path's kernels (cuda_matmul_gemm.cpp runs cuBLAS): a quantized weight's rows
// dequantized to F16, and the bias added to a GEMM's output.
#include <cuda_fp16.h>

#include "backend/cuda/cuda_matmul_kernels.cuh"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;

// Each thread decodes 8 consecutive elements and stores them as one 128-bit write.
__global__ void dequantize_f16_kernel(const WeightView w, int64_t r0, int64_t n_rows, __half* __restrict__ dst) {
  const int64_t per_row = w.cols / 8;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_rows * per_row) return;
  const int64_t r = i / per_row, c8 = i % per_row;
  float v[8];
  decode8_quant(w, r0 + r, c8, v);
  alignas(16) __half2 h[4];  // stored as one 128-bit word
#pragma unroll
  for (int k = 0; k < 4; k++) {
    // Saturate like the activations: a weight past F16's range becomes its largest value.
    h[k] = __floats2half2_rn(fminf(fmaxf(v[2 * k], -65504.0f), 65504.0f), fminf(fmaxf(v[2 * k + 1], -65504.0f), 65504.0f));
  }
  *reinterpret_cast<int4*>(dst + r * w.cols + c8 * 8) = *reinterpret_cast<const int4*>(h);
}

// out [n, rows] += bias on every row.
__global__ void add_bias_kernel(float* __restrict__ out, const float* __restrict__ bias, int64_t n, int64_t rows) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n * rows) out[i] += bias[i % rows];
}

unsigned grid_for(int64_t threads) { return (unsigned)((threads + kThreads - 1) / kThreads); }

}  // namespace

void launch_dequantize_f16(const WeightView& w, int64_t r0, int64_t n_rows, void* dst, cudaStream_t stream) {
  dequantize_f16_kernel<<<grid_for(n_rows * (w.cols / 8)), kThreads, 0, stream>>>(w, r0, n_rows, static_cast<__half*>(dst));
}

void launch_add_bias(float* out, const float* bias, int64_t n, int64_t rows, cudaStream_t stream) {
  add_bias_kernel<<<grid_for(n * rows), kThreads, 0, stream>>>(out, bias, n, rows);
}

}  // namespace tandem::cuda
