// Fused dequantize-and-dot of one weight row with a float activation vector, and the other
// float kernels' types with their scalar twins (each level's kernels: kernel_table.h).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace tandem::cpu {

// Returns sum_i dequant(row)[i] * x[i] over n elements (n a multiple of the block size).
using RowDotFn = float (*)(const void* row, const float* x, int64_t n);

// The same row against n_tokens tokens (x + t * x_stride), out[t * out_stride] for each: the
// weights are widened once per block for several tokens, and every sum is the float the
// type's RowDotFn gives at this ISA level, so a pass of many tokens (a speculative verify
// pass, all-position logits) matches decode's one-token pass bit for bit. nullptr where
// tandem has none (Q8_0 so far, the exact output head of small models). The AVX-512 level has
// a row dot and a tokens kernel of its own (16-lane sums, other floats than AVX2's), always
// chosen together.
using RowDotTokensFn = void (*)(const void* row, const float* x, int64_t x_stride, int n_tokens, int64_t n,
                                float* out, int64_t out_stride);

// Dot of two float vectors (used by prefill on dequantized rows and by attention).
using F32DotFn = float (*)(const float* a, const float* b, int64_t n);

// out[i] = x[i] rounded to fp16 (round to nearest even, as fp32_to_fp16): K and V rows into
// an f16 cache. AVX2 levels use F16C's conversion, bit-identical for every non-NaN input.
using F32ToF16Fn = void (*)(const float* x, uint16_t* out, int64_t n);
void f32_to_f16_scalar(const float* x, uint16_t* out, int64_t n);

// K and V rows into a q8_0 cache: n floats (a multiple of 32) into n / 32 GGML block_q8_0
// (quant_blocks.h: BlockQ8_0), as ggml's reference quantizer (quantize_row_q8_0_ref) makes them:
// d = amax / 127 stored as fp16, q = round(x * (1 / d)) with halves away from zero. Every level
// writes the same bytes. Past finite inputs (not in ggml's contract): quants saturate at +-127
// and a NaN quantizes to 0 and is left out of amax.
using QuantizeQ8_0Fn = void (*)(const float* x, void* out, int64_t n);
void quantize_q8_0_scalar(const float* x, void* out, int64_t n);

// A register tile for prefill on decoded rows: out[t * 2 + r] = a_r . b_t for two rows
// (a, a + a_stride) and four tokens (b + t * b_stride): each loaded row vector meets four
// tokens and each token vector two rows, instead of one load per multiply-add.
using F32TileFn = void (*)(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t n, float* out);
void f32_tile_scalar(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t n, float* out);

// Scalar twins, exposed for tests.
float row_dot_scalar(DType type, const void* row, const float* x, int64_t n);
float f32_dot_scalar(const float* a, const float* b, int64_t n);

// y[i] += a * x[i] with x stored as F32, F16 or Q8_0 (the KV cache's element types; Q8_0: n a
// multiple of 32, and x[i] = d * q exactly, so the sums equal those over dequantized F32 rows).
using AxpyFn = void (*)(float a, const void* x, float* y, int64_t n);
void axpy_scalar(DType x_type, float a, const void* x, float* y, int64_t n);

}  // namespace tandem::cpu
