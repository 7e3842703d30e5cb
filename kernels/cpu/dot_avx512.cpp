// AVX-512 float kernels (compiled with -mavx512f): the prefill register tile at 16 lanes.
#include "kernels/cpu/dot.h"

#if defined(__AVX512F__)
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* placeholders.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace tandem::cpu {

void f32_tile_avx512(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t n, float* out) {
  __m512 acc[2][4];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
  const float* a1 = a + a_stride;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 r0 = _mm512_loadu_ps(a + i), r1 = _mm512_loadu_ps(a1 + i);
    for (int t = 0; t < 4; t++) {
      const __m512 x = _mm512_loadu_ps(b + t * b_stride + i);
      acc[0][t] = _mm512_fmadd_ps(r0, x, acc[0][t]);
      acc[1][t] = _mm512_fmadd_ps(r1, x, acc[1][t]);
    }
  }
  for (int t = 0; t < 4; t++)
    for (int r = 0; r < 2; r++) {
      float s = _mm512_reduce_add_ps(acc[r][t]);
      for (int64_t k = i; k < n; k++) s += a[r * a_stride + k] * b[t * b_stride + k];
      out[t * 2 + r] = s;
    }
}

}  // namespace tandem::cpu

#else  // no AVX-512 build: the dispatcher never selects this

namespace tandem::cpu {
void f32_tile_avx512(const float* a, int64_t as, const float* b, int64_t bs, int64_t n, float* out) {
  f32_tile_scalar(a, as, b, bs, n, out);
}
}  // namespace tandem::cpu

#endif
