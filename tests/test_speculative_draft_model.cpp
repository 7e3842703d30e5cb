// Speculative decoding with a draft model: verification against the draft's own distribution,
// the draft model's passes in the scheduler (catch-up, batched drafts, its prefill beside the
// target's, its pool running out), which must change nothing about the output: greedy token
// for token, sampling in distribution.
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
#include "speculative_helpers.h"
#include "test_paths.h"
#include "tiny_model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using namespace spec_test;

// ---- the draft model ----

// verify() with a proposal distribution q: whatever q is, a token drawn from q and verified
// is distributed as sample()'s; it is accepted with probability sum_t min(p(t), q(t)).
TEST(SamplerVerify, WithProposalDistributionOutputEqualsSampling) {
  std::vector<float> logits(10), draft_logits(10);
  for (size_t i = 0; i < logits.size(); i++) {
    logits[i] = std::sin((float)i * 1.3f) * 1.5f;
    draft_logits[i] = std::cos((float)i * 0.7f) * 1.5f;  // a draft that often disagrees
  }
  const Tokens history = {2, 6};
  for (bool chain : {false, true}) {
    SamplingParams sp;
    sp.temperature = chain ? 0.8f : 1.0f;
    sp.top_k = chain ? 6 : 0;
    sp.top_p = chain ? 0.95f : 1.0f;
    sp.min_p = chain ? 0.02f : 0.0f;
    sp.repeat_penalty = chain ? 1.2f : 1.0f;
    sp.seed = 3;
    Sampler plain(sp), target(sp);
    sp.seed = 11;
    Sampler drafter(sp);
    // p itself, for the expected acceptance rate: the draft sampler's q of the target logits.
    std::vector<TokenProb> p, q;
    Sampler(sp).propose(logits, history, p);
    std::map<int32_t, int> a, b;
    const int n = 40000;
    int accepted = 0;
    for (int i = 0; i < n; i++) {
      a[plain.sample(logits, history)]++;
      const int32_t d = drafter.propose(draft_logits, history, q);
      const auto v = target.verify(logits, history, d, q);
      b[v.token]++;
      accepted += v.accepted;
      if (v.accepted) {
        EXPECT_EQ(v.token, d);
      }
    }
    const ChiSquare c = chi_square(a, b);
    EXPECT_LT(c.stat, c.critical()) << "chain " << chain << " df " << c.df;
    double overlap = 0;
    for (const TokenProb& tp : p)
      for (const TokenProb& tq : q)
        if (tp.id == tq.id) overlap += std::min(tp.p, tq.p);
    EXPECT_NEAR((double)accepted / n, overlap, 0.015) << "chain " << chain;
    EXPECT_GT(accepted, n / 10);
    EXPECT_LT(accepted, n * 9 / 10);
  }
}

TEST(SamplerVerify, WithProposalDistributionGreedyAcceptsExactlyTheArgmax) {
  SamplingParams sp;
  sp.temperature = 0;
  Sampler s(sp);
  const std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f};
  std::vector<TokenProb> q;
  EXPECT_EQ(Sampler(sp).propose(std::vector<float>{0, 0, 3, 1}, {}, q), 2);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].id, 2);
  const auto v = s.verify(logits, {}, 2, q);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 1);
  q = {{1, 1.0f}};
  EXPECT_TRUE(s.verify(logits, {}, 1, q).accepted);
}

