// The device layout of an uploaded weight, and the per-element decoding of it, written once for
// host and device: the kernels call these functions, and the CPU tests call the same functions
// to check the layout against kernels/cpu/dequantize.cpp without a GPU.
//
// Quantized layout (upload_weight's repack): every GGUF block is a contiguous range of quant
// bytes plus the rest (its scales and mins). The repack splits each block there and keeps both
// parts in their GGUF byte order:
//   quants [rows][blocks * q_len]  (block quant bytes back to back: rows 16-byte aligned, so
//                                   the kernels read them with 128-bit loads)
//   meta   [rows][blocks * m_len]  (the remaining bytes of each block, in GGUF order)
// Plain types (F32, F16, BF16) stay as in the file: quants = the rows, no meta.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define TANDEM_HD __host__ __device__ __forceinline__
#else
#define TANDEM_HD inline
#endif

#include "core/dtype.h"
#include "core/fp16.h"

namespace tandem::cuda {

// ---- scalar conversions, identical on host and device ----

TANDEM_HD float half_bits_to_float(uint16_t h) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(h));
#else
  return fp16_to_fp32(h);
#endif
}

TANDEM_HD float bf16_bits_to_float(uint16_t h) {
#ifdef __CUDA_ARCH__
  return __uint_as_float((uint32_t)h << 16);
#else
  return bf16_to_fp32(h);
#endif
}

// Products and sums the device must not fuse into an FMA, so embed() rounds exactly as
// dequantize_row does (nvcc contracts a * b - c by default; these intrinsics never are).
TANDEM_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TANDEM_HD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// ---- the block split ----

struct BlockSplit {
  int block_elems = 1;  // elements per block (1 for plain types)
  int block_bytes = 0;  // GGUF bytes per block
  int q_off = 0;        // the quant bytes are [q_off, q_off + q_len) of the block
  int q_len = 0;
  int m_len = 0;  // block_bytes - q_len: the scale bytes that go to meta
};

// Known for every type matmul_supported() accepts; block_bytes == 0 for any other.
TANDEM_HD BlockSplit block_split(DType t) {
  switch (t) {
    case DType::F32: return {1, 4, 0, 4, 0};
    case DType::F16: return {1, 2, 0, 2, 0};
    case DType::BF16: return {1, 2, 0, 2, 0};
    case DType::Q4_0: return {32, 18, 2, 16, 2};     // d | qs[16]
    case DType::Q4_1: return {32, 20, 4, 16, 4};     // d, m | qs[16]
    case DType::Q8_0: return {32, 34, 2, 32, 2};     // d | qs[32]
    case DType::Q4_K: return {256, 144, 16, 128, 16};  // d, dmin, scales[12] | qs[128]
    case DType::Q6_K: return {256, 210, 0, 192, 18};   // ql[128], qh[64] | scales[16], d
    default: return {};
  }
}

TANDEM_HD bool is_quantized(DType t) { return block_split(t).block_elems > 1; }

// Where each part of a weight lives in its device allocation.
struct WeightView {
  DType type = DType::F32;
  int64_t rows = 0, cols = 0;
  const uint8_t* quants = nullptr;  // [rows][q_row_bytes]
  const uint8_t* meta = nullptr;    // [rows][m_row_bytes]; null for plain types
  int64_t q_row_bytes = 0, m_row_bytes = 0;
};

TANDEM_HD int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// Bytes of the repacked weight (0 for an unsupported type).
TANDEM_HD int64_t packed_bytes(DType t, int64_t rows, int64_t cols) {
  const BlockSplit s = block_split(t);
  if (s.block_bytes == 0) return 0;
  const int64_t blocks = cols / s.block_elems;
  return align16(rows * blocks * s.q_len) + rows * blocks * s.m_len;
}

TANDEM_HD WeightView weight_view(DType t, int64_t rows, int64_t cols, const void* base) {
  const BlockSplit s = block_split(t);
  const int64_t blocks = cols / s.block_elems;
  WeightView v;
  v.type = t;
  v.rows = rows;
  v.cols = cols;
  v.quants = static_cast<const uint8_t*>(base);
  v.q_row_bytes = blocks * s.q_len;
  if (s.m_len > 0) {
    v.meta = v.quants + align16(rows * v.q_row_bytes);
    v.m_row_bytes = blocks * s.m_len;
  }
  return v;
}

// ---- decoding (embed, the dequantize-for-GEMM kernel, and the CPU tests) ----

TANDEM_HD uint16_t load_u16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }

