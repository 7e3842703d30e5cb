// Speculative decoding by prompt lookup: the drafter alone, the back-off, the sampler's
// verification rule, and the scheduler's verify pass, which must change nothing about the
// output: greedy token for token, sampling in distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/draft_lookup.h"
#include "engine/draft_model.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "model/model.h"
#include "test_paths.h"
#include "speculative_helpers.h"
#include "tiny_model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using namespace spec_test;

// ---- the drafter ----

TEST(LookupDraft, ProposesWhatFollowedTheLongestRecurringSuffix) {
  LookupDraftParams p{1, 3};
  // Suffix [7 8 9] occurred at 0 (followed by 1 2) and [8 9] also at 5 (followed by 5): the
  // 3-gram wins over the more recent 2-gram.
  const Tokens t = {7, 8, 9, 1, 2, 8, 9, 5, 6, 7, 8, 9};
  EXPECT_EQ(lookup_draft(t, p, 2), (Tokens{1, 2}));
  EXPECT_EQ(lookup_draft(t, p, 4), (Tokens{1, 2, 8, 9}));
  // Capped at 2-grams: the most recent [8 9] wins.
  EXPECT_EQ(lookup_draft(t, LookupDraftParams{1, 2}, 3), (Tokens{5, 6, 7}));
}

TEST(LookupDraft, MostRecentOccurrenceWins) {
  const Tokens t = {4, 1, 4, 2, 4};  // [4] follows with 1 at 0, with 2 at 2
  EXPECT_EQ(lookup_draft(t, LookupDraftParams{1, 3}, 1), (Tokens{2}));
}

TEST(LookupDraft, ContinuationRunsPeriodicallyPastTheEnd) {
  // [1 2] recurs one period (3 tokens) back; the draft repeats the period as far as asked.
  const Tokens t = {1, 2, 3, 1, 2};
  EXPECT_EQ(lookup_draft(t, LookupDraftParams{1, 2}, 7), (Tokens{3, 1, 2, 3, 1, 2, 3}));
  const Tokens same = {5, 5, 5};
  EXPECT_EQ(lookup_draft(same, LookupDraftParams{1, 3}, 4), (Tokens{5, 5, 5, 5}));
}

TEST(LookupDraft, NothingWithoutARecurrenceOrRoom) {
  EXPECT_TRUE(lookup_draft(Tokens{1, 2, 3, 4}, LookupDraftParams{1, 3}, 8).empty());
  EXPECT_TRUE(lookup_draft(Tokens{1}, LookupDraftParams{1, 3}, 8).empty());
  EXPECT_TRUE(lookup_draft(Tokens{}, LookupDraftParams{1, 3}, 8).empty());
  EXPECT_TRUE(lookup_draft(Tokens{1, 2, 1}, LookupDraftParams{1, 3}, 0).empty());
  // [3] recurs but 2-grams are the shortest wanted.
  EXPECT_TRUE(lookup_draft(Tokens{3, 9, 1, 3}, LookupDraftParams{2, 3}, 4).empty());
  EXPECT_EQ(lookup_draft(Tokens{3, 9, 1, 3}, LookupDraftParams{1, 3}, 2), (Tokens{9, 1}));
}

// ---- back-off ----

// Steps a paused back-off waits before it allows a draft again (0 when not paused).
int serve_pause(DraftBackoff& b) {
  int paused = 0;
  while (b.allowed() == 0 && paused < 1000) b.step_without_draft(), paused++;
  return paused;
}

// Misses until the pause has grown to its cap, each pause served.
void miss_to_the_cap(DraftBackoff& b, int misses) {
  for (int i = 0; i < misses; i++) {
    b.verified(1, 0);
    serve_pause(b);
  }
}

