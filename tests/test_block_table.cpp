// One sequence's block tables (kv/block_table.h) on their own, over a small pool: growing,
// trimming, window groups giving back what no query reads, the prefix cache, and the check
// Model::forward makes of every batch.
#include <gtest/gtest.h>

#include <stdexcept>

#include "backend/cpu/cpu_backend.h"
#include "kv/block_table.h"

namespace tandem {
namespace {

constexpr int kBlock = 4;
constexpr int64_t kWindow = 6;

// A CPU backend and a pool over it of 12 layers of which 5 and 11 attend to everything, the
// rest (windowed) to a window of 6: one full group and five window groups of two layers
// (Gemma 3's pattern). Not windowed: one group of all 12.
struct TestPool {
  CpuBackend backend;
  std::unique_ptr<BlockPool> pool;
  TestPool(int64_t blocks, bool windowed) {
    BlockPoolShape s{12, 2, 8, kBlock, blocks, DType::F16};
    if (windowed) {
      s.layer_windows.assign(12, kWindow);
      s.layer_windows[5] = s.layer_windows[11] = 0;
    }
    auto p = BlockPool::create(s, backend);
    if (!p.ok()) throw std::runtime_error(p.error().message);
    pool = std::move(p.value());
  }
  BlockPool& operator*() { return *pool; }
  BlockPool* operator->() { return pool.get(); }
};

std::vector<int32_t> some_tokens(int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; i++) t.push_back((i * 7 + 3) % 50 + 1);
  return t;
}

TEST(BlockTable, GrowsTrimsAndGivesEveryBlockBack) {
  TestPool pool(16, false);
  {
    BlockTable t(*pool);
    EXPECT_EQ(t.n_groups(), 1);
    ASSERT_TRUE(t.grow_to(10, 0));
    EXPECT_EQ(t.held_positions(), 12);
    EXPECT_EQ(pool->free_blocks(), 13);
    EXPECT_TRUE(t.check_reads(0, 12).ok());
    EXPECT_FALSE(t.check_reads(0, 13).ok());  // position 12 has no block
    t.trim(5);                                // positions 0..4: two blocks
    EXPECT_EQ(t.held_positions(), 8);
    EXPECT_EQ(pool->free_blocks(), 14);
    ASSERT_TRUE(t.grow_to(8, 5));  // already held: nothing taken
    EXPECT_EQ(pool->free_blocks(), 14);
    BlockTable moved = std::move(t);  // the references move with it, once
    EXPECT_EQ(t.n_blocks(), 0);
    EXPECT_EQ(moved.n_blocks(), 2);
    EXPECT_EQ(pool->free_blocks(), 14);
  }
  EXPECT_EQ(pool->free_blocks(), 16);  // destroyed: all back
}

TEST(BlockTable, RunningOutKeepsWhatItTook) {
  TestPool pool(3, false);
  BlockTable t(*pool);
  EXPECT_FALSE(t.grow_to(20, 0));
  EXPECT_EQ(t.held_positions(), 12);
  EXPECT_EQ(pool->free_blocks(), 0);
  t.release();
  EXPECT_EQ(pool->free_blocks(), 3);
  EXPECT_EQ(t.held_positions(), 0);
  BlockTable none;  // in no pool
  EXPECT_FALSE(none.grow_to(1, 0));
  EXPECT_TRUE(none.grow_to(0, 0));
  EXPECT_EQ(none.held_positions(), 0);
}

TEST(BlockTable, WindowGroupsHoldOnlyWhatALaterQueryReads) {
  TestPool pool(64, true);
  BlockTable t(*pool);
  ASSERT_EQ(t.n_groups(), 6);
  ASSERT_TRUE(t.grow_to(12, 0));  // 3 blocks in each of 6 groups
  EXPECT_EQ(t.n_blocks(), 18);
  // 12 computed: the next query (at 12) reads from 7 on, in block 1: block 0 of each window
  // group goes back; group 0 keeps the whole prefix.
  t.drop_out_of_window(12);
  EXPECT_EQ(t.n_blocks(), 18 - 5);
  EXPECT_EQ(t.tables()[1][0], -1);
  EXPECT_GE(t.tables()[0][0], 0);
  EXPECT_TRUE(t.check_reads(12, 12).ok());
  EXPECT_FALSE(t.check_reads(4, 12).ok());  // a query at 4 would read block 0 of window groups
  // Growing from 12 computed takes window blocks from block 1 only; up to 14 in window
  // groups while the full group grows to 16.
  ASSERT_TRUE(t.grow_to(16, 12, 14));
  EXPECT_TRUE(t.check_reads(12, 14).ok());
  EXPECT_EQ(t.tables()[0].size(), 4u);
  EXPECT_EQ(t.tables()[1].size(), 4u);
  EXPECT_EQ(t.held_positions(), 16);
  t.trim(9);
  EXPECT_EQ(t.held_positions(), 12);
  t.release();
  EXPECT_EQ(pool->free_blocks(), 64);
}

TEST(BlockTable, PublishedBlocksAreMatchedInTheirScopeOnly) {
  for (bool windowed : {false, true}) {
    TestPool pool(64, windowed);
    const std::vector<int32_t> toks = some_tokens(11);
    BlockTable a(*pool);
    ASSERT_TRUE(a.grow_to(11, 0));
    a.publish_full(toks, 11);  // blocks 0 and 1 are full
    BlockTable b(*pool), other(*pool, pool->scope_root("another scope"));
    EXPECT_EQ(b.match_prefix(toks), 8) << windowed;
    EXPECT_EQ(b.tables()[0][1], a.tables()[0][1]);
    EXPECT_EQ(pool->ref_count(a.tables()[0][1]), 2);
    EXPECT_EQ(other.match_prefix(toks), 0);
    std::vector<int32_t> changed = toks;
    changed[5] = 99;  // the second block differs
    BlockTable c(*pool);
    EXPECT_EQ(c.match_prefix(changed), 4);
    EXPECT_EQ(c.held_positions(), 4);
    a.release();
    b.release();
    c.release();
    EXPECT_EQ(pool->free_blocks(), 64);  // all free, published blocks cached
    BlockTable d(*pool);
    EXPECT_EQ(d.match_prefix(toks), 8);  // from the cache
  }
}

TEST(BlockTable, WindowHitNeedsTheWindowBeforeIt) {
  // A window group's blocks that left the window are not cached beside the prefix: a hit is
  // cut back to where every group holds the window before its first query.
  TestPool pool(64, true);
  const std::vector<int32_t> toks = some_tokens(25);
  BlockTable a(*pool);
  ASSERT_TRUE(a.grow_to(24, 0));
  a.drop_out_of_window(24);  // window blocks 0..3 go before they are published
  a.publish_full(toks, 24);
  BlockTable b(*pool);
  const int64_t hit = b.match_prefix(toks);
  EXPECT_EQ(hit, 24);  // blocks 4 and 5 hold the window before position 24
  EXPECT_TRUE(b.check_reads(hit, hit).ok());
  BlockTable c(*pool);
  EXPECT_EQ(c.match_prefix(std::span<const int32_t>(toks).first(20)), 0);  // the window before 20 reads block 3: gone
}

TEST(BlockTable, ABatchReadsOnlyBlocksOfThePool) {
  TestPool pool(8, false);
  BlockTable t(*pool);
  ASSERT_TRUE(t.grow_to(6, 0));
  const std::vector<int32_t> toks = some_tokens(6);
  ForwardBatch ok(kBlock);
  ASSERT_TRUE(ok.add_sequence(toks, 0, t.tables(), ForwardBatch::Logits::Last).ok());
  EXPECT_TRUE(BlockTable::check_batch(*pool, ok).ok());
  ForwardBatch wrong_size(kBlock * 2);
  ASSERT_TRUE(wrong_size.add_sequence(toks, 0, t.tables(), ForwardBatch::Logits::Last).ok());
  EXPECT_FALSE(BlockTable::check_batch(*pool, wrong_size).ok());
  const std::vector<int32_t> outside = {t.tables()[0][0], 8};  // block 8 of 8
  ForwardBatch bad(kBlock);
  ASSERT_TRUE(bad.add_sequence(toks, 0, outside, ForwardBatch::Logits::Last).ok());
  EXPECT_FALSE(BlockTable::check_batch(*pool, bad).ok());
  ForwardBatch decode(kBlock);  // a decode token at 5 reads blocks 0 and 1
  ASSERT_TRUE(decode.add_sequence(std::span<const int32_t>(toks).last(1), 5, outside, ForwardBatch::Logits::Last).ok());
  EXPECT_FALSE(BlockTable::check_batch(*pool, decode).ok());
}

}  // namespace
}  // namespace tandem