std::unique_ptr<Model> tiny_model_of(const test::TinyShape& s, uint32_t seed) {
  auto m = Model::from_gguf(test::tiny_model_file(s, seed));
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

// A smaller random model of the same vocabulary: it agrees with the target now and then.
std::unique_ptr<Model> tiny_draft_model(uint32_t seed = 5) {
  test::TinyShape s;
  s.weight_type = DType::F32;
  s.n_ctx = 256;
  s.n_layer = 1;
  s.n_embd = 32;
  s.n_head = 2;
  s.n_kv_head = 1;
  s.n_ff = 64;
  return tiny_model_of(s, seed);
}

SpeculativeParams with_draft_model(int draft_max = 4, float p_min = 0.0f) {
  SpeculativeParams p;
  p.mode = SpeculativeMode::Draft;
  p.draft_max = draft_max;
  p.draft_p_min = p_min;
  return p;
}

TEST(DraftModel, VocabularyMustMatchTokenForToken) {
  test::TinyShape s;
  auto target = tiny_model_of(s, 1);
  ASSERT_NE(target, nullptr);
  auto same = tiny_draft_model();
  EXPECT_TRUE(check_draft_vocabulary(*target, *same).ok());
  test::TinyShape other = s;
  other.n_vocab = 90;
  auto smaller = tiny_model_of(other, 2);
  auto st = check_draft_vocabulary(*target, *smaller);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("90"), std::string::npos) << st.error().message;
  // The same count, one token's text different.
  test::TinyShape renamed = s;
  for (int i = 0; i < s.n_vocab; i++) renamed.tokens.push_back(i == 0 ? "<|endoftext|>" : std::string(1, (char)('!' + (i - 1) % 90)) + (i > 90 ? "x" : ""));
  auto same_text = tiny_model_of(renamed, 3);
  EXPECT_TRUE(check_draft_vocabulary(*target, *same_text).ok());
  renamed.tokens[40] = "zz";
  auto different = tiny_model_of(renamed, 3);
  st = check_draft_vocabulary(*target, *different);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("token 40"), std::string::npos) << st.error().message;
  // Generation refuses such a pair, and a draft mode without a draft model.
  GenerationConfig cfg;
  cfg.max_new_tokens = 4;
  cfg.speculative = with_draft_model();
  cfg.draft_model = different.get();
  Generator gen(*target);
  EXPECT_FALSE(gen.generate({1, 2, 3}, cfg, [](int32_t) { return true; }).ok());
  cfg.draft_model = nullptr;
  EXPECT_FALSE(gen.generate({1, 2, 3}, cfg, [](int32_t) { return true; }).ok());
  auto pool = target->new_kv_pool(16, DType::F16, 4);
  ASSERT_TRUE(pool.ok());
  SchedulerOptions o;
  o.speculative = with_draft_model();
  Scheduler sched(*target, *pool.value(), o);
  RequestParams rp;
  rp.prompt = {1, 2};
  EXPECT_FALSE(sched.add(rp, [](const SeqEvent&) { return true; }).ok());
}

// Greedy speculative decoding with a draft model, by hand: the draft model's greedy
// continuation of the tokens so far, accepted as far as it agrees with the target's greedy
// output, the back-off deciding the lengths. The scheduler must draft and accept exactly
// this much: its draft model's K,V (rolled back, caught up) are those of the tokens so far.
struct ReferenceCounts {
  int64_t drafted = 0, accepted = 0;
};
ReferenceCounts reference_draft_counts(Model& draft, Model& target, const Tokens& prompt, const Tokens& out,
                                       int draft_max) {
  ReferenceCounts r;
  DraftBackoff backoff(draft_max, true);
  const double min_rate = draft_model_min_rate((double)draft.gguf().tensor_bytes(), (double)target.gguf().tensor_bytes());
  const int n = (int)out.size();
  for (int gen = 1; gen < n;) {
    if (backoff.allowed() == 0) {
      backoff.step_without_draft();
      gen++;
      continue;
    }
    const int k = std::min(backoff.allowed(), n - gen - 1);
    if (k <= 0) {
      gen++;
      continue;
    }
    Tokens ctx = prompt;
    ctx.insert(ctx.end(), out.begin(), out.begin() + gen);
    const Tokens d = generate(draft, ctx, k, SpeculativeParams{}).tokens;
    int a = 0;
    while (a < k && d[(size_t)a] == out[(size_t)(gen + a)]) a++;
    r.drafted += k;
    r.accepted += a;
    backoff.verified(k, a, min_rate);
    gen += a + 1;
  }
  return r;
}

