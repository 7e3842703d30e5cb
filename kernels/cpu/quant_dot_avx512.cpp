// AVX-512 VNNI kernels for 8-bit activations (compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni). One 512-bit VPDPBUSD multiplies two 32-element blocks of unsigned weight
// bytes by signed activation bytes and adds each group of four products into an int32 lane:
// 64 multiply-adds in one instruction where AVX2 needs maddubs + madd for 32.
//
// VPDPBUSD wants unsigned x signed, so signed weights are shifted: Q4_0's q - 8 uses q in 0..15
// and subtracts 8 x sum(x); Q8_0's w uses w + 128 and subtracts 128 x sum(x). The sums of x come
// from one more VPDPBUSD against a vector of 8s or 128s. All of it is exact integer arithmetic.
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_dot.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>

namespace tandem::cpu {

namespace {

inline float half(uint16_t h) { return _cvtsh_ss(h); }

// 32 nibbles of a Q4 block as 32 bytes in element order (low nibbles first).
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

template <DType T>
struct Weights;  // the unsigned bytes, scale, and (Q4_1) offset of one block

template <>
struct Weights<DType::Q4_0> {
  static __m256i q(const void* row, int64_t b) { return unpack_nibbles(static_cast<const BlockQ4_0*>(row)[b].qs); }
  static float d(const void* row, int64_t b) { return half(static_cast<const BlockQ4_0*>(row)[b].d); }
  static constexpr int kShift = 8;  // stored q = w + 8
};
template <>
struct Weights<DType::Q4_1> {
  static __m256i q(const void* row, int64_t b) { return unpack_nibbles(static_cast<const BlockQ4_1*>(row)[b].qs); }
  static float d(const void* row, int64_t b) { return half(static_cast<const BlockQ4_1*>(row)[b].d); }
  static float m(const void* row, int64_t b) { return half(static_cast<const BlockQ4_1*>(row)[b].m); }
  static constexpr int kShift = 0;
};
template <>
struct Weights<DType::Q8_0> {
  static __m256i q(const void* row, int64_t b) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const BlockQ8_0*>(row)[b].qs));
    return _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));  // w + 128 as an unsigned byte
  }
  static float d(const void* row, int64_t b) { return half(static_cast<const BlockQ8_0*>(row)[b].d); }
  static constexpr int kShift = 128;
};

inline __m512i pair(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// The AVX2 kernels' horizontal sum, in the same order, so both levels give identical floats.
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Each int32 lane holds the sum of four consecutive products, exactly as AVX2's maddubs + madd
// pairs give, and blocks are scaled and accumulated one after the other in the same 8-lane
// order: prefill (this kernel) and decode (the AVX2 single-token dot) compute the same floats,
// so a cached sequence equals its recomputation bit for bit.
template <DType T>
void dot4(const void* row, const BlockQ8Act* x, int64_t stride, int64_t n, float* out) {
  using W = Weights<T>;
  const int64_t nb = n / kQK;
  const __m512i shift = _mm512_set1_epi8((char)W::kShift);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  float offsets[4] = {0, 0, 0, 0};
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {  // two blocks per 512-bit VPDPBUSD
    const __m512i wq = pair(W::q(row, b), W::q(row, b + 1));
    const float d0 = W::d(row, b), d1 = W::d(row, b + 1);
    for (int j = 0; j < 4; j++) {
      const BlockQ8Act* xb = x + j * stride + b;
      const __m512i xq = pair(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[0].qs)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[1].qs)));
      __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xq);
      if constexpr (W::kShift != 0) p = _mm512_sub_epi32(p, _mm512_dpbusd_epi32(_mm512_setzero_si512(), shift, xq));
      const __m512 pf = _mm512_cvtepi32_ps(p);
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * xb[0].d), _mm512_castps512_ps256(pf), acc[j]);
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * xb[1].d), _mm512_extractf32x8_ps(pf, 1), acc[j]);
      if constexpr (T == DType::Q4_1) {
        offsets[j] += W::m(row, b) * xb[0].s;
        offsets[j] += W::m(row, b + 1) * xb[1].s;
      }
    }
  }
  for (; b < nb; b++) {  // an odd last block, at 256 bits
    const __m256i wq = W::q(row, b);
    const float d0 = W::d(row, b);
    for (int j = 0; j < 4; j++) {
      const BlockQ8Act& xb = x[j * stride + b];
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
      __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wq, xq);
      if constexpr (W::kShift != 0)
        p = _mm256_sub_epi32(p, _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm512_castsi512_si256(shift), xq));
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * xb.d), _mm256_cvtepi32_ps(p), acc[j]);
      if constexpr (T == DType::Q4_1) offsets[j] += W::m(row, b) * xb.s;
    }
  }
  for (int j = 0; j < 4; j++) out[j] = hsum(acc[j]) + offsets[j];
}

}  // namespace

QuantDot4Fn quant_dot4_kernel_avx512(DType t) {
  switch (t) {
    case DType::Q4_0: return dot4<DType::Q4_0>;
    case DType::Q4_1: return dot4<DType::Q4_1>;
    case DType::Q8_0: return dot4<DType::Q8_0>;
    default: return nullptr;
  }
}

}  // namespace tandem::cpu

#else  // no AVX-512 VNNI build: the dispatcher falls back to AVX2

namespace tandem::cpu {
QuantDot4Fn quant_dot4_kernel_avx512(DType) { return nullptr; }
}  // namespace tandem::cpu

#endif
