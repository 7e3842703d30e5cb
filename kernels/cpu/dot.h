// Fused dequantize-and-dot of one weight row with a float activation vector.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/packed_float.h"
#include "kernels/cpu/packed_quant.h"
#include "kernels/cpu/quant_dot.h"

namespace tandem::cpu {

// Returns sum_i dequant(row)[i] * x[i] over n elements (n a multiple of the block size).
using RowDotFn = float (*)(const void* row, const float* x, int64_t n);

// The kernel for a type at an ISA level; nullptr if tandem has none for the type.
RowDotFn row_dot_kernel(DType type, Isa isa);

// The same row against n_tokens tokens (x + t * x_stride), out[t * out_stride] for each: the
// weights are widened once per block for several tokens, and every sum is the float the
// type's RowDotFn gives at this ISA level, so a pass of many tokens (a speculative verify
// pass, all-position logits) matches decode's one-token pass bit for bit. nullptr where
// tandem has none (Q8_0 so far, the exact output head of small models). The AVX-512 level has
// a row dot and a tokens kernel of its own (16-lane sums, other floats than AVX2's), always
// chosen together.
using RowDotTokensFn = void (*)(const void* row, const float* x, int64_t x_stride, int n_tokens, int64_t n,
                                float* out, int64_t out_stride);
RowDotTokensFn row_dot_tokens_kernel(DType type, Isa isa);

// Dot of two float vectors (used by prefill on dequantized rows and by attention).
using F32DotFn = float (*)(const float* a, const float* b, int64_t n);
F32DotFn f32_dot_kernel(Isa isa);

// out[i] = x[i] rounded to fp16 (round to nearest even, as fp32_to_fp16): K and V rows into
// an f16 cache. AVX2 levels use F16C's conversion, bit-identical for every non-NaN input.
using F32ToF16Fn = void (*)(const float* x, uint16_t* out, int64_t n);
F32ToF16Fn f32_to_f16_kernel(Isa isa);
void f32_to_f16_scalar(const float* x, uint16_t* out, int64_t n);
// The same at the best level this CPU has (chosen once): what the KV cache stores use.
void f32_to_f16(const float* x, uint16_t* out, int64_t n);

// K and V rows into a q8_0 cache: n floats (a multiple of 32) into n / 32 GGML block_q8_0
// (quant_blocks.h: BlockQ8_0), as ggml's reference quantizer (quantize_row_q8_0_ref) makes them:
// d = amax / 127 stored as fp16, q = round(x * (1 / d)) with halves away from zero. Every level
// writes the same bytes. Past finite inputs (not in ggml's contract): quants saturate at +-127
// and a NaN quantizes to 0 and is left out of amax.
using QuantizeQ8_0Fn = void (*)(const float* x, void* out, int64_t n);
QuantizeQ8_0Fn quantize_q8_0_kernel(Isa isa);
void quantize_q8_0_scalar(const float* x, void* out, int64_t n);
// The same at the best level this CPU has (chosen once): what the KV cache stores use.
void quantize_q8_0(const float* x, void* out, int64_t n);

// A register tile for prefill on decoded rows: out[t * 2 + r] = a_r . b_t for two rows
// (a, a + a_stride) and four tokens (b + t * b_stride): each loaded row vector meets four
// tokens and each token vector two rows, instead of one load per multiply-add.
using F32TileFn = void (*)(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t n, float* out);
F32TileFn f32_tile_kernel(Isa isa);
void f32_tile_scalar(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t n, float* out);

// Scalar twins, exposed for tests.
float row_dot_scalar(DType type, const void* row, const float* x, int64_t n);
float f32_dot_scalar(const float* a, const float* b, int64_t n);

// AVX2 kernels (dot_avx2.cpp); only call when best_isa() is Avx2.
RowDotFn row_dot_kernel_avx2(DType type);
RowDotTokensFn row_dot_tokens_kernel_avx2(DType type);
float f32_dot_avx2(const float* a, const float* b, int64_t n);
void f32_to_f16_avx2(const float* x, uint16_t* out, int64_t n);
void quantize_q8_0_avx2(const float* x, void* out, int64_t n);
void f32_tile_avx2(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t n, float* out);
// AVX-512 (dot_avx512.cpp); only call when best_isa() is Avx512.
void quantize_q8_0_avx512(const float* x, void* out, int64_t n);
void f32_tile_avx512(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t n, float* out);
RowDotFn row_dot_kernel_avx512(DType type);
RowDotTokensFn row_dot_tokens_kernel_avx512(DType type);

}  // namespace tandem::cpu

namespace tandem::cpu {

// y[i] += a * x[i] with x stored as F32, F16 or Q8_0 (the KV cache's element types; Q8_0: n a
// multiple of 32, and x[i] = d * q exactly, so the sums equal those over dequantized F32 rows).
using AxpyFn = void (*)(float a, const void* x, float* y, int64_t n);
AxpyFn axpy_kernel(DType x_type, Isa isa);
void axpy_scalar(DType x_type, float a, const void* x, float* y, int64_t n);
AxpyFn axpy_kernel_avx2(DType x_type);

// The kernel set a model picks once at load time for one ISA level.
struct CpuKernels {
  Isa isa = Isa::Scalar;
  F32DotFn dot_f32 = nullptr;
  F32TileFn tile_f32 = nullptr;
  QuantizeActFn quantize_act = nullptr;
  // false: every product in float (exact, for reference checks); true: Q4_0/Q4_1/Q8_0 weights
  // multiply 8-bit-quantized activations, as llama.cpp does (faster).
  bool quantized_activations = true;
  SiluMulFn silu_mul = cpu::silu_mul;
  SiluMulFn gelu_tanh_mul = cpu::gelu_tanh_mul;
  static CpuKernels for_isa(Isa isa, bool quantized_activations = true) {
    return {isa, f32_dot_kernel(isa), f32_tile_kernel(isa), quantize_act_kernel(isa), quantized_activations,
            silu_mul_kernel(isa), gelu_tanh_mul_kernel(isa)};
  }
  QuantDotFn quant_dot(DType t) const { return quantized_activations ? quant_dot_kernel(t, isa) : nullptr; }
  QuantDot4Fn quant_dot4(DType t) const { return quantized_activations ? quant_dot4_kernel(t, isa) : nullptr; }
  PackedGemmFn packed(DType t) const { return quantized_activations ? packed_gemm_kernel(t, isa) : nullptr; }
  // Float arithmetic, so used in either activation mode.
  PackedFloatGemmFn packed_float(DType t) const { return packed_float_gemm_kernel(t, isa); }
  RowDotFn row_dot(DType t) const { return row_dot_kernel(t, isa); }
  RowDotTokensFn row_dot_tokens(DType t) const { return row_dot_tokens_kernel(t, isa); }
  AxpyFn axpy(DType t) const { return axpy_kernel(t, isa); }
};

}  // namespace tandem::cpu
