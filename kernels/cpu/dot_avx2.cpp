// AVX2 + FMA + F16C dot kernels. This file is compiled with those flags and called only after
// run-time detection, so it must not define or use shared inline helpers (the linker could pick
// this AVX2 copy for scalar callers): only intrinsics, static helpers (avx2_helpers.h),
// file-local functions and external calls.
#include <cstdint>

#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quant_blocks.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "kernels/cpu/avx2_helpers.h"
#include "kernels/cpu/unroll.h"

namespace tandem::cpu {
namespace {

using avx2::half;
using avx2::hsum;

// 8 unsigned bytes -> 8 floats.
inline __m256 u8x8_to_ps(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }
inline __m256 i8x8_to_ps(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }

float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

float dot_f32_row(const void* row, const float* x, int64_t n) { return dot_f32(static_cast<const float*>(row), x, n); }

float dot_f16_row(const void* row, const float* x, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(row);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
    const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i + 8)));
    acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), acc1);
  }
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; i++) s += half(h[i]) * x[i];
  return s;
}

float dot_bf16_row(const void* row, const float* x, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(row);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))), 16);
    acc = _mm256_fmadd_ps(_mm256_castsi256_ps(w), _mm256_loadu_ps(x + i), acc);
  }
  float s = hsum(acc);
  for (; i < n; i++) {
    const __m128i w = _mm_slli_epi32(_mm_cvtsi32_si128(h[i]), 16);
    s += _mm_cvtss_f32(_mm_castsi128_ps(w)) * x[i];
  }
  return s;
}

// A Q8_0 row against NT tokens (up to eight): each block's weights are widened once for all
// of them, and every token's sum takes the same steps in the same order, so decode's one-token
// dot (NT = 1) and a verify pass's logits are the same floats bit for bit.
template <int NT>
void q8_0_tokens(const BlockQ8_0* b, const float* x, int64_t x_stride, int64_t n, float* out, int64_t out_stride) {
  __m256 acc[NT];
  for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK; i++) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs + 16));
    const __m256 w0 = i8x8_to_ps(lo), w1 = i8x8_to_ps(_mm_srli_si128(lo, 8));
    const __m256 w2 = i8x8_to_ps(hi), w3 = i8x8_to_ps(_mm_srli_si128(hi, 8));
    const __m256 d = _mm256_set1_ps(half(b[i].d));
    for (int t = 0; t < NT; t++) {
      const float* xt = x + t * x_stride + i * kQK;
      __m256 s = _mm256_mul_ps(w0, _mm256_loadu_ps(xt));
      s = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), s);
      s = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xt + 16), s);
      s = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xt + 24), s);
      acc[t] = _mm256_fmadd_ps(d, s, acc[t]);
    }
  }
  for (int t = 0; t < NT; t++) out[t * out_stride] = hsum(acc[t]);
}

float dot_q8_0_row(const void* row, const float* x, int64_t n) {
  float out;
  q8_0_tokens<1>(static_cast<const BlockQ8_0*>(row), x, 0, n, &out, 0);
  return out;
}

void dot_q8_0_tokens(const void* row, const float* x, int64_t x_stride, int n_tokens, int64_t n, float* out,
                     int64_t out_stride) {
  constexpr int kTokens = 8;  // 8 accumulators, 4 weight vectors, the scale and a sum: 14 registers
  const auto* b = static_cast<const BlockQ8_0*>(row);
  for (int t = 0; t < n_tokens; t += kTokens)
    with_count<kTokens>(n_tokens - t < kTokens ? n_tokens - t : kTokens, [&](auto nt) {
      q8_0_tokens<decltype(nt)::value>(b, x + t * x_stride, x_stride, n, out + t * out_stride, out_stride);
    });
}

// Sum over one 32-element block of 4-bit codes (low nibbles = elements 0..15) times x, each
// code's 16 bytes (low nibbles, then high) widened to floats by widen(8 bytes); and the
// block's sum of x (needed by the Q4_1 offset term). decode(16 nibbles) maps the codes to
// bytes first (MXFP4: their values).
template <typename Decode, typename Widen>
inline __m256 nibble_block_dot(const uint8_t* qs, const float* x, Decode decode, Widen widen, __m256* xsum) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = decode(_mm_and_si128(q, mask));
  const __m128i hi = decode(_mm_and_si128(_mm_srli_epi16(q, 4), mask));
  const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
  const __m256 x2 = _mm256_loadu_ps(x + 16), x3 = _mm256_loadu_ps(x + 24);
  __m256 s = _mm256_mul_ps(widen(lo), x0);
  s = _mm256_fmadd_ps(widen(_mm_srli_si128(lo, 8)), x1, s);
  s = _mm256_fmadd_ps(widen(hi), x2, s);
  s = _mm256_fmadd_ps(widen(_mm_srli_si128(hi, 8)), x3, s);
  if (xsum) *xsum = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
  return s;
}

