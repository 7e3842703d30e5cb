// AVX2 attention for one query row's heads that share a KV head (attention.h),
// for CPUs without AVX-512. Compiled with -mavx2 -mfma -mf16c; chosen only when
// best_isa() is Avx2.
//
// The AVX-512 kernel's method at 8 lanes: a key row is widened once for all the
// heads it serves, a head's score is two FMA chains (even and odd vectors) over
// head_dim / 8 vectors and a fixed reduction (8 keys folded together in three
// levels), its softmax a vector exp; the value pass keeps a chunk of each head's
// output in registers across the value rows (16 registers do not hold whole
// heads), as two chains (even and odd keys). Every head's floats come from its
// own chains only, so grouping heads or query rows differently never changes a
// result. Head sizes 64, 96 (Phi-3), 128 and 256 (Gemma 3).
#include "kernels/cpu/isa_fill.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// GCC 12 cannot see that the key folds assign s2 and s4 before reading them (the first of
// each group assigns): -Wmaybe-uninitialized, as in the AVX-512 kernel.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/avx2_helpers.h"
#include "kernels/cpu/exp_avx2.h"
#include "kernels/cpu/prefetch_rows.h"

namespace tandem::cpu {

namespace {

using avx2::tail_mask;

inline float reduce_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// In-place softmax of s[0, n); stat (if set) gets the max and the sum of exps.
void softmax8(float* s, int64_t n, float* stat) {
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 mx = ninf;
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + t));
  const __m256i tail = tail_mask(n - t);
  if (t < n) mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + t, tail), _mm256_castsi256_ps(tail)));
  const __m256 m = _mm256_set1_ps(reduce_max(mx));
  __m256 sum = _mm256_setzero_ps();
  for (t = 0; t + 8 <= n; t += 8) {
    const __m256 e = avx2::exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + t), m));
    _mm256_storeu_ps(s + t, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (t < n) {
    const __m256 e = _mm256_and_ps(avx2::exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(s + t, tail), m)),
                                   _mm256_castsi256_ps(tail));
    _mm256_maskstore_ps(s + t, tail, e);
    sum = _mm256_add_ps(sum, e);
  }
  const float total = avx2::hsum(sum);
  if (stat) stat[0] = _mm256_cvtss_f32(m), stat[1] = total;
  const __m256 inv = _mm256_set1_ps(1.0f / total);
  for (t = 0; t + 8 <= n; t += 8) _mm256_storeu_ps(s + t, _mm256_mul_ps(_mm256_loadu_ps(s + t), inv));
  if (t < n) _mm256_maskstore_ps(s + t, tail, _mm256_mul_ps(_mm256_maskload_ps(s + t, tail), inv));
}

// Elements [8v, 8v + 8) of one head's K or V row, as floats; a Q8_0 row's int8 meet their
// block's fp16 scale d, exactly (d * q is exact in float: the dequantized values).
template <DType T>
inline __m256 load8(const uint8_t* row, int v) {
  if constexpr (T == DType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row) + v));
  } else if constexpr (T == DType::Q8_0) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + v / 4;
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + 8 * (v % 4)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_set1_ps(avx2::half(b->d)));
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + 8 * v);
  }
}

// Each head's 8 lane sums of key t's dot product (keys past the end give
// zeros): even and odd vectors in two chains, added at the end (half the
// latency of one chain: single heads, as decode runs them, ~6% faster).
template <DType T, int NV, int HC>
inline void lane_dots(const float* q, const uint8_t* const* k_rows, int64_t t, int64_t n_keys, __m256 acc[HC]) {
  if (t >= n_keys) {
    for (int h = 0; h < HC; h++) acc[h] = _mm256_setzero_ps();
    return;
  }
  const uint8_t* row = k_rows[t];
  __m256 odd[HC];
  __m256 k0 = load8<T>(row, 0), k1 = load8<T>(row, 1);
  for (int h = 0; h < HC; h++) {
    acc[h] = _mm256_mul_ps(k0, _mm256_loadu_ps(q + h * 8 * NV));
    odd[h] = _mm256_mul_ps(k1, _mm256_loadu_ps(q + h * 8 * NV + 8));
  }
  for (int v = 2; v < NV; v += 2) {
    k0 = load8<T>(row, v), k1 = load8<T>(row, v + 1);
    for (int h = 0; h < HC; h++) {
      acc[h] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q + h * 8 * NV + 8 * v), acc[h]);
      odd[h] = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q + h * 8 * NV + 8 * v + 8), odd[h]);
    }
  }
  for (int h = 0; h < HC; h++) acc[h] = _mm256_add_ps(acc[h], odd[h]);
}