TEST(DraftBackoff, ShrinksAfterRejectionsGrowsAfterAcceptanceAndPauses) {
  DraftBackoff b(8);
  EXPECT_EQ(b.allowed(), 8);
  b.verified(8, 3);  // partial: one past what was accepted
  EXPECT_EQ(b.allowed(), 4);
  b.verified(4, 4);  // whole: doubles
  EXPECT_EQ(b.allowed(), 8);
  b.verified(8, 8);
  EXPECT_EQ(b.allowed(), 8);  // capped at draft_max
  b.verified(8, 0);
  EXPECT_EQ(b.allowed(), 1);  // one miss: a single-token draft next
  b.verified(1, 0);           // two misses in a row: pause for 2 steps
  EXPECT_EQ(b.allowed(), 0);
  b.step_without_draft();
  EXPECT_EQ(b.allowed(), 0);
  b.step_without_draft();
  EXPECT_EQ(b.allowed(), 1);
  b.verified(1, 0);  // a third miss: a pause of 4
  EXPECT_EQ(serve_pause(b), 4);
  miss_to_the_cap(b, 10);
  b.verified(1, 0);
  EXPECT_EQ(serve_pause(b), DraftBackoff::kMaxPause);
  b.verified(1, 1);  // an acceptance ends the streak
  EXPECT_EQ(b.allowed(), 2);
  b.verified(2, 0);
  EXPECT_EQ(b.allowed(), 1);  // a first miss again: no pause
  b.declined();               // a drafter that proposed nothing: a second miss, a pause of 2
  EXPECT_EQ(b.allowed(), 0);
  b.step_without_draft();
  b.step_without_draft();
  EXPECT_EQ(b.allowed(), 1);
  b.verified(1, 1);  // an acceptance ends the streak: declining once more does not pause
  b.declined();
  EXPECT_EQ(b.allowed(), 2);
  // With a price (a draft model's pass): a draft mostly rejected is a miss even when a token
  // of it was accepted; one accepted at the price is not.
  DraftBackoff c(4);
  c.verified(4, 1, 0.4);
  EXPECT_EQ(c.allowed(), 2);
  c.verified(2, 1, 0.4);  // half accepted: paid, no miss
  c.verified(4, 1, 0.4);
  EXPECT_EQ(c.allowed(), 2);
  c.verified(2, 0, 0.4);  // the second miss in a row
  EXPECT_EQ(c.allowed(), 0);
}

// A draft model's back-off is more patient (each resumption costs it a catch-up pass): its
// pauses quadruple up to kMaxPauseDraftModel, a paid draft takes one miss off the streak, and
// a draft pays only while the ledger of recent drafts (accepted less min_rate per drafted
// token, older drafts weighing a quarter as much) pays too; missing four probes in a row at
// the longest pause, it gives up.
TEST(DraftBackoff, DraftModelFlavourIsMorePatient) {
  DraftBackoff model(4, true);
  model.verified(4, 0);
  model.verified(1, 0);  // two misses: a pause of 4
  EXPECT_EQ(serve_pause(model), 4);
  model.verified(1, 0);  // three: 16
  EXPECT_EQ(serve_pause(model), 16);
  model.verified(1, 1);  // one lucky token: the streak drops to two, no pause now
  EXPECT_EQ(model.allowed(), 2);
  model.verified(2, 0);  // three again: 16, not 4
  EXPECT_EQ(serve_pause(model), 16);
  miss_to_the_cap(model, 2);  // 64, then the first pause at the cap
  model.verified(1, 0);
  EXPECT_EQ(serve_pause(model), DraftBackoff::kMaxPauseDraftModel);  // the second miss at the cap
  model.verified(1, 0);
  EXPECT_EQ(serve_pause(model), DraftBackoff::kMaxPauseDraftModel);  // the third
  model.verified(1, 0);  // the fourth: it gives up for the rest of the sequence
  EXPECT_EQ(model.allowed(), 0);
  EXPECT_EQ(serve_pause(model), 1000);  // serve_pause's bound: it never resumes
  DraftBackoff patient(4, true);
  miss_to_the_cap(patient, 7);  // three misses at the cap
  patient.verified(1, 1);       // a paid probe: the count at the cap starts again
  miss_to_the_cap(patient, 3);
  EXPECT_EQ(patient.allowed(), 1);

  DraftBackoff poor(4, true), good(4, true);
  poor.verified(4, 0, 0.5);  // ledger -2
  poor.verified(4, 0, 0.5);  // -0.5 - 2: two misses, a pause of 4
  EXPECT_EQ(serve_pause(poor), 4);
  poor.verified(2, 1, 0.5);  // this draft pays (1 of 2), the ledger (-0.625) does not: a miss
  EXPECT_EQ(serve_pause(poor), 16);
  good.verified(4, 4, 0.5);
  good.verified(4, 4, 0.5);
  good.verified(2, 1, 0.5);  // the ledger stays at +0.625: paid
  EXPECT_EQ(good.allowed(), 2);
  // The poor one starts agreeing: one whole draft outweighs the ledger's past (a rate kept
  // since the start, 3 of 12, would have paused it for 64 steps).
  poor.verified(2, 2, 0.5);  // -0.16 + 1
  EXPECT_EQ(poor.allowed(), 4);
  poor.verified(4, 3, 0.5);
  EXPECT_EQ(poor.allowed(), 4);
}

