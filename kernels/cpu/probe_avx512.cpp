// AVX-512 bodies of the machine probes (compiled with -mavx512f -mavx512vnni ...): the roofs of
// the instructions the AVX-512 kernels run, 512-bit FMA for float products and VPDPBUSD for
// 8-bit activations against quantized weights.
#include "kernels/cpu/probe.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>

#include <cstdint>

namespace tandem::cpu::detail {

double fma_loop_avx512(long iters, float* sink) {
  // Ten independent chains cover the FMA latency (4 cycles) on up to two ports.
  __m512 a[10];
  for (auto& x : a) x = _mm512_set1_ps(1.0f);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iters; i++)
    for (auto& x : a) x = _mm512_fmadd_ps(x, m, c);
  __m512 s = a[0];
  for (int k = 1; k < 10; k++) s = _mm512_add_ps(s, a[k]);
  *sink = _mm512_reduce_add_ps(s);
  return 2.0 * 16 * 10 * (double)iters;
}

double int8_loop_avx512(long iters, float* sink) {
  // VPDPBUSD: 64 u8 x s8 multiply-adds into 16 int32 lanes; 2 ops each, as GFLOP counts them.
  __m512i a[10];
  for (auto& x : a) x = _mm512_setzero_si512();
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  for (long i = 0; i < iters; i++)
    for (auto& x : a) x = _mm512_dpbusd_epi32(x, u, s);
  __m512i t = a[0];
  for (int k = 1; k < 10; k++) t = _mm512_add_epi32(t, a[k]);
  // The lanes wrap (the hardware's arithmetic); sum them unsigned, so no C++ overflow either.
  alignas(64) uint32_t lanes[16];
  _mm512_store_si512(lanes, t);
  uint32_t sum = 0;
  for (uint32_t v : lanes) sum += v;
  *sink = (float)sum;
  return 2.0 * 64 * 10 * (double)iters;
}

}  // namespace tandem::cpu::detail

#else

namespace tandem::cpu::detail {
double fma_loop_avx512(long iters, float* sink) { return fma_loop_avx2(iters, sink); }
double int8_loop_avx512(long iters, float* sink) { return int8_loop_avx2(iters, sink); }
}  // namespace tandem::cpu::detail

#endif
