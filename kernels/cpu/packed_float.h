// F16 and BF16 weights repacked for prefill and decode with float activations: 16 rows
// interleaved so that one 512-bit load (converted to 16 floats) holds element k of 16 rows
// and meets each token through one FMA whose activation operand is a broadcast of x[k]. The
// outer-product form reuses every converted weight vector for up to 8 tokens and needs no
// horizontal sums; decode streams the group front to back.
//
// Layout of one group of 16 rows: for k = 0 .. cols-1, 16 two-byte elements (32 bytes),
// lane r = row r (rows past the matrix's end are zero and never stored out). A group is
// exactly its 16 rows' bytes.
//
// Arithmetic per (row, token): two partial sums, even k and odd k, each a chain of single-
// rounding FMAs in k order, added at the end: the same float for any token count, so
// prefill, decode and batching agree exactly; two chains keep decode off the FMA latency.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/dtype.h"

namespace tandem::cpu {

bool can_pack_float(DType type, int64_t cols);  // F16 or BF16 with an even row length
size_t packed_float_group_bytes(DType type, int64_t cols);

// Repacks rows [0, rows) of an F16/BF16 matrix (rows `row_bytes` apart) into ceil(rows / 16)
// groups, 64-byte aligned.
std::shared_ptr<uint8_t[]> pack_float_rows(DType type, const uint8_t* data, int64_t rows, int64_t cols,
                                           size_t row_bytes);

// out[t * out_stride + r] = row r of the group . x[t * x_stride .. + cols), t < n_tokens (any
// count from 1: prefill hands a whole token chunk to one call, so each kernel picks its own
// passes), r < valid_rows (1..16).
using PackedFloatGemmFn = void (*)(const uint8_t* group, int64_t cols, const float* x, int64_t x_stride,
                                   int n_tokens, float* out, int64_t out_stride, int valid_rows);
// AVX-512 and AVX2 only (packed_float_avx512.cpp, packed_float_avx2.cpp).

// The same arithmetic in plain C++, operation for operation (tests compare it exactly).
void packed_float_gemm_scalar(DType type, const uint8_t* group, int64_t cols, const float* x, int64_t x_stride,
                              int n_tokens, float* out, int64_t out_stride, int valid_rows);

}  // namespace tandem::cpu
