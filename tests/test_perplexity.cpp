// Perplexity and KL divergence (engine/perplexity.h): the windowing, the statistics against
// values worked out by hand, and the scoring on a tiny model against its own logits computed
// token by token (decode), a different path through the model.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "engine/perplexity.h"
#include "engine/sampler.h"
#include "engine/sequence_runner.h"
#include "test_sequence.h"
#include "tiny_model.h"

namespace tandem {
namespace {

TEST(Perplexity, WindowsStartWithBosAndDropThePartialTail) {
  std::vector<int32_t> text(20);
  std::iota(text.begin(), text.end(), 100);
  const auto w = perplexity_windows(text, 8, 1);  // 7 text tokens a window: 2 whole ones
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0], (std::vector<int32_t>{1, 100, 101, 102, 103, 104, 105, 106}));
  EXPECT_EQ(w[1][0], 1);
  EXPECT_EQ(w[1][1], 107);
  EXPECT_EQ(perplexity_windows(text, 5, -1).size(), 4u);  // no BOS: 5 text tokens each
  EXPECT_EQ(perplexity_windows(text, 5, -1, 3).size(), 3u);
  EXPECT_TRUE(perplexity_windows(text, 64, 1).empty());
  EXPECT_EQ(first_scored(512), 256);
}

TEST(Perplexity, LogSoftmaxAndKlByHand) {
  const std::vector<float> row = {0.0f, std::log(3.0f)};  // softmax: 1/4, 3/4
  EXPECT_NEAR(log_softmax_at(row, 0), std::log(0.25), 1e-7);
  EXPECT_NEAR(log_softmax_at(row, 1), std::log(0.75), 1e-7);
  EXPECT_EQ(kl_divergence(row, row), 0.0);
  const std::vector<float> half = {0.0f, 0.0f};  // 1/2, 1/2
  // KL(P || Q) = 1/4 ln(1/2) + 3/4 ln(3/2).
  EXPECT_NEAR(kl_divergence(row, half), 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-7);
  EXPECT_GT(kl_divergence(half, row), 0.0);
  // Shifting every logit changes nothing.
  const std::vector<float> shifted = {100.0f, 100.0f + std::log(3.0f)};
  EXPECT_NEAR(kl_divergence(row, shifted), 0.0, 1e-6);
}

TEST(Perplexity, StatisticsByHand) {
  NllStats n;
  for (int i = 0; i < 10; i++) n.add(std::log(7.0));
  EXPECT_NEAR(n.perplexity(), 7.0, 1e-9);
  EXPECT_NEAR(n.perplexity_error(), 0.0, 1e-9);
  NllStats m;
  m.add(1.0), m.add(3.0);  // mean 2, sample sd sqrt(2): standard error 1
  EXPECT_NEAR(m.perplexity(), std::exp(2.0), 1e-9);
  EXPECT_NEAR(m.perplexity_error(), std::exp(2.0) * 1.0, 1e-9);
  KlStats k;
  for (int i = 1; i <= 100; i++) k.add(i, i % 4 != 0);
  EXPECT_DOUBLE_EQ(k.mean(), 50.5);
  EXPECT_DOUBLE_EQ(k.quantile(0.5), 50);
  EXPECT_DOUBLE_EQ(k.quantile(0.99), 99);
  EXPECT_DOUBLE_EQ(k.max(), 100);
  EXPECT_DOUBLE_EQ(k.same_top_fraction(), 0.75);
}

// The window's logits from one pass score the same NLL as the model's logits decoded one
// token at a time; and a configuration against itself has zero KL and full top-1 agreement.
TEST(Perplexity, WindowScoresEqualTokenByTokenLogits) {
  auto loaded = Model::from_gguf(test::tiny_model_file(test::TinyShape{}));
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  Model& m = *loaded.value();
  std::vector<int32_t> text(40);
  for (size_t i = 0; i < text.size(); i++) text[i] = (int32_t)((i * 29 + 7) % 96);
  const auto windows = perplexity_windows(text, 16, 1);
  ASSERT_EQ(windows.size(), 2u);
  const int64_t V = m.config().n_vocab;
  auto pool = m.new_kv_pool(1, DType::F32, 16);
  ASSERT_TRUE(pool.ok());
  SequenceRunner runner(m, *pool.value());
  NllStats windowed, stepped;
  KlStats self;
  for (const auto& w : windows) {
    runner.clear();
    auto r = runner.run(w, true);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const std::vector<float> all(r->begin(), r->end());
    test::OneSequence seq(m, 16, DType::F32);
    for (int64_t i = 0; i + 1 < (int64_t)w.size(); i++) {
      auto d = seq.decode(w[(size_t)i]);
      ASSERT_TRUE(d.ok());
      if (i < first_scored(16)) continue;
      const std::span<const float> row(all.data() + i * V, (size_t)V);
      windowed.add(-log_softmax_at(row, w[(size_t)i + 1]));
      stepped.add(-log_softmax_at(*d, w[(size_t)i + 1]));
      self.add(kl_divergence(row, row), Sampler::argmax(row) == Sampler::argmax(row));
    }
  }
  EXPECT_EQ(windowed.count(), 2 * 7);
  EXPECT_NEAR(windowed.perplexity(), stepped.perplexity(), 1e-3 * stepped.perplexity());
  EXPECT_GT(windowed.perplexity(), 1.0);
  EXPECT_EQ(self.max(), 0.0);
  EXPECT_EQ(self.same_top_fraction(), 1.0);
}

}  // namespace
}  // namespace tandem
