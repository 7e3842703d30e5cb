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

void f32_to_f16_scalar(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = fp32_to_fp16(x[i]);
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

void f32_tile_scalar(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t n, float* out) {
  for (int t = 0; t < 4; t++)
    for (int r = 0; r < 2; r++) out[t * 2 + r] = f32_dot_scalar(a + r * a_stride, b + t * b_stride, n);
}

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

}  // namespace tandem::cpu
