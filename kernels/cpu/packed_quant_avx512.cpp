// AVX-512 VNNI kernel over packed 16-row groups (layout in packed_quant.h). Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni; chosen only when best_isa() is Avx512.
//
// Per block: the group's 8 weight vectors are loaded (Q4: 4 loads, split into low and high
// nibbles; Q5: one more load of fifth bits merged in) once and meet each token through 8
// VPDPBUSDs whose activation operand is a 4-byte broadcast; one convert and one FMA then scale
// all 16 rows. The shift that makes weights unsigned (Q4_0 q - 8, Q5_0 q - 16, Q8_0 w + 128)
// is undone by starting each token's integer sum at -shift x sum(x), an exact integer. MXFP4's
// codes become their values + 12 by one byte shuffle per vector, and the shift undoes the 12.
#include "kernels/cpu/isa_fill.h"
#include "kernels/cpu/packed_quant.h"

#include <cstring>

#include "kernels/cpu/quant_blocks.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* placeholders.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace tandem::cpu {

namespace {

// Decode reads each weight once, so it waits on memory. The hardware prefetchers alone left
// the packed stream at 40-60% of the read probe at busy minutes on a shared host; asking for
// the bytes 4 KiB ahead (past a group's end too: groups are contiguous) lifted
// packed_stream/Q4_0 from ~11 to ~6.6 ms at 2 threads and 1B decode by ~17%, alternating.
// 8 KiB ahead into L2 (T1) rather than 4 KiB into L1 took it from 8.6 to 7.1 ms (5 rounds);
// L1 then holds only the lines being used.
constexpr int kDecodePrefetch = 8192;

inline __m512i quad(const int8_t* qs) {
  int32_t v;
  std::memcpy(&v, qs, 4);
  return _mm512_set1_epi32(v);
}

// The 8 weight vectors of one block of 4-bit (Q4) or 5-bit (Q5) quants: vector c < 4 the low
// nibbles of quads vector c, vector 4 + c its high nibbles, each with bit s of the fifth-bit
// vector moved to bit 4 (shifts within 16-bit lanes: the bit moved stays in its byte).
template <bool Five>
inline void unpack_quads(const uint8_t* quads, __m512i w[8]) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int c = 0; c < 4; c++) {
    const __m512i v = _mm512_load_si512(quads + 64 * c);
    w[c] = _mm512_and_si512(v, low);
    w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
  }
  if constexpr (Five) {
    const __m512i hb = _mm512_load_si512(quads + 256), bit4 = _mm512_set1_epi8(0x10);
    for (int c = 0; c < 4; c++) {  // 0xF8: w | (shifted & bit4)
      w[c] = _mm512_ternarylogic_epi32(w[c], _mm512_slli_epi16(hb, 4 - c), bit4, 0xF8);
      w[c + 4] = _mm512_ternarylogic_epi32(w[c + 4], _mm512_srli_epi16(hb, c), bit4, 0xF8);
    }
  }
}

// The 16 rows' MXFP4 scales (E8M0 bytes) as mxfp4_scale gives them: 2^(e - 128) by VSCALEFPS,
// exact (e 0 and 1 subnormal, 255 finite).
inline __m512 mxfp4_scales(const uint8_t* e) {
  const __m512i e32 = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(e)));
  return _mm512_scalef_ps(_mm512_set1_ps(1.0f), _mm512_cvtepi32_ps(_mm512_sub_epi32(e32, _mm512_set1_epi32(128))));
}

