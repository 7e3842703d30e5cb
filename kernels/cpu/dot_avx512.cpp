// AVX-512 float kernels (compiled with -mavx512f): the prefill register tile at 16 lanes, the
// q8_0 KV row quantizer (the AVX2 one's steps, two vectors a block), the Q8_0 row dot with
// float activations for one or several tokens (the exact output head of small models), and the
// MXFP4 row dot.
#include "kernels/cpu/dot.h"
#include "kernels/cpu/kernel_table.h"

#if defined(__AVX512F__)
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* placeholders.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/unroll.h"

namespace tandem::cpu {

namespace {

// round(r) with halves away from zero (roundf), exactly: truncate, then step away from zero
// where the remainder r - trunc(r) (exact in float) is at least 1/2. A NaN gives 0; the result
// saturates at +-127 (infinities). The scalar twin's std::round and clamp, lane by lane.
inline __m128i round_q8_lanes(__m512 r) {
  const __m512 t = _mm512_roundscale_ps(r, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(r, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512 away = _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_and_si512(_mm512_castps_si512(r), _mm512_set1_epi32(INT32_MIN)), _mm512_castps_si512(_mm512_set1_ps(1.0f))));
  __m512 q = _mm512_mask_add_ps(t, up, t, away);
  q = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), q);
  q = _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  return _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(q));
}

void quantize_q8_0_avx512(const float* x, void* out, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(out);
  for (int64_t i = 0; i < n / kQK; i++, x += kQK) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    // max_ps returns its second operand where either is NaN: a NaN element never enters amax.
    const __m512 mx = _mm512_max_ps(_mm512_abs_ps(v1), _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps()));
    const float d = _mm512_reduce_max_ps(mx) / 127.0f;
    const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    b[i].d = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs), round_q8_lanes(_mm512_mul_ps(v0, id)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs + 16), round_q8_lanes(_mm512_mul_ps(v1, id)));
  }
}

// A Q8_0 row against NT tokens (up to eight) at 16 lanes: each block's 32 weights widen into two
// vectors and take the block's scale once for all the tokens, so a token's step is two
// multiply-adds (the AVX2 kernel needs five operations at 8 lanes; scaling each token's block
// sum instead measured the same at one token and costs a third more per further token). Every
// token's sum takes the same steps in the same order whatever NT is, so decode's one-token dot
// (NT = 1) and a verify pass's logits are the same floats bit for bit. Blocks alternate
// between two accumulators so a lone token (decode) is not held to one chain's latency.

// One block's step for NT tokens into acc.
template <int NT>
inline void q8_0_block(const BlockQ8_0& blk, const float* x, int64_t x_stride, __m512* acc) {
  const __m512 d = _mm512_set1_ps(_cvtsh_ss(blk.d));
  const __m128i* q = reinterpret_cast<const __m128i*>(blk.qs);
  const __m512 w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))));
  const __m512 w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))));
  for (int t = 0; t < NT; t++) {
    const float* xt = x + t * x_stride;
    acc[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt + 16), _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt), acc[t]));
  }
}

template <int NT>
void q8_0_tokens(const BlockQ8_0* b, const float* x, int64_t x_stride, int64_t n, float* out, int64_t out_stride) {
  __m512 even[NT], odd[NT];
  for (int t = 0; t < NT; t++) even[t] = odd[t] = _mm512_setzero_ps();
  const int64_t blocks = n / kQK;
  int64_t i = 0;
  for (; i + 2 <= blocks; i += 2) {
    q8_0_block<NT>(b[i], x + i * kQK, x_stride, even);
    q8_0_block<NT>(b[i + 1], x + (i + 1) * kQK, x_stride, odd);
  }
  if (i < blocks) q8_0_block<NT>(b[i], x + i * kQK, x_stride, even);
  for (int t = 0; t < NT; t++) out[t * out_stride] = _mm512_reduce_add_ps(_mm512_add_ps(even[t], odd[t]));
}

float dot_q8_0_row(const void* row, const float* x, int64_t n) {
  float out;
  q8_0_tokens<1>(static_cast<const BlockQ8_0*>(row), x, 0, n, &out, 0);
  return out;
}

void dot_q8_0_tokens(const void* row, const float* x, int64_t x_stride, int n_tokens, int64_t n, float* out,
                     int64_t out_stride) {
  constexpr int kTokens = 8;  // 16 accumulators, two weight vectors and the scale: 19 of 32 registers
  const auto* b = static_cast<const BlockQ8_0*>(row);
  for (int t = 0; t < n_tokens; t += kTokens)
    with_count<kTokens>(n_tokens - t < kTokens ? n_tokens - t : kTokens, [&](auto nt) {
      q8_0_tokens<decltype(nt)::value>(b, x + t * x_stride, x_stride, n, out + t * out_stride, out_stride);
    });
}

// An MXFP4 row with float activations: each block's 16 low and 16 high codes looked up as int8
// values (a byte shuffle), widened to two vectors and scaled once; blocks alternate between two
// accumulators, as the Q8_0 kernel's.
inline __m512 mxfp4_block(const BlockMxfp4& blk, const float* x, __m128i values, __m512 acc) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs)), mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_shuffle_epi8(values, _mm_and_si128(q, mask));
  const __m128i hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q, 4), mask));
  const __m512 d = _mm512_set1_ps(mxfp4_scale(blk.e));
  const __m512 w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)));
  const __m512 w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)));
  return _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), acc));
}

float dot_mxfp4_row(const void* row, const float* x, int64_t n) {
  const auto* b = static_cast<const BlockMxfp4*>(row);
  const __m128i values = _mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Values));
  __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();
  const int64_t blocks = n / kQK;
  int64_t i = 0;
  for (; i + 2 <= blocks; i += 2) {
    even = mxfp4_block(b[i], x + i * kQK, values, even);
    odd = mxfp4_block(b[i + 1], x + (i + 1) * kQK, values, odd);
  }
  if (i < blocks) even = mxfp4_block(b[i], x + i * kQK, values, even);
  return _mm512_reduce_add_ps(_mm512_add_ps(even, odd));
}

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

}  // namespace

void fill_dot_avx512(CpuKernels& k) {
  k.tile_f32 = f32_tile_avx512;
  k.quantize_q8_0 = quantize_q8_0_avx512;
  k.row_dot.set(DType::Q8_0, dot_q8_0_row);
  k.row_dot_tokens.set(DType::Q8_0, dot_q8_0_tokens);
  k.row_dot.set(DType::MXFP4, dot_mxfp4_row);
}

}  // namespace tandem::cpu

#else  // no AVX-512 build: the level is never asked for

namespace tandem::cpu {
void fill_dot_avx512(CpuKernels&) {}
}  // namespace tandem::cpu

#endif
