#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/packed_float.h"
#include "kernels/cpu/packed_quant.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_dot.h"
#include "quant_vectors.h"

namespace tandem::cpu {
namespace {

using test::QuantVector;

std::vector<QuantVector> load_vectors() { return test::load_quant_vectors("quant_vectors.bin"); }

TEST(Kernels, DequantizeMatchesGgufPackage) {
  const auto vectors = load_vectors();
  ASSERT_EQ(vectors.size(), 12u) << "tests/data/quant_vectors.bin missing or short";
  for (const auto& v : vectors) {
    std::vector<float> got(v.values.size());
    ASSERT_TRUE(dequantize_row(v.type, v.raw.data(), got.data(), (int64_t)got.size())) << dtype_name(v.type);
    for (size_t i = 0; i < got.size(); i++)
      ASSERT_NEAR(got[i], v.values[i], 1e-6f * (1.0f + std::fabs(v.values[i])))
          << dtype_name(v.type) << " element " << i;
  }
}

TEST(Kernels, EveryIsaDotMatchesReferenceAndScalarTwin) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (const auto& v : load_vectors()) {
    const int64_t n = (int64_t)v.values.size();
    std::vector<float> x(n);
    for (auto& e : x) e = nd(rng);
    double ref = 0.0, mag = 0.0;
    for (int64_t i = 0; i < n; i++) {
      ref += (double)v.values[i] * x[i];
      mag += std::fabs((double)v.values[i] * x[i]);
    }
    const float scalar = row_dot_scalar(v.type, v.raw.data(), x.data(), n);
    EXPECT_NEAR(scalar, ref, 1e-5 * mag + 1e-6) << dtype_name(v.type);
    for (Isa isa : supported_isas()) {
      const RowDotFn f = kernels_for(isa).row_dot(v.type);
      ASSERT_NE(f, nullptr) << dtype_name(v.type) << " " << isa_name(isa);
      EXPECT_NEAR(f(v.raw.data(), x.data(), n), scalar, 1e-5 * mag + 1e-6) << dtype_name(v.type) << " " << isa_name(isa);
    }
  }
}

TEST(Kernels, ActivationQuantizationSameOnEveryIsa) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> x(256);
  for (auto& e : x) e = nd(rng) * 3.0f;
  x[5] = 0.0f;
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block has scale 0
  std::vector<BlockQ8Act> ref(8), got(8);
  quantize_act_scalar(x.data(), ref.data(), 256);
  for (int b = 0; b < 8; b++)  // each value is within half a step of its quantized value
    for (int j = 0; j < 32; j++) ASSERT_NEAR(ref[b].qs[j] * ref[b].d, x[b * 32 + j], 0.51f * ref[b].d + 1e-3f * ref[b].d * 127);
  EXPECT_EQ(ref[2].d, 0.0f);
  for (Isa isa : supported_isas()) {
    kernels_for(isa).quantize_act(x.data(), got.data(), 256);
    for (int b = 0; b < 8; b++) {
      EXPECT_EQ(got[b].d, ref[b].d) << isa_name(isa);
      EXPECT_EQ(got[b].s, ref[b].s) << isa_name(isa);
      EXPECT_EQ(got[b].sum, ref[b].sum) << isa_name(isa);
      EXPECT_EQ(got[b].sum_lo, ref[b].sum_lo) << isa_name(isa);
      for (int j = 0; j < 32; j++) ASSERT_EQ(got[b].qs[j], ref[b].qs[j]) << isa_name(isa) << " block " << b << " " << j;
    }
  }
}