// Q4_0/Q4_1's codes are their values (Q4_0 less 8: bias).
inline __m256 nibble_block_dot(const uint8_t* qs, const float* x, __m256 bias, __m256* xsum) {
  return nibble_block_dot(
      qs, x, [](__m128i c) { return c; }, [&](__m128i b) { return _mm256_add_ps(u8x8_to_ps(b), bias); }, xsum);
}

float dot_q4_0_row(const void* row, const float* x, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(row);
  const __m256 minus8 = _mm256_set1_ps(-8.0f);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK; i++, x += kQK)
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(b[i].d)), nibble_block_dot(b[i].qs, x, minus8, nullptr), acc);
  return hsum(acc);
}

float dot_q4_1_row(const void* row, const float* x, int64_t n) {
  const auto* b = static_cast<const BlockQ4_1*>(row);
  const __m256 zero = _mm256_setzero_ps();
  __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK; i++, x += kQK) {
    __m256 xs;
    const __m256 s = nibble_block_dot(b[i].qs, x, zero, &xs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(b[i].d)), s, acc);
    accm = _mm256_fmadd_ps(_mm256_set1_ps(half(b[i].m)), xs, accm);
  }
  return hsum(_mm256_add_ps(acc, accm));
}

// MXFP4: each code's int8 value (a byte shuffle), times the block's power-of-two scale.
float dot_mxfp4_row(const void* row, const float* x, int64_t n) {
  const auto* b = static_cast<const BlockMxfp4*>(row);
  const __m128i values = _mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Values));
  auto decode = [&](__m128i codes) { return _mm_shuffle_epi8(values, codes); };
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK; i++, x += kQK)
    acc = _mm256_fmadd_ps(_mm256_set1_ps(mxfp4_scale(b[i].e)), nibble_block_dot(b[i].qs, x, decode, i8x8_to_ps, nullptr),
                          acc);
  return hsum(acc);
}

// Q6_K fused: the 6-bit quants of each 128-element half are rebuilt (avx2::unpack_q6_k_half)
// 32 at a time, and each 16 share one 8-bit scale. No decode buffer: the
// tied output matrix of Llama-3-style models is Q6_K, and decode reads all of it every token.
float dot_q6_k_row(const void* row, const float* x, int64_t n) {
  const auto* b = static_cast<const BlockQ6_K*>(row);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; i++) {
    const float d = half(b[i].d);
    for (int h = 0; h < 2; h++, x += 128) {
      const int8_t* sc = b[i].scales + 8 * h;
      __m256i q[4];
      avx2::unpack_q6_k_half(b[i], h, q);
      for (int g = 0; g < 4; g++) {  // elements 32g .. 32g + 31 of this half
        const __m128i lo = _mm256_castsi256_si128(q[g]), up = _mm256_extracti128_si256(q[g], 1);
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), up, _mm_srli_si128(up, 8)};
        for (int k = 0; k < 4; k++) {
          const __m256 scale = _mm256_set1_ps(d * sc[2 * g + k / 2]);
          const __m256 w = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])));
          acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 32 * g + 8 * k), acc);
        }
      }
    }
  }
  return hsum(acc);
}

// Q4_K, Q5_K and the Q5 legacy types (the exact path only: 8-bit products use the packed
// kernels): decode up to 256 elements with the reference dequantizer, then an AVX2 dot.
template <DType T>
float dot_decoded_row(const void* row, const float* x, int64_t n) {
  constexpr bool kSuper = T == DType::Q4_K || T == DType::Q5_K;
  constexpr int64_t kElems = kSuper ? kQK_K : kQK;
  constexpr int64_t kBytes = T == DType::Q4_K ? sizeof(BlockQ4_K)
                             : T == DType::Q5_K ? sizeof(BlockQ5_K)
                             : T == DType::Q5_0 ? sizeof(BlockQ5_0)
                                                : sizeof(BlockQ5_1);
  alignas(32) float buf[kQK_K];
  const auto* src = static_cast<const uint8_t*>(row);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += kQK_K) {
    const int64_t len = n - i < kQK_K ? n - i : kQK_K;  // a multiple of the block (32 or 256)
    dequantize_row(T, src + i / kElems * kBytes, buf, len);
    for (int j = 0; j < len; j += 8) acc = _mm256_fmadd_ps(_mm256_load_ps(buf + j), _mm256_loadu_ps(x + i + j), acc);
  }
  return hsum(acc);
}

void axpy_f32(float a, const void* xv, float* y, int64_t n) {
  const auto* x = static_cast<const float*>(xv);
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] += a * x[i];
}

void axpy_f16(float a, const void* xv, float* y, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(xv);
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, xf, _mm256_loadu_ps(y + i)));
  }
  for (; i < n; i++) y[i] += a * half(x[i]);
}

