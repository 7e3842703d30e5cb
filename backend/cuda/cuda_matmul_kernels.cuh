// The launchers of the matrix products' kernels (the .cu files), for the host code (.cpp) that
// validates and dispatches. Kept free of fmt and backend.h: nvcc 13 cannot compile fmt 9's
// headers in C++20 mode, so no .cu file includes them (directly or through this header).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "backend/cuda/cuda_matmul_layout.cuh"

namespace tandem::cuda {

// Up to this many tokens a product runs the matrix-vector kernels; past it, a GEMM.
constexpr int64_t kMatvecMaxTokens = 8;

// ---- cuda_matmul_activations.cu ----
// q8_1 of x [n, cols] (cols a multiple of 32) into q [n, cols], ds [n, cols / 32].
void launch_quantize_q8_1(const float* x, int64_t n, int64_t cols, int8_t* q, float2* ds, cudaStream_t stream);
// x [count] to F16 (saturating at +-65504) or BF16.
void launch_convert_activations(const float* x, int64_t count, void* out, bool bf16, cudaStream_t stream);

// ---- cuda_matmul_matvec.cu ----
// out [n, w.rows] (+ bias) for 1 <= n <= kMatvecMaxTokens: act_q/act_ds (q8_1) for quantized w,
// x for plain w. False for a type without a kernel (nothing launched).
bool launch_matvec(const WeightView& w, const int8_t* act_q, const float2* act_ds, const float* x, int64_t n,
                   float* out, const float* bias, cudaStream_t stream);

// ---- cuda_matmul_gemm.cu ----
// Rows [r0, r0 + n_rows) of a quantized weight as F16 into dst [n_rows, cols].
void launch_dequantize_f16(const WeightView& w, int64_t r0, int64_t n_rows, void* dst, cudaStream_t stream);
// out [n, rows] += bias on every row.
void launch_add_bias(float* out, const float* bias, int64_t n, int64_t rows, cudaStream_t stream);

// ---- cuda_matmul_embed.cu ----
// out [n, w.cols] = rows tokens[0..n) of w as F32 (a row of NaN for an id outside the table).
void launch_embed(const WeightView& w, const int32_t* tokens, int64_t n, float* out, float scale, cudaStream_t stream);

}  // namespace tandem::cuda