TEST(Kernels, QuantizedActivationDotsEveryIsa) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd;
  for (const auto& v : load_vectors()) {
    if (!has_quant_dot(v.type)) continue;
    const int64_t n = (int64_t)v.values.size();
    std::vector<float> x(n);
    for (auto& e : x) e = nd(rng);
    std::vector<BlockQ8Act> xq(n / 32);
    quantize_act_scalar(x.data(), xq.data(), n);
    double exact = 0.0, mag = 0.0;
    for (int64_t i = 0; i < n; i++) exact += (double)v.values[i] * x[i], mag += std::fabs((double)v.values[i] * x[i]);
    const float scalar = quant_dot_scalar(v.type, v.raw.data(), xq.data(), n);
    EXPECT_NEAR(scalar, exact, 0.02 * mag) << dtype_name(v.type) << ": 8-bit activations stay close to exact";
    for (Isa isa : supported_isas())
      EXPECT_NEAR(kernels_for(isa).quant_dot(v.type)(v.raw.data(), xq.data(), n), scalar, 1e-5 * mag)
          << dtype_name(v.type) << " " << isa_name(isa);
    // Four tokens at once: rows of 64 or 96 elements (2 or 3 blocks: AVX-512 takes blocks in
    // pairs, so an odd count has a tail) against 4 token rows of xq.
    for (const int64_t cols : {64, 96}) {
      if (!kernels_for(Isa::Scalar).quant_dot4(v.type)) break;  // no four-token kernel
      const int64_t stride = 4;  // token j starts at block j * stride
      if (4 * stride * 32 > n) continue;
      for (Isa isa : supported_isas()) {
        float got[4];
        kernels_for(isa).quant_dot4(v.type)(v.raw.data(), xq.data(), stride, cols, got);
        for (int j = 0; j < 4; j++) {
          EXPECT_NEAR(got[j], quant_dot_scalar(v.type, v.raw.data(), xq.data() + j * stride, cols), 1e-5 * mag)
              << dtype_name(v.type) << " " << isa_name(isa) << " token " << j << " cols " << cols;
          // Within one ISA the four-token and one-token dots agree exactly (batching must not
          // change results).
          EXPECT_EQ(got[j], kernels_for(isa).quant_dot(v.type)(v.raw.data(), xq.data() + j * stride, cols))
              << dtype_name(v.type) << " " << isa_name(isa) << " token " << j << " cols " << cols;
        }
      }
    }
  }
}

TEST(Kernels, F32DotAndAxpyEveryIsa) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (int64_t n : {1, 7, 8, 33, 64, 100, 576}) {
    std::vector<float> a(n), b(n);
    std::vector<uint16_t> bh(n);
    for (int64_t i = 0; i < n; i++) a[i] = nd(rng), b[i] = nd(rng), bh[i] = fp32_to_fp16(b[i]);
    const float ref = f32_dot_scalar(a.data(), b.data(), n);
    for (Isa isa : supported_isas()) {
      EXPECT_NEAR(kernels_for(isa).dot_f32(a.data(), b.data(), n), ref, 1e-4 * n) << isa_name(isa) << " n=" << n;
      for (DType t : {DType::F32, DType::F16}) {
        std::vector<float> y_ref(a), y(a);
        axpy_scalar(t, 0.5f, t == DType::F32 ? (const void*)b.data() : (const void*)bh.data(), y_ref.data(), n);
        kernels_for(isa).axpy(t)(0.5f, t == DType::F32 ? (const void*)b.data() : (const void*)bh.data(), y.data(), n);
        for (int64_t i = 0; i < n; i++) ASSERT_NEAR(y[i], y_ref[i], 1e-6f) << isa_name(isa);
      }
    }
  }
}

TEST(Kernels, F32TileEveryIsa) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (int64_t n : {8, 13, 64, 576}) {
    const int64_t as = n + 3, bs = n + 5;  // rows and tokens at their own strides
    std::vector<float> a(2 * as), b(4 * bs);
    for (auto& v : a) v = nd(rng);
    for (auto& v : b) v = nd(rng);
    float ref[8], got[8];
    f32_tile_scalar(a.data(), as, b.data(), bs, n, ref);
    for (int t = 0; t < 4; t++)
      for (int r = 0; r < 2; r++) EXPECT_FLOAT_EQ(ref[t * 2 + r], f32_dot_scalar(a.data() + r * as, b.data() + t * bs, n));
    for (Isa isa : supported_isas()) {
      kernels_for(isa).tile_f32(a.data(), as, b.data(), bs, n, got);
      for (int k = 0; k < 8; k++) EXPECT_NEAR(got[k], ref[k], 1e-4 * n) << isa_name(isa) << " n=" << n;
    }
  }
}

TEST(Kernels, Fp16RoundTripsEveryFiniteHalf) {
  for (uint32_t h = 0; h < 65536; h++) {
    const float f = fp16_to_fp32((uint16_t)h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), (uint16_t)h) << "half 0x" << std::hex << h;
  }
  EXPECT_EQ(fp16_to_fp32(0x3c00), 1.0f);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
}