TEST(SpeculativeMode, ParsesNames) {
  EXPECT_EQ(parse_speculative_mode("lookup").value(), SpeculativeMode::Lookup);
  EXPECT_EQ(parse_speculative_mode("off").value(), SpeculativeMode::Off);
  EXPECT_FALSE(parse_speculative_mode("draft-model").ok());
  EXPECT_EQ(parse_speculative_mode("draft").value(), SpeculativeMode::Draft);
  EXPECT_STREQ(speculative_mode_name(SpeculativeMode::Draft), "draft");
  EXPECT_STREQ(speculative_mode_name(SpeculativeMode::Lookup), "lookup");
}

// ---- the verification rule ----

TEST(SamplerVerify, GreedyAcceptsExactlyTheArgmax) {
  SamplingParams sp;
  sp.temperature = 0;
  Sampler s(sp);
  const std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f};
  EXPECT_EQ(s.verify(logits, {}, 1).accepted, true);
  EXPECT_EQ(s.verify(logits, {}, 1).token, 1);
  const auto v = s.verify(logits, {}, 2);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 1);  // Ties go to the lowest id, with or without a repetition penalty (the candidate path).
  const std::vector<float> tied = {0.5f, 2.0f, 2.0f, 2.0f};
  EXPECT_EQ(s.sample(tied, {}), 1);
  EXPECT_EQ(s.verify(tied, {}, 2).token, 1);
  sp.repeat_penalty = 1.5f;
  Sampler penalized(sp);
  EXPECT_EQ(penalized.sample(tied, Tokens{1}), 2);
  EXPECT_EQ(penalized.verify(tied, Tokens{1}, 2).token, 2);
}

// Whatever the draft, verify()'s token is distributed as sample()'s: accepted with p(draft),
// else drawn without it. A draft of moderate probability exercises both branches; a draft
// outside top-k is always rejected.
TEST(SamplerVerify, OutputDistributionEqualsSampling) {
  std::vector<float> logits(12);
  for (size_t i = 0; i < logits.size(); i++) logits[i] = std::sin((float)i * 1.7f) * 2.0f;
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_k = 8;
  sp.top_p = 0.97f;
  sp.min_p = 0.02f;
  sp.repeat_penalty = 1.3f;
  const Tokens history = {3, 5};
  const int n = 40000;
  for (int32_t draft : {1, 4, 7, 11}) {
    sp.seed = 7;
    Sampler plain(sp);
    sp.seed = 99;
    Sampler spec(sp);
    std::map<int32_t, int> a, b;
    int accepted = 0;
    for (int i = 0; i < n; i++) {
      a[plain.sample(logits, history)]++;
      const auto v = spec.verify(logits, history, draft);
      b[v.token]++;
      accepted += v.accepted;
      if (v.accepted) {
        EXPECT_EQ(v.token, draft);
      } else {
        EXPECT_NE(v.token, draft);
      }
    }
    const ChiSquare c = chi_square(a, b);
    EXPECT_LT(c.stat, c.critical()) << "draft " << draft << " df " << c.df;
    // The acceptance rate is the draft's own probability under sampling.
    EXPECT_NEAR((double)accepted / n, (double)a[draft] / n, 0.015) << "draft " << draft;
  }
}

// ---- the scheduler's verify pass ----

TEST(Speculative, GreedyEqualsPlainGreedyOnTinyModels) {
  for (DType wt : {DType::Q8_0, DType::F32}) {
    auto m = tiny_model(wt);
    ASSERT_NE(m, nullptr);
    int64_t drafted = 0, accepted = 0;
    for (int v = 0; v < 6; v++) {
      const Tokens prompt = repetitive_prompt(v);
      const Generated plain = generate(*m, prompt, 60, SpeculativeParams{});
      EXPECT_EQ(plain.stats.n_drafted, 0);
      for (int dmax : {1, 3, 8}) {
        const Generated spec = generate(*m, prompt, 60, lookup(dmax));
        EXPECT_EQ(spec.tokens, plain.tokens) << "prompt " << v << " draft-max " << dmax;
        EXPECT_EQ(spec.stats.n_generated, 60);
        EXPECT_LE(spec.stats.n_accepted, spec.stats.n_drafted);
        // Accepted drafts save passes: tokens = decode steps + accepted drafts.
        EXPECT_EQ(spec.stats.n_decode_tokens, spec.stats.n_decode_steps + spec.stats.n_accepted);
        drafted += spec.stats.n_drafted;
        accepted += spec.stats.n_accepted;
      }
    }
    EXPECT_GT(accepted, 0) << "some drafts accepted";
    EXPECT_LT(accepted, drafted) << "some drafts rejected";
  }
}

