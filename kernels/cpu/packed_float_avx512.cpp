// AVX-512 kernel over packed float groups (layout in packed_float.h). Compiled with
// -mavx512f -mf16c; chosen only when best_isa() is Avx512.
//
// Per pair of elements: two 32-byte loads widen to 16 floats each (F16: VCVTPH2PS; BF16: a
// 16-bit shift), then each token gets two FMAs whose activation is an embedded broadcast.
// With 8 tokens that is 16 FMAs per 64 weight bytes, enough independent chains to keep both
// FMA pipes busy; with 1 token (decode) the two chains and the stream keep up with memory.
#include "kernels/cpu/isa_fill.h"
#include "kernels/cpu/packed_float.h"

#include <algorithm>

#include "kernels/cpu/packed_quant.h"

#if defined(__AVX512F__)
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* placeholders.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace tandem::cpu {

namespace {

template <DType T>
inline __m512 widen(const uint16_t* p) {
  const __m256i h = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  if constexpr (T == DType::F16) return _mm512_cvtph_ps(h);
  else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <DType T, int NT>
void PackedFloatLoops::run(const uint8_t* group, int64_t cols, const float* x, int64_t x_stride, float* out,
                           int64_t out_stride, int valid_rows) {
  const auto* w = reinterpret_cast<const uint16_t*>(group);
  __m512 even[NT], odd[NT];
  for (int t = 0; t < NT; t++) even[t] = _mm512_setzero_ps(), odd[t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < cols; k += 2) {
    // Streaming (kStreamMaxTokens): the line 8 KiB ahead into L2, as the packed quant kernel does.
    if constexpr (NT <= kStreamMaxTokens) _mm_prefetch(reinterpret_cast<const char*>(w + k * kPackRows) + 8192, _MM_HINT_T1);
    const __m512 w0 = widen<T>(w + k * kPackRows), w1 = widen<T>(w + (k + 1) * kPackRows);
    for (int t = 0; t < NT; t++) {
      even[t] = _mm512_fmadd_ps(w0, _mm512_set1_ps(x[t * x_stride + k]), even[t]);
      odd[t] = _mm512_fmadd_ps(w1, _mm512_set1_ps(x[t * x_stride + k + 1]), odd[t]);
    }
  }
  const __mmask16 mask = valid_rows >= kPackRows ? (__mmask16)0xFFFF : (__mmask16)((1u << valid_rows) - 1);
  for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(out + t * out_stride, mask, _mm512_add_ps(even[t], odd[t]));
}

// Passes of up to 8 tokens (one accumulator pair each), each reading the group from cache.
template <DType T>
void gemm_n(const uint8_t* group, int64_t cols, const float* x, int64_t x_stride, int n_tokens, float* out,
            int64_t out_stride, int valid_rows) {
  for (int t0 = 0; t0 < n_tokens; t0 += 8)
    by_token_count<PackedFloatLoops, T, float>(group, cols, x + t0 * x_stride, x_stride, std::min(8, n_tokens - t0),
                                               out + t0 * out_stride, out_stride, valid_rows);
}

}  // namespace

void fill_packed_float_avx512(CpuKernels& k) {
  k.packed_float.set(DType::F16, gemm_n<DType::F16>);
  k.packed_float.set(DType::BF16, gemm_n<DType::BF16>);
}

}  // namespace tandem::cpu

#else

namespace tandem::cpu {
void fill_packed_float_avx512(CpuKernels&) {}
}  // namespace tandem::cpu

#endif
