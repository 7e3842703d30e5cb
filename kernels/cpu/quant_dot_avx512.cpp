// AVX-512 VNNI kernels for 8-bit activations (compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni). One 512-bit VPDPBUSD multiplies two 32-element blocks of unsigned weight
// bytes by signed activation bytes and adds each group of four products into an int32 lane:
// 64 multiply-adds in one instruction where AVX2 needs maddubs + madd for 32.
//
// VPDPBUSD wants unsigned x signed, so signed weights are shifted: Q4_0's q - 8 uses q in 0..15
// and subtracts 8 x sum(x); Q8_0's w uses w + 128 and subtracts 128 x sum(x). The sums of x come
// from one more VPDPBUSD against a vector of ones. All of it is exact integer arithmetic, so the
// result equals the scalar twin's up to float summation order.
#include <immintrin.h>

#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_dot.h"

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
inline __m512 scales(float lo, float hi) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(lo)), _mm256_set1_ps(hi), 1);
}

template <DType T>
void dot4(const void* row, const BlockQ8Act* x, int64_t stride, int64_t n, float* out) {
  using W = Weights<T>;
  const int64_t nb = n / kQK;
  const __m512i shift = _mm512_set1_epi8((char)W::kShift);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  float offsets[4] = {0, 0, 0, 0};
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {  // two blocks per 512-bit step
    const __m512i wq = pair(W::q(row, b), W::q(row, b + 1));
    const float d0 = W::d(row, b), d1 = W::d(row, b + 1);
    for (int j = 0; j < 4; j++) {
      const BlockQ8Act* xb = x + j * stride + b;
      const __m512i xq = pair(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[0].qs)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[1].qs)));
      __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xq);
      if constexpr (W::kShift != 0) p = _mm512_sub_epi32(p, _mm512_dpbusd_epi32(_mm512_setzero_si512(), shift, xq));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scales(d0 * xb[0].d, d1 * xb[1].d), acc[j]);
      if constexpr (T == DType::Q4_1) offsets[j] += W::m(row, b) * xb[0].s + W::m(row, b + 1) * xb[1].s;
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
      const __m256 part = _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d0 * xb.d));
      acc[j] = _mm512_add_ps(acc[j], _mm512_insertf32x8(_mm512_setzero_ps(), part, 0));
      if constexpr (T == DType::Q4_1) offsets[j] += W::m(row, b) * xb.s;
    }
  }
  for (int j = 0; j < 4; j++) out[j] = _mm512_reduce_add_ps(acc[j]) + offsets[j];
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
