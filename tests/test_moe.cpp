// Mixtures of experts: the router's choices and weights, a batched pass whose rows route to
// different experts against one token at a time, the scheduler's batching on an MoE model, and
// the errors of broken MoE files. (Logits against the numpy reference: reference_logits_moe.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "speculative_helpers.h"
#include "tiny_model.h"

namespace tandem {
namespace {

using namespace spec_test;

std::vector<float> route(const MoeRouting& r, const std::vector<float>& logits) {
  CpuBackend be;
  const Tensor in = be.upload(logits, 1, r.n_expert), out = be.new_tensor(1, 2 * r.n_used);
  be.moe_route(in, r, out);
  const auto v = be.read(out);
  return {v.begin(), v.end()};
}

TEST(MoeRouting, SoftmaxTopKRenormalisedOrNotThenScaled) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  double z = 0;
  for (float l : logits) z += std::exp(l);
  const float p2 = (float)(std::exp(2.0) / z), p1 = (float)(std::exp(1.0) / z);
  MoeRouting r{5, 3, ExpertGating::Softmax, false, false, 1.0f};
  // The largest first; of the tie, the lower id first.
  auto v = route(r, logits);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 3.0f);
  EXPECT_EQ(v[2], 4.0f);
  EXPECT_NEAR(v[3], p2, 1e-6);
  EXPECT_NEAR(v[5], p1, 1e-6);
  r.normalize = true;
  r.scale = 2.0f;
  v = route(r, logits);
  EXPECT_NEAR(v[3], 2.0f * p2 / (2 * p2 + p1), 1e-6);
  EXPECT_NEAR(v[3] + v[4] + v[5], 2.0f, 1e-5);
}

TEST(MoeRouting, SoftmaxOverTheTopKOnly) {
  // gpt-oss: the k largest raw logits, then a softmax over those k alone.
  const MoeRouting r{4, 2, ExpertGating::Softmax, true, false, 1.0f};
  const auto v = route(r, {3.0f, -2.0f, 1.0f, 0.0f});
  EXPECT_EQ(v[0], 0.0f);
  EXPECT_EQ(v[1], 2.0f);
  EXPECT_NEAR(v[2], 1.0 / (1.0 + std::exp(-2.0)), 1e-6);
  EXPECT_NEAR(v[2] + v[3], 1.0f, 1e-6);
}

test::TinyShape moe_shape() {
  test::TinyShape s;
  s.family = "qwen3moe";
  s.n_expert = 8;
  s.n_expert_used = 2;
  s.n_ff_expert = 32;
  s.n_layer = 2;
  s.n_ctx = 128;
  return s;
}

