// embed(): the table's rows for each token, decoded to F32 exactly as dequantize_row decodes them,
// then multiplied by the model's embedding scale as the CPU backend does (one rounding).
#include "backend/cuda/cuda_matmul_kernels.cuh"

namespace tandem::cuda {

namespace {

// One thread block per token. A token id outside the table gives a row of NaN (visible
// downstream) rather than a read out of bounds; the backend checks ids before the pass.
__global__ void embed_kernel(const WeightView w, const int32_t* __restrict__ tokens, float* __restrict__ out,
                             float scale) {
  const int32_t id = tokens[blockIdx.x];
  float* row = out + (int64_t)blockIdx.x * w.cols;
  if (id < 0 || id >= w.rows) {
    for (int64_t c = threadIdx.x; c < w.cols; c += blockDim.x) row[c] = __int_as_float(0x7fc00000);
    return;
  }
  if (is_quantized(w.type)) {
    for (int64_t c8 = threadIdx.x; c8 < w.cols / 8; c8 += blockDim.x) {
      float v[8];
      decode8_quant(w, id, c8, v);
#pragma unroll
      for (int k = 0; k < 8; k++) row[c8 * 8 + k] = scale != 1.0f ? mul_rn(v[k], scale) : v[k];
    }
  } else {
    for (int64_t c = threadIdx.x; c < w.cols; c += blockDim.x) {
      const float v = decode_plain(w, id, c);
      row[c] = scale != 1.0f ? mul_rn(v, scale) : v;
    }
  }
}

}  // namespace

void launch_embed(const WeightView& w, const int32_t* tokens, int64_t n, float* out, float scale, cudaStream_t stream) {
  embed_kernel<<<(unsigned)n, 256, 0, stream>>>(w, tokens, out, scale);
}

}  // namespace tandem::cuda
