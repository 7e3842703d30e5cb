// AVX-512 VNNI kernels for 8-bit activations (compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni -mavx512dq). One 512-bit VPDPBUSD multiplies two 32-element blocks of unsigned
// weight bytes by signed activation bytes and adds each group of four products into an int32
// lane: 64 multiply-adds in one instruction where AVX2 needs maddubs + madd for 32.
//
// VPDPBUSD wants unsigned x signed, so signed weights are shifted: Q4_0's q - 8 uses q in 0..15
// and subtracts 8 x sum(x); Q8_0's w uses w + 128 and subtracts 128 x sum(x). That correction
// depends on the token only, so a tile computes it once per token and starts every row's
// VPDPBUSD from it. All of it is exact integer arithmetic.
//
// One template body computes a tile of R weight rows x J tokens. Block pair (b, b + 1) fills a
// 16-lane float accumulator, block b in lanes 0-7 and b + 1 in lanes 8-15, each scaled by a
// vector of d_w x d_x: no scalar scale work per product. The single dot (R = J = 1, decode
// leftovers), the 4-row decode tile (J = 1) and the 4 x 4 prefill tile are the same arithmetic
// per (row, token), so a cached decode equals its recomputed prefill bit for bit.
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_dot.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512DQ__)
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* placeholders.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
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
  using Block = BlockQ4_0;
  static __m256i q(const Block& w) { return unpack_nibbles(w.qs); }
  static constexpr int kShift = 8;  // stored q = w + 8
};
template <>
struct Weights<DType::Q4_1> {
  using Block = BlockQ4_1;
  static __m256i q(const Block& w) { return unpack_nibbles(w.qs); }
  static constexpr int kShift = 0;
};
template <>
struct Weights<DType::Q8_0> {
  using Block = BlockQ8_0;
  static __m256i q(const Block& w) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs));
    return _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));  // w + 128 as an unsigned byte
  }
  static constexpr int kShift = 128;
};

inline __m512i pair(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
inline __m512 halves(float lo, float hi) { return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1); }
inline __m256i act(const BlockQ8Act& x) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs)); }

inline float hsum(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// out[j * out_stride + r] = row r . token j, rows row_bytes apart, tokens x_stride blocks apart.
// `second` is false only for an odd last block: its partner lanes then add exact zeros.
template <DType T, int R, int J>
void tile(const void* row0, size_t row_bytes, const BlockQ8Act* x, int64_t x_stride, int64_t n, float* out,
          int64_t out_stride) {
  using W = Weights<T>;
  using Block = typename W::Block;
  const int64_t nb = n / kQK;
  const Block* rows[R];
  for (int r = 0; r < R; r++) rows[r] = reinterpret_cast<const Block*>(static_cast<const uint8_t*>(row0) + r * row_bytes);
  const __m512i shift = _mm512_set1_epi8((char)W::kShift);
  __m512 acc[R][J];
  __m128 offs[R];  // Q4_1: sum over blocks of m_w x s_x, one lane per token
  for (int r = 0; r < R; r++) {
    offs[r] = _mm_setzero_ps();
    for (int j = 0; j < J; j++) acc[r][j] = _mm512_setzero_ps();
  }
  auto step = [&](int64_t b, bool second) {
    __m512i wq[R];
    __m512 dw[R];
    for (int r = 0; r < R; r++) {
      const Block& w0 = rows[r][b];
      if (second) {
        wq[r] = pair(W::q(w0), W::q(rows[r][b + 1]));
        dw[r] = halves(half(w0.d), half(rows[r][b + 1].d));
      } else {
        wq[r] = _mm512_zextsi256_si512(W::q(w0));
        dw[r] = halves(half(w0.d), 0.0f);
      }
    }
    for (int j = 0; j < J; j++) {
      const BlockQ8Act* xb = x + j * x_stride + b;
      const __m512i xq = second ? pair(act(xb[0]), act(xb[1])) : _mm512_zextsi256_si512(act(xb[0]));
      const __m512 dx = halves(xb[0].d, second ? xb[1].d : 0.0f);
      __m512i base = _mm512_setzero_si512();
      if constexpr (W::kShift != 0) base = _mm512_sub_epi32(base, _mm512_dpbusd_epi32(_mm512_setzero_si512(), shift, xq));
      for (int r = 0; r < R; r++) {
        const __m512i p = _mm512_dpbusd_epi32(base, wq[r], xq);
        acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw[r], dx), acc[r][j]);
      }
    }
    if constexpr (T == DType::Q4_1) {
      for (int64_t k = b; k < b + (second ? 2 : 1); k++) {
        auto s = [&](int j) { return j < J ? x[j * x_stride + k].s : 0.0f; };
        const __m128 sv = J == 1 ? _mm_set_ss(s(0)) : _mm_setr_ps(s(0), s(1), s(2), s(3));  // no store-to-load stall
        for (int r = 0; r < R; r++) offs[r] = _mm_fmadd_ps(_mm_set1_ps(half(rows[r][k].m)), sv, offs[r]);
      }
    }
  };
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) step(b, true);
  if (b < nb) step(b, false);
  for (int r = 0; r < R; r++) {
    float o[4];
    _mm_storeu_ps(o, offs[r]);
    for (int j = 0; j < J; j++) out[j * out_stride + r] = hsum(acc[r][j]) + o[j];
  }
}

template <DType T>
float dot(const void* row, const BlockQ8Act* x, int64_t n) {
  float out;
  tile<T, 1, 1>(row, 0, x, 0, n, &out, 1);
  return out;
}

template <DType T>
QuantKernels kernels() {
  return {dot<T>, tile<T, 4, 1>, tile<T, 4, 4>};
}

}  // namespace

QuantKernels quant_kernels_avx512(DType t) {
  switch (t) {
    case DType::Q4_0: return kernels<DType::Q4_0>();
    case DType::Q4_1: return kernels<DType::Q4_1>();
    case DType::Q8_0: return kernels<DType::Q8_0>();
    default: return {};
  }
}

}  // namespace tandem::cpu

#else  // no AVX-512 VNNI build: the dispatcher falls back to AVX2

namespace tandem::cpu {
QuantKernels quant_kernels_avx512(DType) { return {}; }
}  // namespace tandem::cpu

#endif
