// The matrix-vector kernels' work units: the piece of a weight row one lane loads with 128-bit
// loads (a "unit"), and its dot product with one token's activations. Written once for host
// and device, so the CPU tests run these exact functions (with __dp4a emulated) against a
// float64 reference, and the kernels (cuda_matmul_matvec.cu) only add the indexing and the
// warp reduction around them.
//
// Quantized types multiply int8 weights (nibbles, or q - 32 for Q6_K) with 8-bit activations
// (q8_1: per 32 elements, int8 q, scale d, s = d * sum(q)) four at a time with dp4a, and apply
// the weight's scales per block:
//   Q4_0  sum d_w (q - 8) d_a a        = d_w (d_a dot(q, a) - 8 s_a)
//   Q4_1  sum (d_w q + m) d_a a        = d_w d_a dot(q, a) + m s_a
//   Q8_0  sum d_w q d_a a              = d_w d_a dot(q, a)
//   Q4_K  sub-block j: sum (d sc_j q - dmin m_j) d_a a = d sc_j d_a dot(q, a) - dmin m_j s_a
//   Q6_K  16 elements with scale sc: sum d sc (q - 32) d_a a = d sc d_a dot(q - 32, a)
#pragma once

#include <cstring>

#include "backend/cuda/cuda_matmul_layout.cuh"

namespace tandem::cuda {

// ---- integer helpers (the device instructions; plain loops on the host) ----

// c + the dot product of a's and b's four signed bytes.
TANDEM_HD int dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(a, b, c);
#else
  for (int k = 0; k < 4; k++) c += (int)(int8_t)(a >> (8 * k)) * (int)(int8_t)(b >> (8 * k));
  return c;
#endif
}

// Bytewise a - b, each byte wrapping (q - 32 of 0..63 gives the signed byte -32..31).
TANDEM_HD int vsub4(int a, int b) {
#ifdef __CUDA_ARCH__
  return (int)__vsub4((unsigned)a, (unsigned)b);
#else
  unsigned r = 0;
  for (int k = 0; k < 4; k++) r |= ((((unsigned)a >> (8 * k)) - ((unsigned)b >> (8 * k))) & 0xFFu) << (8 * k);
  return (int)r;
#endif
}

TANDEM_HD int4 load16(const void* p) {
#ifdef __CUDA_ARCH__
  return *static_cast<const int4*>(p);
#else
  int4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}
