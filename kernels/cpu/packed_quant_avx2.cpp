// AVX2 kernel over the same packed 16-row groups as the AVX-512 one (layout in
// packed_quant.h), for CPUs without AVX-512 VNNI. Compiled with -mavx2 -mfma
// -mf16c; chosen only when best_isa() is Avx2.
//
// A 64-byte vector of the layout is two 256-bit halves, rows 0-7 and rows 8-15,
// each done on its own. With no VPDPBUSD, a 4-byte group times the broadcast
// activation quad is VPMADDUBSW (unsigned x signed byte pairs into int16) then
// VPMADDWD (pairs into int32). The integer sums equal the scalar twin's
// exactly, so every float does too:
// - Q4_0/Q4_1/Q4_K: nibbles (0..15) go straight in; a block's 8 int16 sums stay
// under 2^15
//   (8 x 2 x 15 x 127), so one VPMADDWD a block, and Q4_0's -8 x sum(x) is
//   added after.
// - MXFP4: codes looked up (VPSHUFB) as their values + 12 (0..24); two quads' int16 sums
//   (4 x 2 x 24 x 127) fit, so one VPMADDWD per two, and -12 x sum(x) is added after.
// - Q5_0/Q5_1/Q5_K: the fifth bit ORed in (0..31); int16 sums over two quads
//   (4 x 2 x 31 x 127) fit, so one VPMADDWD per two.
// - Q8_0: stored as w + 128, which VPMADDUBSW would saturate; flipping the top
// bit gives w,
//   and |w| times x carrying w's sign (VPSIGNB) is w x with pairs under 2^15 (w
//   = -128 too).
// - Q6_K: 6-bit u (0..63) rebuilt from nibble and high-bit vectors; two int16
// pair sums
//   (2 x 2 x 63 x 127) fit, and VPMADDWD against the row's scale doubled into
//   both int16 halves applies it; the -32 x scale x sum(x half) term is one
//   more VPMADDWD.
#include <cstring>

#include "kernels/cpu/isa_fill.h"
#include "kernels/cpu/packed_quant.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/unroll.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "kernels/cpu/avx2_helpers.h"

namespace tandem::cpu {

namespace {

using avx2::store_half;

// Decode prefetch distance, as in the AVX-512 kernel (packed_quant_avx512.cpp).
constexpr int kDecodePrefetch = 8192;

inline __m256i quad(const int8_t* qs) {
  int32_t v;
  std::memcpy(&v, qs, 4);
  return _mm256_set1_epi32(v);
}

inline __m256i load(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }

// 8 fp16 values (one half's rows) as floats.
inline __m256 halfs(const uint8_t* p) { return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p))); }

// 8 rows' MXFP4 scales (E8M0 bytes) as mxfp4_scale gives them: 2^(e - 128), exact (e 0 and 1
// subnormal).
inline __m256 mxfp4_scales(const uint8_t* e) {
  const __m256i e32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(e)));
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e32, _mm256_set1_epi32(1)), 23);
  const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e32);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e32)));
}

inline void prefetch_ahead(const uint8_t* p, int bytes) {
  for (int line = 0; line < bytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p) + kDecodePrefetch + line, _MM_HINT_T1);
}

// Runs body(b, h, acc) for every block b and 8-row half h, acc being that
// half's NT token accumulators, then stores them. Few tokens (decode): both
// halves block by block, all in registers, one stream through the group. More:
// half by half, each pass over the group (which stays in L1/L2) with only its
// own accumulators live; block by block GCC hoisted every activation broadcast
// of both halves into stack slots and spilled all over.
template <int NT, typename Body>
inline void blocks_by_half(int64_t nb, float* out, int64_t out_stride, int valid_rows, Body body) {
  if constexpr (NT <= 2) {
    __m256 acc0[NT], acc1[NT];
    each<NT>([&](auto t) { acc0[t] = acc1[t] = _mm256_setzero_ps(); });
    for (int64_t b = 0; b < nb; b++) {
      body(b, std::integral_constant<int, 0>{}, acc0);
      body(b, std::integral_constant<int, 1>{}, acc1);
    }
    each<NT>([&](auto t) {
      store_half(out + t * out_stride, 0, acc0[t], valid_rows);
      store_half(out + t * out_stride, 1, acc1[t], valid_rows);
    });
  } else {
    for (int h = 0; h < 2; h++) {
      __m256 acc[NT];
      each<NT>([&](auto t) { acc[t] = _mm256_setzero_ps(); });
      for (int64_t b = 0; b < nb; b++) body(b, h, acc);
      each<NT>([&](auto t) { store_half(out + t * out_stride, h, acc[t], valid_rows); });
    }
  }
}

