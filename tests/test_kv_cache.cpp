// The KV cache's memory: the seed's size formula, and the paged pool every command keeps its
// K,V in (backend-allocated storage; rows land at the slots the ForwardBatch names).
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/fp16.h"
#include "kv/block_pool.h"
#include "kv/kv_planner.h"

namespace tandem {
namespace {

TEST(KvCache, SeedFormulaLlama2_70B) {
  // 80 layers, 8 KV heads (GQA), head dim 128, 4096 tokens, fp16: 1.34 GB per sequence.
  EXPECT_EQ(kv_cache_bytes(80, 8, 4096, 128, 2), 1342177280ull);
  // Without GQA (64 KV heads) it is 8x: 10.7 GB.
  EXPECT_EQ(kv_cache_bytes(80, 64, 4096, 128, 2), 10737418240ull);
  EXPECT_EQ(kv_cache_bytes(80, 8, 4096, 128, 2, 4), 4 * 1342177280ull);
}

TEST(KvCache, PoolAllocatesExactlyTheFormula) {
  CpuBackend be;
  for (DType t : {DType::F16, DType::F32}) {
    auto pool = BlockPool::create({30, 3, 64, 16, 63, t}, be);  // 1008 positions
    ASSERT_TRUE(pool.ok()) << pool.error().message;
    EXPECT_EQ(pool.value()->bytes(), kv_cache_bytes(30, 3, 63 * 16, 64, t == DType::F16 ? 2 : 4));
    EXPECT_EQ(pool.value()->store().bytes(), pool.value()->bytes());
  }
  // q8_0: 34 bytes per 32 elements.
  auto q = BlockPool::create({30, 3, 64, 16, 63, DType::Q8_0}, be);
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_EQ(q.value()->bytes(), 2ull * 30 * 3 * (64 / 32 * 34) * 63 * 16);
  EXPECT_EQ(q.value()->row_bytes(), 3u * 2 * 34);
}

// The backend's store puts a token's K and V rows of a layer at its slot: position p of a
// sequence in block table[p / block_tokens], row p % block_tokens, after the layer's offset.
TEST(KvCache, StoresRowsAtTheirSlots) {
  CpuBackend be;
  auto pool = BlockPool::create({2, 1, 4, 4, 3, DType::F16}, be);
  ASSERT_TRUE(pool.ok());
  const KvStore& kv = pool.value()->store();
  const std::vector<float> k = {1, 2, 3, 4, 5, 6, 7, 8}, v = {-1, -2, -3, -4, -5, -6, -7, -8};
  const Tensor kt = be.upload(k, 2, 4), vt = be.upload(v, 2, 4);
  ForwardBatch b(4);
  const int32_t table[2] = {2, 0};  // positions 0-3 in block 2, 4-7 in block 0
  ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{0, 0}, 3, table, ForwardBatch::Logits::None).ok());
  be.run_pass(2, [&] { be.store_kv(kt, vt, kv, 1, b); });
  auto at = [&](int32_t block, size_t offset, int row) {
    return reinterpret_cast<const uint16_t*>(kv.data + (size_t)block * kv.block_bytes() + offset + (size_t)row * kv.row_bytes);
  };
  EXPECT_EQ(fp16_to_fp32(at(2, kv.k_offset(1), 3)[0]), 1.0f);  // position 3: block 2, row 3
  EXPECT_EQ(fp16_to_fp32(at(0, kv.k_offset(1), 0)[3]), 8.0f);  // position 4: block 0, row 0
  EXPECT_EQ(fp16_to_fp32(at(0, kv.v_offset(1), 0)[3]), -8.0f);
}

TEST(KvCache, PoolRejectsBadShapes) {
  CpuBackend be;
  EXPECT_FALSE(BlockPool::create({0, 3, 64, 16, 10, DType::F16}, be).ok());
  EXPECT_FALSE(BlockPool::create({2, 3, 64, 16, 0, DType::F16}, be).ok());
  EXPECT_FALSE(BlockPool::create({2, 3, 64, 16, 10, DType::Q4_0}, be).ok());
  EXPECT_FALSE(BlockPool::create({2, 3, 48, 16, 10, DType::Q8_0}, be).ok());  // 48: not whole q8_0 blocks
  // An absurd pool is an error naming the bytes, never a crash.
  auto huge = BlockPool::create({80, 8, 128, 16, int64_t(1) << 40, DType::F16}, be);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.error().message.find("bytes"), std::string::npos) << huge.error().message;
}

}  // namespace
}  // namespace tandem
