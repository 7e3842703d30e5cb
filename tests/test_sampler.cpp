#include <gtest/gtest.h>

#include <map>

#include "engine/sampler.h"

namespace tandem {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f};

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.sample(kLogits, {}), 1);
  EXPECT_EQ(Sampler::argmax(kLogits), 1);
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplingParams p;
  p.top_k = 1;
  p.temperature = 1.5f;
  Sampler s(p);
  for (int i = 0; i < 20; i++) EXPECT_EQ(s.sample(kLogits, {}), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f;
  p.seed = 99;
  Sampler a(p), b(p);
  for (int i = 0; i < 50; i++) EXPECT_EQ(a.sample(kLogits, {}), b.sample(kLogits, {}));
}

TEST(Sampler, DrawsFollowTheDistribution) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f;
  p.seed = 1;
  Sampler s(p);
  std::map<int, int> count;
  const int n = 20000;
  for (int i = 0; i < n; i++) count[s.sample(kLogits, {})]++;
  double z = 0;
  for (float l : kLogits) z += std::exp(l);
  for (int id = 0; id < 6; id++) EXPECT_NEAR(count[id] / (double)n, std::exp(kLogits[id]) / z, 0.015) << id;
}

TEST(Sampler, TopPAndMinPCutTheTail) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 0.5f;  // ids 1 and 4 (tied at 3.0) hold 2 x 0.32 of the mass: only they survive
  p.min_p = 0.0f;
  Sampler s(p);
  for (int i = 0; i < 200; i++) {
    const int t = s.sample(kLogits, {});
    EXPECT_TRUE(t == 1 || t == 4) << t;
  }
  SamplingParams q;
  q.temperature = 1.0f;
  q.top_k = 0, q.top_p = 1.0f;
  q.min_p = 0.5f;  // keeps p >= 0.5 * p_max: ids 1, 4 and 2 (e^-0.5 = 0.61)
  Sampler m(q);
  for (int i = 0; i < 200; i++) {
    const int t = m.sample(kLogits, {});
    EXPECT_TRUE(t == 1 || t == 4 || t == 2) << t;
  }
}

TEST(Sampler, RepetitionPenaltyDiscouragesRecentTokens) {
  SamplingParams p;
  p.temperature = 0;
  p.repeat_penalty = 2.0f;  // 3.0 -> 1.5 for ids 1 and 4, so 2 (2.5) wins
  Sampler s(p);
  const std::vector<int32_t> history = {1, 4};
  EXPECT_EQ(s.sample(kLogits, history), 2);
}

// Mask of tokens {0, 2, 5} of kLogits' six (bit t set <=> token t allowed).
const std::vector<uint64_t> kMask = {(1ull << 0) | (1ull << 2) | (1ull << 5)};

TEST(Sampler, GreedyUnderAMaskIsTheBestAllowedToken) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.sample(kLogits, {}, kMask), 2);  // 1 and 4 (3.0) are masked; 2 (2.5) is the best left
  const std::vector<uint64_t> only_last = {1ull << 5};
  EXPECT_EQ(s.sample(kLogits, {}, only_last), 5);
  const std::vector<uint64_t> none = {0};  // nothing allowed: the whole vocabulary, not a crash
  EXPECT_EQ(s.sample(kLogits, {}, none), 1);
}

TEST(Sampler, DrawsUnderAMaskFollowTheRenormalizedDistribution) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f;
  p.seed = 3;
  Sampler s(p);
  std::map<int, int> count;
  const int n = 20000;
  for (int i = 0; i < n; i++) count[s.sample(kLogits, {}, kMask)]++;
  const double z = std::exp(kLogits[0]) + std::exp(kLogits[2]) + std::exp(kLogits[5]);
  for (int id = 0; id < 6; id++) {
    const bool allowed = id == 0 || id == 2 || id == 5;
    EXPECT_NEAR(count[id] / (double)n, allowed ? std::exp(kLogits[id]) / z : 0.0, 0.015) << id;
  }
}

TEST(Sampler, VerifyRejectsADraftOutsideTheMask) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f;
  p.seed = 5;
  Sampler s(p);
  for (int i = 0; i < 200; i++) {
    const Sampler::Verdict v = s.verify(kLogits, {}, 1, kMask);  // token 1: the likeliest, but masked
    EXPECT_FALSE(v.accepted);
    EXPECT_TRUE(v.token == 0 || v.token == 2 || v.token == 5) << v.token;
  }
  SamplingParams g;
  g.temperature = 0;
  Sampler greedy(g);
  EXPECT_TRUE(greedy.verify(kLogits, {}, 2, kMask).accepted);
  EXPECT_FALSE(greedy.verify(kLogits, {}, 1, kMask).accepted);
}

}  // namespace
}  // namespace tandem
