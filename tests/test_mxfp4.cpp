// MXFP4 (GGML type 39: gpt-oss's expert weights). Decoding against the gguf package (every
// E8M0 scale byte with every code; blocks the package's quantizer made), each ISA's float and
// 8-bit row products against their scalar twins and float64 sums over the decoded weights at
// gpt-oss's row length (2880, 90 blocks) and at odd block counts, and the CPU backend's
// products of a prepared MXFP4 weight. The packed kernels' exactness and int16 headroom are
// checked with the other packed types in test_kernels.cpp.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "gguf/gguf_file.h"
#include "gguf_builder.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/packed_quant.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_dot.h"
#include "kv/kv_planner.h"
#include "quant_vectors.h"

namespace tandem {
namespace {

using cpu::BlockQ8Act;
using cpu::Isa;

// Random MXFP4 rows: scales 2^-10 .. 2^-4 (E8M0 118 .. 124), random codes.
std::vector<uint8_t> random_rows(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<uint8_t> raw((size_t)(rows * cols / 32 * 17));
  for (auto& b : raw) b = (uint8_t)rng();
  for (size_t at = 0; at < raw.size(); at += 17) raw[at] = (uint8_t)(118 + rng() % 7);
  return raw;
}

std::vector<float> decoded(const std::vector<uint8_t>& raw, int64_t n) {
  std::vector<float> out((size_t)n);
  EXPECT_TRUE(cpu::dequantize_row(DType::MXFP4, raw.data(), out.data(), n));
  return out;
}

TEST(Mxfp4, TypeGeometryAndName) {
  const auto info = dtype_info(39);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->name, "MXFP4");
  EXPECT_EQ(info->block_elems, 32u);
  EXPECT_EQ(info->block_bytes, 17u);
  EXPECT_TRUE(info->compute_supported);
  EXPECT_EQ(*dtype_from_name("mxfp4"), DType::MXFP4);
  EXPECT_EQ(sizeof(cpu::BlockMxfp4), 17u);
}

// A GGUF file with an MXFP4 tensor parses, its bytes counted as 17 per 32 elements.
TEST(Mxfp4, GgufTensorLoads) {
  test::GgufBuilder b;
  b.kv_str("general.architecture", "llama");
  std::mt19937 rng(3);
  b.tensor("w", DType::MXFP4, {64, 3}, random_rows(3, 64, rng));
  const auto bytes = b.build();
  auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
  ASSERT_TRUE(f.ok()) << f.error().message;
  const GgufTensor* t = f.value()->find_tensor("w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype(), DType::MXFP4);
  EXPECT_EQ(t->nbytes, 3u * 2 * 17);
  EXPECT_TRUE(t->type.compute_supported);
}

// ggml_e8m0_to_fp32_half: 2^(e - 128) for every byte, 0 and 1 subnormal, 255 finite.
TEST(Mxfp4, ScaleIsHalfTheE8M0PowerOfTwo) {
  for (int e = 0; e < 256; e++) EXPECT_EQ(cpu::mxfp4_scale((uint8_t)e), std::ldexp(1.0f, e - 128)) << "e " << e;
  EXPECT_EQ(std::bit_cast<uint32_t>(cpu::mxfp4_scale(0)), 0x00200000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(cpu::mxfp4_scale(255)), 0x7F000000u);
}

// Bit for bit what the package decodes: every scale with every code (infinities where
// 2^127 x 2 and more overflow, as in ggml), and the package's own quantizer's blocks.
TEST(Mxfp4, DecodesAsTheGgufPackage) {
  const auto records = test::load_quant_vectors("mxfp4_vectors.bin");
  ASSERT_EQ(records.size(), 2u) << "tests/data/mxfp4_vectors.bin missing or short";
  ASSERT_EQ(records[0].values.size(), 256u * 32);
  for (const auto& r : records) {
    ASSERT_EQ(r.type, DType::MXFP4);
    const std::vector<float> got = decoded(r.raw, (int64_t)r.values.size());
    for (size_t i = 0; i < got.size(); i++)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(r.values[i]))
          << "element " << i << ": " << got[i] << " vs " << r.values[i];
  }
}

// Each ISA's float row dot against the scalar twin and a float64 sum over decoded weights;
// each ISA's 8-bit dot against the scalar twin, a float64 sum over decoded weights times the
// decoded 8-bit activations, and (loosely) the float activations; the four-token dot equal to
// the one-token dot. Rows of 1, 3 and 5 blocks (AVX-512 pairs blocks) and of gpt-oss's 2880.
TEST(Mxfp4, RowDotsEveryIsa) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  const auto quantized = test::load_quant_vectors("mxfp4_vectors.bin");
  ASSERT_EQ(quantized.size(), 2u);
  for (int64_t cols : {32, 96, 160, 2880, 2048}) {
    // 2048: the package's quantized blocks (a spread of scales); the others random rows.
    const std::vector<uint8_t> raw = cols == 2048 ? quantized[1].raw : random_rows(4, cols, rng);
    const int64_t rows = (int64_t)raw.size() / (cols / 32 * 17);
    const std::vector<float> w = decoded(raw, rows * cols);
    std::vector<float> x(4 * cols);
    for (auto& e : x) e = nd(rng);
    std::vector<BlockQ8Act> xq(4 * cols / 32);
    cpu::quantize_act_scalar(x.data(), xq.data(), 4 * cols);
    std::vector<float> x8(cols);  // token 0's 8-bit activations, decoded (d q: exact in float)
    for (int64_t i = 0; i < cols; i++) x8[i] = xq[i / 32].d * xq[i / 32].qs[i % 32];
    for (int64_t r = 0; r < rows; r++) {
      const uint8_t* row = raw.data() + r * (cols / 32 * 17);
      const auto [exact, mag] = test::dot64(w.data() + r * cols, x.data(), cols);
      const auto [exact8, mag8] = test::dot64(w.data() + r * cols, x8.data(), cols);
      const float scalar = cpu::row_dot_scalar(DType::MXFP4, row, x.data(), cols);
      const float scalar8 = cpu::quant_dot_scalar(DType::MXFP4, row, xq.data(), cols);
      EXPECT_NEAR(scalar, exact, 1e-5 * mag + 1e-12) << cols;
      EXPECT_NEAR(scalar8, exact8, 1e-5 * mag8 + 1e-12) << cols;
      EXPECT_NEAR(scalar8, exact, 0.02 * mag) << cols << ": 8-bit activations stay close to exact";
      for (Isa isa : cpu::supported_isas()) {
        const cpu::CpuKernels& k = cpu::kernels_for(isa);
        ASSERT_NE(k.row_dot(DType::MXFP4), nullptr) << isa_name(isa);
        ASSERT_NE(k.quant_dot(DType::MXFP4), nullptr) << isa_name(isa);
        ASSERT_NE(k.quant_dot4(DType::MXFP4), nullptr) << isa_name(isa);
        EXPECT_NEAR(k.row_dot(DType::MXFP4)(row, x.data(), cols), scalar, 1e-5 * mag + 1e-12)
            << isa_name(isa) << " cols " << cols;
        const float one = k.quant_dot(DType::MXFP4)(row, xq.data(), cols);
        EXPECT_NEAR(one, scalar8, 1e-5 * mag8 + 1e-12) << isa_name(isa) << " cols " << cols;
        float four[4];
        k.quant_dot4(DType::MXFP4)(row, xq.data(), cols / 32, cols, four);
        for (int j = 0; j < 4; j++)
          EXPECT_EQ(four[j], k.quant_dot(DType::MXFP4)(row, xq.data() + j * cols / 32, cols))
              << isa_name(isa) << " cols " << cols << " token " << j;
      }
    }
  }
}

