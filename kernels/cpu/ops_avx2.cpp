// AVX2 element-wise kernels (ops.h). Compiled with -mavx2 -mfma; chosen only
// when best_isa() is Avx2.
#include "kernels/cpu/ops.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "kernels/cpu/exp_avx2.h"

namespace tandem::cpu {

namespace {

// silu(g) = g * sigmoid(g), with e = exp(-|g|) <= 1 so the exp never overflows:
// sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) for g < 0.
inline __m256 silu8(__m256 g) {
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  const __m256 e = avx2::exp_nonpositive(_mm256_or_ps(g, sign));  // -|g|
  const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 num = _mm256_blendv_ps(one, e, neg);
  return _mm256_mul_ps(g, _mm256_div_ps(num, _mm256_add_ps(one, e)));
}

void silu_mul_avx2(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
  if (i < n) {  // the tail through a buffer: AVX2 has no masked float load/store
                // of any width
    float g[8] = {}, u[8] = {};
    for (int64_t j = i; j < n; j++) g[j - i] = gate[j], u[j - i] = up[j];
    _mm256_storeu_ps(g, _mm256_mul_ps(silu8(_mm256_loadu_ps(g)), _mm256_loadu_ps(u)));
    for (int64_t j = i; j < n; j++) gate[j] = g[j - i];
  }
}

}  // namespace

SiluMulFn silu_mul_kernel_avx2() { return silu_mul_avx2; }

}  // namespace tandem::cpu

#else

namespace tandem::cpu {
SiluMulFn silu_mul_kernel_avx2() { return nullptr; }
}  // namespace tandem::cpu

#endif
