// AVX-512 attention for many query heads against one key segment (a block of prefill rows of
// one sequence, attention.cpp's blocked path): the scores by outer products. Each tile of 16
// keys is widened and transposed once (kt[d] holds element d of the 16 keys), then a head's
// scores for the tile are FMAs of kt[d] with its q[d] broadcast: no horizontal sums, whose
// shuffles share the FMA pipes in the key-by-key kernel (attention_avx512.cpp). The transpose
// is paid once per tile for every head.
//
// The floats are the key-by-key kernel's, bit for bit: a key's score there is 16 lane chains
// (lane l: q[l] k[l], then + q[16v + l] k[16v + l] for v = 1.., each one FMA) summed by a fixed
// halving tree ((l, l + 8), then (l, l + 4), (l, l + 2), (0, 1)) times the scale; here the
// same chains run with keys in the lanes, and the same tree is vertical adds. Softmax and the
// value pass are the shared ones (attention_avx512.h).
#include "kernels/cpu/isa_fill.h"

#if defined(__AVX512F__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_avx512.h"

namespace tandem::cpu {

namespace {

using avx512::load16;
using avx512::softmax16;
using avx512::value_pass;

// r[j] = row j of a 16 x 16 block; afterwards r[l] = column l.
inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {  // u[4i + k], 128-bit chunk c: element 4c + k of rows 4i..4i+3
    u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int k = 0; k < 4; k++) {  // t[k]: elements k and 8 + k of rows 0-7; t[8 + k]: of rows 8-15 (t[4+k], t[12+k]: 4+k, 12+k)
    t[k] = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);
    t[4 + k] = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD);
    t[8 + k] = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
    t[12 + k] = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
  }
  for (int k = 0; k < 4; k++) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0xDD);
    r[4 + k] = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0x88);
    r[12 + k] = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0xDD);
  }
}

// The 16 keys from t0 (zeros past n_keys) as kt[d * 16 + j] = element d of key t0 + j.
template <DType T, int NV>
void transpose_tile(const uint8_t* const* k_rows, int64_t t0, int64_t n_keys, float* kt) {
  for (int v = 0; v < NV; v++) {
    __m512 r[16];
    for (int j = 0; j < 16; j++) r[j] = t0 + j < n_keys ? load16<T>(k_rows[t0 + j], v) : _mm512_setzero_ps();
    transpose16(r);
    for (int l = 0; l < 16; l++) _mm512_store_ps(kt + (16 * v + l) * 16, r[l]);
  }
}

// HC heads' scores for one tile: q[h] the heads' queries, sc[h] + t0 their score rows.
template <int NV, int HC>
struct TileScores {
  const float* const* q;
  const float* kt;
  // Lane chain l of every head: q[l] kt[l], then + q[16v + l] kt[16v + l] for v = 1..NV-1.
  void chain(int l, __m512 a[HC]) const {
    const __m512 k0 = _mm512_load_ps(kt + l * 16);
    for (int h = 0; h < HC; h++) a[h] = _mm512_mul_ps(k0, _mm512_set1_ps(q[h][l]));
    for (int v = 1; v < NV; v++) {
      const __m512 k = _mm512_load_ps(kt + (16 * v + l) * 16);
      for (int h = 0; h < HC; h++) a[h] = _mm512_fmadd_ps(k, _mm512_set1_ps(q[h][16 * v + l]), a[h]);
    }
  }
  // The halving tree, level by level: chains l and l + 8, then pairs m and m + 4, quads n and n + 2.
  void pair(int l, __m512 o[HC]) const {
    __m512 a[HC], b[HC];
    chain(l, a), chain(l + 8, b);
    for (int h = 0; h < HC; h++) o[h] = _mm512_add_ps(a[h], b[h]);
  }
  void quad(int m, __m512 o[HC]) const {
    __m512 a[HC], b[HC];
    pair(m, a), pair(m + 4, b);
    for (int h = 0; h < HC; h++) o[h] = _mm512_add_ps(a[h], b[h]);
  }
  void oct(int n, __m512 o[HC]) const {
    __m512 a[HC], b[HC];
    quad(n, a), quad(n + 2, b);
    for (int h = 0; h < HC; h++) o[h] = _mm512_add_ps(a[h], b[h]);
  }
  void store(float scale, float* const* sc, int64_t t0, __mmask16 valid) const {
    __m512 a[HC], b[HC];
    oct(0, a), oct(1, b);
    for (int h = 0; h < HC; h++)
      _mm512_mask_storeu_ps(sc[h] + t0, valid, _mm512_mul_ps(_mm512_add_ps(a[h], b[h]), _mm512_set1_ps(scale)));
  }
};