template <DType T, int NT>
void PackedQuantLoops::gemm(const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride, float* out,
                            int64_t out_stride, int valid_rows) {
  constexpr int kShift = packed_shift(T);
  const int64_t nb = cols / kQK;
  // MXFP4: each code's value + 12 (0..24), looked up in every 128-bit lane.
  const __m512i values = _mm512_add_epi8(
      _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Values))),
      _mm512_set1_epi8(packed_shift(DType::MXFP4)));
  __m512 acc[NT];
  for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* quads = group + packed_quads_at(T, b);
    if constexpr (NT <= kStreamMaxTokens)  // streaming: the block 8 KiB ahead (kDecodePrefetch)
      for (int line = 0; line < packed_unit_bytes(T) / packed_unit_blocks(T); line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(quads) + kDecodePrefetch + line, _MM_HINT_T1);
    __m512i w[8];
    if constexpr (T == DType::Q8_0) {
      for (int s = 0; s < 8; s++) w[s] = _mm512_load_si512(quads + 64 * s);
    } else {
      unpack_quads<packed_five_bits(T)>(quads, w);
      if constexpr (T == DType::MXFP4)
        for (int s = 0; s < 8; s++) w[s] = _mm512_shuffle_epi8(values, w[s]);
    }
    __m512 dw;
    if constexpr (T == DType::MXFP4) dw = mxfp4_scales(group + packed_d_at(T, b));
    else dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(group + packed_d_at(T, b))));
    __m512 mw;
    if constexpr (packed_has_offset(T))
      mw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(group + packed_m_at(T, b))));
    // The tokens' integer sums side by side, weight vector by weight vector: NT independent
    // VPDPBUSD chains in program order, where one token's 8 dependent steps in a row left
    // overlapping them to the out-of-order window (the sums are exact, so order is free).
    __m512i p[NT];
    for (int t = 0; t < NT; t++)
      p[t] = kShift ? _mm512_set1_epi32(-kShift * x[t * x_stride + b].sum) : _mm512_setzero_si512();
    for (int s = 0; s < 8; s++)
      for (int t = 0; t < NT; t++) p[t] = _mm512_dpbusd_epi32(p[t], w[s], quad(x[t * x_stride + b].qs + 4 * s));
    for (int t = 0; t < NT; t++) {
      const BlockQ8Act& xb = x[t * x_stride + b];
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[t]), _mm512_mul_ps(dw, _mm512_set1_ps(xb.d)), acc[t]);
      if constexpr (packed_has_offset(T)) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xb.s), acc[t]);
    }
  }
  const __mmask16 mask = valid_rows >= kPackRows ? (__mmask16)0xFFFF : (__mmask16)((1u << valid_rows) - 1);
  for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(out + t * out_stride, mask, acc[t]);
}

// Q4_K/Q5_K (layout in packed_quant.h): the quants as Q4_0/Q5_0 (unsigned, no shift); per
// block the rows' d sc and dmin m (exact floats) are made once for all tokens, and each token
// adds float(p) (d sc dx) and subtracts (dmin m)(dx sum x).
template <DType T, int NT>
void PackedQuantLoops::gemm_kquant(const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride,
                                   float* out, int64_t out_stride, int valid_rows) {
  constexpr int kBlockBytes = kquant_unit_bytes(T) / 8;  // the group's bytes per block, on average
  const int64_t nb = cols / kQK;
  __m512 acc[NT];
  for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
  __m512 d = _mm512_setzero_ps(), dmin = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    if constexpr (NT <= kStreamMaxTokens)  // streaming: 8 KiB ahead of this block's share of the group
      for (int line = 0; line < kBlockBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(group) + b * kBlockBytes + kDecodePrefetch + line, _MM_HINT_T1);
    if (b % 8 == 0) {
      const uint8_t* dp = group + kquant_d_at(T, b / 8);
      d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(dp)));
      dmin = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(dp + 32)));
    }
    __m512i w[8];
    unpack_quads<packed_five_bits(T)>(group + kquant_bits_at(T, b), w);
    const uint8_t* sc = group + kquant_scales_at(T, b);
    const __m512 ds = _mm512_mul_ps(
        d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc)))));
    const __m512 dm = _mm512_mul_ps(
        dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 16)))));
    __m512i p[NT];  // side by side, as in gemm
    for (int t = 0; t < NT; t++) p[t] = _mm512_setzero_si512();
    for (int s = 0; s < 8; s++)
      for (int t = 0; t < NT; t++) p[t] = _mm512_dpbusd_epi32(p[t], w[s], quad(x[t * x_stride + b].qs + 4 * s));
    for (int t = 0; t < NT; t++) {
      const BlockQ8Act& xb = x[t * x_stride + b];
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[t]), _mm512_mul_ps(ds, _mm512_set1_ps(xb.d)), acc[t]);
      acc[t] = _mm512_fnmadd_ps(dm, _mm512_set1_ps(xb.d * (float)xb.sum), acc[t]);
    }
  }
  const __mmask16 mask = valid_rows >= kPackRows ? (__mmask16)0xFFFF : (__mmask16)((1u << valid_rows) - 1);
  for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(out + t * out_stride, mask, acc[t]);
}

