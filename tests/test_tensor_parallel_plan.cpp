// Which rows and heads each rank of a tensor-parallel job owns (model/tensor_parallel.h), and
// what a pass moves between the ranks: no MPI needed (test_tensor_parallel.cpp runs the ranks).
#include <gtest/gtest.h>

#include <numeric>

#include "model/tensor_parallel.h"

namespace tandem {
namespace {

ModelConfig config(int n_embd, int n_head, int n_kv_head, int head_dim, int n_ff, int n_vocab, int n_layer = 30) {
  ModelConfig c;
  c.arch = "llama", c.name = "shape";
  c.n_embd = n_embd, c.n_head = n_head, c.n_kv_head = n_kv_head, c.head_dim = head_dim, c.n_ff = n_ff;
  c.n_vocab = n_vocab, c.n_layer = n_layer;
  return c;
}
ModelConfig smollm2_135m() { return config(576, 9, 3, 64, 1536, 49152); }

std::vector<TensorParallelPlan> plans(const ModelConfig& c, int size) {
  std::vector<TensorParallelPlan> all;
  for (int r = 0; r < size; r++) {
    auto p = TensorParallelPlan::make(c, r, size);
    EXPECT_TRUE(p.ok()) << p.error().message;
    if (p.ok()) all.push_back(p.value());
  }
  return all;
}

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

// Every rank's shares cover each dimension once, in rank order, as its own fields say.
void expect_tiles(const ModelConfig& c, const std::vector<TensorParallelPlan>& ps) {
  int q = 0;
  int64_t ff = 0, embd = 0, vocab = 0;
  for (const TensorParallelPlan& p : ps) {
    EXPECT_EQ(p.q_head0, q);
    EXPECT_EQ(p.ff0, ff);
    EXPECT_EQ(p.embd0, embd);
    EXPECT_EQ(p.vocab0, vocab);
    EXPECT_EQ(p.q_cols[(size_t)p.rank], (int64_t)p.n_q_head * c.head_dim);
    EXPECT_EQ(p.ff_cols[(size_t)p.rank], p.n_ff);
    EXPECT_EQ(p.embd_cols[(size_t)p.rank], p.n_embd);
    EXPECT_EQ(p.vocab_cols[(size_t)p.rank], p.n_vocab);
    // A rank's query heads read only its K,V heads.
    EXPECT_GE(p.q_head0 / c.gqa_group(), p.kv_head0);
    EXPECT_LE((p.q_head0 + p.n_q_head - 1) / c.gqa_group(), p.kv_head0 + p.n_kv_head - 1);
    q += p.n_q_head, ff += p.n_ff, embd += p.n_embd, vocab += p.n_vocab;
    EXPECT_EQ(sum(p.q_cols), (int64_t)c.q_dim());
    EXPECT_EQ(sum(p.embd_cols), c.n_embd);
  }
  EXPECT_EQ(q, c.n_head);
  EXPECT_EQ(ff, c.n_ff);
  EXPECT_EQ(embd, c.n_embd);
  EXPECT_EQ(vocab, c.n_vocab);
}

TEST(TensorParallelPlan, SmolLM2SplitsItsThreeKvHeadsUnevenly) {
  const ModelConfig c = smollm2_135m();
  const auto two = plans(c, 2);
  ASSERT_EQ(two.size(), 2u);
  expect_tiles(c, two);
  EXPECT_EQ(two[0].n_kv_head, 2);
  EXPECT_EQ(two[0].n_q_head, 6);
  EXPECT_EQ(two[1].kv_head0, 2);
  EXPECT_EQ(two[1].n_q_head, 3);
  EXPECT_FALSE(two[1].kv_replicated);
  EXPECT_EQ(two[1].n_embd, 288);
  const auto three = plans(c, 3);
  ASSERT_EQ(three.size(), 3u);
  expect_tiles(c, three);
  for (const auto& p : three) {
    EXPECT_EQ(p.n_kv_head, 1);
    EXPECT_EQ(p.n_q_head, 3);
    EXPECT_EQ(p.n_embd, 192);
  }
  // 3 K,V heads over 4 ranks: neither divided nor replicated evenly.
  auto four = TensorParallelPlan::make(c, 0, 4);
  ASSERT_FALSE(four.ok());
  EXPECT_NE(four.error().message.find("its 3 K,V heads are fewer than 4 ranks"), std::string::npos)
      << four.error().message;
}

TEST(TensorParallelPlan, ReplicatedKvHeadsShareTheirQueryHeadsUnevenly) {
  const ModelConfig qwen = config(896, 14, 2, 64, 4864, 151936, 24);
  const auto ps = plans(qwen, 4);
  ASSERT_EQ(ps.size(), 4u);
  expect_tiles(qwen, ps);
  const int q[] = {4, 3, 4, 3}, kv[] = {0, 0, 1, 1};
  for (int r = 0; r < 4; r++) {
    EXPECT_EQ(ps[(size_t)r].n_q_head, q[r]);
    EXPECT_EQ(ps[(size_t)r].kv_head0, kv[r]);
    EXPECT_TRUE(ps[(size_t)r].kv_replicated);
  }
}

TEST(TensorParallelPlan, RowSharesAreWholeGroupsAndTheLastTakesTheRest) {
  const ModelConfig c = config(640, 4, 1, 256, 2048, 1000);  // Gemma 3 270M's widths, a vocabulary of 62.5 groups
  const auto ps = plans(c, 3);
  ASSERT_EQ(ps.size(), 3u);
  expect_tiles(c, ps);
  EXPECT_EQ(ps[0].embd_cols, (std::vector<int64_t>{224, 208, 208}));
  EXPECT_EQ(ps[0].vocab_cols, (std::vector<int64_t>{336, 336, 328}));
  EXPECT_EQ(ps[0].q_cols, (std::vector<int64_t>{512, 256, 256}));
  auto narrow = TensorParallelPlan::make(config(64, 4, 2, 16, 16, 96), 0, 2);
  ASSERT_FALSE(narrow.ok());
  EXPECT_NE(narrow.error().message.find("feed-forward width of 16 is fewer than 2 groups of 16 rows"), std::string::npos)
      << narrow.error().message;
}

TEST(TensorParallelPlan, KvHeadShareIsRankZerosLargest) {
  auto s = kv_head_share(8, 0, 3);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->count, 3);
  EXPECT_EQ(kv_head_share(8, 2, 3)->count, 2);
  EXPECT_EQ(kv_head_share(8, 2, 3)->first, 6);
  EXPECT_TRUE(kv_head_share(1, 3, 4)->replicated);
  EXPECT_FALSE(kv_head_share(3, 0, 4).ok());
}

// Per layer a rank receives the others' shares of the attention output, the gated activation
// and the two branch outputs; the logits' other shares once.
TEST(TensorParallelPlan, CommunicationCostCountsWhatARankReceives) {
  const ModelConfig c = smollm2_135m();
  const auto ps = plans(c, 2);
  ASSERT_EQ(ps.size(), 2u);
  const CommunicationCost k = communication_cost(c, ps[1], 1, 1);
  EXPECT_EQ(k.collectives, 4 * 30 + 2);
  EXPECT_EQ(k.per_layer_bytes, (6 * 64 + 768 + 2 * 288) * 4.0);  // rank 0's 6 heads, 768 of n_ff, 288 of n_embd twice
  EXPECT_EQ(k.logits_bytes, 24576 * 4.0);
  EXPECT_EQ(k.gathered_bytes, 30 * k.per_layer_bytes + k.logits_bytes);
  EXPECT_EQ(k.wire_bytes_per_rank(2), k.gathered_bytes + 576 * 4.0);
  EXPECT_EQ(communication_cost(c, TensorParallelPlan::whole(c), 1, 1).collectives, 0);
}

}  // namespace
}  // namespace tandem
