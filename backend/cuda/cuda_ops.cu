// The element-wise and per-row kernels of the CUDA backend: norms (fused with the residual
// add), RoPE, the gated activations, the logits' scale and soft-cap, the K,V store. Compiled with --fmad=false so each product and sum rounds
// as the CPU's scalar code (kernels/cpu/ops.cpp) rounds it: these ops give the CPU's floats.
#include <cuda_fp16.h>

#include "backend/cuda/cuda_kernels.h"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;

__device__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The block's sum of v (every thread gets it). blockDim.x a multiple of 32, at most 1024.
__device__ double block_sum(double v) {
  __shared__ double part[32];
  __shared__ double total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double w = lane < (int)(blockDim.x / 32) ? part[lane] : 0.0;
    w = warp_sum(w);
    if (lane == 0) total = w;
  }
  __syncthreads();
  const double r = total;
  __syncthreads();  // part/total are reused by the next call
  return r;
}

// out[0..n) = x * (1 / sqrt(mean(x^2) + eps)) * w, as cpu::rmsnorm: the sum in double, the
// scale in float.
__device__ void norm_row(const float* x, const float* w, float* out, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += (double)x[i] * x[i];
  ss = block_sum(ss);
  const float scale = 1.0f / sqrtf((float)(ss / (double)n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = x[i] * scale * w[i];
}

__global__ void rmsnorm_kernel(const float* x, const float* w, float* out, int64_t cols, int64_t width,
                               int64_t pieces, float eps) {
  const int64_t row = blockIdx.x / pieces, piece = blockIdx.x % pieces;
  const int64_t at = row * cols + piece * width;
  norm_row(x + at, w, out + at, width, eps);
}

// delta * 1.0f is delta: one formula gives both of the CPU's (add, and add scaled).
__global__ void add_residual_kernel(float* x, const float* delta, float delta_scale, const float* norm, float* out,
                                    int64_t cols, float eps) {
  float* xr = x + (int64_t)blockIdx.x * cols;
  const float* dr = delta + (int64_t)blockIdx.x * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) xr[i] += delta_scale * dr[i];
  if (!norm) return;
  // Each thread reads back only the elements it wrote itself.
  norm_row(xr, norm, out + (int64_t)blockIdx.x * cols, cols, eps);
}

__global__ void gather_rmsnorm_kernel(const float* x, const int32_t* rows, const float* norm, float* scratch,
                                      int64_t cols, float eps) {
  norm_row(x + (int64_t)rows[blockIdx.x] * cols, norm, scratch + (int64_t)blockIdx.x * cols, cols, eps);
}

__global__ void rope_angles_kernel(const int32_t* positions, const double* inv_freq, int half, float* out,
                                   int64_t out_cols) {
  const double pos = (double)positions[blockIdx.x];
  float* o = out + (int64_t)blockIdx.x * out_cols;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double theta = pos * inv_freq[i];
    o[2 * i] = (float)cos(theta);
    o[2 * i + 1] = (float)sin(theta);
  }
}

__global__ void rope_kernel(float* q, int64_t q_cols, int n_head, float* k, int64_t k_cols, int n_kv_head,
                            int head_dim, int half, bool neox, const float* angles, int64_t angle_cols) {
  const int64_t t = blockIdx.x;
  const float* cs = angles + t * angle_cols;
  const int per_q = n_head * half, total = (n_head + n_kv_head) * half;
  for (int w = threadIdx.x; w < total; w += blockDim.x) {
    const bool is_q = w < per_q;
    const int r = is_q ? w : w - per_q;
    const int h = r / half, i = r % half;
    // The pair's two elements: adjacent (2i, 2i + 1) or NeoX's halves (i, i + half).
    float* v = (is_q ? q + t * q_cols : k + t * k_cols) + (int64_t)h * head_dim + (neox ? i : 2 * i);
    const int other = neox ? half : 1;
    const float c = cs[2 * i], s = cs[2 * i + 1];
    const float a = v[0], b = v[other];
    v[0] = a * c - b * s;
    v[other] = a * s + b * c;
  }
}

// GELU's tanh form 0.5 g (1 + tanh(u)) = g * sigmoid(2u), u = sqrt(2/pi) (g + 0.044715 g^3),
// in the CPU vector kernels' order (ops_avx512.cpp: g^3 as (g g) g, one fused multiply-add
// for u) and their stable sigmoid: e = exp(-|z|) <= 1, sigmoid(z) = (z < 0 ? e : 1) / (1 + e).
__device__ float gelu_tanh(float g) {
  constexpr float kTwoSqrt2OverPi = 2.0f * 0.7978845608028654f;
  const float g3 = g * g * g;
  const float z = kTwoSqrt2OverPi * __fmaf_rn(0.044715f, g3, g);
  const float e = expf(-fabsf(z));
  return g * ((z < 0.0f ? e : 1.0f) / (1.0f + e));
}

__global__ void gated_activation_kernel(float* gate, const float* up, int64_t n, int act) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float g = gate[i];
    gate[i] = (act == kGateGeluTanh ? gelu_tanh(g) : g / (1.0f + expf(-g))) * up[i];
  }
}