TEST(Kernels, MatmulEqualsMatvecPerToken) {
  const auto vectors = load_vectors();
  for (const auto& v : vectors) {
    // Reuse the 512-element record as a [rows, cols] matrix.
    const int64_t cols = dtype_info((uint32_t)v.type)->block_elems == 256 ? 256 : 64;
    const int64_t rows = 512 / cols;
    for (Isa isa : supported_isas()) {
      const CpuKernels k = kernels_for(isa);
      WeightMatrix w{v.type, v.raw.data(), rows, cols, v.raw.size() / rows, k.row_dot(v.type), k.quant_dot(v.type),
                     k.quant_dot4(v.type), {}, 0, {}};
      w.pack_for(k);
      const int64_t T = 9;
      std::vector<float> X(T * cols), Y(T * rows), y(rows);
      std::mt19937 rng(1);
      std::normal_distribution<float> nd;
      for (auto& e : X) e = nd(rng);
      matmul(w, X.data(), T, Y.data(), k);
      for (int64_t t = 0; t < T; t++) {
        matvec(w, X.data() + t * cols, y.data(), k);
        for (int64_t r = 0; r < rows; r++)
          ASSERT_NEAR(Y[t * rows + r], y[r], 1e-4f * (1 + std::fabs(y[r]))) << dtype_name(v.type) << " " << isa_name(isa);
      }
    }
  }
}

// The quant types with packed 8-bit-activation kernels.
constexpr DType kPackedQuantTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                                       DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4};

bool is_super_block(DType t) { return dtype_info((uint32_t)t)->block_elems == 256; }

// Random GGUF-layout rows of a quant type: fp16 scales (and offsets, mins) in +-0.02, random
// quant bytes (and random sub-block scales); MXFP4: E8M0 scales 2^-10 .. 2^-4.
std::vector<uint8_t> random_quant_rows(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const size_t rb = tandem::row_bytes(*dtype_info((uint32_t)t), cols);
  std::vector<uint8_t> raw(rows * rb);
  for (auto& b : raw) b = (uint8_t)rng();
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  const size_t block = rb / (cols / (is_super_block(t) ? 256 : 32));
  const size_t d_at = t == DType::Q6_K ? offsetof(BlockQ6_K, d) : 0;
  // Q4_1/Q5_1 offsets and Q4_K/Q5_K min scales follow d.
  const bool second = t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q5_K;
  for (size_t off = 0; off < raw.size(); off += block) {
    if (t == DType::MXFP4) {
      raw[off] = (uint8_t)(118 + rng() % 7);
      continue;
    }
    const uint16_t d = fp32_to_fp16(scale(rng)), m = fp32_to_fp16(scale(rng));
    std::memcpy(&raw[off + d_at], &d, 2);
    if (second) std::memcpy(&raw[off + 2], &m, 2);
  }
  return raw;
}