// Q6_K (layout in packed_quant.h): per block, 4 nibble loads and 2 high-part loads rebuild
// the 8 weight vectors. Masking a high-part vector with 0x33 and 0xCC leaves fields 0, 2 and
// 1, 3 with zeros around them, so one 16-bit shift moves each field to bits 4-5 without
// dragging a neighbour into bits 6-7, and one ternary-logic op merges it under the nibble.
// Each half of 16 sums on its own (VPDPBUSD from -32 x its activation sum) and takes its
// row's int8 scale as an exact integer multiply.
template <int NT>
void PackedQuantLoops::gemm_q6_k(const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride, float* out,
                                 int64_t out_stride, int valid_rows) {
  constexpr int kBlockBytes = kQ6KUnitBytes / 16;  // the group's bytes per block, on average
  const int64_t nb = cols / kQK;
  const __m512i low = _mm512_set1_epi8(0x0F), even = _mm512_set1_epi8(0x33), odd = _mm512_set1_epi8((char)0xCC);
  __m512 acc[NT];
  for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
  __m512 dw = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    if constexpr (NT <= kStreamMaxTokens)  // streaming: 8 KiB ahead of this block's share of the group
      for (int line = 0; line < kBlockBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(group) + b * kBlockBytes + kDecodePrefetch + line, _MM_HINT_T1);
    if (b % 8 == 0)
      dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(group + q6k_d_at(b / 8))));
    const uint8_t* bits = group + q6k_bits_at(b);
    __m512i w[8];
    for (int e = 0; e < 2; e++) {
      const __m512i h = _mm512_load_si512(bits + 256 + 64 * e);
      const __m512i he = _mm512_and_si512(h, even), ho = _mm512_and_si512(h, odd);
      const __m512i hs[4] = {_mm512_slli_epi16(he, 4), _mm512_slli_epi16(ho, 2), he, _mm512_srli_epi16(ho, 2)};
      for (int c = 0; c < 4; c++) {
        __m512i nib = _mm512_load_si512(bits + 64 * c);
        if (e == 1) nib = _mm512_srli_epi16(nib, 4);
        w[4 * e + c] = _mm512_ternarylogic_epi32(nib, hs[c], low, 0xE4);  // low ? nib : hs
      }
    }
    const int8_t* sc = reinterpret_cast<const int8_t*>(group + q6k_scales_at(b));
    const __m512i sc0 = _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc)));
    const __m512i sc1 = _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 16)));
    for (int t = 0; t < NT; t++) {
      const BlockQ8Act& xb = x[t * x_stride + b];
      __m512i p0 = _mm512_set1_epi32(-32 * xb.sum_lo), p1 = _mm512_set1_epi32(-32 * (xb.sum - xb.sum_lo));
      for (int s = 0; s < 4; s++) {
        p0 = _mm512_dpbusd_epi32(p0, w[s], quad(xb.qs + 4 * s));
        p1 = _mm512_dpbusd_epi32(p1, w[s + 4], quad(xb.qs + 16 + 4 * s));
      }
      const __m512i p = _mm512_add_epi32(_mm512_mullo_epi32(p0, sc0), _mm512_mullo_epi32(p1, sc1));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, _mm512_set1_ps(xb.d)), acc[t]);
    }
  }
  const __mmask16 mask = valid_rows >= kPackRows ? (__mmask16)0xFFFF : (__mmask16)((1u << valid_rows) - 1);
  for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(out + t * out_stride, mask, acc[t]);
}

}  // namespace

void fill_packed_quant_avx512(CpuKernels& k) { fill_packed_quant(k); }

}  // namespace tandem::cpu

#else

namespace tandem::cpu {
void fill_packed_quant_avx512(CpuKernels&) {}
}  // namespace tandem::cpu

#endif