template <int NV, int HC>
void tile_scores(const float* q, int h0, const float* kt, float scale, float* scores, int64_t stride, int64_t t0,
                 __mmask16 valid) {
  constexpr int D = 16 * NV;
  const float* qh[HC];
  float* sh[HC];
  for (int h = 0; h < HC; h++) qh[h] = q + (h0 + h) * D, sh[h] = scores + (h0 + h) * stride;
  TileScores<NV, HC>{qh, kt}.store(scale, sh, t0, valid);
}

// The transposed tiles of a segment (a thread's, kept between calls), 64-byte aligned.
float* tile_store(size_t floats) {
  thread_local std::vector<float> store;
  if (store.size() < floats + 16) store.resize(floats + 16);
  auto p = reinterpret_cast<uintptr_t>(store.data());
  return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
}

template <DType T, int NV>
void wide_heads(int, int n_heads, const float* q, const uint8_t* const* k_rows, const uint8_t* const* v_rows,
                int64_t n_keys, float scale, float* scores, int64_t scores_stride, float* out, float* stats) {
  constexpr int D = 16 * NV;
  const int64_t n_tiles = (n_keys + 15) / 16;
  float* kt = tile_store((size_t)(n_tiles * D * 16));
  for (int64_t tile = 0; tile < n_tiles; tile++) transpose_tile<T, NV>(k_rows, tile * 16, n_keys, kt + tile * D * 16);
  for (int64_t tile = 0; tile < n_tiles; tile++) {
    const int64_t t0 = tile * 16;
    const __mmask16 valid = n_keys - t0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n_keys - t0)) - 1);
    const float* k = kt + tile * D * 16;
    int h0 = 0;
    for (; h0 + 4 <= n_heads; h0 += 4) tile_scores<NV, 4>(q, h0, k, scale, scores, scores_stride, t0, valid);
    for (; h0 < n_heads; h0++) tile_scores<NV, 1>(q, h0, k, scale, scores, scores_stride, t0, valid);
  }
  for (int h = 0; h < n_heads; h++) softmax16(scores + h * scores_stride, n_keys, stats ? stats + 2 * h : nullptr);
  // The value pass as the key-by-key kernel groups it (HC x NV accumulators in registers).
  constexpr int kMax = NV <= 4 ? 4 : NV <= 6 ? 3 : 2;
  int h0 = 0;
  for (; h0 + kMax <= n_heads; h0 += kMax)
    value_pass<T, NV, kMax>(v_rows, n_keys, scores + h0 * scores_stride, scores_stride, out + h0 * D);
  for (; h0 < n_heads; h0++) value_pass<T, NV, 1>(v_rows, n_keys, scores + h0 * scores_stride, scores_stride, out + h0 * D);
}

template <DType T, int... HeadDims>
void fill_wide_type(CpuKernels& k) {
  (k.attend_wide_heads.set(T, HeadDims, wide_heads<T, HeadDims / 16>), ...);
}

}  // namespace

void fill_attention_wide_avx512(CpuKernels& k) {
  fill_wide_type<DType::F32, 64, 96, 128, 256>(k);
  fill_wide_type<DType::F16, 64, 96, 128, 256>(k);
  fill_wide_type<DType::Q8_0, 64, 96, 128, 256>(k);
}

}  // namespace tandem::cpu

#else

namespace tandem::cpu {
void fill_attention_wide_avx512(CpuKernels&) {}
}  // namespace tandem::cpu

#endif
