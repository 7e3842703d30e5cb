// The Speculator on its own, without a scheduler: lookup drafts into free target blocks only,
// the verdict walk (accepted prefix, the target's own token, back-off), the draft model's
// passes and the rollback of its K,V.
#include <gtest/gtest.h>

#include "engine/draft_lookup.h"
#include "engine/speculator.h"
#include "speculative_helpers.h"

namespace tandem {
namespace {

using namespace spec_test;

struct Fixture {
  std::unique_ptr<Model> model = tiny_model();
  std::unique_ptr<BlockPool> pool = pool_for(*model, 32);
  SpeculationStats stats;
};

// A decoding sequence over `tokens`: its target blocks hold every token's K,V but the last.
DraftRequest decoding(Speculation& sp, const Tokens& tokens, BlockTable& kv, int64_t room = 100) {
  EXPECT_TRUE(kv.grow_to((int64_t)tokens.size() - 1, 0));
  DraftRequest r;
  r.spec = &sp;
  r.tokens = tokens;
  r.kv = &kv;
  r.room = room;
  return r;
}

TEST(Speculator, LookupDraftsWhatRecursWithinRoomBudgetAndFreeBlocks) {
  Fixture f;
  Speculator spec(lookup(6), {}, *f.model, 512, f.stats);
  const Tokens tokens = repetitive_prompt(1);
  const std::vector<int32_t> expect = lookup_draft(tokens, lookup(6).lookup, 6);
  ASSERT_EQ(expect.size(), 6u);

  auto sp = spec.start(std::nullopt, {});
  ASSERT_TRUE(sp.ok()) << sp.error().message;
  BlockTable kv(*f.pool);
  std::vector<DraftRequest> reqs{decoding(sp.value(), tokens, kv)};
  EXPECT_EQ(spec.propose(reqs, 512), 6);
  EXPECT_EQ(sp.value().draft, expect);
  EXPECT_GE(kv.held_positions(), (int64_t)tokens.size() + 6);  // the decode token and the draft

  // The room left before max_tokens and the pass's budget both cap it; a grammar cuts it.
  EXPECT_EQ(spec.propose(reqs, 2), 2);
  reqs[0].room = 1;
  EXPECT_EQ(spec.propose(reqs, 512), 1);
  reqs[0].room = 100;
  reqs[0].prune = [](std::vector<int32_t>& d) { d.resize(3); };
  EXPECT_EQ(spec.propose(reqs, 512), 3);
  EXPECT_EQ(sp.value().draft, std::vector<int32_t>(expect.begin(), expect.begin() + 3));

  // Only free blocks: with the pool taken by another sequence, the draft shrinks to the
  // positions the sequence already holds.
  kv.trim((int64_t)tokens.size());
  BlockTable hog(*f.pool);
  hog.grow_to(f.pool->shape().n_blocks * f.pool->block_tokens(), 0);
  reqs[0].prune = nullptr;
  const int64_t held = kv.held_positions() - (int64_t)tokens.size();
  EXPECT_EQ(spec.propose(reqs, 512), held);
  EXPECT_EQ(kv.held_positions() - (int64_t)tokens.size(), held);
}

TEST(Speculator, VerifyKeepsTheAcceptedPrefixThenTheTargetsOwnToken) {
  Fixture f;
  Speculator spec(lookup(8), {}, *f.model, 512, f.stats);
  auto sp = spec.start(std::nullopt, {});
  ASSERT_TRUE(sp.ok());
  const size_t V = (size_t)f.model->config().n_vocab;
  const std::vector<float> rows(5 * V, 0.0f);

  std::vector<int32_t> emitted;
  int sampled = 0;
  VerifySteps steps;
  steps.sample = [&](std::span<const float>) { return sampled++, 77; };
  steps.judge = [&](std::span<const float>, int32_t d, std::span<const TokenProb> q) -> std::optional<Sampler::Verdict> {
    EXPECT_TRUE(q.empty());  // a lookup draft has no proposal distribution
    return d < 50 ? Sampler::Verdict{d, true} : Sampler::Verdict{99, false};
  };
  steps.emit = [&](int32_t t, std::span<const float>) { return emitted.push_back(t), true; };

  // The first two accepted, the third rejected: its replacement ends the step.
  sp.value().draft = {10, 11, 60, 12};
  auto v = spec.verify(sp.value(), rows, steps);
  EXPECT_TRUE(v.alive);
  EXPECT_EQ(v.accepted, 2);
  EXPECT_EQ(emitted, (std::vector<int32_t>{10, 11, 99}));
  EXPECT_EQ(sampled, 0);
  EXPECT_TRUE(sp.value().draft.empty());
  EXPECT_EQ(sp.value().backoff.allowed(), 3);  // one past the accepted count

  // Accepted whole: the last row's own sample follows, and the allowance doubles.
  emitted.clear();
  sp.value().draft = {1, 2, 3};
  v = spec.verify(sp.value(), rows, steps);
  EXPECT_EQ(v.accepted, 3);
  EXPECT_EQ(emitted, (std::vector<int32_t>{1, 2, 3, 77}));
  EXPECT_EQ(sp.value().backoff.allowed(), 6);

  // A sequence that ends on an accepted token stops the walk there.
  emitted.clear();
  steps.emit = [&](int32_t t, std::span<const float>) { return emitted.push_back(t), t != 2; };
  sp.value().draft = {1, 2, 3};
  v = spec.verify(sp.value(), rows, steps);
  EXPECT_FALSE(v.alive);
  EXPECT_EQ(emitted, (std::vector<int32_t>{1, 2}));

  EXPECT_EQ(f.stats.verify_steps, 3);
  EXPECT_EQ(f.stats.drafted_tokens, 10);
  EXPECT_EQ(f.stats.accepted_tokens, 7);
}

TEST(Speculator, ADraftModelProposesFromItsOwnKvAndRollsBack) {
  Fixture f;
  auto draft_model = tiny_model(DType::Q8_0, 42);  // the same weights: it agrees with the target
  auto dpool = new_draft_pool(*draft_model, *f.pool);
  ASSERT_TRUE(dpool.ok()) << dpool.error().message;
  SpeculativeParams params;
  params.mode = SpeculativeMode::Draft;
  params.draft_max = 4;
  Speculator spec(params, DraftModel{draft_model.get(), dpool.value().get()}, *f.model, 512, f.stats);

  Speculator without(params, {}, *f.model, 512, f.stats);
  EXPECT_FALSE(without.start(std::nullopt, {}).ok());  // draft mode needs a draft model

  auto sp = spec.start(std::nullopt, {});
  ASSERT_TRUE(sp.ok()) << sp.error().message;
  const Tokens tokens = {5, 9, 17, 3, 41, 8, 22};
  BlockTable kv(*f.pool);
  std::vector<DraftRequest> reqs{decoding(sp.value(), tokens, kv)};
  EXPECT_EQ(spec.propose(reqs, 512), 4);
  const Speculation& s = sp.value();
  EXPECT_EQ(s.draft_q.size(), 4u);
  // Its K,V hold the tokens and every draft token but the last (only the target runs that).
  EXPECT_EQ(s.draft_computed, (int64_t)tokens.size() + 3);
  EXPECT_GE(s.draft_kv.held_positions(), s.draft_computed);
  EXPECT_GE(f.stats.draft_passes, 4);  // the catch-up over the prompt, then three draft positions

  // The target kept two of the drafts: the draft model keeps no position past them.
  Speculator::rollback(sp.value(), (int64_t)tokens.size() + 2);
  EXPECT_EQ(s.draft_computed, (int64_t)tokens.size() + 2);
  EXPECT_LE(s.draft_kv.held_positions(), s.draft_computed + dpool.value()->block_tokens());
  sp.value().release();
  EXPECT_EQ(s.draft_kv.n_blocks(), 0);
}

}  // namespace
}  // namespace tandem