// Packed groups hold the 16 rows' GGUF bytes exactly when the block count is a multiple of 4
// (units of four blocks), and round up to a whole unit otherwise.
TEST(Mxfp4, PackedGroupsAreTheRowsBytes) {
  EXPECT_TRUE(cpu::can_pack(DType::MXFP4));
  EXPECT_EQ(cpu::packed_group_bytes(DType::MXFP4, 2880), 16u * 90 * 17 + 2 * 16 * 17);  // 90 blocks: 23 units
  EXPECT_EQ(cpu::packed_group_bytes(DType::MXFP4, 2048), 16u * 64 * 17);
  EXPECT_EQ(cpu::packed_group_bytes(DType::MXFP4, 32), 16u * 4 * 17);
}

// The packed kernels turn scale bytes into floats 16 (AVX-512) or 8 (AVX2) rows at a time:
// every byte up to 199 (the subnormal 0 and 1 too; larger ones overflow the sums) gives the
// scalar twin's floats exactly, row r block b having scale byte (16 r + b) % 200.
TEST(Mxfp4, PackedKernelsTakeEveryScale) {
  std::mt19937 rng(41);
  std::normal_distribution<float> nd;
  const int64_t rows = 16, cols = 32 * 16, nb = cols / 32;
  auto raw = random_rows(rows, cols, rng);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t b = 0; b < nb; b++) raw[(r * nb + b) * 17] = (uint8_t)((16 * r + b) % 200);
  const auto packed = cpu::pack_rows(DType::MXFP4, raw.data(), rows, cols, (size_t)(nb * 17));
  std::vector<float> x(cpu::kPackMaxTokens * cols);
  for (auto& e : x) e = nd(rng);
  std::vector<BlockQ8Act> xq(cpu::kPackMaxTokens * nb);
  cpu::quantize_act_scalar(x.data(), xq.data(), (int64_t)x.size());
  std::vector<float> ref(cpu::kPackMaxTokens * rows), got(ref.size());
  cpu::packed_gemm_scalar(DType::MXFP4, packed.get(), cols, xq.data(), nb, cpu::kPackMaxTokens, ref.data(), rows, rows);
  for (int j = 0; j < cpu::kPackMaxTokens; j++)
    for (int64_t r = 0; r < rows; r++) {
      const float plain = cpu::quant_dot_scalar(DType::MXFP4, raw.data() + r * nb * 17, xq.data() + j * nb, cols);
      ASSERT_TRUE(std::isfinite(ref[j * rows + r]));
      ASSERT_NEAR(ref[j * rows + r], plain, 1e-5f * std::fabs(plain)) << "row " << r;
    }
  int kernels = 0;
  for (Isa isa : cpu::supported_isas()) {
    const cpu::PackedGemmFn f = cpu::kernels_for(isa).packed(DType::MXFP4);
    if (!f) continue;
    kernels++;
    f(packed.get(), cols, xq.data(), nb, cpu::kPackMaxTokens, got.data(), rows, rows);
    for (size_t i = 0; i < got.size(); i++)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(ref[i])) << isa_name(isa) << " output " << i;
  }
  if (kernels == 0) GTEST_SKIP() << "no AVX2 on this CPU: no packed kernel to check";
}

