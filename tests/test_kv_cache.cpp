#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "core/fp16.h"
#include "kv/kv_cache.h"

namespace tandem {
namespace {

TEST(KvCache, SeedFormulaLlama2_70B) {
  // 80 layers, 8 KV heads (GQA), head dim 128, 4096 tokens, fp16: 1.34 GB per sequence.
  EXPECT_EQ(kv_cache_bytes(80, 8, 4096, 128, 2), 1342177280ull);
  // Without GQA (64 KV heads) it is 8x: 10.7 GB.
  EXPECT_EQ(kv_cache_bytes(80, 64, 4096, 128, 2), 10737418240ull);
  EXPECT_EQ(kv_cache_bytes(80, 8, 4096, 128, 2, 4), 4 * 1342177280ull);
}

TEST(KvCache, AllocatesExactlyTheFormula) {
  for (DType t : {DType::F16, DType::F32}) {
    auto kv = KvCache::create({30, 3, 64, 1000, t});
    ASSERT_TRUE(kv.ok()) << kv.error().message;
    EXPECT_EQ(kv->allocated_bytes(), kv_cache_bytes(30, 3, 1000, 64, t == DType::F16 ? 2 : 4));
    // Layer 29's V ends exactly at the end of the allocation.
    const auto* begin = static_cast<const uint8_t*>(kv->k(0));
    const auto* end_v = static_cast<const uint8_t*>(kv->v(29)) + 1000 * 3 * 64 * kv->elem_bytes();
    EXPECT_EQ((uint64_t)(end_v - begin), kv->allocated_bytes());
  }
}

// The forward pass sees a contiguous cache as a KvStore of one block holding the whole
// context: the backend's store at positions 3 and 4 of layer 1 lands in k(1) and v(1) rows.
TEST(KvCache, StoresRowsAtTheirPositions) {
  auto kv = KvCache::create({2, 1, 4, 8, DType::F16});
  ASSERT_TRUE(kv.ok());
  const std::vector<float> k = {1, 2, 3, 4, 5, 6, 7, 8}, v = {-1, -2, -3, -4, -5, -6, -7, -8};
  CpuBackend be;
  const Tensor kt = be.upload(k, 2, 4), vt = be.upload(v, 2, 4);
  const KvStore store{static_cast<uint8_t*>(kv->k(0)), DType::F16, 2, 8, 1, 4 * kv->elem_bytes()};
  ForwardBatch b(8);
  const int32_t table[1] = {0};
  ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{0, 0}, 3, table, ForwardBatch::Logits::None).ok());
  be.run_pass(2, [&] { be.store_kv(kt, vt, store, 1, b); });
  kv->advance(5);
  EXPECT_EQ(kv->size(), 5);
  const auto* kh = static_cast<const uint16_t*>(kv->k(1));
  const auto* vh = static_cast<const uint16_t*>(kv->v(1));
  EXPECT_EQ(fp16_to_fp32(kh[3 * 4 + 0]), 1.0f);
  EXPECT_EQ(fp16_to_fp32(kh[4 * 4 + 3]), 8.0f);
  EXPECT_EQ(fp16_to_fp32(vh[4 * 4 + 3]), -8.0f);
  kv->truncate(2);
  EXPECT_EQ(kv->size(), 2);
  kv->clear();
  EXPECT_EQ(kv->size(), 0);
}

TEST(KvCache, RejectsBadShapes) {
  EXPECT_FALSE(KvCache::create({0, 3, 64, 10, DType::F16}).ok());
  EXPECT_FALSE(KvCache::create({2, 3, 64, 10, DType::Q8_0}).ok());
}

}  // namespace
}  // namespace tandem