// A Q8_0 row against several tokens (the exact output head of a verify pass) gives each token
// decode's float exactly, and a float-activation matmul of any token count built on it equals
// one matvec per token bit for bit.
TEST(Kernels, RowDotTokensEqualsRowDotBitForBit) {
  std::mt19937 rng(31);
  std::normal_distribution<float> nd;
  int checked = 0;
  for (Isa isa : supported_isas()) {
    const RowDotTokensFn f = kernels_for(isa).row_dot_tokens(DType::Q8_0);
    if (!f) continue;
    const RowDotFn dot = kernels_for(isa).row_dot(DType::Q8_0);
    for (int64_t cols : {32, 576}) {
      const int64_t rows = 5;
      const auto raw = random_quant_rows(DType::Q8_0, rows, cols, rng);
      const size_t rb = raw.size() / rows;
      for (int n : {1, 2, 3, 7, 8, 9, 17}) {
        std::vector<float> X(n * cols + 3), out(n * 2, -1.0f);
        for (auto& e : X) e = nd(rng);
        for (int64_t r = 0; r < rows; r++) {
          f(raw.data() + r * rb, X.data() + 3, cols, n, cols, out.data(), 2);  // unaligned rows, strided out
          for (int t = 0; t < n; t++) {
            const float want = dot(raw.data() + r * rb, X.data() + 3 + t * cols, cols);
            ASSERT_EQ(std::bit_cast<uint32_t>(out[t * 2]), std::bit_cast<uint32_t>(want))
                << isa_name(isa) << " cols " << cols << " tokens " << n << " token " << t;
          }
        }
        checked++;
      }
    }
    // Through matmul: every tile, every token count.
    const CpuKernels k = kernels_for(isa, false);
    const int64_t rows = 70, cols = 96;
    const auto raw = random_quant_rows(DType::Q8_0, rows, cols, rng);
    WeightMatrix w{DType::Q8_0, raw.data(), rows, cols, raw.size() / rows, k.row_dot(DType::Q8_0), nullptr, nullptr,
                   {}, 0, {}};
    w.dot_tokens = k.row_dot_tokens(DType::Q8_0);
    for (int64_t T : {2, 5, 8, 13}) {
      std::vector<float> X(T * cols), Y(T * rows), y(rows);
      for (auto& e : X) e = nd(rng);
      matmul(w, X.data(), T, Y.data(), k);
      for (int64_t t = 0; t < T; t++) {
        matvec(w, X.data() + t * cols, y.data(), k);
        for (int64_t r = 0; r < rows; r++)
          ASSERT_EQ(std::bit_cast<uint32_t>(Y[t * rows + r]), std::bit_cast<uint32_t>(y[r])) << isa_name(isa) << " T " << T;
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "this CPU has no AVX2: no multi-token row kernel to check";
}

TEST(Kernels, PackedGemmExactAcrossTokenCountsAndIsas) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  for (DType t : kPackedQuantTypes) {
    // A partial second group and an odd count of blocks (K-quants: of super-blocks).
    const int64_t step = is_super_block(t) ? 256 : 32, rows = 20, cols = 3 * step, nb = cols / 32;
    const auto raw = random_quant_rows(t, rows, cols, rng);
    const size_t rb = raw.size() / rows;
    const auto packed = pack_rows(t, raw.data(), rows, cols, rb);
    const size_t gbytes = packed_group_bytes(t, cols);
    if (t == DType::Q4_K || t == DType::Q5_K) {  // one unit a super-block: 64 bytes of unpacked scales more
      ASSERT_EQ(gbytes, rb * kPackRows + 3 * 64) << dtype_name(t);
    } else {
      // With an odd count the last unit's second half is padding that no kernel reads; with an
      // even one a group is exactly its 16 rows' bytes, so decode reads nothing extra.
      ASSERT_EQ(gbytes, (rb + rb / 3) * kPackRows) << dtype_name(t);
      ASSERT_EQ(packed_group_bytes(t, cols + step), (rb + rb / 3) * kPackRows) << "packing must not add bytes for decode to read";
    }
    std::vector<float> x(kPackMaxTokens * cols);
    for (auto& e : x) e = nd(rng);
    std::vector<BlockQ8Act> xq(kPackMaxTokens * nb);
    quantize_act_scalar(x.data(), xq.data(), kPackMaxTokens * cols);
    // The scalar twin agrees with the plain 8-bit dot (a different order: within rounding).
    std::vector<float> ref(kPackMaxTokens * rows);
    for (int64_t g = 0; g < 2; g++)
      packed_gemm_scalar(t, packed.get() + g * gbytes, cols, xq.data(), nb, kPackMaxTokens, ref.data() + g * kPackRows,
                         rows, (int)std::min<int64_t>(kPackRows, rows - g * kPackRows));
    for (int j = 0; j < kPackMaxTokens; j++)
      for (int64_t r = 0; r < rows; r++) {
        const float plain = quant_dot_scalar(t, raw.data() + r * rb, xq.data() + j * nb, cols);
        ASSERT_NEAR(ref[j * rows + r], plain, 1e-4f * (1 + std::fabs(plain))) << dtype_name(t);
      }
    for (Isa isa : supported_isas()) {
      const PackedGemmFn f = kernels_for(isa).packed(t);
      if (isa != Isa::Scalar) {
        ASSERT_NE(f, nullptr) << dtype_name(t) << " " << isa_name(isa);
      }
      if (!f) continue;
      for (int n = 1; n <= kPackMaxTokens; n++) {
        std::vector<float> got(kPackMaxTokens * rows + 1, -7.0f);  // sentinel past the end
        for (int64_t g = 0; g < 2; g++)
          f(packed.get() + g * gbytes, cols, xq.data(), nb, n, got.data() + g * kPackRows, rows,
            (int)std::min<int64_t>(kPackRows, rows - g * kPackRows));
        for (int j = 0; j < n; j++)
          for (int64_t r = 0; r < rows; r++)
            ASSERT_EQ(got[j * rows + r], ref[j * rows + r]) << dtype_name(t) << " " << isa_name(isa) << " n=" << n;
        EXPECT_EQ(got[n * rows], -7.0f) << "wrote past the rows it was given";
      }
    }
  }
}

// The largest products the integer paths can meet (Q8_0 weights of -128 and 127, Q4 nibbles
// of 15, Q5 quants of 31, Q6_K quants of 63 with scales of -128 and 127, MXFP4 values of 12
// and -12 (stored 24 and 0), activations of +-127): the AVX2 kernels sum byte pairs in int16
// (VPMADDUBSW) and must not saturate anywhere.
TEST(Kernels, PackedGemmExactAtExtremeValues) {
  for (DType t : kPackedQuantTypes) {
    const int64_t rows = 16, cols = 512, nb = cols / 32;
    const size_t rb = tandem::row_bytes(*dtype_info((uint32_t)t), cols);
    std::vector<uint8_t> raw(rows * rb);
    const uint16_t d = fp32_to_fp16(0.01f);
    for (int64_t r = 0; r < rows; r++) {
      uint8_t* row = raw.data() + r * rb;
      if (t == DType::Q6_K) {
        for (int64_t sb = 0; sb < cols / 256; sb++) {
          auto& w = reinterpret_cast<BlockQ6_K*>(row)[sb];
          std::memset(w.ql, 0xFF, sizeof w.ql);
          std::memset(w.qh, 0xFF, sizeof w.qh);
          for (int j = 0; j < 16; j++) w.scales[j] = (int8_t)(r % 2 ? 127 : -128);
          w.d = d;
        }
        continue;
      }
      if (t == DType::Q4_K || t == DType::Q5_K) {  // every scale and min 63, every quant 15 or 31
        const size_t block = rb / (cols / 256);
        for (int64_t sb = 0; sb < cols / 256; sb++) {
          uint8_t* blk = row + sb * block;
          std::memcpy(blk, &d, 2);
          std::memcpy(blk + 2, &d, 2);
          std::memset(blk + 4, 0xFF, block - 4);
        }
        continue;
      }
      const size_t block = rb / nb;
      if (t == DType::MXFP4) {  // codes 7 (12) or 15 (-12) in every nibble
        for (int64_t b = 0; b < nb; b++) {
          row[b * block] = 120;
          std::memset(row + b * block + 1, r % 2 ? 0x77 : 0xFF, block - 1);
        }
        continue;
      }
      for (int64_t b = 0; b < nb; b++) {
        uint8_t* blk = row + b * block;
        std::memcpy(blk, &d, 2);
        if (t == DType::Q4_1 || t == DType::Q5_1) std::memcpy(blk + 2, &d, 2);
        const size_t qs = t == DType::Q4_1 || t == DType::Q5_1 ? 4 : 2;
        std::memset(blk + qs, t == DType::Q8_0 ? (r % 2 ? 0x7F : 0x80) : 0xFF, block - qs);
      }
    }
    const auto packed = pack_rows(t, raw.data(), rows, cols, rb);
    std::vector<float> x(kPackMaxTokens * cols);
    for (int64_t i = 0; i < (int64_t)x.size(); i++) x[i] = (i / cols) % 2 ? 1.0f : -1.0f;  // quantizes to +-127
    std::vector<BlockQ8Act> xq(kPackMaxTokens * nb);
    quantize_act_scalar(x.data(), xq.data(), kPackMaxTokens * cols);
    std::vector<float> ref(kPackMaxTokens * rows);
    packed_gemm_scalar(t, packed.get(), cols, xq.data(), nb, kPackMaxTokens, ref.data(), rows, rows);
    for (int j = 0; j < kPackMaxTokens; j++)
      for (int64_t r = 0; r < rows; r++) {
        const float plain = quant_dot_scalar(t, raw.data() + r * rb, xq.data() + j * nb, cols);
        ASSERT_NEAR(ref[j * rows + r], plain, 1e-4f * (1 + std::fabs(plain))) << dtype_name(t);
      }
    for (Isa isa : supported_isas()) {
      const PackedGemmFn f = kernels_for(isa).packed(t);
      if (!f) continue;
      for (int n : {1, 3, kPackMaxTokens}) {
        std::vector<float> got(kPackMaxTokens * rows);
        f(packed.get(), cols, xq.data(), nb, n, got.data(), rows, rows);
        for (int j = 0; j < n; j++)
          for (int64_t r = 0; r < rows; r++)
            ASSERT_EQ(got[j * rows + r], ref[j * rows + r]) << dtype_name(t) << " " << isa_name(isa) << " n=" << n;
      }
    }
  }
}

// Whole products (matmul: the packed kernels on AVX2/AVX-512, the row kernels on scalar) of a
// random matrix of each quant type against a float64 dot over the dequantized weights, with
// 8-bit activations (within their rounding) and with exact float products.
TEST(Kernels, QuantProductsMatchFloat64OverDequantizedWeights) {
  std::mt19937 rng(31);
  std::normal_distribution<float> nd;
  for (DType t : kPackedQuantTypes) {
    const int64_t rows = 40, cols = 512, T = 11;
    const auto raw = random_quant_rows(t, rows, cols, rng);
    const size_t rb = raw.size() / rows;
    std::vector<float> wf(rows * cols), X(T * cols), Y(T * rows);
    for (int64_t r = 0; r < rows; r++) ASSERT_TRUE(dequantize_row(t, raw.data() + r * rb, wf.data() + r * cols, cols));
    for (auto& e : X) e = nd(rng);
    for (Isa isa : supported_isas())
      for (bool int8 : {true, false}) {
        const CpuKernels k = kernels_for(isa, int8);
        WeightMatrix w{t, raw.data(), rows, cols, rb, k.row_dot(t), k.quant_dot(t), k.quant_dot4(t), {}, 0, {}};
        ASSERT_NE(w.dot, nullptr) << dtype_name(t);
        w.pack_for(k);
        EXPECT_EQ(w.is_packed(), int8 && isa != Isa::Scalar) << dtype_name(t) << " " << isa_name(isa);
        for (int64_t n : {int64_t(1), T}) {
          std::fill(Y.begin(), Y.end(), 0.0f);
          matmul(w, X.data(), n, Y.data(), k);
          for (int64_t j = 0; j < n; j++)
            for (int64_t r = 0; r < rows; r++) {
              const auto [ref, mag] = test::dot64(wf.data() + r * cols, X.data() + j * cols, cols);
              ASSERT_NEAR(Y[j * rows + r], ref, (int8 ? 0.02 : 1e-5) * mag + 1e-6)
                  << dtype_name(t) << " " << isa_name(isa) << (int8 ? " 8-bit" : " exact") << " row " << r << " token " << j;
            }
        }
      }
  }
}

TEST(Kernels, PackedFloatGemmExactAcrossTokenCountsAndIsas) {
  std::mt19937 rng(22);
  std::normal_distribution<float> nd;
  for (DType t : {DType::F16, DType::BF16}) {
    const int64_t rows = 21, cols = 70;  // a partial second group
    // Prefill hands a whole token chunk to one call, so counts run past every kernel's pass.
    constexpr int kTokens = 20;
    std::vector<uint16_t> raw(rows * cols);
    auto bf16 = [](float f) {  // truncation: any bf16 will do
      uint32_t b;
      std::memcpy(&b, &f, 4);
      return (uint16_t)(b >> 16);
    };
    for (auto& e : raw) e = t == DType::F16 ? fp32_to_fp16(nd(rng)) : bf16(nd(rng));
    const auto* bytes = reinterpret_cast<const uint8_t*>(raw.data());
    ASSERT_TRUE(can_pack_float(t, cols));
    const auto packed = pack_float_rows(t, bytes, rows, cols, cols * 2);
    const size_t gbytes = packed_float_group_bytes(t, cols);
    ASSERT_EQ(gbytes, (size_t)cols * 2 * kPackRows) << "a group is exactly its rows' bytes";
    std::vector<float> x(kTokens * cols);
    for (auto& e : x) e = nd(rng);
    // The scalar twin agrees with a plain double-precision dot within rounding.
    std::vector<float> ref(kTokens * rows);
    for (int64_t g = 0; g < 2; g++)
      packed_float_gemm_scalar(t, packed.get() + g * gbytes, cols, x.data(), cols, kTokens,
                               ref.data() + g * kPackRows, rows, (int)std::min<int64_t>(kPackRows, rows - g * kPackRows));
    for (int j = 0; j < kTokens; j++)
      for (int64_t r = 0; r < rows; r++) {
        double plain = 0;
        for (int64_t c = 0; c < cols; c++) {
          const uint16_t v = raw[r * cols + c];
          plain += (double)(t == DType::F16 ? fp16_to_fp32(v) : bf16_to_fp32(v)) * x[j * cols + c];
        }
        ASSERT_NEAR(ref[j * rows + r], plain, 1e-4 * (1 + std::fabs(plain))) << dtype_name(t);
      }
    for (Isa isa : supported_isas()) {
      const PackedFloatGemmFn f = kernels_for(isa).packed_float(t);
      if (!f) continue;
      for (int n = 1; n <= kTokens; n++) {
        std::vector<float> got(kTokens * rows + 1, -7.0f);  // sentinel past the end
        for (int64_t g = 0; g < 2; g++)
          f(packed.get() + g * gbytes, cols, x.data(), cols, n, got.data() + g * kPackRows, rows,
            (int)std::min<int64_t>(kPackRows, rows - g * kPackRows));
        for (int j = 0; j < n; j++)
          for (int64_t r = 0; r < rows; r++)
            ASSERT_EQ(got[j * rows + r], ref[j * rows + r]) << dtype_name(t) << " " << isa_name(isa) << " n=" << n;
        EXPECT_EQ(got[n * rows], -7.0f) << "wrote past the rows it was given";
      }
    }
  }
}

TEST(Kernels, RmsNormRopeSoftmaxSilu) {
  std::vector<float> x{1, 2, 3, 4}, w{1, 1, 2, 0.5f}, out(4);
  rmsnorm(x.data(), w.data(), out.data(), 4, 0.0f);
  const float rms = std::sqrt((1 + 4 + 9 + 16) / 4.0f);
  EXPECT_NEAR(out[2], 3 / rms * 2, 1e-6f);
  // RoPE by angle pi/2 turns (1, 0) into (0, 1); the pair with zero frequency is unchanged.
  std::vector<float> q{1, 0, 5, 6};
  const double inv_freq[2] = {M_PI / 2, 0.0};
  float cos_sin[4];
  rope_angles(1, inv_freq, 4, cos_sin);
  rope(q.data(), 1, 4, 4, cos_sin);
  EXPECT_NEAR(q[0], 0.0f, 1e-6f);
  EXPECT_NEAR(q[1], 1.0f, 1e-6f);
  EXPECT_FLOAT_EQ(q[2], 5.0f);
  EXPECT_FLOAT_EQ(q[3], 6.0f);
  std::vector<float> s{1, 2, 3};
  softmax(s.data(), 3);
  EXPECT_NEAR(s[0] + s[1] + s[2], 1.0f, 1e-6f);
  EXPECT_NEAR(s[2] / s[1], std::exp(1.0f), 1e-5f);
  std::vector<float> g{0.0f, 1.0f}, u{3.0f, 2.0f};
  silu_mul(g.data(), u.data(), 2);
  EXPECT_FLOAT_EQ(g[0], 0.0f);
  EXPECT_NEAR(g[1], 2.0f / (1.0f + std::exp(-1.0f)), 1e-6f);
}

// The F16C conversion that fills the f16 KV cache against the software rounding, bit for bit:
// normal values, ties, subnormals, overflow, infinities, signed zeros, and every tail length.
TEST(Kernels, F32ToF16MatchesSoftwareRoundingBitForBit) {
  std::mt19937 rng(12);
  std::vector<float> x;
  for (int i = 0; i < 4000; i++) {
    const uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) f = 1.0f;  // NaN payloads may differ; every other value may not
    x.push_back(i % 3 == 0 ? f : std::ldexp((float)(int)(rng() % 4096) - 2048.0f, (int)(rng() % 40) - 34));
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65520.0f, 1e9f, -1e9f, 1.0f + 1.0f / 2048, 5.96e-8f, 2.98e-8f, 1e-40f,
                  INFINITY, -INFINITY})
    x.push_back(f);
  for (Isa isa : supported_isas())
    for (size_t n : {x.size(), (size_t)7, (size_t)9}) {
      std::vector<uint16_t> want(n), got(n);
      f32_to_f16_scalar(x.data(), want.data(), (int64_t)n);
      kernels_for(isa).f32_to_f16(x.data(), got.data(), (int64_t)n);
      for (size_t i = 0; i < n; i++) ASSERT_EQ(got[i], want[i]) << isa_name(isa) << " x=" << x[i];
    }
}