// n a multiple of 32; each element d * q exactly, then the F32 kernel's FMA: the same floats
// as axpy_f32 over the dequantized row.
void axpy_q8_0(float a, const void* xv, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(xv);
  const __m256 va = _mm256_set1_ps(a);
  for (int64_t i = 0; i < n / kQK; i++, y += kQK) {
    const __m256 d = _mm256_set1_ps(half(b[i].d));
    for (int k = 0; k < 4; k++) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[i].qs + 8 * k));
      const __m256 xf = _mm256_mul_ps(i8x8_to_ps(q), d);
      _mm256_storeu_ps(y + 8 * k, _mm256_fmadd_ps(va, xf, _mm256_loadu_ps(y + 8 * k)));
    }
  }
}

// round(r) with halves away from zero (roundf), exactly: truncate, then step away from zero
// where the remainder r - trunc(r) (exact in float) is at least 1/2. A NaN gives 0; the result
// saturates at +-127 (infinities). The scalar twin's std::round and clamp, lane by lane.
inline __m256i round_q8_lanes(__m256 r) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 t = _mm256_round_ps(r, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 rem = _mm256_andnot_ps(sign, _mm256_sub_ps(r, t));
  const __m256 away = _mm256_or_ps(_mm256_and_ps(r, sign), _mm256_set1_ps(1.0f));  // copysign(1, r)
  __m256 q = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(rem, _mm256_set1_ps(0.5f), _CMP_GE_OQ), away));
  q = _mm256_and_ps(q, _mm256_cmp_ps(r, r, _CMP_ORD_Q));
  q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
  return _mm256_cvttps_epi32(q);
}

void quantize_q8_0_avx2(const float* x, void* out, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(out);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < n / kQK; i++, x += kQK) {
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      mx = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), mx);  // a NaN lane keeps mx (the second operand)
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d = _mm_cvtss_f32(m4) / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    b[i].d = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = round_q8_lanes(_mm256_mul_ps(v[k], id));
    // 32 int32 to 32 int8 in order: the packs work per 128-bit lane, so fix the order after.
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs), p);
  }
}

void f32_to_f16_avx2(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  if (i < n) f32_to_f16_scalar(x + i, out + i, n - i);
}

void f32_tile_avx2(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t n, float* out) {
  // 8 accumulators, 2 row vectors and 1 token vector: 11 of the 16 ymm registers.
  __m256 acc[2][4];
  for (auto& row : acc)
    for (auto& v : row) v = _mm256_setzero_ps();
  const float* a1 = a + a_stride;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 r0 = _mm256_loadu_ps(a + i), r1 = _mm256_loadu_ps(a1 + i);
    for (int t = 0; t < 4; t++) {
      const __m256 x = _mm256_loadu_ps(b + t * b_stride + i);
      acc[0][t] = _mm256_fmadd_ps(r0, x, acc[0][t]);
      acc[1][t] = _mm256_fmadd_ps(r1, x, acc[1][t]);
    }
  }
  for (int t = 0; t < 4; t++)
    for (int r = 0; r < 2; r++) {
      float s = hsum(acc[r][t]);
      for (int64_t k = i; k < n; k++) s += a[r * a_stride + k] * b[t * b_stride + k];
      out[t * 2 + r] = s;
    }
}

}  // namespace

void fill_dot_avx2(CpuKernels& k) {
  k.dot_f32 = dot_f32;
  k.tile_f32 = f32_tile_avx2;
  k.f32_to_f16 = f32_to_f16_avx2;
  k.quantize_q8_0 = quantize_q8_0_avx2;
  k.row_dot.set(DType::F32, dot_f32_row);
  k.row_dot.set(DType::F16, dot_f16_row);
  k.row_dot.set(DType::BF16, dot_bf16_row);
  k.row_dot.set(DType::Q4_0, dot_q4_0_row);
  k.row_dot.set(DType::Q4_1, dot_q4_1_row);
  k.row_dot.set(DType::Q8_0, dot_q8_0_row);
  k.row_dot.set(DType::Q5_0, dot_decoded_row<DType::Q5_0>);
  k.row_dot.set(DType::Q5_1, dot_decoded_row<DType::Q5_1>);
  k.row_dot.set(DType::Q4_K, dot_decoded_row<DType::Q4_K>);
  k.row_dot.set(DType::Q5_K, dot_decoded_row<DType::Q5_K>);
  k.row_dot.set(DType::Q6_K, dot_q6_k_row);
  k.row_dot.set(DType::MXFP4, dot_mxfp4_row);
  k.row_dot_tokens.set(DType::Q8_0, dot_q8_0_tokens);
  k.axpy.set(DType::F32, axpy_f32);
  k.axpy.set(DType::F16, axpy_f16);
  k.axpy.set(DType::Q8_0, axpy_q8_0);
}

}  // namespace tandem::cpu

#else  // no AVX2 build: the level is never asked for

namespace tandem::cpu {
void fill_dot_avx2(CpuKernels&) {}
}  // namespace tandem::cpu

#endif
