// The bounded head (kernels/cpu/bounded_head.h): for rows read only for their argmax, the
// 8-bit twin plus a bound must give the f32-activation head's argmax, ties included, and that
// argmax's own float; every value it did not recompute must lie below the head's maximum and
// below the row's own exact float (the bound is a bound).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "kernels/cpu/bounded_head.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant_blocks.h"

namespace tandem::cpu {
namespace {

constexpr int64_t kRows = 2000, kCols = 576, kBlocks = kCols / kQK, kTokens = 16;

std::vector<BlockQ8_0> random_rows(std::mt19937& rng) {
  std::uniform_real_distribution<float> scale(0.001f, 0.01f);
  std::uniform_int_distribution<int> quant(-127, 127);
  std::vector<BlockQ8_0> w((size_t)(kRows * kBlocks));
  for (auto& b : w) {
    b.d = fp32_to_fp16(scale(rng));
    for (auto& q : b.qs) q = (int8_t)quant(rng);
  }
  // Row 5's family: exact copies (row 3 before it, row 30 after it) and copies one quant apart,
  // so the rows that tokens aimed at row 5 rank first are tied or within the 8-bit error.
  auto row = [&](int64_t r) { return w.begin() + r * kBlocks; };
  for (int64_t r : {3, 30}) std::copy(row(5), row(5) + kBlocks, row(r));
  for (int64_t r = 10; r < 20; r++) {
    std::copy(row(5), row(5) + kBlocks, row(r));
    // The block's largest quant one step toward zero: a row that tokens aimed at row 5 rank
    // just below it.
    BlockQ8_0& b = w[(size_t)(r * kBlocks + r % kBlocks)];
    int8_t* q = std::max_element(b.qs, b.qs + kQK, [](int8_t a, int8_t c) { return std::abs(a) < std::abs(c); });
    *q = (int8_t)(*q - (*q > 0 ? 1 : -1));
  }
  return w;
}

// Tokens 0-7 aim at row 5 (its weights plus noise), 8-13 are random, 14 is zeros (every
// logit 0: all rows tie), 15 holds a NaN.
std::vector<float> tokens(const std::vector<BlockQ8_0>& w, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> X((size_t)(kTokens * kCols));
  for (int64_t t = 0; t < kTokens; t++)
    for (int64_t i = 0; i < kCols; i++) {
      const BlockQ8_0& b = w[(size_t)(5 * kBlocks + i / kQK)];
      const float aim = fp16_to_fp32(b.d) * b.qs[i % kQK] * 100.0f;
      X[(size_t)(t * kCols + i)] = t < 8 ? aim + 0.05f * (float)t * nd(rng) : t < 14 ? nd(rng) : 0.0f;
    }
  X[(size_t)(15 * kCols + 7)] = std::numeric_limits<float>::quiet_NaN();
  return X;
}

TEST(BoundedHead, ArgmaxTiesAndFloatsAreTheExactHeads) {
  std::mt19937 rng(7);
  const std::vector<BlockQ8_0> w = random_rows(rng);
  const std::vector<float> X = tokens(w, rng);
  int checked = 0;
  for (Isa isa : supported_isas()) {
    const CpuKernels f32 = kernels_for(isa, false), q8 = kernels_for(isa, true);
    WeightMatrix exact{DType::Q8_0, reinterpret_cast<const uint8_t*>(w.data()), kRows, kCols, sizeof(BlockQ8_0) * kBlocks,
                       f32.row_dot(DType::Q8_0), nullptr, nullptr, {}, 0, {}, {}, {}, {}};
    exact.dot_tokens = f32.row_dot_tokens(DType::Q8_0);
    const auto head = BoundedHead::make(exact, q8);
    if (!head) continue;
    checked++;
    std::vector<float> want((size_t)(kTokens * kRows)), got((size_t)(kTokens * kRows));
    matmul(exact, X.data(), kTokens, want.data(), f32);
    // Tokens 0-14 together; then 14 and 15: without finite activations there is no bound, and
    // the call gives the exact head's floats for every row of every token.
    bounded_head_logits(exact, *head, X.data(), kTokens - 1, got.data(), q8);
    std::vector<float> last((size_t)(2 * kRows));
    bounded_head_logits(exact, *head, X.data() + 14 * kCols, 2, last.data(), q8);
    for (int64_t i = 0; i < 2 * kRows; i++)
      ASSERT_EQ(std::bit_cast<uint32_t>(last[(size_t)i]), std::bit_cast<uint32_t>(want[(size_t)(14 * kRows + i)]))
          << isa_name(isa) << " value " << i;
    for (int64_t t = 0; t < kTokens - 1; t++) {
      const float* ref = want.data() + t * kRows;
      const float* out = got.data() + t * kRows;
      const int64_t best = std::max_element(ref, ref + kRows) - ref;
      ASSERT_EQ(std::max_element(out, out + kRows) - out, best) << isa_name(isa) << " token " << t;
      ASSERT_EQ(std::bit_cast<uint32_t>(out[best]), std::bit_cast<uint32_t>(ref[best]));
      int64_t recomputed = 0;
      for (int64_t r = 0; r < kRows; r++) {
        if (std::bit_cast<uint32_t>(out[r]) == std::bit_cast<uint32_t>(ref[r])) {
          recomputed++;
          continue;
        }
        ASSERT_LT(out[r], ref[best]) << isa_name(isa) << " token " << t << " row " << r;
        ASSERT_LE(out[r], ref[r]) << isa_name(isa) << " token " << t << " row " << r << ": the bound does not hold";
      }
      if (t < 8) {
        EXPECT_EQ(best, 3) << "row 5's family ties at the top; the lowest index wins";
      } else if (t == 14) {
        EXPECT_EQ(best, 0);
      } else {  // the point of it: few rows need the f32 products
        EXPECT_LT(recomputed, kRows / 20) << isa_name(isa) << " token " << t;
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "this CPU has no AVX2: the head's multi-token float kernel, which the scheme needs, is absent";
}

TEST(BoundedHead, OnlyForQ8_0HeadsWithAMultiTokenFloatKernel) {
  std::mt19937 rng(8);
  const std::vector<BlockQ8_0> w = random_rows(rng);
  const CpuKernels f32 = kernels_for(best_isa(), false), q8 = kernels_for(best_isa(), true);
  WeightMatrix exact{DType::Q8_0, reinterpret_cast<const uint8_t*>(w.data()), kRows, kCols, sizeof(BlockQ8_0) * kBlocks,
                     f32.row_dot(DType::Q8_0), nullptr, nullptr, {}, 0, {}, {}, {}, {}};
  EXPECT_EQ(BoundedHead::make(exact, q8), nullptr) << "no multi-token float kernel: its floats could not be recomputed";
  exact.dot_tokens = f32.row_dot_tokens(DType::Q8_0);
  EXPECT_EQ(BoundedHead::make(exact, f32), nullptr) << "float kernels have no 8-bit twin";
  exact.type = DType::Q4_0;
  EXPECT_EQ(BoundedHead::make(exact, q8), nullptr);
}

}  // namespace
}  // namespace tandem::cpu
