#include "kernels/cpu/quant_dot.h"

#include <cmath>

#include "core/fp16.h"
#include "kernels/cpu/quant_blocks.h"

namespace tandem::cpu {

bool has_quant_dot(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::MXFP4: return true;
    default: return false;
  }
}

void quantize_act_scalar(const float* x, BlockQ8Act* out, int64_t n) {
  for (int64_t b = 0; b < n / kQK; b++, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; j++) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < kQK; j++) {
      out[b].qs[j] = (int8_t)std::nearbyint(x[j] * id);  // round half to even, as the SIMD path does
      sum += out[b].qs[j];
    }
    out[b].d = fp16_to_fp32(fp32_to_fp16(d));
    out[b].s = fp16_to_fp32(fp32_to_fp16(d * (float)sum));
    out[b].sum = sum;
    out[b].sum_lo = 0;
    for (int j = 0; j < 16; j++) out[b].sum_lo += out[b].qs[j];
  }
}

// Q6_K against 8-bit activations: each 32-element group of a 256-element super-block meets one
// activation block; its two halves of 16 carry their own 8-bit scale.
static float quant_dot_q6_k_scalar(const BlockQ6_K* w, const BlockQ8Act* x, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; i++) {
    const float d = fp16_to_fp32(w[i].d);
    for (int g = 0; g < 8; g++) {
      const int h = g / 4, k = g % 4;
      const uint8_t* ql = w[i].ql + 64 * h + (k & 1) * 32;
      const uint8_t* qh = w[i].qh + 32 * h;
      const BlockQ8Act& xb = x[i * 8 + g];
      int sum[2] = {0, 0};
      for (int l = 0; l < 32; l++) {
        const int lo = k < 2 ? (ql[l] & 0xF) : (ql[l] >> 4);
        const int q = (lo | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
        sum[l / 16] += q * xb.qs[l];
      }
      const int8_t* sc = w[i].scales + 8 * h + 2 * k;
      acc += d * xb.d * (float)(sc[0] * sum[0] + sc[1] * sum[1]);
    }
  }
  return acc;
}

// The fifth bit of element j of a Q5_0/Q5_1 block, as 0 or 16.
static int q5_high(const uint8_t qh[4], int j) { return ((qh[j / 8] >> (j % 8)) & 1) << 4; }

// Q4_K/Q5_K against 8-bit activations, sub-block s of each super-block meeting one activation
// block: acc += (d sc) dx sum(q x) - (dmin m) dx sum(x). d sc and dmin m are exact in float
// (11-bit by 6-bit), sum(q x) and sum(x) exact integers.
template <typename Block>
static float quant_dot_kquant_scalar(const Block* w, const BlockQ8Act* x, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; i++)
    for (int s = 0; s < 8; s++) {
      const BlockQ8Act& xb = x[i * 8 + s];
      const uint8_t* qs = w[i].qs + 32 * (s / 2);
      int32_t sumi = 0;
      for (int l = 0; l < 32; l++) {
        int q = s % 2 ? qs[l] >> 4 : qs[l] & 0xF;
        if constexpr (sizeof(Block) == sizeof(BlockQ5_K)) q |= ((w[i].qh[l] >> s) & 1) << 4;
        sumi += q * xb.qs[l];
      }
      uint8_t sc, m;
      q4_k_scale_min(s, w[i].scales, &sc, &m);
      const float ds = fp16_to_fp32(w[i].d) * (float)sc, dm = fp16_to_fp32(w[i].dmin) * (float)m;
      acc = std::fma((float)sumi, ds * xb.d, acc);
      acc = std::fma(-dm, xb.d * (float)xb.sum, acc);
    }
  return acc;
}

float quant_dot_scalar(DType t, const void* row, const BlockQ8Act* x, int64_t n) {
  if (t == DType::Q6_K) return quant_dot_q6_k_scalar(static_cast<const BlockQ6_K*>(row), x, n);
  if (t == DType::Q4_K) return quant_dot_kquant_scalar(static_cast<const BlockQ4_K*>(row), x, n);
  if (t == DType::Q5_K) return quant_dot_kquant_scalar(static_cast<const BlockQ5_K*>(row), x, n);
  float acc = 0.0f;
  for (int64_t b = 0; b < n / kQK; b++) {
    int sumi = 0;
    switch (t) {
      case DType::Q4_0: {
        const auto& w = static_cast<const BlockQ4_0*>(row)[b];
        for (int j = 0; j < kQK / 2; j++)
          sumi += ((w.qs[j] & 0xF) - 8) * x[b].qs[j] + ((w.qs[j] >> 4) - 8) * x[b].qs[j + kQK / 2];
        acc += fp16_to_fp32(w.d) * x[b].d * (float)sumi;
        break;
      }
      case DType::Q4_1: {
        const auto& w = static_cast<const BlockQ4_1*>(row)[b];
        for (int j = 0; j < kQK / 2; j++) sumi += (w.qs[j] & 0xF) * x[b].qs[j] + (w.qs[j] >> 4) * x[b].qs[j + kQK / 2];
        acc += fp16_to_fp32(w.d) * x[b].d * (float)sumi + fp16_to_fp32(w.m) * x[b].s;
        break;
      }
      case DType::Q5_0: {
        const auto& w = static_cast<const BlockQ5_0*>(row)[b];
        for (int j = 0; j < kQK / 2; j++)
          sumi += (((w.qs[j] & 0xF) | q5_high(w.qh, j)) - 16) * x[b].qs[j] +
                  (((w.qs[j] >> 4) | q5_high(w.qh, j + kQK / 2)) - 16) * x[b].qs[j + kQK / 2];
        acc += fp16_to_fp32(w.d) * x[b].d * (float)sumi;
        break;
      }
      case DType::Q5_1: {
        const auto& w = static_cast<const BlockQ5_1*>(row)[b];
        for (int j = 0; j < kQK / 2; j++)
          sumi += ((w.qs[j] & 0xF) | q5_high(w.qh, j)) * x[b].qs[j] +
                  ((w.qs[j] >> 4) | q5_high(w.qh, j + kQK / 2)) * x[b].qs[j + kQK / 2];
        acc += fp16_to_fp32(w.d) * x[b].d * (float)sumi + fp16_to_fp32(w.m) * x[b].s;
        break;
      }
      case DType::Q8_0: {
        const auto& w = static_cast<const BlockQ8_0*>(row)[b];
        for (int j = 0; j < kQK; j++) sumi += w.qs[j] * x[b].qs[j];
        acc += fp16_to_fp32(w.d) * x[b].d * (float)sumi;
        break;
      }
      case DType::MXFP4: {
        const auto& w = static_cast<const BlockMxfp4*>(row)[b];
        for (int j = 0; j < kQK / 2; j++)
          sumi += kMxfp4Values[w.qs[j] & 0xF] * x[b].qs[j] + kMxfp4Values[w.qs[j] >> 4] * x[b].qs[j + kQK / 2];
        acc += mxfp4_scale(w.e) * x[b].d * (float)sumi;
        break;
      }
      default: return 0.0f;
    }
  }
  return acc;
}

void quant_dot4_scalar(DType t, const void* row, const BlockQ8Act* x, int64_t x_stride, int64_t n, float* out) {
  for (int j = 0; j < 4; j++) out[j] = quant_dot_scalar(t, row, x + j * x_stride, n);
}

}  // namespace tandem::cpu
