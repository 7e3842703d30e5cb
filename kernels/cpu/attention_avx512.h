// Pieces the AVX-512 attention kernels share (attention_avx512.cpp: a few heads, key by key;
// attention_wide_avx512.cpp: many heads by outer products): the softmax, a cache row's
// elements as floats, and the value pass. Include only from files compiled for AVX-512.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "kernels/cpu/exp_avx512.h"
#include "kernels/cpu/quant_blocks.h"

namespace tandem::cpu::avx512 {

// In-place softmax of s[0, n); stat (if set) gets the max and the sum of exps.
inline void softmax16(float* s, int64_t n, float* stat) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  int64_t t = 0;
  for (; t + 16 <= n; t += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + t));
  const __mmask16 tail = (__mmask16)((1u << (n - t)) - 1);
  if (t < n) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail, s + t));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (t = 0; t + 16 <= n; t += 16) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + t), m));
    _mm512_storeu_ps(s + t, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (t < n) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + t), m));
    _mm512_mask_storeu_ps(s + t, tail, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(tail, e));
  }
  const float total = _mm512_reduce_add_ps(sum);
  if (stat) stat[0] = _mm512_cvtss_f32(m), stat[1] = total;
  const __m512 inv = _mm512_set1_ps(1.0f / total);
  for (t = 0; t + 16 <= n; t += 16) _mm512_storeu_ps(s + t, _mm512_mul_ps(_mm512_loadu_ps(s + t), inv));
  if (t < n) _mm512_mask_storeu_ps(s + t, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, s + t), inv));
}

// Elements [16v, 16v + 16) of one head's K or V row, as floats. A Q8_0 row is blocks of 32
// (fp16 scale d, then 32 int8 q): the int8 widen and meet their block's d, and d * q is exact
// in float, so the kernel sees exactly the dequantized values (an F32 cache of them gives the
// same floats).
template <DType T>
inline __m512 load16(const uint8_t* row, int v) {
  if constexpr (T == DType::F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row) + v));
  } else if constexpr (T == DType::Q8_0) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + v / 2;
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + 16 * (v % 2)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(_cvtsh_ss(b->d)));
  } else {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + 16 * v);
  }
}

// out[h] = sum over keys t of scores[h][t] * V row t, for HC heads of NV vectors: each
// output element one FMA chain over the keys in order (so how heads group never changes it).
template <DType T, int NV, int HC>
void value_pass(const uint8_t* const* v_rows, int64_t n_keys, const float* scores, int64_t scores_stride, float* out) {
  constexpr int D = 16 * NV;
  if constexpr (NV > 8) {
    // Wide heads: VC output vectors of each head per pass over a block of value rows, the
    // running sums parked in `out` between blocks (stored and reloaded exactly, so each
    // element is still one FMA chain over the keys in order). A block's rows stay in L1 for
    // the passes (32 rows of 256 F32 elements: 32 KiB).
    constexpr int VC = 8;
    static_assert(NV % VC == 0);
    constexpr int64_t kValueBlock = 32;
    for (int64_t b0 = 0; b0 < n_keys; b0 += kValueBlock) {
      const int64_t b1 = std::min(n_keys, b0 + kValueBlock);
      for (int v0 = 0; v0 < NV; v0 += VC) {
        __m512 o[HC][VC];
        for (int h = 0; h < HC; h++)
          for (int v = 0; v < VC; v++)
            o[h][v] = b0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(out + h * D + 16 * (v0 + v));
        for (int64_t t = b0; t < b1; t++) {
          __m512 x[VC];
          for (int v = 0; v < VC; v++) x[v] = load16<T>(v_rows[t], v0 + v);
          for (int h = 0; h < HC; h++) {
            const __m512 p = _mm512_set1_ps(scores[h * scores_stride + t]);
            for (int v = 0; v < VC; v++) o[h][v] = _mm512_fmadd_ps(p, x[v], o[h][v]);
          }
        }
        for (int h = 0; h < HC; h++)
          for (int v = 0; v < VC; v++) _mm512_storeu_ps(out + h * D + 16 * (v0 + v), o[h][v]);
      }
    }
    return;
  }
  __m512 o[HC][NV];
  for (int h = 0; h < HC; h++)
    for (int v = 0; v < NV; v++) o[h][v] = _mm512_setzero_ps();
  for (int64_t t = 0; t < n_keys; t++) {
    __m512 x[NV];
    for (int v = 0; v < NV; v++) x[v] = load16<T>(v_rows[t], v);
    for (int h = 0; h < HC; h++) {
      const __m512 p = _mm512_set1_ps(scores[h * scores_stride + t]);
      for (int v = 0; v < NV; v++) o[h][v] = _mm512_fmadd_ps(p, x[v], o[h][v]);
    }
  }
  for (int h = 0; h < HC; h++)
    for (int v = 0; v < NV; v++) _mm512_storeu_ps(out + h * D + 16 * v, o[h][v]);
}

}  // namespace tandem::cpu::avx512

#endif
