// Weights repacked for prefill and decode with 8-bit activations: 16 rows interleaved so that
// one 512-bit VPDPBUSD multiplies four consecutive elements of 16 rows by the same four
// activation bytes (a broadcast operand) and each int32 lane keeps summing one row's block.
// After 8 such steps a lane holds the exact integer dot of one row's 32-element block with the
// token's block, and one float multiply-add scales 16 rows at once. No horizontal sums, no
// per-product scale work, no shuffles; each unpacked weight vector meets up to 8 tokens.
//
// Layout of one group of 16 rows (rows past the matrix's end are zero, and never stored out):
// blocks go in pairs, each pair one unit that holds everything its two blocks need, so a
// group is one sequential stream (a separate scale stream halved decode's bandwidth):
//   quads(b0) quads(b1) d(b0) d(b1) [m(b0) m(b1)]
//   quads   kQuadBytes: the block's element quads; in each 64-byte vector lane r is row r.
//           Q8_0: 8 vectors, vector s = elements 4s..4s+3 as unsigned bytes (w + 128).
//           Q4_0/Q4_1: 4 vectors, vector c = bytes 4c..4c+3 of qs: low nibbles are elements
//           4c..4c+3, high nibbles elements 16 + 4c..16 + 4c + 3.
//           Q5_0/Q5_1: those 4 vectors of low 4 bits, then 1 of fifth bits: bit s of byte k
//           of lane r is the fifth bit of the element that vector s of the 8 (4 low nibbles,
//           then 4 high) puts in byte k. Stored values are q (0..31).
//   d       16 fp16 scales, row order (32 bytes)
//   m       16 fp16 offsets (Q4_1/Q5_1 only)
// Units are whole cache lines; with an odd block count the last unit's second half is zero
// padding (never read). The group is the size of the 16 rows it came from, so decode reads
// no extra bytes.
//
// MXFP4 goes by units of four blocks, its scales being one byte a row (17 lines, the 16 rows'
// GGUF bytes exactly):
//   quads(b0) .. quads(b3) e(b0) .. e(b3)
//   quads   as Q4_0's: the 4-bit codes (the kernels look up their values)
//   e       16 E8M0 scale bytes, row order (16 bytes)
// With a block count not a multiple of 4 the last unit's unused blocks are zero padding.
// The kernels shift the codes' int8 values (-12..12) by 12 to meet the activations unsigned
// and undo it with -12 x sum(x), as Q4_0's -8.
//
// Q6_K (Llama-3's tied output matrix: a third of a 1B model's bytes) goes by super-blocks of
// 256 (8 blocks of 32), in units of two super-blocks (6720 bytes, 105 lines):
//   bits(sb0) bits(sb1) scales(sb0) scales(sb1) d(sb0) d(sb1)
//   bits    per block, 6 vectors: 4 of nibbles as in Q4 (vector c: low nibbles are elements
//           4c..4c+3, high nibbles 16 + 4c..), then 2 of high parts: in vector e, bits
//           2f..2f+1 of byte k of lane r are the top 2 bits of element 16e + 4f + k. Stored
//           values are u = q + 32 (0..63).
//   scales  per block, 32 bytes: the int8 scale of each row's first 16 elements (row order),
//           then of its second 16
//   d       16 fp16 super-block scales
// The kernel undoes the + 32 per half of 16 with BlockQ8Act::sum_lo.
//
// Q4_K/Q5_K go by super-blocks of 256 (8 blocks of 32), one unit each (Q4_K 2368 bytes, 37
// lines; Q5_K 2880, 45 lines: 64 bytes more than the 16 rows' GGUF bytes, their 6-bit scales
// stored as bytes):
//   bits(b0) .. bits(b7) scales(b0) .. scales(b7) d dmin
//   bits    per block, as Q4_0 (Q4_K) or Q5_0 (Q5_K): the 32 quants q (0..15 or 0..31)
//   scales  per block, 32 bytes: each row's 6-bit scale sc as a byte (row order), then its min m
//   d dmin  16 fp16 super-block scales, then 16 fp16 min scales
// x = (d sc) q - (dmin m): per block and token the kernel adds float(sum q x) (d sc dx) and
// subtracts (dmin m)(dx sum x); both products d sc and dmin m are exact in float.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "kernels/cpu/quant_dot.h"

