// Dot products of quantized weight rows with activations quantized to 8 bits, as llama.cpp
// does for its legacy quant types: each 32-block of the activation gets a scale
// d = max|x| / 127 (rounded to fp16) and int8 quants, so a weight block times an activation
// block is one integer dot product and one multiply. Cheaper than decoding weights to float,
// and numerically what the llama.cpp peer computes.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace tandem::cpu {

struct BlockQ8Act {
  float d;          // scale, fp16-rounded
  float s;          // d * sum(qs), fp16-rounded (the Q4_1 offset term needs it)
  int32_t sum;      // sum(qs), exact (the packed kernels' shift correction needs it)
  int32_t sum_lo;   // sum(qs[0..15]), exact (packed Q6_K's halves of 16 each need their own)
  int8_t qs[32];
};

// The weight types with an 8-bit-activation kernel: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
// Q6_K, MXFP4 (the four-token kernel: Q4_0, Q4_1, Q8_0, MXFP4). Q5_0, Q5_1, Q4_K and Q5_K have
// only the scalar row kernel: with AVX2 or AVX-512 their products take the packed kernels.
// MXFP4's codes meet the activations as their int8 values (quant_blocks.h: kMxfp4Values).
bool has_quant_dot(DType weight_type);

// Quantizes n floats (a multiple of 32) into n / 32 blocks.
using QuantizeActFn = void (*)(const float* x, BlockQ8Act* out, int64_t n);
void quantize_act_scalar(const float* x, BlockQ8Act* out, int64_t n);

// sum_i dequant(row)[i] * dequant(x)[i] over n elements.
using QuantDotFn = float (*)(const void* row, const BlockQ8Act* x, int64_t n);
float quant_dot_scalar(DType weight_type, const void* row, const BlockQ8Act* x, int64_t n);

// One weight row against 4 tokens at once (prefill): out[j] = row . x[j * x_stride blocks].
// Each weight block is unpacked once for all four tokens.
using QuantDot4Fn = void (*)(const void* row, const BlockQ8Act* x, int64_t x_stride, int64_t n, float* out);
void quant_dot4_scalar(DType weight_type, const void* row, const BlockQ8Act* x, int64_t x_stride, int64_t n, float* out);

// AVX2 versions: quant_dot_avx2.cpp. At the AVX-512 level Q4_0/Q4_1/Q8_0/MXFP4 products use
// the packed kernels (packed_quant.h).

}  // namespace tandem::cpu
