// AVX-512 attention for one query row's heads that share a KV head (attention.h). Compiled
// with -mavx512f -mf16c; chosen only when best_isa() is Avx512.
//
// Each key (or value) row is loaded and widened once for all the heads it serves; a head's
// score is one FMA chain over head_dim / 16 vectors and a fixed reduction, its softmax a
// vector exp, and its output stays in registers across the value rows (head_dim 256: half a
// head at a time, over blocks of value rows that stay in L1). Every head's floats come from
// its own chains only, so grouping heads differently never changes a result. Head sizes 64,
// 96 (Phi-3), 128 and 256 (Gemma 3).
#include "kernels/cpu/isa_fill.h"

#if defined(__AVX512F__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/exp_avx512.h"
#include "kernels/cpu/prefetch_rows.h"
#include "kernels/cpu/quant_blocks.h"

namespace tandem::cpu {

namespace {

using avx512::load16;
using avx512::softmax16;
using avx512::value_pass;

// Each head's 16 lane sums of key t's dot product (keys past the end give zeros).
template <DType T, int NV, int HC>
inline void lane_dots(const float* q, const uint8_t* const* k_rows, int64_t t, int64_t n_keys, __m512 acc[HC]) {
  if (t >= n_keys) {
    for (int h = 0; h < HC; h++) acc[h] = _mm512_setzero_ps();
    return;
  }
  if constexpr (NV > 8) {
    // A wide row does not fit the registers at once: each of its vectors meets every head in
    // turn (the same chains, in the same order, as below).
    for (int v = 0; v < NV; v++) {
      const __m512 k = load16<T>(k_rows[t], v);
      for (int h = 0; h < HC; h++)
        acc[h] = v == 0 ? _mm512_mul_ps(k, _mm512_loadu_ps(q + h * 16 * NV))
                        : _mm512_fmadd_ps(k, _mm512_loadu_ps(q + h * 16 * NV + 16 * v), acc[h]);
    }
    return;
  }
  __m512 k[NV];
  for (int v = 0; v < NV; v++) k[v] = load16<T>(k_rows[t], v);
  for (int h = 0; h < HC; h++) {
    acc[h] = _mm512_mul_ps(k[0], _mm512_loadu_ps(q + h * 16 * NV));
    for (int v = 1; v < NV; v++) acc[h] = _mm512_fmadd_ps(k[v], _mm512_loadu_ps(q + h * 16 * NV + 16 * v), acc[h]);
  }
}

// The horizontal sums of 16 keys' lane vectors, folded together four levels deep: each fold
// halves every key's lanes and doubles the keys a vector holds, so 16 keys cost 15 adds and
// 30 shuffles instead of 16 full reductions. A key's sum tree is the same in every slot (the
// folds only ever add a key's lanes to its own), so scores never depend on how keys group.
// After fold 1, 128-bit chunks (lo, hi) of keys a, b; after fold 2, chunk j is key j of 4;
// after fold 3, chunk k holds keys k and 4 + k; after fold 4, lane 4k + m holds key 4m + k.
inline __m512 fold1(__m512 a, __m512 b) { return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE)); }
inline __m512 fold2(__m512 c, __m512 d) { return _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x88), _mm512_shuffle_f32x4(c, d, 0xDD)); }
inline __m512 fold3(__m512 e, __m512 f) { return _mm512_add_ps(_mm512_shuffle_ps(e, f, 0x44), _mm512_shuffle_ps(e, f, 0xEE)); }
inline __m512 fold4(__m512 g, __m512 h) { return _mm512_add_ps(_mm512_shuffle_ps(g, h, 0x88), _mm512_shuffle_ps(g, h, 0xDD)); }

