// Small AVX2 helpers for the AVX2 kernel files only (each includes this after checking
// __AVX2__). Everything is static: every file gets its own copy compiled for AVX2, so the
// linker can never hand an AVX2 body to a scalar caller.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace tandem::cpu::avx2 {

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline float half(uint16_t h) { return _cvtsh_ss(h); }

}  // namespace tandem::cpu::avx2