TANDEM_HD int word(const int4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// One token's activations as the units read them.
struct ActRow {
  const int8_t* q = nullptr;   // [cols] int8 (quantized types)
  const float2* ds = nullptr;  // [cols / 32] {d, s} (quantized types)
  const float* x = nullptr;    // [cols] F32 (plain types)
};

// dot of 16 int8 weights (4 words) with 16 int8 activations.
TANDEM_HD int dot16(int w0, int w1, int w2, int w3, const int4& a) {
  return dp4a(w3, a.w, dp4a(w2, a.z, dp4a(w1, a.y, dp4a(w0, a.x, 0))));
}

// ---- the units, one per type: units_per_row(cols), load(w, row, u), dot(act) ----

// Sum over a Q4 block of nibble x int8 activation: the 16 low nibbles meet activations 0..15,
// the 16 high nibbles 16..31 (GGML's Q4_0/Q4_1 order).
TANDEM_HD int nibble_dot(int4 q, const ActRow& a, int64_t u) {
  const int4 a0 = load16(a.q + u * 32), a1 = load16(a.q + u * 32 + 16);
  const int lo = dot16(q.x & 0x0F0F0F0F, q.y & 0x0F0F0F0F, q.z & 0x0F0F0F0F, q.w & 0x0F0F0F0F, a0);
  const int hi = dot16((q.x >> 4) & 0x0F0F0F0F, (q.y >> 4) & 0x0F0F0F0F, (q.z >> 4) & 0x0F0F0F0F,
                       (q.w >> 4) & 0x0F0F0F0F, a1);
  return lo + hi;
}

struct UnitQ4_0 {  // one block: 16 quant bytes
  static constexpr int kUnroll = 4;
  int4 q;
  float d;
  TANDEM_HD static int64_t units_per_row(int64_t cols) { return cols / 32; }
  TANDEM_HD static UnitQ4_0 load(const WeightView& w, int64_t row, int64_t u) {
    return {load16(w.quants + row * w.q_row_bytes + u * 16), half_bits_to_float(load_u16(w.meta + row * w.m_row_bytes + u * 2))};
  }
  TANDEM_HD float dot(const ActRow& a, int64_t u) const {
    const int sum = nibble_dot(q, a, u);
    const float2 ds = a.ds[u];
    return d * (ds.x * (float)sum - 8.0f * ds.y);
  }
};

struct UnitQ4_1 {  // one block: 16 quant bytes
  static constexpr int kUnroll = 4;
  int4 q;
  float d, m;
  TANDEM_HD static int64_t units_per_row(int64_t cols) { return cols / 32; }
  TANDEM_HD static UnitQ4_1 load(const WeightView& w, int64_t row, int64_t u) {
    const uint8_t* meta = w.meta + row * w.m_row_bytes + u * 4;
    return {load16(w.quants + row * w.q_row_bytes + u * 16), half_bits_to_float(load_u16(meta)),
            half_bits_to_float(load_u16(meta + 2))};
  }
  TANDEM_HD float dot(const ActRow& a, int64_t u) const {
    const int sum = nibble_dot(q, a, u);
    const float2 ds = a.ds[u];
    return d * ds.x * (float)sum + m * ds.y;
  }
};

struct UnitQ8_0 {  // one block: 32 quant bytes
  static constexpr int kUnroll = 2;
  int4 q0, q1;
  float d;
  TANDEM_HD static int64_t units_per_row(int64_t cols) { return cols / 32; }
  TANDEM_HD static UnitQ8_0 load(const WeightView& w, int64_t row, int64_t u) {
    const uint8_t* q = w.quants + row * w.q_row_bytes + u * 32;
    return {load16(q), load16(q + 16), half_bits_to_float(load_u16(w.meta + row * w.m_row_bytes + u * 2))};
  }
  TANDEM_HD float dot(const ActRow& a, int64_t u) const {
    const int4 a0 = load16(a.q + u * 32), a1 = load16(a.q + u * 32 + 16);
    const int s = dot16(q0.x, q0.y, q0.z, q0.w, a0) + dot16(q1.x, q1.y, q1.z, q1.w, a1);
    return d * a.ds[u].x * (float)s;
  }
};

// A quarter of a super-block: 32 quant bytes holding sub-blocks 2k (low nibbles) and 2k + 1
// (high nibbles), k = u % 4.
struct UnitQ4_K {
  static constexpr int kUnroll = 2;
  int4 q0, q1;       // quant bytes 0-15 and 16-31
  float dsc0, dmn0;  // d * scale and dmin * min of sub-block 2k
  float dsc1, dmn1;  // and of 2k + 1
  TANDEM_HD static int64_t units_per_row(int64_t cols) { return cols / 64; }
  TANDEM_HD static UnitQ4_K load(const WeightView& w, int64_t row, int64_t u) {
    const int64_t sb = u / 4;
    const int k = (int)(u % 4);
    const uint8_t* q = w.quants + row * w.q_row_bytes + sb * 128 + k * 32;
    const uint8_t* meta = w.meta + row * w.m_row_bytes + sb * 16;
    const float d = half_bits_to_float(load_u16(meta)), dmin = half_bits_to_float(load_u16(meta + 2));
    int sc0, m0, sc1, m1;
    q4_k_scale_min(2 * k, meta + 4, &sc0, &m0);
    q4_k_scale_min(2 * k + 1, meta + 4, &sc1, &m1);
    return {load16(q), load16(q + 16), d * (float)sc0, dmin * (float)m0, d * (float)sc1, dmin * (float)m1};
  }
  TANDEM_HD float dot(const ActRow& a, int64_t u) const {
    const int64_t b0 = u * 2;  // activation blocks of sub-blocks 2k and 2k + 1: (sb * 8 + 2k) = 2u
    const int4 a00 = load16(a.q + b0 * 32), a01 = load16(a.q + b0 * 32 + 16);
    const int4 a10 = load16(a.q + b0 * 32 + 32), a11 = load16(a.q + b0 * 32 + 48);
    const int s0 = dot16(q0.x & 0x0F0F0F0F, q0.y & 0x0F0F0F0F, q0.z & 0x0F0F0F0F, q0.w & 0x0F0F0F0F, a00) +
                   dot16(q1.x & 0x0F0F0F0F, q1.y & 0x0F0F0F0F, q1.z & 0x0F0F0F0F, q1.w & 0x0F0F0F0F, a01);
    const int s1 = dot16((q0.x >> 4) & 0x0F0F0F0F, (q0.y >> 4) & 0x0F0F0F0F, (q0.z >> 4) & 0x0F0F0F0F,
                         (q0.w >> 4) & 0x0F0F0F0F, a10) +
                   dot16((q1.x >> 4) & 0x0F0F0F0F, (q1.y >> 4) & 0x0F0F0F0F, (q1.z >> 4) & 0x0F0F0F0F,
                         (q1.w >> 4) & 0x0F0F0F0F, a11);
    const float2 ds0 = a.ds[b0], ds1 = a.ds[b0 + 1];
    return dsc0 * ds0.x * (float)s0 - dmn0 * ds0.y + dsc1 * ds1.x * (float)s1 - dmn1 * ds1.y;
  }
};

// 64 elements of a Q6_K super-block: in half h (of 128 elements), positions l0..l0+15 of each
// of its four 32-element quarters i (ql byte l0 + (i & 1) * 32, nibble i >> 1; qh byte l0, bits
// 2i..2i+1). Each quarter's 16 elements share one scale (index h * 8 + l0 / 16 + 2i).
struct UnitQ6_K {
  static constexpr int kUnroll = 2;
  int4 ql_lo, ql_hi, qh;  // ql[l0..l0+15], ql[l0+32..l0+47], qh[l0..l0+15] of half h
  float dsc[4];           // d * scale of each quarter
  TANDEM_HD static int64_t units_per_row(int64_t cols) { return cols / 64; }
  TANDEM_HD static UnitQ6_K load(const WeightView& w, int64_t row, int64_t u) {
    const int64_t sb = u / 4;
    const int h = (int)(u % 4) / 2, l0 = (int)(u % 2) * 16;
    const uint8_t* q = w.quants + row * w.q_row_bytes + sb * 192;
    const uint8_t* meta = w.meta + row * w.m_row_bytes + sb * 18;
    const float d = half_bits_to_float(load_u16(meta + 16));
    UnitQ6_K r;
    r.ql_lo = load16(q + h * 64 + l0);
    r.ql_hi = load16(q + h * 64 + 32 + l0);
    r.qh = load16(q + 128 + h * 32 + l0);
    for (int i = 0; i < 4; i++) r.dsc[i] = d * (float)(int8_t)meta[h * 8 + l0 / 16 + 2 * i];
    return r;
  }
  // The four bytes of quarter i at word c, as signed q - 32.
  TANDEM_HD int quarter_word(int i, int c) const {
    const int lo = word(i & 1 ? ql_hi : ql_lo, c), hi = word(qh, c);
    const int v = ((lo >> ((i >> 1) * 4)) & 0x0F0F0F0F) | (((hi >> (2 * i)) & 0x03030303) << 4);
    return vsub4(v, 0x20202020);
  }
  TANDEM_HD float dot(const ActRow& a, int64_t u) const {
    const int64_t sb = u / 4;
    const int h = (int)(u % 4) / 2, l0 = (int)(u % 2) * 16;
    float sum = 0.0f;
    for (int i = 0; i < 4; i++) {
      const int64_t b = sb * 8 + h * 4 + i;  // the activation block of quarter i
      const int4 x = load16(a.q + b * 32 + l0);
      const int s = dot16(quarter_word(i, 0), quarter_word(i, 1), quarter_word(i, 2), quarter_word(i, 3), x);
      sum += dsc[i] * a.ds[b].x * (float)s;
    }
    return sum;
  }
};

// Plain types against F32 activations (float accumulate).
// 8 16-bit floats, F16 or BF16.
template <bool BF16>
struct UnitHalf16 {
  static constexpr int kUnroll = 2;
  int4 v;
  TANDEM_HD static int64_t units_per_row(int64_t cols) { return cols / 8; }
  TANDEM_HD static UnitHalf16 load(const WeightView& w, int64_t row, int64_t u) {
    return {load16(w.quants + row * w.q_row_bytes + u * 16)};
  }
  TANDEM_HD static float widen(uint16_t b) { return BF16 ? bf16_bits_to_float(b) : half_bits_to_float(b); }
  TANDEM_HD static float lo(int x) { return widen((uint16_t)(x & 0xFFFF)); }
  TANDEM_HD static float hi(int x) { return widen((uint16_t)((unsigned)x >> 16)); }
  TANDEM_HD float dot(const ActRow& a, int64_t u) const {
    const float4 x0 = *reinterpret_cast<const float4*>(a.x + u * 8), x1 = *reinterpret_cast<const float4*>(a.x + u * 8 + 4);
    return lo(v.x) * x0.x + hi(v.x) * x0.y + lo(v.y) * x0.z + hi(v.y) * x0.w + lo(v.z) * x1.x + hi(v.z) * x1.y +
           lo(v.w) * x1.z + hi(v.w) * x1.w;
  }
};
using UnitF16 = UnitHalf16<false>;
using UnitBF16 = UnitHalf16<true>;

struct UnitF32 {  // 4 floats
  static constexpr int kUnroll = 4;
  float4 v;
  TANDEM_HD static int64_t units_per_row(int64_t cols) { return cols / 4; }
  TANDEM_HD static UnitF32 load(const WeightView& w, int64_t row, int64_t u) {
    return {*reinterpret_cast<const float4*>(w.quants + row * w.q_row_bytes + u * 16)};
  }
  TANDEM_HD float dot(const ActRow& a, int64_t u) const {
    const float4 x = *reinterpret_cast<const float4*>(a.x + u * 4);
    return v.x * x.x + v.y * x.y + v.z * x.z + v.w * x.w;
  }
};

// True when the vectorized plain-type units apply: whole units per row, and 16-byte aligned
// rows of weights and activations (otherwise the kernels take the scalar path).
inline bool plain_units_fit(DType t, int64_t cols, const void* weights, const float* x) {
  const int per = t == DType::F32 ? 4 : 8;
  return cols % per == 0 && cols % 4 == 0 && reinterpret_cast<uintptr_t>(weights) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

}  // namespace tandem::cuda