TEST(Speculative, StopTokenInsideAnAcceptedDraftEndsThere) {
  auto m = tiny_model();
  const Tokens prompt = repetitive_prompt(1);
  const Generated plain = generate(*m, prompt, 60, SpeculativeParams{});
  // Stop at each of several tokens of the plain output: speculative output stops at the same place.
  for (size_t at : {5ul, 20ul, 41ul}) {
    const int32_t stop = plain.tokens[at];
    const size_t first = (size_t)(std::find(plain.tokens.begin(), plain.tokens.end(), stop) - plain.tokens.begin());
    const Generated a = generate(*m, prompt, 60, SpeculativeParams{}, 0, 0, {stop});
    const Generated b = generate(*m, prompt, 60, lookup(), 0, 0, {stop});
    EXPECT_EQ(a.tokens, Tokens(plain.tokens.begin(), plain.tokens.begin() + (ptrdiff_t)first));
    EXPECT_EQ(b.tokens, a.tokens);
    EXPECT_TRUE(b.stats.stopped_by_eog);
    EXPECT_EQ(b.stats.n_generated, a.stats.n_generated);
  }
}

// Several sequences in one batch, some drafting and some not, prompts prefilled in chunks
// alongside others' verify passes, and with a pool so small that sequences get preempted:
// each sees exactly its greedy output alone, and every block comes back.
TEST(Speculative, BatchedSequencesWithAndWithoutDraftsMatchAlone) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  for (int64_t blocks : {128, 24}) {
    auto pool = pool_for(*m, blocks);
    SchedulerOptions o;
    o.max_batch_tokens = 24;
    o.speculative = lookup();  // the default; odd requests opt out
    Scheduler sched(*m, *pool, o);
    Collected c;
    std::map<int64_t, int> which;
    for (int r = 0; r < 6; r++) {
      RequestParams rp;
      rp.prompt = repetitive_prompt(r);
      rp.max_tokens = 30;
      rp.sampling.temperature = 0;
      rp.want_logprobs = true;
      if (r % 2) rp.speculative = SpeculativeParams{};
      auto id = sched.add(rp, c.callback());
      ASSERT_TRUE(id.ok());
      which[id.value()] = r;
      if (r == 2) {
        ASSERT_TRUE(sched.step().ok());  // later requests join mid-generation
      }
    }
    run_all(sched);
    for (auto& [id, r] : which) {
      const Generated alone = generate(*m, repetitive_prompt(r), 30, SpeculativeParams{});
      EXPECT_EQ(c.tokens[id], alone.tokens) << "request " << r << " with " << blocks << " blocks";
      EXPECT_EQ(c.finished[id].finish, FinishReason::Length);
      for (float lp : c.logprobs[id]) EXPECT_TRUE(lp <= 0 && std::isfinite(lp));
    }
    EXPECT_GT(sched.stats().accepted_tokens, 0);
    EXPECT_GT(sched.stats().verify_steps, 0);
    EXPECT_EQ(pool->used_blocks(), 0) << "every block returns to the pool";
    if (blocks == 24) {
      EXPECT_GT(sched.stats().preemptions, 0);
    }
  }
}

// After a verify pass the sequence holds blocks for its computed positions and the next one
// only: those the rejected draft positions took are back in the pool.
TEST(Speculative, RejectedPositionsReturnTheirBlocks) {
  auto m = tiny_model();
  auto pool = pool_for(*m, 64, 2);
  SchedulerOptions o;
  o.speculative = lookup();
  Scheduler sched(*m, *pool, o);
  // Tokens that recur but that the model does not continue that way: drafts mostly rejected.
  RequestParams rp;
  rp.prompt = {5, 9, 14, 5, 22, 31, 5, 40, 47, 5};
  rp.max_tokens = 40;
  rp.sampling.temperature = 0;
  int64_t generated = 0;
  auto id = sched.add(rp, [&](const SeqEvent& e) {
    if (e.finish == FinishReason::None) generated++;
    return true;
  });
  ASSERT_TRUE(id.ok());
  int64_t checked = 0;
  while (sched.has_work()) {
    const int64_t before = sched.stats().drafted_tokens - sched.stats().accepted_tokens;
    ASSERT_TRUE(sched.step().ok());
    if (!sched.has_work()) break;
    // Positions computed = prompt + generated - 1 (the last token runs next step): blocks
    // for those alone, as after a plain decode step.
    const int64_t positions = (int64_t)rp.prompt.size() + generated - 1;
    EXPECT_EQ(pool->used_blocks(), (positions + 1) / 2) << "after step " << sched.stats().steps;
    checked += sched.stats().drafted_tokens - sched.stats().accepted_tokens > before;
  }
  EXPECT_GT(checked, 0) << "some step rejected draft tokens";
  EXPECT_EQ(pool->used_blocks(), 0);
}

