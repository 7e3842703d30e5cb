#include "kernels/cpu/kernel_table.h"

namespace tandem::cpu {

namespace {

// The scalar twins take their type as an argument; the table holds one pointer per type.
template <DType T>
float row_dot_scalar_t(const void* row, const float* x, int64_t n) {
  return row_dot_scalar(T, row, x, n);
}
template <DType T>
float quant_dot_scalar_t(const void* row, const BlockQ8Act* x, int64_t n) {
  return quant_dot_scalar(T, row, x, n);
}
template <DType T>
void quant_dot4_scalar_t(const void* row, const BlockQ8Act* x, int64_t x_stride, int64_t n, float* out) {
  quant_dot4_scalar(T, row, x, x_stride, n, out);
}
template <DType T>
void axpy_scalar_t(float a, const void* x, float* y, int64_t n) {
  axpy_scalar(T, a, x, y, n);
}

template <DType... Ts>
void fill_by_type(CpuKernels& k) {
  (k.row_dot.set(Ts, row_dot_scalar_t<Ts>), ...);
}
template <DType... Ts>
void fill_quant_by_type(CpuKernels& k) {
  (k.act8.quant_dot.set(Ts, quant_dot_scalar_t<Ts>), ...);
}

// Every level starts from the scalar twins; the packed kernels and attention's head kernels
// have none (their callers fall back to the row kernels).
void fill_scalar(CpuKernels& k) {
  // Float products.
  k.dot_f32 = f32_dot_scalar;
  k.tile_f32 = f32_tile_scalar;
  fill_by_type<DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
               DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4>(k);
  // The KV cache: stores and attention's value sums.
  k.f32_to_f16 = f32_to_f16_scalar;
  k.quantize_q8_0 = quantize_q8_0_scalar;
  k.axpy.set(DType::F32, axpy_scalar_t<DType::F32>);
  k.axpy.set(DType::F16, axpy_scalar_t<DType::F16>);
  k.axpy.set(DType::Q8_0, axpy_scalar_t<DType::Q8_0>);
  // Products with 8-bit activations.
  k.quantize_act = quantize_act_scalar;
  fill_quant_by_type<DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K,
                     DType::Q6_K, DType::MXFP4>(k);
  k.act8.quant_dot4.set(DType::Q4_0, quant_dot4_scalar_t<DType::Q4_0>);
  k.act8.quant_dot4.set(DType::Q4_1, quant_dot4_scalar_t<DType::Q4_1>);
  k.act8.quant_dot4.set(DType::Q8_0, quant_dot4_scalar_t<DType::Q8_0>);
  k.act8.quant_dot4.set(DType::MXFP4, quant_dot4_scalar_t<DType::MXFP4>);
  // Gated activations.
  k.silu_mul = silu_mul;
  k.gelu_tanh_mul = gelu_tanh_mul;
}

void fill_avx2(CpuKernels& k) {
  fill_dot_avx2(k);
  fill_quant_dot_avx2(k);
  fill_packed_quant_avx2(k);
  fill_packed_float_avx2(k);
  fill_attention_avx2(k);
  fill_ops_avx2(k);
}

// AVX-512 VNNI CPUs run the AVX2 kernels where AVX-512 has none of its own.
void fill_avx512(CpuKernels& k) {
  fill_avx2(k);
  fill_dot_avx512(k);
  fill_packed_quant_avx512(k);
  fill_packed_float_avx512(k);
  fill_attention_avx512(k);
  fill_attention_wide_avx512(k);
  fill_ops_avx512(k);
}

CpuKernels make_table(Isa isa) {
  CpuKernels k;
  k.isa = isa;
  fill_scalar(k);
  if (isa == Isa::Avx2) fill_avx2(k);
  if (isa == Isa::Avx512) fill_avx512(k);
  return k;
}

}  // namespace

const CpuKernels& kernels_for(Isa isa) {
  // One static per level, so a level's tables (and its ISA files' fill code) are only made on
  // a CPU that asked for it.
  switch (isa) {
    case Isa::Avx512: {
      static const CpuKernels avx512 = make_table(Isa::Avx512);
      return avx512;
    }
    case Isa::Avx2: {
      static const CpuKernels avx2 = make_table(Isa::Avx2);
      return avx2;
    }
    default: {
      static const CpuKernels scalar = make_table(Isa::Scalar);
      return scalar;
    }
  }
}

CpuKernels kernels_for(Isa isa, bool quantized_activations) {
  CpuKernels k = kernels_for(isa);
  k.quantized_activations = quantized_activations;
  return k;
}

void f32_to_f16(const float* x, uint16_t* out, int64_t n) {
  static const F32ToF16Fn best = kernels_for(best_isa()).f32_to_f16;
  best(x, out, n);
}

void quantize_q8_0(const float* x, void* out, int64_t n) {
  static const QuantizeQ8_0Fn best = kernels_for(best_isa()).quantize_q8_0;
  best(x, out, n);
}

}  // namespace tandem::cpu