// Horizontal sums of 8 keys' lane vectors in three folds, each halving every
// key's lanes and doubling the keys a vector holds; a key's sum tree is the
// same in every slot. After fold 1, 128-bit halves (lo, hi) hold keys a, b;
// after fold 2, lane pair j of each half is one key; after fold 3, lanes hold
// keys 0 2 4 6 1 3 5 7.
inline __m256 fold1(__m256 a, __m256 b) {
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
inline __m256 fold2(__m256 c, __m256 d) {
  return _mm256_add_ps(_mm256_shuffle_ps(c, d, 0x44), _mm256_shuffle_ps(c, d, 0xEE));
}
inline __m256 fold3(__m256 e, __m256 f) {
  return _mm256_add_ps(_mm256_shuffle_ps(e, f, 0x88), _mm256_shuffle_ps(e, f, 0xDD));
}

// NV vectors per head, HC heads at once.
template <DType T, int NV, int HC>
void heads(const float* q, const uint8_t* const* k_rows, const uint8_t* const* v_rows, int64_t n_keys, float scale,
           float* scores, int64_t scores_stride, float* out, float* stats) {
  constexpr int D = 8 * NV;
  const __m256i key_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  constexpr int kRow = kHeadRowBytes<T, D>;
  prefetch_rows<kRow>(k_rows, 0, 8, n_keys);
  for (int64_t t0 = 0; t0 < n_keys; t0 += 8) {
    // the next 8 keys' K rows, and these keys' V rows for the value pass
    prefetch_rows<kRow>(k_rows, t0 + 8, t0 + 16, n_keys);
    prefetch_rows<kRow>(v_rows, t0, t0 + 8, n_keys);
    __m256 s4[HC], s2[HC], a[HC], b[HC];
    for (int i4 = 0; i4 < 8; i4 += 4) {
      for (int i2 = i4; i2 < i4 + 4; i2 += 2) {
        lane_dots<T, NV, HC>(q, k_rows, t0 + i2, n_keys, a);
        lane_dots<T, NV, HC>(q, k_rows, t0 + i2 + 1, n_keys, b);
        for (int h = 0; h < HC; h++) {
          const __m256 ab = fold1(a[h], b[h]);
          s2[h] = i2 == i4 ? ab : fold2(s2[h], ab);
        }
      }
      for (int h = 0; h < HC; h++) s4[h] = i4 == 0 ? s2[h] : fold3(s4[h], s2[h]);
    }
    const __m256i valid = tail_mask(std::min<int64_t>(8, n_keys - t0));
    for (int h = 0; h < HC; h++)
      _mm256_maskstore_ps(scores + h * scores_stride + t0, valid,
                          _mm256_mul_ps(_mm256_permutevar8x32_ps(s4[h], key_order), _mm256_set1_ps(scale)));
  }
  for (int h = 0; h < HC; h++) softmax8(scores + h * scores_stride, n_keys, stats ? stats + 2 * h : nullptr);
  // Each output element is two chains, over even and over odd keys, added at the end, so a
  // single head's pass (VC = 4 vectors) has 8 FMAs in flight instead of 4.
  constexpr int VC = HC == 1 ? 4 : 2;  // output vectors per head per pass (x2 chains)
  static_assert(NV % VC == 0);
  // The passes over chunks of the output go block by block of keys, so a block's V rows
  // stay in L1 for all of them (passes over every key re-read each row from L2 or beyond:
  // decode at 4096 keys spent ~46% of this kernel there). Between blocks the even chains
  // wait in `out`, the odd ones in `odd`.
  constexpr int64_t kValueBlock = 64;  // even, so a key's chain is its own parity
  alignas(32) float odd[HC * D];
  for (int64_t b0 = 0; b0 < n_keys; b0 += kValueBlock) {
    const int64_t b1 = std::min(n_keys, b0 + kValueBlock);
    for (int v0 = 0; v0 < NV; v0 += VC) {
      __m256 oe[HC][VC], oo[HC][VC];
      for (int h = 0; h < HC; h++)
        for (int v = 0; v < VC; v++) {
          const int at = h * D + 8 * (v0 + v);
          oe[h][v] = b0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out + at);
          oo[h][v] = b0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(odd + at);
        }
      auto key = [&](int64_t t, __m256(&o)[HC][VC]) {
        __m256 x[VC];
        for (int v = 0; v < VC; v++) x[v] = load8<T>(v_rows[t], v0 + v);
        for (int h = 0; h < HC; h++) {
          const __m256 p = _mm256_broadcast_ss(scores + h * scores_stride + t);
          for (int v = 0; v < VC; v++) o[h][v] = _mm256_fmadd_ps(p, x[v], o[h][v]);
        }
      };
      int64_t t = b0;
      for (; t + 2 <= b1; t += 2) {
        key(t, oe);
        key(t + 1, oo);
      }
      if (t < b1) key(t, oe);  // the last key, when n_keys is odd: an even index
      for (int h = 0; h < HC; h++)
        for (int v = 0; v < VC; v++) {
          const int at = h * D + 8 * (v0 + v);
          _mm256_storeu_ps(out + at, oe[h][v]);
          _mm256_store_ps(odd + at, oo[h][v]);
        }
    }
  }
  for (int i = 0; i < HC * D; i += 8)
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_load_ps(odd + i)));
}

template <DType T, int NV>
void AttentionLoops::run(int n_heads, const float* q, const uint8_t* const* k_rows, const uint8_t* const* v_rows,
                         int64_t n_keys, float scale, float* scores, int64_t scores_stride, float* out, float* stats) {
  constexpr int kMax = 3;  // 4 x HC score registers plus the key vector fit in 16
  constexpr int D = 8 * NV;
  for (int h0 = 0; h0 < n_heads; h0 += kMax) {
    const float* qh = q + h0 * D;
    float* sh = scores + h0 * scores_stride;
    float* oh = out + h0 * D;
    float* st = stats ? stats + 2 * h0 : nullptr;
    switch (std::min(kMax, n_heads - h0)) {
      case 1:
        heads<T, NV, 1>(qh, k_rows, v_rows, n_keys, scale, sh, scores_stride, oh, st);
        break;
      case 2:
        heads<T, NV, 2>(qh, k_rows, v_rows, n_keys, scale, sh, scores_stride, oh, st);
        break;
      default:
        heads<T, NV, 3>(qh, k_rows, v_rows, n_keys, scale, sh, scores_stride, oh, st);
        break;
    }
  }
}

}  // namespace

void fill_attention_avx2(CpuKernels& k) { fill_attend_heads<8>(k); }

}  // namespace tandem::cpu

#else

namespace tandem::cpu {
void fill_attention_avx2(CpuKernels&) {}
}  // namespace tandem::cpu

#endif
