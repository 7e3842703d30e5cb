// Decode's products (n <= 8 tokens): one warp per output row streams the row once, each lane
// taking every 32nd unit (cuda_matmul_units.cuh) with 128-bit loads, and multiplies it with
// every token's activations while it holds it in registers.
#include "backend/cuda/cuda_matmul_kernels.cuh"
#include "backend/cuda/cuda_matmul_units.cuh"

namespace tandem::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;

// out [n, w.rows]: token t's row is act (stride cols); MaxT: the most tokens this instance
// handles (1 lets the compiler drop the token loop for the plain decode step).
template <class Unit, int MaxT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    matvec_kernel(const WeightView w, const int8_t* __restrict__ act_q, const float2* __restrict__ act_ds,
                  const float* __restrict__ x, int n, float* __restrict__ out, const float* __restrict__ bias) {
  const int lane = threadIdx.x % 32;
  const int64_t row = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= w.rows) return;
  ActRow act[MaxT];
#pragma unroll
  for (int t = 0; t < MaxT; t++)  // only the pointers the weight's type reads are set
    act[t] = {act_q ? act_q + t * w.cols : nullptr, act_ds ? act_ds + t * (w.cols / 32) : nullptr,
              x ? x + t * w.cols : nullptr};
  float acc[MaxT];
#pragma unroll
  for (int t = 0; t < MaxT; t++) acc[t] = 0.0f;

  constexpr int U = Unit::kUnroll;
  const int64_t units = Unit::units_per_row(w.cols);
  // U units in flight per lane before any is used: loads of one row overlap.
  for (int64_t u0 = lane; u0 < units; u0 += 32 * U) {
    Unit wu[U];
#pragma unroll
    for (int k = 0; k < U; k++)
      if (u0 + 32 * k < units) wu[k] = Unit::load(w, row, u0 + 32 * k);
#pragma unroll
    for (int k = 0; k < U; k++) {
      if (u0 + 32 * k >= units) break;
#pragma unroll
      for (int t = 0; t < MaxT; t++)
        if (t < n) acc[t] += wu[k].dot(act[t], u0 + 32 * k);
    }
  }
#pragma unroll
  for (int t = 0; t < MaxT; t++)
    for (int off = 16; off > 0; off /= 2) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
  if (lane == 0) {
    const float b = bias ? bias[row] : 0.0f;
#pragma unroll
    for (int t = 0; t < MaxT; t++)
      if (t < n) out[t * w.rows + row] = acc[t] + b;
  }
}

// Plain types whose rows or activations do not fit 128-bit units: one element at a time.
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    matvec_plain_scalar_kernel(const WeightView w, const float* __restrict__ x, int n, float* __restrict__ out,
                               const float* __restrict__ bias) {
  const int lane = threadIdx.x % 32;
  const int64_t row = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= w.rows) return;
  float acc[kMatvecMaxTokens] = {};
  for (int64_t c = lane; c < w.cols; c += 32) {
    const float v = decode_plain(w, row, c);
    for (int t = 0; t < n; t++) acc[t] += v * x[t * w.cols + c];
  }
  for (int t = 0; t < kMatvecMaxTokens; t++)
    for (int off = 16; off > 0; off /= 2) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
  if (lane == 0)
    for (int t = 0; t < n; t++) out[t * w.rows + row] = acc[t] + (bias ? bias[row] : 0.0f);
}

template <class Unit>
void launch(const WeightView& w, const int8_t* act_q, const float2* act_ds, const float* x, int64_t n, float* out,
            const float* bias, cudaStream_t stream) {
  const unsigned grid = (unsigned)((w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (n == 1)
    matvec_kernel<Unit, 1><<<grid, kWarpsPerBlock * 32, 0, stream>>>(w, act_q, act_ds, x, 1, out, bias);
  else
    matvec_kernel<Unit, kMatvecMaxTokens><<<grid, kWarpsPerBlock * 32, 0, stream>>>(w, act_q, act_ds, x, (int)n, out,
                                                                                     bias);
}

}  // namespace

bool launch_matvec(const WeightView& w, const int8_t* act_q, const float2* act_ds, const float* x, int64_t n,
                   float* out, const float* bias, cudaStream_t stream) {
  switch (w.type) {
    case DType::Q4_0: launch<UnitQ4_0>(w, act_q, act_ds, x, n, out, bias, stream); return true;
    case DType::Q4_1: launch<UnitQ4_1>(w, act_q, act_ds, x, n, out, bias, stream); return true;
    case DType::Q8_0: launch<UnitQ8_0>(w, act_q, act_ds, x, n, out, bias, stream); return true;
    case DType::Q4_K: launch<UnitQ4_K>(w, act_q, act_ds, x, n, out, bias, stream); return true;
    case DType::Q6_K: launch<UnitQ6_K>(w, act_q, act_ds, x, n, out, bias, stream); return true;
    case DType::F16:
    case DType::BF16:
    case DType::F32: break;
    default: return false;
  }
  if (!plain_units_fit(w.type, w.cols, w.quants, x)) {
    const unsigned grid = (unsigned)((w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    matvec_plain_scalar_kernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(w, x, (int)n, out, bias);
  } else if (w.type == DType::F16) {
    launch<UnitF16>(w, act_q, act_ds, x, n, out, bias, stream);
  } else if (w.type == DType::BF16) {
    launch<UnitBF16>(w, act_q, act_ds, x, n, out, bias, stream);
  } else {
    launch<UnitF32>(w, act_q, act_ds, x, n, out, bias, stream);
  }
  return true;
}

}  // namespace tandem::cuda
