// Small AVX2 helpers for the AVX2 kernel files only (each includes this after checking
// __AVX2__). Everything is static: every file gets its own copy compiled for AVX2, so the
// linker can never hand an AVX2 body to a scalar caller.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/quant_blocks.h"

namespace tandem::cpu::avx2 {

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline float half(uint16_t h) { return _cvtsh_ss(h); }

// Lanes [0, n) set (n clamped to 0..8 by the compare): the masks of partial-vector loads and stores.
static inline __m256i tail_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Rows [8h, 8h + 8) of a 16-row packed group's outputs, limited to valid_rows.
static inline void store_half(float* out, int h, __m256 v, int valid_rows) {
  const int n = valid_rows - 8 * h;
  if (n >= 8) return _mm256_storeu_ps(out + 8 * h, v);
  if (n > 0) _mm256_maskstore_ps(out + 8 * h, tail_mask(n), v);
}

// The signed 6-bit quants (-32 .. 31) of one 128-element half h of a Q6_K super-block, 32 per
// vector in element order: q[g] holds elements 128h + 32g .. 128h + 32g + 31, each rebuilt from
// ql (low 4 bits) and qh (high 2 bits). Their scales: scales[8h + 2g] for the first 16 of q[g],
// scales[8h + 2g + 1] for the rest.
static inline void unpack_q6_k_half(const BlockQ6_K& b, int h, __m256i q[4]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03), k32 = _mm256_set1_epi8(32);
  const uint8_t* ql = b.ql + 64 * h;
  const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
  const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
  const __m256i lo[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                         _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
  const __m256i hi[4] = {qh, _mm256_srli_epi16(qh, 2), _mm256_srli_epi16(qh, 4), _mm256_srli_epi16(qh, 6)};
  for (int g = 0; g < 4; g++)
    q[g] = _mm256_sub_epi8(_mm256_or_si256(lo[g], _mm256_slli_epi16(_mm256_and_si256(hi[g], m2), 4)), k32);
}

}  // namespace tandem::cpu::avx2