// p[t] = sum over block b's quants (rows 8h..8h+7) times token t's, exact: the unsigned
// stored values (MXFP4: its codes' values + 12, 0..24), no shift undone.
template <DType T, int NT>
inline void quad_sums(const uint8_t* quads, int h, const BlockQ8Act* x, int64_t x_stride, int64_t b, __m256i p[NT]) {
  constexpr bool Five = packed_five_bits(T), Fp4 = T == DType::MXFP4;
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  const __m256i values = _mm256_add_epi8(
      _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Values))),
      _mm256_set1_epi8(packed_shift(DType::MXFP4)));
  __m256i hb = _mm256_setzero_si256();
  if constexpr (Five) hb = load(quads + 256 + 32 * h);
  __m256i p16[NT];
  each<NT>([&](auto t) { p16[t] = p[t] = _mm256_setzero_si256(); });
  for (int c = 0; c < 4; c++) {
    const __m256i v = load(quads + 64 * c + 32 * h);
    __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    if constexpr (Five) {  // bit c (low nibbles) and 4 + c (high) of the fifth-bit vector to bit 4
      lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4 - c), bit4));
      hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srli_epi16(hb, c), bit4));
    }
    if constexpr (Fp4) lo = _mm256_shuffle_epi8(values, lo), hi = _mm256_shuffle_epi8(values, hi);
    each<NT>([&](auto t) {
      const int8_t* qs = x[t * x_stride + b].qs;
      const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, quad(qs + 4 * c)),
                                         _mm256_maddubs_epi16(hi, quad(qs + 16 + 4 * c)));
      p16[t] = _mm256_add_epi16(p16[t], s);
    });
    if (!Five && !Fp4 ? c == 3 : c % 2 == 1)
      each<NT>([&](auto t) {
        p[t] = _mm256_add_epi32(p[t], _mm256_madd_epi16(p16[t], ones));
        p16[t] = _mm256_setzero_si256();
      });
  }
}

template <DType T, int NT>
void PackedQuantLoops::gemm(const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride, float* out,
                            int64_t out_stride, int valid_rows) {
  constexpr int kShift = T == DType::Q8_0 ? 0 : packed_shift(T);  // Q8_0: signed below
  const int64_t nb = cols / kQK;
  const __m256i ones = _mm256_set1_epi16(1), top = _mm256_set1_epi8((char)0x80);
  blocks_by_half<NT>(nb, out, out_stride, valid_rows, [&](int64_t b, auto h, __m256* acc) {
    const uint8_t* quads = group + packed_quads_at(T, b);
    if constexpr (NT <= kStreamMaxTokens)
      if (h == 0) prefetch_ahead(quads, packed_unit_bytes(T) / packed_unit_blocks(T));
    __m256i p[NT];
    if constexpr (T == DType::Q8_0) {
      each<NT>([&](auto t) { p[t] = _mm256_setzero_si256(); });
      for (int s = 0; s < 8; s++) {
        const __m256i w = _mm256_xor_si256(load(quads + 64 * s + 32 * h), top);
        const __m256i aw = _mm256_abs_epi8(w);
        each<NT>([&](auto t) {
          const __m256i xs = _mm256_sign_epi8(quad(x[t * x_stride + b].qs + 4 * s), w);
          p[t] = _mm256_add_epi32(p[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), ones));
        });
      }
    } else {
      quad_sums<T, NT>(quads, h, x, x_stride, b, p);
      if constexpr (kShift != 0)
        each<NT>([&](auto t) { p[t] = _mm256_add_epi32(p[t], _mm256_set1_epi32(-kShift * x[t * x_stride + b].sum)); });
    }
    __m256 dw;
    if constexpr (T == DType::MXFP4) dw = mxfp4_scales(group + packed_d_at(T, b) + 8 * h);
    else dw = halfs(group + packed_d_at(T, b) + 16 * h);
    __m256 mw;
    if constexpr (packed_has_offset(T)) mw = halfs(group + packed_m_at(T, b) + 16 * h);
    each<NT>([&](auto t) {
      const BlockQ8Act& xb = x[t * x_stride + b];
      __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[t]), _mm256_mul_ps(dw, _mm256_set1_ps(xb.d)), acc[t]);
      if constexpr (packed_has_offset(T)) a = _mm256_fmadd_ps(mw, _mm256_set1_ps(xb.s), a);
      acc[t] = a;
    });
  });
}