// The CPU backend's product of a prepared MXFP4 weight (packed for 8-bit activations on AVX2
// and AVX-512; row kernels otherwise) against float64 sums over the decoded weights, at every
// ISA, in both activation modes, for 1 and several tokens; a 49-row matrix leaves a partial
// 16-row group.
TEST(Mxfp4, CpuBackendMatmulMatchesDecodedWeights) {
  std::mt19937 rng(29);
  std::normal_distribution<float> nd;
  const int64_t rows = 49, cols = 2880;
  const auto raw = random_rows(rows, cols, rng);
  const std::vector<float> w = decoded(raw, rows * cols);
  const int64_t max_tokens = 11;
  std::vector<float> x(max_tokens * cols);
  for (auto& e : x) e = nd(rng);
  for (Isa isa : cpu::supported_isas())
    for (bool int8 : {true, false}) {
      CpuBackend be(CpuBackendOptions{isa, 2, int8});
      const WeightSource src{"blk.0.ffn_up_exps.weight", DType::MXFP4, raw.data(), rows, cols, (size_t)(cols / 32 * 17)};
      auto prepared = be.prepare_weight(src, true);
      ASSERT_TRUE(prepared.ok()) << prepared.error().message;
      const Weight W = prepared.value();
      EXPECT_EQ(W.type, DType::MXFP4);
      EXPECT_EQ(W.bytes, raw.size());
      for (int64_t n : {int64_t(1), int64_t(3), max_tokens}) {
        const Tensor in = be.upload(std::span<const float>(x.data(), n * cols), n, cols), out = be.new_tensor(n, rows);
        const Product p{&W, &out};
        be.run_pass(n, [&] { be.matmul({&p, 1}, in); });
        const std::span<const float> y = be.read(out);
        for (int64_t t = 0; t < n; t++)
          for (int64_t r = 0; r < rows; r++) {
            const auto [ref, mag] = test::dot64(w.data() + r * cols, x.data() + t * cols, cols);
            ASSERT_NEAR(y[t * rows + r], ref, (int8 ? 0.02 : 1e-5) * mag)
                << isa_name(isa) << (int8 ? " 8-bit" : " f32") << " tokens " << n << " token " << t << " row " << r;
          }
      }
    }
}

}  // namespace
}  // namespace tandem