// The vector SiLU against the scalar one: over the range activations take (and far past it,
// where exp would overflow if taken of +|g|), with lengths that leave every tail size.
TEST(Kernels, SiluMulMatchesScalarAtEveryIsa) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> wide(-120.0f, 120.0f), usual(-8.0f, 8.0f);
  for (Isa isa : supported_isas())
    for (int64_t n : {1, 15, 16, 17, 100, 1536}) {
      std::vector<float> g(n), u(n);
      for (int64_t i = 0; i < n; i++) g[i] = i % 5 == 0 ? wide(rng) : usual(rng), u[i] = usual(rng);
      std::vector<float> want = g, got = g;
      silu_mul(want.data(), u.data(), n);
      kernels_for(isa).silu_mul(got.data(), u.data(), n);
      for (int64_t i = 0; i < n; i++)
        ASSERT_NEAR(got[i], want[i], 1e-6f * std::abs(want[i]) + 1e-30f) << isa_name(isa) << " g=" << g[i];
    }
}

// Attention against a direct evaluation of softmax(q k^T / sqrt(d)) v with GQA, for head sizes
// the SIMD kernels take (64, 96, 128, 256) and one they leave to the generic path (8), F32 and F16
// caches, and more keys than one 16-lane vector. Rows past one key segment (256 keys) merge
// their segments: rows on both sides of the boundary, three segments, and few rows (decode's
// items split by segment over threads) as well as many (a row's segments on one thread).
// Each query row alone gives the same floats as the rows together (how work is grouped never
// changes a result).
TEST(Kernels, AttentionMatchesDirectFormula) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  struct Rows {
    int64_t n_ctx, pos0, n_q;
  };
  for (const Rows rs : {Rows{40, 21, 19}, Rows{280, 250, 19}, Rows{600, 580, 19}, Rows{600, 500, 3}})
    for (int hd : {8, 64, 96, 128, 256})
      for (DType kv_type : {DType::F32, DType::F16}) {
        const AttentionShape s{6, 2, hd};
        const int64_t n_ctx = rs.n_ctx, pos0 = rs.pos0, n_q = rs.n_q, kvd = 2 * hd, qd = 6 * hd;
        std::vector<float> k(n_ctx * kvd), v(n_ctx * kvd), q(n_q * qd), out(n_q * qd), one(qd);
        for (auto* vec : {&k, &v, &q})
          for (auto& e : *vec) e = nd(rng);
        std::vector<uint16_t> k16(k.size()), v16(v.size());
        for (size_t j = 0; j < k.size(); j++) {
          k16[j] = fp32_to_fp16(k[j]), v16[j] = fp32_to_fp16(v[j]);
          if (kv_type == DType::F16) k[j] = fp16_to_fp32(k16[j]), v[j] = fp16_to_fp32(v16[j]);
        }
        const void* kc = kv_type == DType::F16 ? (const void*)k16.data() : k.data();
        const void* vc = kv_type == DType::F16 ? (const void*)v16.data() : v.data();
        for (Isa isa : supported_isas()) {
          const auto kern = kernels_for(isa);
          attention(q.data(), kc, vc, kv_type, n_q, pos0, s, out.data(), kern);
          for (int64_t i = 0; i < n_q; i++) {
            attention(q.data() + i * qd, kc, vc, kv_type, 1, pos0 + i, s, one.data(), kern);
            for (int64_t j = 0; j < qd; j++) ASSERT_EQ(one[j], out[i * qd + j]) << "row " << i << " alone, " << isa_name(isa);
            for (int h = 0; h < 6; h++) {
              const int kvh = h / 3;
              std::vector<double> sc(pos0 + i + 1);
              double mx = -1e30, sum = 0;
              for (int64_t t = 0; t <= pos0 + i; t++) {
                double d = 0;
                for (int j = 0; j < hd; j++) d += q[i * qd + h * hd + j] * k[t * kvd + kvh * hd + j];
                sc[t] = d / std::sqrt((double)hd);
                mx = std::max(mx, sc[t]);
              }
              for (auto& e : sc) sum += (e = std::exp(e - mx));
              for (int j = 0; j < hd; j++) {
                double o = 0;
                for (int64_t t = 0; t <= pos0 + i; t++) o += sc[t] / sum * v[t * kvd + kvh * hd + j];
                ASSERT_NEAR(out[i * qd + h * hd + j], o, 2e-5)
                    << isa_name(isa) << " head_dim " << hd << " " << dtype_name(kv_type) << " pos0 " << pos0;
              }
            }
          }
        }
      }
}

}  // namespace
}  // namespace tandem::cpu