// NV vectors per head, HC heads at once.
template <DType T, int NV, int HC>
void heads(const float* q, const uint8_t* const* k_rows, const uint8_t* const* v_rows, int64_t n_keys, float scale,
           float* scores, int64_t scores_stride, float* out, float* stats) {
  constexpr int D = 16 * NV;
  const __m512i key_order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  constexpr int kRow = kHeadRowBytes<T, D>;
  // K rows two tiles ahead: decode waits on each fresh K row (perf: the first use of its
  // load is the hot spot), and one tile ahead left too little time. SmolLM2 tg64 @ d4096
  // (f16 KV, 4 alternating rounds): 16 ahead 119-141 tok/s, 32 ahead 123-152, 64 as 32;
  // Gemma 3 and q8_0 KV even within noise.
  constexpr int64_t kAhead = 32;
  prefetch_rows<kRow>(k_rows, 0, kAhead, n_keys);
  for (int64_t t0 = 0; t0 < n_keys; t0 += 16) {
    // K rows kAhead keys on, and these keys' V rows for the value pass
    prefetch_rows<kRow>(k_rows, t0 + kAhead, t0 + kAhead + 16, n_keys);
    prefetch_rows<kRow>(v_rows, t0, t0 + 16, n_keys);
    __m512 s8[HC], s4[HC], s2[HC], a[HC], b[HC];
    for (int i8 = 0; i8 < 16; i8 += 8) {
      for (int i4 = i8; i4 < i8 + 8; i4 += 4) {
        for (int i2 = i4; i2 < i4 + 4; i2 += 2) {
          lane_dots<T, NV, HC>(q, k_rows, t0 + i2, n_keys, a);
          lane_dots<T, NV, HC>(q, k_rows, t0 + i2 + 1, n_keys, b);
          for (int h = 0; h < HC; h++) {
            const __m512 ab = fold1(a[h], b[h]);
            s2[h] = i2 == i4 ? ab : fold2(s2[h], ab);
          }
        }
        for (int h = 0; h < HC; h++) s4[h] = i4 == i8 ? s2[h] : fold3(s4[h], s2[h]);
      }
      for (int h = 0; h < HC; h++) s8[h] = i8 == 0 ? s4[h] : fold4(s8[h], s4[h]);
    }
    const __mmask16 valid = n_keys - t0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n_keys - t0)) - 1);
    for (int h = 0; h < HC; h++)
      _mm512_mask_storeu_ps(scores + h * scores_stride + t0, valid,
                            _mm512_mul_ps(_mm512_permutexvar_ps(key_order, s8[h]), _mm512_set1_ps(scale)));
  }
  for (int h = 0; h < HC; h++) softmax16(scores + h * scores_stride, n_keys, stats ? stats + 2 * h : nullptr);
  value_pass<T, NV, HC>(v_rows, n_keys, scores, scores_stride, out);
}

template <DType T, int NV>
void AttentionLoops::run(int n_heads, const float* q, const uint8_t* const* k_rows, const uint8_t* const* v_rows,
                         int64_t n_keys, float scale, float* scores, int64_t scores_stride, float* out, float* stats) {
  // HC x NV accumulators plus NV row vectors fit in 32 registers (wide heads: HC x 8 plus 8).
  constexpr int kMax = NV <= 4 ? 4 : NV <= 6 ? 3 : 2;
  constexpr int D = 16 * NV;
  for (int h0 = 0; h0 < n_heads; h0 += kMax) {
    const float* qh = q + h0 * D;
    float* sh = scores + h0 * scores_stride;
    float* oh = out + h0 * D;
    float* st = stats ? stats + 2 * h0 : nullptr;
    switch (std::min(kMax, n_heads - h0)) {
      case 1: heads<T, NV, 1>(qh, k_rows, v_rows, n_keys, scale, sh, scores_stride, oh, st); break;
      case 2: heads<T, NV, 2>(qh, k_rows, v_rows, n_keys, scale, sh, scores_stride, oh, st); break;
      case 3: heads<T, NV, (kMax >= 3 ? 3 : 1)>(qh, k_rows, v_rows, n_keys, scale, sh, scores_stride, oh, st); break;
      default: heads<T, NV, kMax>(qh, k_rows, v_rows, n_keys, scale, sh, scores_stride, oh, st); break;
    }
  }
}

}  // namespace

void fill_attention_avx512(CpuKernels& k) { fill_attend_heads<16>(k); }

}  // namespace tandem::cpu

#else

namespace tandem::cpu {
void fill_attention_avx512(CpuKernels&) {}
}  // namespace tandem::cpu

#endif
