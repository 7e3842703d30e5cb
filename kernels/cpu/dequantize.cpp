#include "kernels/cpu/dequantize.h"

#include <cstring>

#include "core/fp16.h"
#include "kernels/cpu/quant_blocks.h"

namespace tandem::cpu {

namespace {

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK / 2; j++) {
      y[j] = d * ((b[i].qs[j] & 0xF) - 8);
      y[j + kQK / 2] = d * ((b[i].qs[j] >> 4) - 8);
    }
  }
}

void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    const float m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < kQK / 2; j++) {
      y[j] = d * (b[i].qs[j] & 0xF) + m;
      y[j + kQK / 2] = d * (b[i].qs[j] >> 4) + m;
    }
  }
}

// The fifth bit of element j of a Q5_0/Q5_1 block, as 0 or 16.
inline int q5_high(const uint8_t qh[4], int j) { return ((qh[j / 8] >> (j % 8)) & 1) << 4; }

void dequant_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK / 2; j++) {
      y[j] = d * (((b[i].qs[j] & 0xF) | q5_high(b[i].qh, j)) - 16);
      y[j + kQK / 2] = d * (((b[i].qs[j] >> 4) | q5_high(b[i].qh, j + kQK / 2)) - 16);
    }
  }
}

void dequant_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    const float m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < kQK / 2; j++) {
      y[j] = d * ((b[i].qs[j] & 0xF) | q5_high(b[i].qh, j)) + m;
      y[j + kQK / 2] = d * ((b[i].qs[j] >> 4) | q5_high(b[i].qh, j + kQK / 2)) + m;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK; j++) y[j] = d * b[i].qs[j];
  }
}

void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = fp16_to_fp32(b[i].d);
    const float dmin = fp16_to_fp32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    // Each 32 bytes of qs hold two sub-blocks: low nibbles first, then high nibbles.
    for (int j = 0; j < kQK_K; j += 64) {
      uint8_t sc, m;
      q4_k_scale_min(j / 32, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      q4_k_scale_min(j / 32 + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
    }
  }
}

void dequant_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = fp16_to_fp32(b[i].d);
    const float dmin = fp16_to_fp32(b[i].dmin);
    // Sub-block s: nibble s % 2 of qs[32 (s / 2) + l], fifth bit s of qh[l].
    for (int s = 0; s < 8; s++) {
      uint8_t sc, m;
      q4_k_scale_min(s, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      const uint8_t* q = b[i].qs + 32 * (s / 2);
      for (int l = 0; l < 32; l++) {
        const int lo = s % 2 ? q[l] >> 4 : q[l] & 0xF;
        *y++ = d1 * (lo | ((b[i].qh[l] >> s) & 1) << 4) - m1;
      }
    }
  }
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int l = 0; l < 32; l++) {
        const int is = l / 16;
        const int q1 = (int8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = (int8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

void dequant_mxfp4(const BlockMxfp4* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, y += kQK) {
    const float d = mxfp4_scale(b[i].e);
    for (int j = 0; j < kQK / 2; j++) {
      y[j] = d * kMxfp4Values[b[i].qs[j] & 0xF];
      y[j + kQK / 2] = d * kMxfp4Values[b[i].qs[j] >> 4];
    }
  }
}

}  // namespace

bool dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case DType::F32: std::memcpy(dst, src, n * sizeof(float)); return true;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_fp32(h[i]);
      return true;
    }
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32(h[i]);
      return true;
    }
    case DType::Q4_0: dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, n / kQK); return true;
    case DType::Q4_1: dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, n / kQK); return true;
    case DType::Q5_0: dequant_q5_0(static_cast<const BlockQ5_0*>(src), dst, n / kQK); return true;
    case DType::Q5_1: dequant_q5_1(static_cast<const BlockQ5_1*>(src), dst, n / kQK); return true;
    case DType::Q8_0: dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, n / kQK); return true;
    case DType::Q4_K: dequant_q4_k(static_cast<const BlockQ4_K*>(src), dst, n / kQK_K); return true;
    case DType::Q5_K: dequant_q5_k(static_cast<const BlockQ5_K*>(src), dst, n / kQK_K); return true;
    case DType::Q6_K: dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, n / kQK_K); return true;
    case DType::MXFP4: dequant_mxfp4(static_cast<const BlockMxfp4*>(src), dst, n / kQK); return true;
    default: return false;
  }
}

}  // namespace tandem::cpu
