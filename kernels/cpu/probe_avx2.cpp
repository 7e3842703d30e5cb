// AVX2 bodies of the machine probes (compiled with -mavx2 -mfma).
#include <immintrin.h>

#include "kernels/cpu/probe.h"

namespace tandem::cpu::detail {

double fma_loop_avx2(long iters, float* sink) {
  // Ten independent chains cover the FMA latency (4-5 cycles) on two ports.
  __m256 a0 = _mm256_set1_ps(1.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0;
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iters; i++) {
    a0 = _mm256_fmadd_ps(a0, m, c);
    a1 = _mm256_fmadd_ps(a1, m, c);
    a2 = _mm256_fmadd_ps(a2, m, c);
    a3 = _mm256_fmadd_ps(a3, m, c);
    a4 = _mm256_fmadd_ps(a4, m, c);
    a5 = _mm256_fmadd_ps(a5, m, c);
    a6 = _mm256_fmadd_ps(a6, m, c);
    a7 = _mm256_fmadd_ps(a7, m, c);
    a8 = _mm256_fmadd_ps(a8, m, c);
    a9 = _mm256_fmadd_ps(a9, m, c);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(_mm256_add_ps(a6, a7), _mm256_add_ps(a8, a9))));
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  *sink = out[0] + out[7];
  return 2.0 * 8 * 10 * (double)iters;
}

float read_pass_avx2(const float* p, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_loadu_ps(p + i));
    s1 = _mm256_add_ps(s1, _mm256_loadu_ps(p + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_loadu_ps(p + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  float t = 0;
  for (float x : out) t += x;
  for (; i < n; i++) t += p[i];
  return t;
}

}  // namespace tandem::cpu::detail

namespace tandem::cpu::detail {

double int8_loop_avx2(long iters, float* sink) {
  // What the AVX2 quantized kernels run per 32 u8 x s8 products: VPMADDUBSW (pairs to int16),
  // VPMADDWD by ones (to int32), VPADDD; 2 ops per product, as GFLOP counts them.
  __m256i a[8];
  for (auto& x : a) x = _mm256_setzero_si256();
  const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  for (long i = 0; i < iters; i++)
    for (auto& x : a) x = _mm256_add_epi32(x, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones));
  __m256i t = a[0];
  for (int k = 1; k < 8; k++) t = _mm256_add_epi32(t, a[k]);
  alignas(32) uint32_t out[8];  // the lanes wrap; summed unsigned, as the hardware adds
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), t);
  *sink = (float)(out[0] + out[7]);
  return 2.0 * 32 * 8 * (double)iters;
}

}  // namespace tandem::cpu::detail