__global__ void scale_softcap_kernel(float* y, int64_t n, float scale, float softcap) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = y[i];
    if (scale != 1.0f) v *= scale;
    if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
    y[i] = v;
  }
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return (unsigned)(blocks < 65536 ? blocks : 65536);
}

// blockIdx.x: token; blockIdx.y: 0 for K, 1 for V.
__global__ void store_kv_kernel(const float* k, const float* v, int64_t width, const int64_t* slots, KvView kv) {
  const int64_t t = blockIdx.x;
  const bool is_v = blockIdx.y == 1;
  const float* src = (is_v ? v : k) + t * width;
  const int64_t slot = slots[t];
  uint8_t* dst = kv.pool + (size_t)(slot / kv.block_tokens) * kv.block_bytes +
                 (size_t)(slot % kv.block_tokens) * kv.row_bytes + (is_v ? kv.v_offset : kv.k_offset);
  if (kv.kv_dtype == kKvF32) {
    float* d = reinterpret_cast<float*>(dst);
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) d[i] = src[i];
  } else if (kv.kv_dtype == kKvF16) {
    __half* d = reinterpret_cast<__half*>(dst);
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) d[i] = __float2half_rn(src[i]);
  } else {
    // Q8_0: one warp per 32-element block, as GGML's quantize_row_q8_0_ref.
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int64_t b = threadIdx.x / 32; b < width / 32; b += warps) {
      const float x = src[b * 32 + lane];
      float amax = fabsf(x);
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      uint8_t* blk = dst + b * 34;
      if (lane == 0) *reinterpret_cast<__half*>(blk) = __float2half_rn(d);
      blk[2 + lane] = (uint8_t)(int8_t)roundf(x * id);
    }
  }
}

int threads_for(int64_t width) {
  int t = 32;
  while (t < kThreads && t < width) t *= 2;
  return t;
}

}  // namespace

int rmsnorm(const float* x, const float* w, float* out, int64_t rows, int64_t cols, int64_t width, float eps,
            cudaStream_t s) {
  if (rows <= 0) return 0;
  const int64_t pieces = cols / width;
  rmsnorm_kernel<<<(unsigned)(rows * pieces), threads_for(width), 0, s>>>(x, w, out, cols, width, pieces, eps);
  return 1;
}

int add_residual(float* x, const float* delta, float delta_scale, const float* norm, float* out, int64_t rows,
                 int64_t cols, float eps, cudaStream_t s) {
  if (rows <= 0) return 0;
  add_residual_kernel<<<(unsigned)rows, threads_for(cols), 0, s>>>(x, delta, delta_scale, norm, out, cols, eps);
  return 1;
}

int gather_rmsnorm(const float* x, const int32_t* rows, int64_t n_rows, const float* norm, float* scratch,
                   int64_t cols, float eps, cudaStream_t s) {
  if (n_rows <= 0) return 0;
  gather_rmsnorm_kernel<<<(unsigned)n_rows, threads_for(cols), 0, s>>>(x, rows, norm, scratch, cols, eps);
  return 1;
}

int rope_angles(const int32_t* positions, const double* inv_freq, int rope_dim, float* out, int64_t out_cols,
                int64_t n_tokens, cudaStream_t s) {
  if (n_tokens <= 0 || rope_dim < 2) return 0;
  rope_angles_kernel<<<(unsigned)n_tokens, threads_for(rope_dim / 2), 0, s>>>(positions, inv_freq, rope_dim / 2, out,
                                                                               out_cols);
  return 1;
}

int rope(float* q, int64_t q_cols, int n_head, float* k, int64_t k_cols, int n_kv_head, int head_dim, int rope_dim,
         bool neox, const float* angles, int64_t angle_cols, int64_t n_tokens, cudaStream_t s) {
  if (n_tokens <= 0 || rope_dim < 2) return 0;
  const int half = rope_dim / 2;
  rope_kernel<<<(unsigned)n_tokens, threads_for((int64_t)(n_head + n_kv_head) * half), 0, s>>>(
      q, q_cols, n_head, k, k_cols, n_kv_head, head_dim, half, neox, angles, angle_cols);
  return 1;
}

int gated_activation(float* gate, const float* up, int64_t rows, int64_t cols, int act, cudaStream_t s) {
  const int64_t n = rows * cols;
  if (n <= 0) return 0;
  gated_activation_kernel<<<grid_for(n), kThreads, 0, s>>>(gate, up, n, act);
  return 1;
}

int scale_softcap(float* y, int64_t n, float scale, float softcap, cudaStream_t s) {
  if (n <= 0 || (scale == 1.0f && softcap <= 0.0f)) return 0;
  scale_softcap_kernel<<<grid_for(n), kThreads, 0, s>>>(y, n, scale, softcap);
  return 1;
}

int store_kv(const float* k, const float* v, int64_t width, int64_t n_tokens, const int64_t* slots, const KvView& kv,
             cudaStream_t s) {
  if (n_tokens <= 0) return 0;
  store_kv_kernel<<<dim3((unsigned)n_tokens, 2), threads_for(width), 0, s>>>(k, v, width, slots, kv);
  return 1;
}

}  // namespace tandem::cuda
