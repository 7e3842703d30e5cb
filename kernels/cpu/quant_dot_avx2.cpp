// AVX2 8-bit-activation kernels. Compiled with -mavx2 -mfma -mf16c and called only after
// run-time detection; like dot_avx2.cpp it uses no shared (non-static) inline helpers.
#include <cstdint>

#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quant_dot.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "kernels/cpu/avx2_helpers.h"

namespace tandem::cpu {
namespace {

using avx2::half;
using avx2::hsum;
inline int32_t hsum_epi32(__m256i v) {
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  return _mm_cvtsi128_si32(s4);
}
inline float round_half(float f) { return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }

// 32 nibbles -> 32 bytes: low nibbles (elements 0..15) in the low lane, high nibbles above.
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Sum of unsigned bytes u times signed bytes s, as 8 floats (pairs summed in int16, then int32).
inline __m256 dot_us8(__m256i u, __m256i s) {
  const __m256i p16 = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

// Signed x signed: move x's sign onto y so that maddubs sees |x| (unsigned).
inline __m256 dot_ss8(__m256i x, __m256i y) { return dot_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)); }

float dot_q4_1(const void* row, const BlockQ8Act* x, int64_t n) {
  const auto* w = static_cast<const BlockQ4_1*>(row);
  __m256 acc = _mm256_setzero_ps();
  float offsets = 0.0f;
  for (int64_t b = 0; b < n / kQK; b++) {
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w[b].d) * x[b].d), dot_us8(unpack_nibbles(w[b].qs), y), acc);
    offsets += half(w[b].m) * x[b].s;
  }
  return hsum(acc) + offsets;
}

// The weight block as signed or unsigned bytes, ready for dot_us8 / dot_ss8, and its scales.
struct WeightBlock {
  __m256i q;
  float d, m;
};

template <DType T>
inline WeightBlock load_block(const void* row, int64_t b) {
  if constexpr (T == DType::Q4_0) {
    const auto& w = static_cast<const BlockQ4_0*>(row)[b];
    return {_mm256_sub_epi8(unpack_nibbles(w.qs), _mm256_set1_epi8(8)), half(w.d), 0.0f};
  } else if constexpr (T == DType::MXFP4) {  // each code's int8 value, looked up in both lanes
    const auto& w = static_cast<const BlockMxfp4*>(row)[b];
    const __m256i values = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Values)));
    return {_mm256_shuffle_epi8(values, unpack_nibbles(w.qs)), mxfp4_scale(w.e), 0.0f};
  } else if constexpr (T == DType::Q4_1) {
    const auto& w = static_cast<const BlockQ4_1*>(row)[b];
    return {unpack_nibbles(w.qs), half(w.d), half(w.m)};
  } else {
    const auto& w = static_cast<const BlockQ8_0*>(row)[b];
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs)), half(w.d), 0.0f};
  }
}

// A row of signed weights (Q4_0, Q8_0, MXFP4) against one token.
template <DType T>
float dot_signed(const void* row, const BlockQ8Act* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; b++) {
    const WeightBlock w = load_block<T>(row, b);
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(w.d * x[b].d), dot_ss8(w.q, y), acc);
  }
  return hsum(acc);
}

template <DType T>
void dot4(const void* row, const BlockQ8Act* x, int64_t stride, int64_t n, float* out) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  float offsets[4] = {0, 0, 0, 0};
  for (int64_t b = 0; b < n / kQK; b++) {
    const WeightBlock w = load_block<T>(row, b);
    // Q4_1 quants are unsigned (0..15) and go straight into maddubs; the others carry a sign.
    const __m256i wa = T == DType::Q4_1 ? w.q : _mm256_sign_epi8(w.q, w.q);
    for (int j = 0; j < 4; j++) {
      const BlockQ8Act& xb = x[j * stride + b];
      __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
      if (T != DType::Q4_1) y = _mm256_sign_epi8(y, w.q);
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(w.d * xb.d), dot_us8(wa, y), acc[j]);
      if (T == DType::Q4_1) offsets[j] += w.m * xb.s;
    }
  }
  for (int j = 0; j < 4; j++) out[j] = hsum(acc[j]) + offsets[j];
}

void quantize_act_avx2(const float* x, BlockQ8Act* out, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < n / kQK; b++, x += kQK) {
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id));  // round half to even
    const __m256i lo = _mm256_add_epi32(q[0], q[1]);
    out[b].sum_lo = hsum_epi32(lo);
    out[b].sum = out[b].sum_lo + hsum_epi32(_mm256_add_epi32(q[2], q[3]));
    // Pack 32 int32 to 32 int8 in order: packs work per 128-bit lane, so fix the order after.
    const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
    __m256i p = _mm256_packs_epi16(p01, p23);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs), p);
    out[b].d = round_half(d);
    out[b].s = round_half(d * (float)out[b].sum);
  }
}

// Q6_K: each half's quants come from avx2::unpack_q6_k_half; maddubs takes |q|
// and x with q's sign, and one madd weights each half-of-16's pair sums by its 8-bit scale.
float dot_q6_k(const void* row, const BlockQ8Act* x, int64_t n) {
  const auto* w = static_cast<const BlockQ6_K*>(row);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; i++) {
    const float d = half(w[i].d);
    for (int h = 0; h < 2; h++) {
      __m256i q[4];
      avx2::unpack_q6_k_half(w[i], h, q);
      const int8_t* sc = w[i].scales + 8 * h;
      for (int k = 0; k < 4; k++) {
        const BlockQ8Act& xb = x[i * 8 + h * 4 + k];
        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
        const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q[k], q[k]), _mm256_sign_epi8(y, q[k]));
        const __m256i scales = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
        const __m256i p32 = _mm256_madd_epi16(p16, scales);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), _mm256_cvtepi32_ps(p32), acc);
      }
    }
  }
  return hsum(acc);
}

}  // namespace

void fill_quant_dot_avx2(CpuKernels& k) {
  k.quantize_act = quantize_act_avx2;
  k.act8.quant_dot.set(DType::Q4_0, dot_signed<DType::Q4_0>);
  k.act8.quant_dot.set(DType::Q4_1, dot_q4_1);
  k.act8.quant_dot.set(DType::Q8_0, dot_signed<DType::Q8_0>);
  k.act8.quant_dot.set(DType::Q6_K, dot_q6_k);
  k.act8.quant_dot.set(DType::MXFP4, dot_signed<DType::MXFP4>);
  k.act8.quant_dot4.set(DType::Q4_0, dot4<DType::Q4_0>);
  k.act8.quant_dot4.set(DType::Q4_1, dot4<DType::Q4_1>);
  k.act8.quant_dot4.set(DType::Q8_0, dot4<DType::Q8_0>);
  k.act8.quant_dot4.set(DType::MXFP4, dot4<DType::MXFP4>);
}

}  // namespace tandem::cpu

#else

namespace tandem::cpu {
void fill_quant_dot_avx2(CpuKernels&) {}
}  // namespace tandem::cpu

#endif