// 8 unsigned bytes as floats.
inline __m256 u8_floats(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Q4_K/Q5_K: as the AVX-512 kernel (packed_quant_avx512.cpp), 8 rows at a time.
template <DType T, int NT>
void PackedQuantLoops::gemm_kquant(const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride,
                                   float* out, int64_t out_stride, int valid_rows) {
  constexpr int kBlockBytes = kquant_unit_bytes(T) / 8;  // the group's bytes per block, on average
  const int64_t nb = cols / kQK;
  blocks_by_half<NT>(nb, out, out_stride, valid_rows, [&](int64_t b, auto h, __m256* acc) {
    if constexpr (NT <= kStreamMaxTokens)
      if (h == 0) prefetch_ahead(group + b * kBlockBytes, kBlockBytes);
    const uint8_t* dp = group + kquant_d_at(T, b / 8) + 16 * h;
    const uint8_t* sc = group + kquant_scales_at(T, b) + 8 * h;
    const __m256 ds = _mm256_mul_ps(halfs(dp), u8_floats(sc)), dm = _mm256_mul_ps(halfs(dp + 32), u8_floats(sc + 16));
    __m256i p[NT];
    quad_sums<T, NT>(group + kquant_bits_at(T, b), h, x, x_stride, b, p);
    each<NT>([&](auto t) {
      const BlockQ8Act& xb = x[t * x_stride + b];
      const __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[t]), _mm256_mul_ps(ds, _mm256_set1_ps(xb.d)), acc[t]);
      acc[t] = _mm256_fnmadd_ps(dm, _mm256_set1_ps(xb.d * (float)xb.sum), a);
    });
  });
}

// The int16 pair (v, v) in each int32 lane, from int32 lanes holding small
// values.
inline __m256i twice16(__m256i v) {
  return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
}

template <int NT>
void PackedQuantLoops::gemm_q6_k(const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride, float* out,
                                 int64_t out_stride, int valid_rows) {
  constexpr int kBlockBytes = kQ6KUnitBytes / 16;  // the group's bytes per block, on average
  const int64_t nb = cols / kQK;
  const __m256i low = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8(0x30), lo16 = _mm256_set1_epi32(0xFFFF);
  blocks_by_half<NT>(nb, out, out_stride, valid_rows, [&](int64_t b, auto h, __m256* acc) {
    if constexpr (NT <= kStreamMaxTokens)
      if (h == 0) prefetch_ahead(group + b * kBlockBytes, kBlockBytes);
    const uint8_t* bits = group + q6k_bits_at(b);
    const auto* sc = reinterpret_cast<const int8_t*>(group + q6k_scales_at(b));
    // Row r's scales: of its first 16 elements sc[r], of the rest sc[16 +
    // r].
    const __m256i s0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8 * h)));
    const __m256i s1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16 + 8 * h)));
    const __m256i sc0 = twice16(s0), sc1 = twice16(s1);
    // (-32 x scale of half 0, -32 x scale of half 1) per row, against
    // (sum_lo, sum_hi).
    const __m256i zero = _mm256_setzero_si256();
    const __m256i shift = _mm256_or_si256(_mm256_and_si256(_mm256_sub_epi32(zero, _mm256_slli_epi32(s0, 5)), lo16),
                                          _mm256_slli_epi32(_mm256_sub_epi32(zero, _mm256_slli_epi32(s1, 5)), 16));
    __m256i p[NT];
    each<NT>([&](auto t) {
      const BlockQ8Act& xb = x[t * x_stride + b];
      const int32_t sums = (int32_t)((uint32_t)(xb.sum - xb.sum_lo) << 16 | ((uint32_t)xb.sum_lo & 0xFFFF));
      p[t] = _mm256_madd_epi16(shift, _mm256_set1_epi32(sums));
    });
    each<2>([&](auto e) {  // e: which half of 16 (its elements 16e .. 16e + 15)
      const __m256i hv = load(bits + 256 + 64 * e + 32 * h);
      const __m256i hs[4] = {_mm256_slli_epi16(hv, 4), _mm256_slli_epi16(hv, 2), hv, _mm256_srli_epi16(hv, 2)};
      for (int c = 0; c < 4; c += 2) {  // two quads per int16 sum
        __m256i u[2];
        for (int k = 0; k < 2; k++) {
          __m256i nib = load(bits + 64 * (c + k) + 32 * h);
          if constexpr (e == 1) nib = _mm256_srli_epi16(nib, 4);
          u[k] = _mm256_or_si256(_mm256_and_si256(nib, low), _mm256_and_si256(hs[c + k], high));
        }
        each<NT>([&](auto t) {
          const int8_t* qs = x[t * x_stride + b].qs + 16 * e + 4 * c;
          const __m256i s16 =
              _mm256_add_epi16(_mm256_maddubs_epi16(u[0], quad(qs)), _mm256_maddubs_epi16(u[1], quad(qs + 4)));
          p[t] = _mm256_add_epi32(p[t], _mm256_madd_epi16(s16, e == 0 ? sc0 : sc1));
        });
      }
    });
    const __m256 dw = halfs(group + q6k_d_at(b / 8) + 16 * h);
    each<NT>([&](auto t) {
      acc[t] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[t]), _mm256_mul_ps(dw, _mm256_set1_ps(x[t * x_stride + b].d)), acc[t]);
    });
  });
}

}  // namespace

void fill_packed_quant_avx2(CpuKernels& k) { fill_packed_quant(k); }

}  // namespace tandem::cpu

#else

namespace tandem::cpu {
void fill_packed_quant_avx2(CpuKernels&) {}
}  // namespace tandem::cpu

#endif