// Sampling: the tokens' distribution is unchanged by speculation. A bigram model (its next
// token depends on the current one only) with sharp distributions, after a prompt holding a
// walk of its own, so lookup's drafts are often accepted and often rejected; thousands of
// seeded runs with and without drafts, and a two-sample chi-square test on each of the first
// tokens (the second onwards come from verify passes). Once with the raw distribution, once
// through top-k, top-p, min-p and a repetition penalty (which sees the accepted tokens).
TEST(Speculative, SamplingDistributionMatchesPlainSampling) {
  test::TinyShape shape;
  shape.weight_type = DType::F32;
  shape.n_ctx = 256;
  shape.output_scale = 0.5f;
  shape.branch_scale = 1e-4f;
  auto loaded = Model::from_gguf(test::tiny_model_file(shape, 7));
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  Model& m = *loaded.value();
  Tokens prompt = repetitive_prompt(2);
  for (float temp : {1.0f, 0.0f}) {  // a random walk, then the greedy one
    const Generated walk = generate(m, prompt, 60, SpeculativeParams{}, temp, 5);
    prompt.insert(prompt.end(), walk.tokens.begin(), walk.tokens.end());
  }
  const int n = 2500, len = 4;
  auto run = [&](bool spec, uint64_t seed0, SamplingParams sp, SchedulerStats& stats) {
    std::vector<std::map<int32_t, int>> hist(len);
    auto pool = pool_for(m, 1024, 16);
    SchedulerOptions o;
    o.max_running = 64;
    o.max_batch_tokens = 4096;
    if (spec) o.speculative = lookup(4);
    Scheduler sched(m, *pool, o);
    Collected c;
    for (int i = 0; i < n; i++) {
      RequestParams rp;
      rp.prompt = prompt;
      rp.max_tokens = len;
      rp.sampling = sp;
      rp.sampling.seed = seed0 + (uint64_t)i;
      EXPECT_TRUE(sched.add(rp, c.callback()).ok());
    }
    run_all(sched);
    for (auto& [id, toks] : c.tokens) {
      EXPECT_EQ(toks.size(), (size_t)len);
      for (size_t j = 0; j < toks.size() && j < (size_t)len; j++) hist[j][toks[j]]++;
    }
    stats = sched.stats();
    EXPECT_EQ(pool->used_blocks(), 0);
    return hist;
  };
  SamplingParams raw;
  raw.temperature = 1.0f, raw.top_k = 0, raw.top_p = 1.0f, raw.min_p = 0.0f;
  SamplingParams chain;
  chain.temperature = 0.8f, chain.top_k = 12, chain.top_p = 0.9f, chain.min_p = 0.03f, chain.repeat_penalty = 1.2f;
  for (const SamplingParams& sp : {raw, chain}) {
    SchedulerStats plain_stats, spec_stats;
    const auto plain = run(false, 1, sp, plain_stats);
    const auto spec = run(true, 1000000, sp, spec_stats);
    EXPECT_EQ(plain_stats.drafted_tokens, 0);
    EXPECT_GT(spec_stats.accepted_tokens, n / 2) << "drafts often accepted";
    EXPECT_GT(spec_stats.drafted_tokens - spec_stats.accepted_tokens, n / 2) << "and often rejected";
    EXPECT_LT(spec_stats.steps, plain_stats.steps) << "accepted drafts save passes";
    for (int j = 0; j < len; j++) {
      const ChiSquare c = chi_square(plain[(size_t)j], spec[(size_t)j]);
      EXPECT_LT(c.stat, c.critical()) << "token " << j << ": df " << c.df << " (top_k " << sp.top_k << ")";
    }
  }
}

}  // namespace
}  // namespace tandem
