#include "kernels/cpu/packed_quant.h"

#include <cmath>
#include <cstring>
#include <new>
#include <type_traits>


#include "core/fp16.h"
#include "core/huge_pages.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/work_team.h"

namespace tandem::cpu {

namespace {

// Scale, offset and the 32 elements' stored bytes of block b of one GGUF row.
struct RawBlock {
  uint16_t d = 0, m = 0;  // MXFP4: d is the E8M0 byte
  const uint8_t* qs = nullptr;  // Q8_0: 32 signed bytes; Q4/Q5: 16 nibble pairs
  const uint8_t* qh = nullptr;  // Q5: the 32 fifth bits
};

RawBlock raw_block(DType t, const uint8_t* row, int64_t b) {
  switch (t) {
    case DType::Q4_0: {
      const auto& w = reinterpret_cast<const BlockQ4_0*>(row)[b];
      return {w.d, 0, w.qs};
    }
    case DType::Q4_1: {
      const auto& w = reinterpret_cast<const BlockQ4_1*>(row)[b];
      return {w.d, w.m, w.qs};
    }
    case DType::Q5_0: {
      const auto& w = reinterpret_cast<const BlockQ5_0*>(row)[b];
      return {w.d, 0, w.qs, w.qh};
    }
    case DType::Q5_1: {
      const auto& w = reinterpret_cast<const BlockQ5_1*>(row)[b];
      return {w.d, w.m, w.qs, w.qh};
    }
    case DType::MXFP4: {
      const auto& w = reinterpret_cast<const BlockMxfp4*>(row)[b];
      return {w.e, 0, w.qs};
    }
    default: {
      const auto& w = reinterpret_cast<const BlockQ8_0*>(row)[b];
      return {w.d, 0, reinterpret_cast<const uint8_t*>(w.qs)};
    }
  }
}

// Row r's 32 quants q (0..15, or 0..31 with five_bits) of one block into its quad vectors
// (packed_quant.h): element 4c + k is the low nibble of byte k of vector c, element
// 16 + 4c + k its high nibble, and the fifth bit of the element that vector s holds is bit s.
void put_quants(const uint8_t q[32], int r, bool five_bits, uint8_t* quads) {
  for (int c = 0; c < 4; c++)
    for (int k = 0; k < 4; k++) quads[64 * c + 4 * r + k] = (uint8_t)((q[4 * c + k] & 0xF) | (q[16 + 4 * c + k] & 0xF) << 4);
  if (!five_bits) return;
  for (int k = 0; k < 4; k++) {
    int v = 0;
    for (int c = 0; c < 4; c++) v |= (q[4 * c + k] >> 4 & 1) << c | (q[16 + 4 * c + k] >> 4 & 1) << (4 + c);
    quads[256 + 4 * r + k] = (uint8_t)v;
  }
}

// Row r of a group from its GGUF Q4_K or Q5_K row, in the layout of packed_quant.h.
template <DType T>
void pack_kquant_row(const uint8_t* row, int64_t cols, int r, uint8_t* group) {
  using Block = std::conditional_t<T == DType::Q4_K, BlockQ4_K, BlockQ5_K>;
  const auto* sbs = reinterpret_cast<const Block*>(row);
  for (int64_t sb = 0; sb < cols / kQK_K; sb++) {
    const Block& w = sbs[sb];
    std::memcpy(group + kquant_d_at(T, sb) + 2 * r, &w.d, 2);
    std::memcpy(group + kquant_d_at(T, sb) + 32 + 2 * r, &w.dmin, 2);
    for (int s = 0; s < 8; s++) {  // sub-block s: nibble s % 2 of qs[32 (s / 2) + l], fifth bit s of qh[l]
      uint8_t q[32];
      for (int l = 0; l < 32; l++) {
        const uint8_t byte = w.qs[32 * (s / 2) + l];
        q[l] = s % 2 ? byte >> 4 : byte & 0xF;
        if constexpr (T == DType::Q5_K) q[l] |= (w.qh[l] >> s & 1) << 4;
      }
      const int64_t b = sb * 8 + s;
      put_quants(q, r, T == DType::Q5_K, group + kquant_bits_at(T, b));
      q4_k_scale_min(s, w.scales, group + kquant_scales_at(T, b) + r, group + kquant_scales_at(T, b) + 16 + r);
    }
  }
}

// Row r of a group from its GGUF Q6_K row, in the layout of packed_quant.h. Each packed byte
// is assembled whole (two 4-bit lows, or four 2-bit highs) and stored once: loading a 1B
// model's 128k-row Q6_K head was most of its load time when every element OR-ed into place.
void pack_q6_k_row(const uint8_t* row, int64_t cols, int r, uint8_t* group) {
  const auto* sbs = reinterpret_cast<const BlockQ6_K*>(row);
  for (int64_t sb = 0; sb < cols / kQK_K; sb++) {
    const BlockQ6_K& w = sbs[sb];
    std::memcpy(group + q6k_d_at(sb) + 2 * r, &w.d, 2);
    for (int h = 0; h < 2; h++)
      for (int k = 0; k < 4; k++) {  // element e = 128 h + 32 k + m is in block sb * 8 + 4 h + k
        uint8_t* bits = group + q6k_bits_at(sb * 8 + 4 * h + k);
        const uint8_t* ql = w.ql + 64 * h + (k & 1) * 32;  // GGUF: ql nibble k / 2, qh bits 2k
        const uint8_t* qh = w.qh + 32 * h;
        const int lo_shift = k < 2 ? 0 : 4;
        auto lo = [&](int m) { return (ql[m] >> lo_shift) & 0xF; };
        auto hi = [&](int m) { return (qh[m] >> (2 * k)) & 3; };
        for (int c = 0; c < 4; c++)  // m = 16 half + 4 c + j: half picks the nibble
          for (int j = 0; j < 4; j++) bits[64 * c + 4 * r + j] = (uint8_t)(lo(4 * c + j) | lo(16 + 4 * c + j) << 4);
        for (int half = 0; half < 2; half++)  // c picks the 2-bit field
          for (int j = 0; j < 4; j++) {
            int v = 0;
            for (int c = 0; c < 4; c++) v |= hi(16 * half + 4 * c + j) << (2 * c);
            bits[256 + 64 * half + 4 * r + j] = (uint8_t)v;
          }
      }
    for (int j = 0; j < 8; j++)
      for (int half = 0; half < 2; half++)
        group[q6k_scales_at(sb * 8 + j) + 16 * half + r] = (uint8_t)w.scales[2 * j + half];
  }
}

// Rows of group g of a Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/MXFP4 matrix, the type fixed at compile time.
template <DType T>
void pack_quant_group(const uint8_t* data, int64_t g, int64_t rows, int64_t nb, size_t row_bytes, uint8_t* group) {
  for (int r = 0; r < kPackRows && g * kPackRows + r < rows; r++) {
    const uint8_t* row = data + (size_t)(g * kPackRows + r) * row_bytes;
    for (int64_t b = 0; b < nb; b++) {
      const RawBlock w = raw_block(T, row, b);
      uint8_t* quads = group + packed_quads_at(T, b);
      if constexpr (T == DType::MXFP4) group[packed_d_at(T, b) + r] = (uint8_t)w.d;
      else std::memcpy(group + packed_d_at(T, b) + 2 * r, &w.d, 2);
      if constexpr (packed_has_offset(T)) std::memcpy(group + packed_m_at(T, b) + 2 * r, &w.m, 2);
      if constexpr (T == DType::Q8_0) {
        for (int s = 0; s < 8; s++)
          for (int k = 0; k < 4; k++) quads[64 * s + 4 * r + k] = w.qs[4 * s + k] ^ 0x80;
      } else if constexpr (packed_five_bits(T)) {
        uint8_t q[32];
        for (int j = 0; j < 16; j++) {
          q[j] = (uint8_t)((w.qs[j] & 0xF) | (w.qh[j / 8] >> (j % 8) & 1) << 4);
          q[j + 16] = (uint8_t)((w.qs[j] >> 4) | (w.qh[2 + j / 8] >> (j % 8) & 1) << 4);
        }
        put_quants(q, r, true, quads);
      } else {
        for (int c = 0; c < 4; c++) std::memcpy(quads + 64 * c + 4 * r, w.qs + 4 * c, 4);
      }
    }
  }
}

}  // namespace

std::shared_ptr<uint8_t[]> allocate_packed(size_t bytes) {
  std::shared_ptr<uint8_t[]> mem = allocate_huge_pages(bytes, true);
  if (!mem) throw std::bad_alloc();
  return mem;
}

bool can_pack(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::MXFP4: return true;
    default: return false;
  }
}