std::unique_ptr<Model> load(const test::TinyShape& s, bool exact = true, DType wt = DType::F32) {
  test::TinyShape shape = s;
  shape.weight_type = wt;
  ModelOptions o;
  CpuBackendOptions bo;
  bo.quantized_activations = !exact;
  o.backend = std::make_shared<CpuBackend>(bo);
  auto m = Model::from_gguf(test::tiny_model_file(shape), o);
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

// A prefill pass buckets its rows by expert (each expert's weights once for all its rows); one
// token at a time each row runs alone. Both must give the same logits, and the tokens of the
// prompt must between them use most of the experts.
TEST(MoeModel, BatchedRowsRouteToTheirExpertsAsAloneDoes) {
  for (DType wt : {DType::F32, DType::Q8_0}) {
    auto m = load(moe_shape(), true, wt);
    ASSERT_TRUE(m);
    EXPECT_NE(m->config().spec.describe().find("8 experts"), std::string::npos) << m->config().spec.describe();
    const Tokens prompt = {5, 17, 33, 2, 60, 41, 8, 90, 12, 77, 3, 50};
    auto pool = pool_for(*m, 16, 16);
    const int64_t V = m->config().n_vocab;
    std::vector<float> batched;
    {
      std::vector<BatchEntry> batch;
      for (size_t i = 0; i < prompt.size(); i++) batch.push_back({prompt[i], (int64_t)i, 0, true});
      BlockTable t(*pool);
      ASSERT_TRUE(t.grow_to((int64_t)prompt.size(), 0));
      auto l = m->forward_batch(*pool, batch, t.tables().subspan(0, 1));
      ASSERT_TRUE(l.ok()) << l.error().message;
      batched.assign(l.value().begin(), l.value().end());
    }
    BlockTable t(*pool);
    ASSERT_TRUE(t.grow_to((int64_t)prompt.size(), 0));
    for (size_t i = 0; i < prompt.size(); i++) {
      const BatchEntry e{prompt[i], (int64_t)i, 0, true};
      auto l = m->forward_batch(*pool, {&e, 1}, t.tables().subspan(0, 1));
      ASSERT_TRUE(l.ok()) << l.error().message;
      for (int64_t v = 0; v < V; v++) ASSERT_NEAR(l.value()[(size_t)v], batched[i * V + v], 2e-4) << "row " << i;
    }
  }
}

// Continuous batching on an MoE model: sequences of different lengths in one step (prefill
// chunks beside decode tokens) give each one's greedy tokens alone, with 8-bit activations.
TEST(MoeModel, ContinuousBatchingMatchesEachAlone) {
  auto m = load(moe_shape(), false, DType::Q8_0);
  ASSERT_TRUE(m);
  const std::vector<Tokens> prompts = {{5, 9, 17}, {40, 41, 42, 43, 44, 45, 46, 47}, {3}, {70, 12, 70, 12, 70}};
  std::vector<Tokens> alone;
  for (const Tokens& p : prompts) alone.push_back(generate(*m, p, 12, {}).tokens);
  auto pool = pool_for(*m, 64, 4);
  Scheduler s(*m, *pool);
  Collected c;
  std::vector<int64_t> ids;
  for (const Tokens& p : prompts) {
    RequestParams r;
    r.prompt = p;
    r.max_tokens = 12;
    r.sampling.temperature = 0;
    auto id = s.add(r, c.callback());
    ASSERT_TRUE(id.ok());
    ids.push_back(id.value());
  }
  run_all(s);
  for (size_t i = 0; i < prompts.size(); i++) EXPECT_EQ(c.tokens[ids[i]], alone[i]) << "prompt " << i;
}

// Lookup speculation (verify passes of 1 + k rows routed at once) and preemption in a pool too
// small for every sequence (recomputed prefixes) change no greedy token of an MoE model.
TEST(MoeModel, SpeculationAndPreemptionKeepGreedyTokens) {
  auto m = load(moe_shape(), false, DType::Q8_0);
  ASSERT_TRUE(m);
  const Tokens prompt = repetitive_prompt(2);
  const Generated plain = generate(*m, prompt, 24, {}), drafted = generate(*m, prompt, 24, lookup(4));
  EXPECT_EQ(drafted.tokens, plain.tokens);
  EXPECT_GT(drafted.stats.n_drafted, 0);

  const std::vector<Tokens> prompts = {repetitive_prompt(1), repetitive_prompt(3), {9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8, 7}};
  std::vector<Tokens> alone;
  for (const Tokens& p : prompts) alone.push_back(generate(*m, p, 20, {}).tokens);
  auto pool = pool_for(*m, 24, 4);  // 96 positions: less than the three sequences' 147
  Scheduler s(*m, *pool);
  Collected c;
  std::vector<int64_t> ids;
  for (const Tokens& p : prompts) {
    RequestParams r;
    r.prompt = p;
    r.max_tokens = 20;
    r.sampling.temperature = 0;
    auto id = s.add(r, c.callback());
    ASSERT_TRUE(id.ok()) << id.error().message;
    ids.push_back(id.value());
  }
  run_all(s);
  EXPECT_GT(s.stats().preemptions, 0);
  for (size_t i = 0; i < prompts.size(); i++) EXPECT_EQ(c.tokens[ids[i]], alone[i]) << "prompt " << i;
}

TEST(MoeModel, BrokenFilesNameWhatIsWrong) {
  auto error_of = [](const test::TinyShape& s, auto edit) {
    auto bytes = test::tiny_model_bytes(s);
    edit(bytes);
    auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
    if (!f.ok()) return f.error().message;
    auto m = Model::from_gguf(std::move(f.value()));
    return m.ok() ? std::string("loaded") : m.error().message;
  };
  auto none = [](std::vector<uint8_t>&) {};
  test::TinyShape s = moe_shape();
  s.n_expert_used = 9;  // more than the 8 experts
  EXPECT_NE(error_of(s, none).find("expert_used_count"), std::string::npos) << error_of(s, none);
  // A tensor renamed in place (same length): the loader names the one it misses.
  auto rename = [](const std::string& from, const std::string& to) {
    return [=](std::vector<uint8_t>& b) {
      auto it = std::search(b.begin(), b.end(), from.begin(), from.end());
      ASSERT_NE(it, b.end());
      std::copy(to.begin(), to.end(), it);
    };
  };
  const std::string err = error_of(moe_shape(), rename("blk.1.ffn_up_exps", "blk.1.ffn_up_expz"));
  EXPECT_NE(err.find("missing tensor blk.1.ffn_up_exps.weight"), std::string::npos) << err;
  // Tensor parallelism refuses it, naming the experts' shape.
  auto m = load(moe_shape());
  ASSERT_TRUE(m);
  auto plan = TensorParallelPlan::make(m->config(), 0, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message.find("8 experts of width 32"), std::string::npos) << plan.error().message;
}

}  // namespace
}  // namespace tandem
