// AVX-512 element-wise kernels (ops.h). Compiled with -mavx512f; chosen only when best_isa()
// is Avx512.
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/ops.h"

#if defined(__AVX512F__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/exp_avx512.h"

namespace tandem::cpu {

namespace {

// g * sigmoid(z), with e = exp(-|z|) <= 1 so the exp never overflows:
// sigmoid(z) = 1 / (1 + e) for z >= 0 and e / (1 + e) for z < 0.
inline __m512 times_sigmoid16(__m512 g, __m512 z) {
  const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(z)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __mmask16 neg = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 num = _mm512_mask_blend_ps(neg, one, e);
  return _mm512_mul_ps(g, _mm512_div_ps(num, _mm512_add_ps(one, e)));
}

// silu(g) = g * sigmoid(g); GELU's tanh form 0.5 g (1 + tanh(u)) = g * sigmoid(2u), with
// u = sqrt(2 / pi) (g + 0.044715 g^3).
template <bool Gelu>
inline __m512 act16(__m512 g) {
  if constexpr (!Gelu) return times_sigmoid16(g, g);
  const __m512 g3 = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
  const __m512 u = _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), g3, g);
  return times_sigmoid16(g, _mm512_mul_ps(_mm512_set1_ps(2.0f * kSqrt2OverPi), u));
}

template <bool Gelu>
void act_mul_avx512(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(act16<Gelu>(_mm512_loadu_ps(gate + i)), _mm512_loadu_ps(up + i)));
  if (i < n) {
    const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(tail, gate + i), u = _mm512_maskz_loadu_ps(tail, up + i);
    _mm512_mask_storeu_ps(gate + i, tail, _mm512_mul_ps(act16<Gelu>(g), u));
  }
}

}  // namespace

void fill_ops_avx512(CpuKernels& k) {
  k.silu_mul = act_mul_avx512<false>;
  k.gelu_tanh_mul = act_mul_avx512<true>;
}

}  // namespace tandem::cpu

#else

namespace tandem::cpu {
void fill_ops_avx512(CpuKernels&) {}
}  // namespace tandem::cpu

#endif