// Unpacks the 6-bit scale and min of sub-block j (0..7) of a Q4_K block (as quant_blocks.h does).
TANDEM_HD void q4_k_scale_min(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Elements [8 * c8, 8 * c8 + 8) of a row of a quantized weight, rounded exactly as
// dequantize_row rounds them (the same float operations in the same order).
TANDEM_HD void decode8_quant(const WeightView& w, int64_t row, int64_t c8, float out[8]) {
  const BlockSplit s = block_split(w.type);
  const int64_t e = c8 * 8;
  const int64_t b = e / s.block_elems;
  const int e0 = (int)(e % s.block_elems);
  const uint8_t* q = w.quants + row * w.q_row_bytes + b * s.q_len;
  const uint8_t* m = w.meta + row * w.m_row_bytes + b * s.m_len;
  switch (w.type) {
    case DType::Q4_0: {  // element j: low nibble of qs[j]; element j + 16: its high nibble
      const float d = half_bits_to_float(load_u16(m));
      const int shift = e0 >= 16 ? 4 : 0;
      for (int k = 0; k < 8; k++) out[k] = mul_rn(d, (float)(((q[e0 % 16 + k] >> shift) & 0xF) - 8));
      return;
    }
    case DType::Q4_1: {
      const float d = half_bits_to_float(load_u16(m)), mn = half_bits_to_float(load_u16(m + 2));
      const int shift = e0 >= 16 ? 4 : 0;
      for (int k = 0; k < 8; k++) out[k] = add_rn(mul_rn(d, (float)((q[e0 % 16 + k] >> shift) & 0xF)), mn);
      return;
    }
    case DType::Q8_0: {
      const float d = half_bits_to_float(load_u16(m));
      for (int k = 0; k < 8; k++) out[k] = mul_rn(d, (float)(int8_t)q[e0 + k]);
      return;
    }
    case DType::Q4_K: {  // each 32 quant bytes: sub-block 2i in the low nibbles, 2i + 1 in the high
      const int j = e0 / 32, shift = (j % 2) * 4;
      const uint8_t* qs = q + (e0 / 64) * 32 + e0 % 32;
      int sc, mn;
      q4_k_scale_min(j, m + 4, &sc, &mn);
      const float d1 = mul_rn(half_bits_to_float(load_u16(m)), (float)sc);
      const float m1 = mul_rn(half_bits_to_float(load_u16(m + 2)), (float)mn);
      for (int k = 0; k < 8; k++) out[k] = add_rn(mul_rn(d1, (float)((qs[k] >> shift) & 0xF)), -m1);
      return;
    }
    case DType::Q6_K: {  // per 128 elements: 64 ql bytes and 32 qh bytes; quarter i of the 128
      const int half = e0 / 128, i = (e0 % 128) / 32, l0 = e0 % 32;
      const uint8_t* ql = q + half * 64 + (i & 1) * 32 + l0;
      const uint8_t* qh = q + 128 + half * 32 + l0;
      const int ql_shift = (i >> 1) * 4, qh_shift = 2 * i;
      const float d = half_bits_to_float(load_u16(m + 16));
      const float dsc = mul_rn(d, (float)(int8_t)m[half * 8 + l0 / 16 + 2 * i]);
      for (int k = 0; k < 8; k++) {
        const int v = ((ql[k] >> ql_shift) & 0xF) | (((qh[k] >> qh_shift) & 3) << 4);
        out[k] = mul_rn(dsc, (float)(v - 32));
      }
      return;
    }
    default:
      for (int k = 0; k < 8; k++) out[k] = 0.0f;
      return;
  }
}

// One element of a plain-type row.
TANDEM_HD float decode_plain(const WeightView& w, int64_t row, int64_t col) {
  const uint8_t* p = w.quants + row * w.q_row_bytes;
  switch (w.type) {
    case DType::F32: return reinterpret_cast<const float*>(p)[col];
    case DType::F16: return half_bits_to_float(reinterpret_cast<const uint16_t*>(p)[col]);
    case DType::BF16: return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(p)[col]);
    default: return 0.0f;
  }
}

// ---- 8-bit activations (GGML's q8_1: per 32 elements a scale d and s = d * sum(q)) ----

// The host twin of the device's quantization (same operations, so the same bytes): tests use
// it to know exactly which activations the kernels multiplied.
inline void quantize_block_q8_1(const float* x, int8_t* q, float* d_out, float* s_out) {
  float amax = 0.0f;
  for (int i = 0; i < 32; i++) amax = std::fmax(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int sum = 0;
  for (int i = 0; i < 32; i++) {
    const int v = (int)std::round(x[i] * id);
    q[i] = (int8_t)v;
    sum += v;
  }
  *d_out = d;
  *s_out = d * (float)sum;
}

}  // namespace tandem::cuda
