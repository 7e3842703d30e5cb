// Activations in the forms the products read: 8-bit blocks (q8_1) for the matrix-vector
// kernels, F16/BF16 copies for cuBLAS.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_matmul_kernels.cuh"

namespace tandem::cuda {

namespace {

// One warp per 32-element block: the same operations as quantize_block_q8_1 (the host twin),
// so the bytes agree exactly (IEEE division and roundf; no fused operations to differ).
__global__ void quantize_q8_1_kernel(const float* __restrict__ x, int64_t n_blocks, int8_t* __restrict__ q,
                                     float2* __restrict__ ds) {
  const int64_t block = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (block >= n_blocks) return;  // whole warps leave together: blockDim is a multiple of 32
  const float v = x[block * 32 + lane];
  float amax = fabsf(v);
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float d = __fdiv_rn(amax, 127.0f);
  const float id = d != 0.0f ? __frcp_rn(d) : 0.0f;
  const int qi = (int)roundf(__fmul_rn(v, id));
  int sum = qi;
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  q[block * 32 + lane] = (int8_t)qi;
  if (lane == 0) ds[block] = make_float2(d, __fmul_rn(d, (float)sum));
}

__global__ void to_f16_kernel(const float* __restrict__ x, int64_t count, __half* __restrict__ out) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  // Saturate: an activation past F16's range becomes its largest value, not infinity.
  if (i < count) out[i] = __float2half_rn(fminf(fmaxf(x[i], -65504.0f), 65504.0f));
}

__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t count, __nv_bfloat16* __restrict__ out) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) out[i] = __float2bfloat16_rn(x[i]);
}

constexpr int kThreads = 256;

unsigned grid_for(int64_t threads) { return (unsigned)((threads + kThreads - 1) / kThreads); }

}  // namespace

void launch_quantize_q8_1(const float* x, int64_t n, int64_t cols, int8_t* q, float2* ds, cudaStream_t stream) {
  const int64_t n_blocks = n * cols / 32;
  quantize_q8_1_kernel<<<grid_for(n_blocks * 32), kThreads, 0, stream>>>(x, n_blocks, q, ds);
}

void launch_convert_activations(const float* x, int64_t count, void* out, bool bf16, cudaStream_t stream) {
  if (bf16)
    to_bf16_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, count, static_cast<__nv_bfloat16*>(out));
  else
    to_f16_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, count, static_cast<__half*>(out));
}

}  // namespace tandem::cuda