TEST(Speculative, DraftModelGreedyEqualsPlainAndDraftsAsAReferenceDoes) {
  test::TinyShape shape;
  shape.weight_type = DType::F32;
  shape.n_ctx = 256;
  shape.branch_scale = 0.3f;
  auto target = tiny_model_of(shape, 42);
  auto self = tiny_model_of(shape, 42);  // the target's twin: agrees always
  auto other = tiny_draft_model();       // agrees now and then
  ASSERT_TRUE(target && self && other);
  int64_t rejected = 0;
  for (int v = 0; v < 4; v++) {
    const Tokens prompt = repetitive_prompt(v);
    const Generated plain = generate(*target, prompt, 40, SpeculativeParams{});
    for (int dmax : {1, 3, 6}) {
      const Generated twin = generate(*target, prompt, 40, with_draft_model(dmax), 0, 0, {}, self.get());
      EXPECT_EQ(twin.tokens, plain.tokens) << "prompt " << v << " draft-max " << dmax;
      EXPECT_EQ(twin.stats.n_accepted, twin.stats.n_drafted) << "the twin's drafts are all accepted";
      EXPECT_GE(twin.stats.n_drafted, 19);  // draft-max 1: one per step, two tokens a step
      EXPECT_EQ(twin.stats.n_decode_tokens, twin.stats.n_decode_steps + twin.stats.n_accepted);
      EXPECT_GT(twin.stats.n_draft_passes, 0);
      const Generated g = generate(*target, prompt, 40, with_draft_model(dmax), 0, 0, {}, other.get());
      EXPECT_EQ(g.tokens, plain.tokens) << "prompt " << v << " draft-max " << dmax;
      const ReferenceCounts ref = reference_draft_counts(*other, *target, prompt, plain.tokens, dmax);
      EXPECT_EQ(g.stats.n_drafted, ref.drafted) << "prompt " << v << " draft-max " << dmax;
      EXPECT_EQ(g.stats.n_accepted, ref.accepted) << "prompt " << v << " draft-max " << dmax;
      rejected += g.stats.n_drafted - g.stats.n_accepted;
    }
  }
  EXPECT_GT(rejected, 0) << "some drafts rejected";
}

// Drafting stops where the draft model is unsure: with draft_p_min 1 nothing is ever drafted
// (no distribution puts all its mass on one token), and the output is plain decoding's.
TEST(Speculative, DraftModelStopsWhereItIsUnsure) {
  auto target = tiny_model();
  auto draft = tiny_draft_model();
  const Tokens prompt = repetitive_prompt(3);
  const Generated plain = generate(*target, prompt, 20, SpeculativeParams{});
  const Generated g = generate(*target, prompt, 20, with_draft_model(4, 1.0f), 0, 0, {}, draft.get());
  EXPECT_EQ(g.tokens, plain.tokens);
  EXPECT_EQ(g.stats.n_drafted, 0);
  EXPECT_GT(g.stats.n_draft_passes, 0);
  // A draft model that never dares backs off like rejected drafts: its passes pause (2, 4, 8
  // steps...) instead of costing one per decode step.
  const Generated never = generate(*target, prompt, 60, with_draft_model(4, 1.0f), 0, 0, {}, draft.get());
  EXPECT_EQ(never.stats.n_drafted, 0);
  EXPECT_LE(never.stats.n_draft_passes, 12) << "of " << never.stats.n_decode_steps << " decode steps";
  // In between, fewer drafts than drafting always, the same output.
  const Generated always = generate(*target, prompt, 20, with_draft_model(4, 0.0f), 0, 0, {}, draft.get());
  const Generated some = generate(*target, prompt, 20, with_draft_model(4, 0.2f), 0, 0, {}, draft.get());
  EXPECT_EQ(always.tokens, plain.tokens);
  EXPECT_EQ(some.tokens, plain.tokens);
  EXPECT_LT(some.stats.n_drafted, always.stats.n_drafted);
}

// Several sequences through the scheduler, drafting with a draft model or lookup or not at
// all, joining mid-generation, in pools small enough to preempt: each gets its greedy output
// alone, and every block of both pools comes back.
TEST(Speculative, DraftModelBatchedWithPreemptionMatchesAlone) {
  auto m = tiny_model();
  auto twin = tiny_model();
  auto other = tiny_draft_model();
  ASSERT_TRUE(m && twin && other);
  for (Model* dm : {twin.get(), other.get()}) {
    for (int64_t blocks : {128, 24}) {
      auto pool = pool_for(*m, blocks);
      auto dpool = new_draft_pool(*dm, *pool);
      ASSERT_TRUE(dpool.ok());
      SchedulerOptions o;
      o.max_batch_tokens = 24;
      o.speculative = with_draft_model(4);
      o.draft_model = {dm, dpool.value().get()};
      Scheduler sched(*m, *pool, o);
      Collected c;
      std::map<int64_t, int> which;
      for (int r = 0; r < 6; r++) {
        RequestParams rp;
        rp.prompt = repetitive_prompt(r);
        rp.max_tokens = 30;
        rp.sampling.temperature = 0;
        if (r % 3 == 1) rp.speculative = SpeculativeParams{};
        if (r % 3 == 2) rp.speculative = lookup();
        auto id = sched.add(rp, c.callback());
        ASSERT_TRUE(id.ok());
        which[id.value()] = r;
        if (r == 2) {
          ASSERT_TRUE(sched.step().ok());
        }
      }
      int64_t steps = 0;
      while (sched.has_work() && steps++ < 20000) {
        ASSERT_TRUE(sched.step().ok());
        // The draft model's K,V never outgrow the target's.
        EXPECT_LE(dpool.value()->used_blocks(), pool->used_blocks() + (int64_t)sched.n_running());
      }
      for (auto& [id, r] : which) {
        const Generated alone = generate(*m, repetitive_prompt(r), 30, SpeculativeParams{});
        EXPECT_EQ(c.tokens[id], alone.tokens) << "request " << r << " with " << blocks << " blocks";
        EXPECT_EQ(c.finished[id].finish, FinishReason::Length);
      }
      EXPECT_GT(sched.stats().draft_passes, 0);
      EXPECT_GT(sched.stats().accepted_tokens, 0);
      if (dm == twin.get() && blocks == 128) {
        // Lookup's drafts may fail; the twin's never do: rejections are lookup's alone.
        EXPECT_GT(sched.stats().accepted_tokens, sched.stats().drafted_tokens / 2);
      }
      EXPECT_EQ(pool->used_blocks(), 0);
      EXPECT_EQ(dpool.value()->used_blocks(), 0);
      if (blocks == 24) {
        EXPECT_GT(sched.stats().preemptions, 0);
      }
    }
  }
}