size_t packed_group_bytes(DType t, int64_t cols) {
  if (!can_pack(t)) return 0;
  if (t == DType::Q6_K) return (size_t)(cols / kQK_K + 1) / 2 * kQ6KUnitBytes;
  if (packed_kquant(t)) return (size_t)(cols / kQK_K) * kquant_unit_bytes(t);
  const int64_t nb = cols / kQK;
  const int u = packed_unit_blocks(t);
  return (size_t)(nb + u - 1) / u * packed_unit_bytes(t);  // whole units: every group starts on a cache line
}

std::shared_ptr<uint8_t[]> pack_rows(DType t, const uint8_t* data, int64_t rows, int64_t cols, size_t row_bytes) {
  const int64_t nb = cols / kQK, groups = (rows + kPackRows - 1) / kPackRows;
  const size_t gbytes = packed_group_bytes(t, cols), total = (size_t)groups * gbytes;
  std::shared_ptr<uint8_t[]> out = allocate_packed(total);
  uint8_t* mem = out.get();
  // On the backend's team when packing runs in its scope: a 1B model's Q6_K output alone is
  // 8016 groups.
  parallel_for(groups, Split{16, 0}, [&](int64_t g0, int64_t g1, int) {
    for (int64_t g = g0; g < g1; g++) {
      uint8_t* group = mem + g * gbytes;
      switch (t) {
        case DType::Q6_K:
          for (int r = 0; r < kPackRows && g * kPackRows + r < rows; r++)
            pack_q6_k_row(data + (size_t)(g * kPackRows + r) * row_bytes, cols, r, group);
          break;
        case DType::Q4_K:
          for (int r = 0; r < kPackRows && g * kPackRows + r < rows; r++)
            pack_kquant_row<DType::Q4_K>(data + (size_t)(g * kPackRows + r) * row_bytes, cols, r, group);
          break;
        case DType::Q5_K:
          for (int r = 0; r < kPackRows && g * kPackRows + r < rows; r++)
            pack_kquant_row<DType::Q5_K>(data + (size_t)(g * kPackRows + r) * row_bytes, cols, r, group);
          break;
        case DType::Q4_0: pack_quant_group<DType::Q4_0>(data, g, rows, nb, row_bytes, group); break;
        case DType::Q4_1: pack_quant_group<DType::Q4_1>(data, g, rows, nb, row_bytes, group); break;
        case DType::Q5_0: pack_quant_group<DType::Q5_0>(data, g, rows, nb, row_bytes, group); break;
        case DType::Q5_1: pack_quant_group<DType::Q5_1>(data, g, rows, nb, row_bytes, group); break;
        case DType::MXFP4: pack_quant_group<DType::MXFP4>(data, g, rows, nb, row_bytes, group); break;
        default: pack_quant_group<DType::Q8_0>(data, g, rows, nb, row_bytes, group); break;
      }
    }
  });
  return out;
}

