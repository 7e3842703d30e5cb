#include "kernels/cpu/dot.h"

#include <algorithm>
#include <cmath>

#include "core/fp16.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/quant_blocks.h"

namespace tandem::cpu {

float f32_dot_scalar(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

// The scalar twin: decode a chunk with the reference dequantizer, then a plain dot.
float row_dot_scalar(DType type, const void* row, const float* x, int64_t n) {
  constexpr int64_t kChunk = 256;  // a multiple of every block size
  float buf[kChunk];
  const int64_t block = dtype_info(static_cast<uint32_t>(type))->block_elems;
  const int64_t bytes_per_block = dtype_info(static_cast<uint32_t>(type))->block_bytes;
  const auto* src = static_cast<const uint8_t*>(row);
  float s = 0.0f;
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    dequantize_row(type, src + (i / block) * bytes_per_block, buf, len);
    for (int64_t j = 0; j < len; j++) s += buf[j] * x[i + j];
  }
  return s;
}

template <DType T>
static float row_dot_scalar_t(const void* row, const float* x, int64_t n) {
  return row_dot_scalar(T, row, x, n);
}

RowDotFn row_dot_kernel(DType type, Isa isa) {
  // A level's row dot and tokens kernel come from the same file, so their sums agree.
  if (isa == Isa::Avx512) {
    if (RowDotFn f = row_dot_kernel_avx512(type)) return f;
  }
  if (has_avx2(isa)) {
    if (RowDotFn f = row_dot_kernel_avx2(type)) return f;
  }
  switch (type) {
    case DType::F32: return row_dot_scalar_t<DType::F32>;
    case DType::F16: return row_dot_scalar_t<DType::F16>;
    case DType::BF16: return row_dot_scalar_t<DType::BF16>;
    case DType::Q4_0: return row_dot_scalar_t<DType::Q4_0>;
    case DType::Q4_1: return row_dot_scalar_t<DType::Q4_1>;
    case DType::Q5_0: return row_dot_scalar_t<DType::Q5_0>;
    case DType::Q5_1: return row_dot_scalar_t<DType::Q5_1>;
    case DType::Q8_0: return row_dot_scalar_t<DType::Q8_0>;
    case DType::Q4_K: return row_dot_scalar_t<DType::Q4_K>;
    case DType::Q5_K: return row_dot_scalar_t<DType::Q5_K>;
    case DType::Q6_K: return row_dot_scalar_t<DType::Q6_K>;
    default: return nullptr;
  }
}

RowDotTokensFn row_dot_tokens_kernel(DType type, Isa isa) {
  if (isa == Isa::Avx512) {
    if (RowDotTokensFn f = row_dot_tokens_kernel_avx512(type)) return f;
  }
  return has_avx2(isa) ? row_dot_tokens_kernel_avx2(type) : nullptr;
}

F32DotFn f32_dot_kernel(Isa isa) { return has_avx2(isa) ? f32_dot_avx2 : f32_dot_scalar; }

void f32_to_f16_scalar(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = fp32_to_fp16(x[i]);
}

F32ToF16Fn f32_to_f16_kernel(Isa isa) { return has_avx2(isa) ? f32_to_f16_avx2 : f32_to_f16_scalar; }

void f32_to_f16(const float* x, uint16_t* out, int64_t n) {
  static const F32ToF16Fn best = f32_to_f16_kernel(best_isa());
  best(x, out, n);
}

void quantize_q8_0_scalar(const float* x, void* out, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(out);
  for (int64_t i = 0; i < n / kQK; i++, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; j++) amax = std::max(amax, std::fabs(x[j]));  // a NaN never wins
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK; j++) {
      const float r = std::round(x[j] * id);  // halves away from zero, as roundf
      b[i].qs[j] = r != r ? 0 : (int8_t)std::clamp(r, -127.0f, 127.0f);
    }
  }
}

QuantizeQ8_0Fn quantize_q8_0_kernel(Isa isa) {
  if (isa == Isa::Avx512) return quantize_q8_0_avx512;
  return has_avx2(isa) ? quantize_q8_0_avx2 : quantize_q8_0_scalar;
}

void quantize_q8_0(const float* x, void* out, int64_t n) {
  static const QuantizeQ8_0Fn best = quantize_q8_0_kernel(best_isa());
  best(x, out, n);
}

void f32_tile_scalar(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t n, float* out) {
  for (int t = 0; t < 4; t++)
    for (int r = 0; r < 2; r++) out[t * 2 + r] = f32_dot_scalar(a + r * a_stride, b + t * b_stride, n);
}

F32TileFn f32_tile_kernel(Isa isa) {
  if (isa == Isa::Avx512) return f32_tile_avx512;
  return has_avx2(isa) ? f32_tile_avx2 : f32_tile_scalar;
}

}  // namespace tandem::cpu

namespace tandem::cpu {

void axpy_scalar(DType x_type, float a, const void* x, float* y, int64_t n) {
  if (x_type == DType::Q8_0) {
    const auto* b = static_cast<const BlockQ8_0*>(x);
    for (int64_t i = 0; i < n / kQK; i++, y += kQK) {
      const float d = fp16_to_fp32(b[i].d);
      for (int j = 0; j < kQK; j++) y[j] += a * (d * (float)b[i].qs[j]);  // d * q: the dequantized value, exactly
    }
    return;
  }
  if (x_type == DType::F32) {
    const auto* xf = static_cast<const float*>(x);
    for (int64_t i = 0; i < n; i++) y[i] += a * xf[i];
  } else {
    const auto* xh = static_cast<const uint16_t*>(x);
    for (int64_t i = 0; i < n; i++) y[i] += a * fp16_to_fp32(xh[i]);
  }
}

template <DType T>
static void axpy_scalar_t(float a, const void* x, float* y, int64_t n) {
  axpy_scalar(T, a, x, y, n);
}

AxpyFn axpy_kernel(DType x_type, Isa isa) {
  if (x_type != DType::F32 && x_type != DType::F16 && x_type != DType::Q8_0) return nullptr;
  if (has_avx2(isa)) {
    if (AxpyFn f = axpy_kernel_avx2(x_type)) return f;
  }
  switch (x_type) {
    case DType::F32: return axpy_scalar_t<DType::F32>;
    case DType::F16: return axpy_scalar_t<DType::F16>;
    default: return axpy_scalar_t<DType::Q8_0>;
  }
}

}  // namespace tandem::cpu
