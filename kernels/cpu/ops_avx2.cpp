// AVX2 element-wise kernels (ops.h). Compiled with -mavx2 -mfma; chosen only
// when best_isa() is Avx2.
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/ops.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "kernels/cpu/exp_avx2.h"

namespace tandem::cpu {

namespace {

// g * sigmoid(z), with e = exp(-|z|) <= 1 so the exp never overflows:
// sigmoid(z) = 1 / (1 + e) for z >= 0 and e / (1 + e) for z < 0.
inline __m256 times_sigmoid8(__m256 g, __m256 z) {
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  const __m256 e = avx2::exp_nonpositive(_mm256_or_ps(z, sign));  // -|z|
  const __m256 neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 num = _mm256_blendv_ps(one, e, neg);
  return _mm256_mul_ps(g, _mm256_div_ps(num, _mm256_add_ps(one, e)));
}

// silu(g) = g * sigmoid(g); GELU's tanh form 0.5 g (1 + tanh(u)) = g * sigmoid(2u), with
// u = sqrt(2 / pi) (g + 0.044715 g^3).
template <bool Gelu>
inline __m256 act8(__m256 g) {
  if constexpr (!Gelu) return times_sigmoid8(g, g);
  const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
  const __m256 u = _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g);
  return times_sigmoid8(g, _mm256_mul_ps(_mm256_set1_ps(2.0f * kSqrt2OverPi), u));
}

template <bool Gelu>
void act_mul_avx2(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(act8<Gelu>(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
  if (i < n) {  // the tail through a buffer: AVX2 has no masked float load/store
                // of any width
    float g[8] = {}, u[8] = {};
    for (int64_t j = i; j < n; j++) g[j - i] = gate[j], u[j - i] = up[j];
    _mm256_storeu_ps(g, _mm256_mul_ps(act8<Gelu>(_mm256_loadu_ps(g)), _mm256_loadu_ps(u)));
    for (int64_t j = i; j < n; j++) gate[j] = g[j - i];
  }
}

}  // namespace

void fill_ops_avx2(CpuKernels& k) {
  k.silu_mul = act_mul_avx2<false>;
  k.gelu_tanh_mul = act_mul_avx2<true>;
}

}  // namespace tandem::cpu

#else

namespace tandem::cpu {
void fill_ops_avx2(CpuKernels&) {}
}  // namespace tandem::cpu

#endif