// A draft pool too small for every sequence's history: sequences draft where they find draft
// blocks and decode plainly where they do not; the output is unchanged and nothing leaks.
TEST(Speculative, DraftPoolExhaustionOnlyLimitsDrafting) {
  auto m = tiny_model();
  auto twin = tiny_model();
  auto pool = pool_for(*m, 128);
  auto dpool = pool_for(*twin, 12);  // 48 positions for four sequences of ~60
  SchedulerOptions o;
  o.speculative = with_draft_model(4);
  o.draft_model = {twin.get(), dpool.get()};
  Scheduler sched(*m, *pool, o);
  Collected c;
  std::map<int64_t, int> which;
  for (int r = 0; r < 4; r++) {
    RequestParams rp;
    rp.prompt = repetitive_prompt(r);
    rp.max_tokens = 30;
    rp.sampling.temperature = 0;
    auto id = sched.add(rp, c.callback());
    ASSERT_TRUE(id.ok());
    which[id.value()] = r;
  }
  run_all(sched);
  for (auto& [id, r] : which) EXPECT_EQ(c.tokens[id], generate(*m, repetitive_prompt(r), 30, SpeculativeParams{}).tokens);
  EXPECT_GT(sched.stats().accepted_tokens, 0) << "some sequence drafted";
  EXPECT_EQ(sched.stats().preemptions, 0) << "draft blocks never preempt";
  EXPECT_EQ(pool->used_blocks(), 0);
  EXPECT_EQ(dpool->used_blocks(), 0);
}

// Sampling with a draft model keeps the target's distribution. The target is a bigram model
// with sharp distributions; the draft is the same model with its logits scaled (the same
// seed, a larger output scale): its q is the target's p sharpened, so its drafts are often
// accepted and often rejected, and a rejection draws from max(0, p - q). Thousands of seeded
// runs with and without drafts; a chi-square test on each of the first tokens.
TEST(Speculative, DraftModelSamplingDistributionMatchesPlainSampling) {
  test::TinyShape shape;
  shape.weight_type = DType::F32;
  shape.n_ctx = 256;
  shape.output_scale = 0.5f;
  shape.branch_scale = 1e-4f;
  auto target = tiny_model_of(shape, 7);
  shape.output_scale = 0.8f;
  auto draft = tiny_model_of(shape, 7);
  ASSERT_TRUE(target && draft);
  const Tokens prompt = repetitive_prompt(2);
  const int n = 2500, len = 4;
  auto run = [&](bool spec, uint64_t seed0, SamplingParams sp, SchedulerStats& stats) {
    std::vector<std::map<int32_t, int>> hist(len);
    auto pool = pool_for(*target, 1024, 16);
    auto dpool = new_draft_pool(*draft, *pool);
    EXPECT_TRUE(dpool.ok());
    SchedulerOptions o;
    o.max_running = 64;
    o.max_batch_tokens = 4096;
    if (spec) o.speculative = with_draft_model(3);
    o.draft_model = {draft.get(), dpool.value().get()};
    Scheduler sched(*target, *pool, o);
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
    EXPECT_EQ(dpool.value()->used_blocks(), 0);
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
    EXPECT_GT(spec_stats.drafted_tokens - spec_stats.accepted_tokens, n / 4) << "and often rejected";
    EXPECT_LT(spec_stats.steps, plain_stats.steps) << "accepted drafts save passes";
    for (int j = 0; j < len; j++) {
      const ChiSquare c = chi_square(plain[(size_t)j], spec[(size_t)j]);
      EXPECT_LT(c.stat, c.critical()) << "token " << j << ": df " << c.df << " (top_k " << sp.top_k << ")";
    }
  }
}

