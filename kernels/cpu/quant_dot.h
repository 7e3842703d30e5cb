// Dot products of quantized weight rows with activations quantized to 8 bits, as llama.cpp
// does for its legacy quant types: each 32-block of the activation gets a scale
// d = max|x| / 127 (rounded to fp16) and int8 quants, so a weight block times an activation
// block is one integer dot product and one multiply. Cheaper than decoding weights to float,
// and numerically what the llama.cpp peer computes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/isa.h"

namespace tandem::cpu {

struct BlockQ8Act {
  float d;          // scale, fp16-rounded
  float s;          // d * sum(qs), fp16-rounded (the Q4_1 offset term needs it)
  int32_t sum;      // sum(qs), exact (the packed kernels' shift correction needs it)
  int8_t qs[32];
};

// The weight types with an 8-bit-activation kernel: Q4_0, Q4_1, Q8_0, Q6_K (tiles: Q4_0, Q4_1,
// Q8_0).
bool has_quant_dot(DType weight_type);

// Quantizes n floats (a multiple of 32) into n / 32 blocks.
using QuantizeActFn = void (*)(const float* x, BlockQ8Act* out, int64_t n);
QuantizeActFn quantize_act_kernel(Isa isa);
void quantize_act_scalar(const float* x, BlockQ8Act* out, int64_t n);

// sum_i dequant(row)[i] * dequant(x)[i] over n elements.
using QuantDotFn = float (*)(const void* row, const BlockQ8Act* x, int64_t n);
float quant_dot_scalar(DType weight_type, const void* row, const BlockQ8Act* x, int64_t n);

// A register tile: 4 weight rows (row, row + row_bytes, ...) times J tokens (x + j * x_stride
// blocks), out[j * out_stride + r] = row r . token j. Each weight block is unpacked once for
// all J tokens and each activation block once for all 4 rows.
using QuantTileFn = void (*)(const void* row, size_t row_bytes, const BlockQ8Act* x, int64_t x_stride, int64_t n,
                             float* out, int64_t out_stride);

// The kernels of one weight type at one ISA level. Within a level all three give the same
// float for the same (row, token), so a product does not depend on how rows and tokens were
// grouped (a batched step equals sequences run alone; a cached decode equals its prefill).
struct QuantKernels {
  QuantDotFn dot = nullptr;         // 1 row x 1 token
  QuantTileFn rows4 = nullptr;      // 4 rows x 1 token (decode); nullptr: use dot
  QuantTileFn tile4x4 = nullptr;    // 4 rows x 4 tokens (prefill); nullptr: use dot
};
QuantKernels quant_kernels(DType weight_type, Isa isa);
QuantDotFn quant_dot_kernel(DType weight_type, Isa isa);  // quant_kernels(...).dot

// AVX2 versions (quant_dot_avx2.cpp).
QuantKernels quant_kernels_avx2(DType weight_type);
void quantize_act_avx2(const float* x, BlockQ8Act* out, int64_t n);
// At the AVX-512 level Q4_0/Q4_1/Q8_0 products use the packed kernels (packed_quant.h); the
// rest use these AVX2 ones.

}  // namespace tandem::cpu