namespace tandem::cpu {

constexpr int kPackRows = 16;
constexpr int kPackMaxTokens = 8;  // tokens per kernel call (one accumulator each)
// Kernel calls of at most this many tokens prefetch their weights ahead (today: every call).
// A decode step, a speculative verify pass or a few batched sequences stream each weight from
// memory once, and the hardware prefetchers alone fall behind: before, only 1-token calls
// prefetched, and on SmolLM2 F16 a 5-token pass cost 16.4 ms against 6.7 ms for one token
// (9.3 ms with the prefetch; 8 tokens 18.7 -> 11.3 ms; Q4_1 4 tokens 5.3 -> 3.8 ms; pp512
// within noise). Prefill calls reread a group from cache, where the prefetch costs little.
constexpr int kStreamMaxTokens = kPackMaxTokens;

// Types whose packed quants carry a fifth-bit vector, and whose blocks carry an offset.
constexpr bool packed_five_bits(DType t) { return t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q5_K; }
constexpr bool packed_has_offset(DType t) { return t == DType::Q4_1 || t == DType::Q5_1; }
constexpr bool packed_kquant(DType t) { return t == DType::Q4_K || t == DType::Q5_K; }

// The shift that makes packed quants unsigned: stored u, the weight's integer is u - shift.
constexpr int packed_shift(DType t) {
  return t == DType::Q4_0 ? 8 : t == DType::Q5_0 ? 16 : t == DType::Q8_0 ? 128 : t == DType::MXFP4 ? 12 : 0;
}

constexpr int packed_quad_bytes(DType t) {
  return t == DType::Q8_0 ? 8 * 64 : packed_five_bits(t) ? 5 * 64 : 4 * 64;
}
// Blocks per unit, and the bytes of one block's scales (and of its offsets).
constexpr int packed_unit_blocks(DType t) { return t == DType::MXFP4 ? 4 : 2; }
constexpr int packed_scale_bytes(DType t) { return t == DType::MXFP4 ? 16 : 32; }
constexpr int packed_unit_bytes(DType t) {
  return packed_unit_blocks(t) * (packed_quad_bytes(t) + packed_scale_bytes(t) * (packed_has_offset(t) ? 2 : 1));
}
// Byte offsets of block b's quads, scales and offsets inside a group.
constexpr size_t packed_quads_at(DType t, int64_t b) {
  const int u = packed_unit_blocks(t);
  return (size_t)(b / u) * packed_unit_bytes(t) + (size_t)(b % u) * packed_quad_bytes(t);
}
constexpr size_t packed_d_at(DType t, int64_t b) {
  const int u = packed_unit_blocks(t);
  return (size_t)(b / u) * packed_unit_bytes(t) + (size_t)u * packed_quad_bytes(t) + (size_t)(b % u) * packed_scale_bytes(t);
}
constexpr size_t packed_m_at(DType t, int64_t b) { return packed_d_at(t, b) + 64; }
static_assert(packed_unit_bytes(DType::Q4_0) == 9 * 64 && packed_unit_bytes(DType::Q5_1) == 12 * 64);
static_assert(packed_unit_bytes(DType::MXFP4) == kPackRows * 17 * 4);

constexpr int kQ6KBlockBits = 6 * 64;  // bytes of one block's bit vectors
constexpr int kQ6KSuperBits = 8 * kQ6KBlockBits;
constexpr int kQ6KUnitBytes = 2 * (kQ6KSuperBits + 8 * 32 + 32);
static_assert(kQ6KUnitBytes == 2 * kPackRows * 210 && kQ6KUnitBytes % 64 == 0);
// Byte offsets of block b's bit vectors and scales, and of super-block sb's d, in a group.
constexpr size_t q6k_bits_at(int64_t b) {
  const int64_t sb = b / 8;
  return (size_t)(sb / 2) * kQ6KUnitBytes + (size_t)(sb % 2) * kQ6KSuperBits + (size_t)(b % 8) * kQ6KBlockBits;
}
constexpr size_t q6k_scales_at(int64_t b) {
  const int64_t sb = b / 8;
  return (size_t)(sb / 2) * kQ6KUnitBytes + 2 * kQ6KSuperBits + (size_t)(sb % 2) * 256 + (size_t)(b % 8) * 32;
}
constexpr size_t q6k_d_at(int64_t sb) {
  return (size_t)(sb / 2) * kQ6KUnitBytes + 2 * kQ6KSuperBits + 512 + (size_t)(sb % 2) * 32;
}

// Q4_K/Q5_K: byte offsets of block b's quants and scales, and of super-block sb's d (dmin
// 32 bytes on), in a group.
constexpr int kquant_unit_bytes(DType t) { return 8 * packed_quad_bytes(t) + 8 * 32 + 64; }
static_assert(kquant_unit_bytes(DType::Q4_K) == kPackRows * 144 + 64 && kquant_unit_bytes(DType::Q4_K) % 64 == 0);
static_assert(kquant_unit_bytes(DType::Q5_K) == kPackRows * 176 + 64 && kquant_unit_bytes(DType::Q5_K) % 64 == 0);
constexpr size_t kquant_bits_at(DType t, int64_t b) {
  return (size_t)(b / 8) * kquant_unit_bytes(t) + (size_t)(b % 8) * packed_quad_bytes(t);
}
constexpr size_t kquant_scales_at(DType t, int64_t b) {
  return (size_t)(b / 8) * kquant_unit_bytes(t) + 8 * (size_t)packed_quad_bytes(t) + (size_t)(b % 8) * 32;
}
constexpr size_t kquant_d_at(DType t, int64_t sb) {
  return (size_t)sb * kquant_unit_bytes(t) + 8 * (size_t)packed_quad_bytes(t) + 256;
}

// Zeroed memory for packed weights: 2 MiB aligned and marked for transparent huge pages, so
// decode's stream through hundreds of MiB does not take a TLB miss every 4 KiB.
std::shared_ptr<uint8_t[]> allocate_packed(size_t bytes);

// Bytes of one packed group of 16 rows with `cols` elements; 0 if the type has no packing.
size_t packed_group_bytes(DType type, int64_t cols);
bool can_pack(DType type);

// Repacks rows [0, rows) of a GGUF-layout matrix (rows `row_bytes` apart) into
// ceil(rows / 16) groups, 64-byte aligned.
std::shared_ptr<uint8_t[]> pack_rows(DType type, const uint8_t* data, int64_t rows, int64_t cols, size_t row_bytes);

// out[t * out_stride + r] = row r of the group . token t (x + t * x_stride blocks), for
// t < n_tokens (1..8) and r < valid_rows (1..16). Every (row, token) gets the same float
// whatever n_tokens is, so batching and caching never change a result.
using PackedGemmFn = void (*)(const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride, int n_tokens,
                              float* out, int64_t out_stride, int valid_rows);
// AVX-512 and AVX2 only (packed_quant_avx512.cpp, packed_quant_avx2.cpp); elsewhere products
// use the row kernels.

// The same arithmetic in plain C++, operation for operation (tests compare it exactly).
void packed_gemm_scalar(DType type, const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride,
                        int n_tokens, float* out, int64_t out_stride, int valid_rows);

}  // namespace tandem::cpu