// ---- the real model ----

TEST(Speculative, RealModelGreedyEqualsPlainOnAParaphrase) {
  const std::string path = test::default_model_path();
  if (!test::exists(path)) GTEST_SKIP() << "model not found at " << path << " (run scripts/setup.sh)";
  auto m = Model::load(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto tok = Tokenizer::from_gguf(m.value()->gguf());
  ASSERT_TRUE(tok.ok());
  const std::string para =
      "The history of the bicycle begins in the early nineteenth century, when inventors in Europe experimented "
      "with two-wheeled machines pushed along by the rider's feet. Later designs added pedals, chains and "
      "pneumatic tyres, and within a few decades cycling had become popular.";
  const Tokens prompt = tok.value()->encode(
      "Here is a paragraph:\n\n" + para + "\n\nRepeat the paragraph word for word, replacing 'Europe' with 'France'.\n\n" +
          para.substr(0, 40),
      true, false);
  const Generated plain = generate(*m.value(), prompt, 32, SpeculativeParams{});
  SpeculativeParams defaults;  // what --speculative lookup runs
  defaults.mode = SpeculativeMode::Lookup;
  const Generated spec = generate(*m.value(), prompt, 32, defaults);
  EXPECT_EQ(spec.tokens, plain.tokens) << "plain: " << tok.value()->decode(plain.tokens)
                                       << "\nspeculative: " << tok.value()->decode(spec.tokens);
  EXPECT_GT(spec.stats.n_accepted, 10);
  EXPECT_LT(spec.stats.n_decode_steps, plain.stats.n_decode_steps);
}

// The bundled model drafting for itself (loaded twice: two models, two pools) agrees with
// itself nearly always (the verify pass's wider matrix products may round differently); a
// random-weight model of its vocabulary almost never does. Either way the output is plain
// greedy decoding's.
TEST(Speculative, RealModelWithDraftModelsGreedyEqualsPlain) {
  const std::string path = test::default_model_path();
  if (!test::exists(path)) GTEST_SKIP() << "model not found at " << path << " (run scripts/setup.sh)";
  auto m = Model::load(path);
  auto self = Model::load(path);
  ASSERT_TRUE(m.ok() && self.ok());
  Model& target = *m.value();
  auto tok = Tokenizer::from_gguf(target.gguf());
  ASSERT_TRUE(tok.ok());
  const GgufArray* tokens = target.gguf().get_array("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  test::TinyShape shape;
  shape.weight_type = DType::Q8_0;
  shape.n_ctx = 512;
  for (std::string_view t : tokens->strings) shape.tokens.emplace_back(t);
  shape.n_vocab = (int)shape.tokens.size();
  auto random = tiny_model_of(shape, 9);
  ASSERT_NE(random, nullptr);
  ASSERT_TRUE(check_draft_vocabulary(target, *random).ok());
  const Tokens prompt = tok.value()->encode("Write a short story about a lighthouse keeper and his cat.\n", true, false);
  const Generated plain = generate(target, prompt, 32, SpeculativeParams{});
  SpeculativeParams spec;
  spec.mode = SpeculativeMode::Draft;
  spec.draft_p_min = 0;  // draft every step, however unsure
  const Generated twin = generate(target, prompt, 32, spec, 0, 0, {}, self.value().get());
  EXPECT_EQ(twin.tokens, plain.tokens) << "plain: " << tok.value()->decode(plain.tokens)
                                       << "\nspeculative: " << tok.value()->decode(twin.tokens);
  EXPECT_GT(twin.stats.n_drafted, 20);
  EXPECT_GE(twin.stats.acceptance_rate(), 0.9);
  EXPECT_LT(twin.stats.n_decode_steps, plain.stats.n_decode_steps / 2);
  const Generated noise = generate(target, prompt, 32, spec, 0, 0, {}, random.get());
  EXPECT_EQ(noise.tokens, plain.tokens);
  EXPECT_GT(noise.stats.n_drafted, 0);
  EXPECT_LE(noise.stats.acceptance_rate(), 0.1);
}

}  // namespace
}  // namespace tandem
