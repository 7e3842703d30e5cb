// AVX2 kernel over the same packed float groups as the AVX-512 one (layout in
// packed_float.h), for CPUs without AVX-512. Compiled with -mavx2 -mfma -mf16c;
// chosen only when best_isa() is Avx2.
//
// Element k of the 16 rows is 32 bytes: two 16-byte halves widen to 8 floats
// each (rows 0-7, rows 8-15). With 16 registers, two halves x two chains (even
// and odd k, as the layout's arithmetic fixes) x 3 tokens is 12 accumulators,
// so a call of up to 8 tokens goes in passes of 3; each pass reads the group
// from L1/L2, and every (row, token) float is the same.
#include <algorithm>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/packed_float.h"
#include "kernels/cpu/packed_quant.h"
#include "kernels/cpu/unroll.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "kernels/cpu/avx2_helpers.h"

namespace tandem::cpu {

namespace {

using avx2::store_half;

constexpr int kPassTokens = 3;
constexpr int kDecodePrefetch = 8192;  // as in packed_float_avx512.cpp

template <DType T>
inline __m256 widen(const uint16_t* p) {
  const __m128i h = _mm_load_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (T == DType::F16)
    return _mm256_cvtph_ps(h);
  else
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <DType T, int NT>
void gemm(const uint8_t* group, int64_t cols, const float* x, int64_t x_stride, float* out, int64_t out_stride,
          int valid_rows) {
  const auto* w = reinterpret_cast<const uint16_t*>(group);
  __m256 even_lo[NT], even_hi[NT], odd_lo[NT], odd_hi[NT];
  each<NT>([&](auto t) { even_lo[t] = even_hi[t] = odd_lo[t] = odd_hi[t] = _mm256_setzero_ps(); });
  for (int64_t k = 0; k < cols; k += 2) {
    const uint16_t* e = w + k * kPackRows;
    if constexpr (NT <= kStreamMaxTokens) _mm_prefetch(reinterpret_cast<const char*>(e) + kDecodePrefetch, _MM_HINT_T1);
    const __m256 lo0 = widen<T>(e), hi0 = widen<T>(e + 8);
    each<NT>([&](auto t) {
      const __m256 xv = _mm256_broadcast_ss(x + t * x_stride + k);
      even_lo[t] = _mm256_fmadd_ps(lo0, xv, even_lo[t]);
      even_hi[t] = _mm256_fmadd_ps(hi0, xv, even_hi[t]);
    });
    const __m256 lo1 = widen<T>(e + kPackRows), hi1 = widen<T>(e + kPackRows + 8);
    each<NT>([&](auto t) {
      const __m256 xv = _mm256_broadcast_ss(x + t * x_stride + k + 1);
      odd_lo[t] = _mm256_fmadd_ps(lo1, xv, odd_lo[t]);
      odd_hi[t] = _mm256_fmadd_ps(hi1, xv, odd_hi[t]);
    });
  }
  each<NT>([&](auto t) {
    store_half(out + t * out_stride, 0, _mm256_add_ps(even_lo[t], odd_lo[t]), valid_rows);
    store_half(out + t * out_stride, 1, _mm256_add_ps(even_hi[t], odd_hi[t]), valid_rows);
  });
}

template <DType T>
void gemm_n(const uint8_t* group, int64_t cols, const float* x, int64_t x_stride, int n_tokens, float* out,
            int64_t out_stride, int valid_rows) {
  for (int t0 = 0; t0 < n_tokens; t0 += kPassTokens) {
    const float* xt = x + t0 * x_stride;
    float* ot = out + t0 * out_stride;
    switch (std::min(kPassTokens, n_tokens - t0)) {
      case 1:
        gemm<T, 1>(group, cols, xt, x_stride, ot, out_stride, valid_rows);
        break;
      case 2:
        gemm<T, 2>(group, cols, xt, x_stride, ot, out_stride, valid_rows);
        break;
      default:
        gemm<T, 3>(group, cols, xt, x_stride, ot, out_stride, valid_rows);
        break;
    }
  }
}

}  // namespace

void fill_packed_float_avx2(CpuKernels& k) {
  k.packed_float.set(DType::F16, gemm_n<DType::F16>);
  k.packed_float.set(DType::BF16, gemm_n<DType::BF16>);
}

}  // namespace tandem::cpu

#else

namespace tandem::cpu {
void fill_packed_float_avx2(CpuKernels&) {}
}  // namespace tandem::cpu

#endif