// Per (row, token): p = -shift x sum(x) + sum over the block of u8 weight x s8 activation
// (exact), then acc = fma(float(p), d_w * d_x, acc), then for Q4_1/Q5_1 acc = fma(m_w, s_x, acc).
// Q4_K/Q5_K per (row, token) and block: p = sum of u x x (exact), then
// acc = fma(float(p), (d_w sc) d_x, acc), then acc = fma(-(dmin_w m), d_x float(sum(x)), acc).
// Q6_K per (row, token) and block: p_h = -32 x sum(x half h) + sum over half h of u x x
// (exact), p = p_0 x scale_0 + p_1 x scale_1, then acc = fma(float(p), d_w * d_x, acc).
static void packed_gemm_q6_k_scalar(const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride,
                                    int n_tokens, float* out, int64_t out_stride, int valid_rows) {
  for (int tok = 0; tok < n_tokens; tok++)
    for (int r = 0; r < valid_rows; r++) {
      float acc = 0.0f;
      for (int64_t b = 0; b < cols / kQK; b++) {
        const BlockQ8Act& xb = x[tok * x_stride + b];
        const uint8_t* bits = group + q6k_bits_at(b);
        const auto* sc = reinterpret_cast<const int8_t*>(group + q6k_scales_at(b));
        const auto* d = reinterpret_cast<const uint16_t*>(group + q6k_d_at(b / 8));
        int32_t p[2] = {-32 * xb.sum_lo, -32 * (xb.sum - xb.sum_lo)};
        for (int s = 0; s < 8; s++)
          for (int k = 0; k < 4; k++) {
            const int byte = 4 * r + k;
            const int lo = s < 4 ? bits[64 * s + byte] & 0xF : bits[64 * (s - 4) + byte] >> 4;
            const int hi = (bits[256 + 64 * (s / 4) + byte] >> (2 * (s % 4))) & 3;
            p[s / 4] += (lo | hi << 4) * xb.qs[4 * s + k];
          }
        const int32_t sum = p[0] * sc[r] + p[1] * sc[16 + r];
        acc = std::fma((float)sum, fp16_to_fp32(d[r]) * xb.d, acc);
      }
      out[tok * out_stride + r] = acc;
    }
}

// sum over one block of row r's stored quants u times the token's quants (MXFP4: its codes'
// values shifted by 12).
static int32_t quad_dot(DType t, const uint8_t* quads, int r, const int8_t* xq) {
  int32_t p = 0;
  for (int s = 0; s < 8; s++)
    for (int k = 0; k < 4; k++) {
      const int byte = 4 * r + k;
      int u;
      if (t == DType::Q8_0) u = quads[64 * s + byte];
      else u = s < 4 ? quads[64 * s + byte] & 0xF : quads[64 * (s - 4) + byte] >> 4;
      if (packed_five_bits(t)) u |= (quads[256 + byte] >> s & 1) << 4;
      if (t == DType::MXFP4) u = kMxfp4Values[u] + packed_shift(t);
      p += u * xq[4 * s + k];
    }
  return p;
}

static void packed_gemm_kquant_scalar(DType t, const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride,
                                      int n_tokens, float* out, int64_t out_stride, int valid_rows) {
  for (int tok = 0; tok < n_tokens; tok++)
    for (int r = 0; r < valid_rows; r++) {
      float acc = 0.0f;
      for (int64_t b = 0; b < cols / kQK; b++) {
        const BlockQ8Act& xb = x[tok * x_stride + b];
        const uint8_t* sc = group + kquant_scales_at(t, b);
        const auto* d = reinterpret_cast<const uint16_t*>(group + kquant_d_at(t, b / 8));
        const int32_t p = quad_dot(t, group + kquant_bits_at(t, b), r, xb.qs);
        const float ds = fp16_to_fp32(d[r]) * (float)sc[r], dm = fp16_to_fp32(d[16 + r]) * (float)sc[16 + r];
        acc = std::fma((float)p, ds * xb.d, acc);
        acc = std::fma(-dm, xb.d * (float)xb.sum, acc);
      }
      out[tok * out_stride + r] = acc;
    }
}

void packed_gemm_scalar(DType t, const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride,
                        int n_tokens, float* out, int64_t out_stride, int valid_rows) {
  if (t == DType::Q6_K) return packed_gemm_q6_k_scalar(group, cols, x, x_stride, n_tokens, out, out_stride, valid_rows);
  if (packed_kquant(t))
    return packed_gemm_kquant_scalar(t, group, cols, x, x_stride, n_tokens, out, out_stride, valid_rows);
  const int64_t nb = cols / kQK;
  const int shift = packed_shift(t);
  for (int tok = 0; tok < n_tokens; tok++)
    for (int r = 0; r < valid_rows; r++) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; b++) {
        const BlockQ8Act& xb = x[tok * x_stride + b];
        const auto* d = reinterpret_cast<const uint16_t*>(group + packed_d_at(t, b));
        const auto* m = reinterpret_cast<const uint16_t*>(group + packed_m_at(t, b));
        const int32_t p = -shift * xb.sum + quad_dot(t, group + packed_quads_at(t, b), r, xb.qs);
        const float dw = t == DType::MXFP4 ? mxfp4_scale(group[packed_d_at(t, b) + r]) : fp16_to_fp32(d[r]);
        const float scale = dw * xb.d;
        acc = std::fma((float)p, scale, acc);
        if (packed_has_offset(t)) acc = std::fma(fp16_to_fp32(m[r]), xb.s, acc);
      }
      out[tok * out_stride + r] = acc;
    }
}

}  // namespace tandem::cpu
