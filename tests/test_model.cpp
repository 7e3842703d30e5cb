// Forward-pass consistency on tiny random models of every weight type: prefill logits equal
// decode-one-at-a-time logits and the no-cache logits. (Agreement with an independent
// reference is checked by tests/reference/check_logits.py on the real model.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#include "model/llama_model.h"
#include "tiny_model.h"

namespace tandem {
namespace {

using test::TinyShape;

std::unique_ptr<LlamaModel> tiny(const TinyShape& s, cpu::Isa isa = cpu::best_isa(), int64_t chunk = 512) {
  auto f = test::tiny_model_file(s);
  if (!f) return nullptr;
  ModelOptions o;
  o.backend = std::make_shared<CpuBackend>(CpuBackendOptions{isa});
  o.max_prefill_chunk = chunk;
  auto m = LlamaModel::from_gguf(std::move(f), o);
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); i++) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

const std::vector<int32_t> kTokens = {5, 17, 3, 88, 42, 42, 7, 1, 60, 33, 21, 9};

class ModelPaths : public ::testing::TestWithParam<DType> {};

TEST_P(ModelPaths, PrefillEqualsDecodeEqualsNoCache) {
  TinyShape s;
  s.weight_type = GetParam();
  if (s.weight_type == DType::Q4_K || s.weight_type == DType::Q6_K) s.n_embd = 256, s.n_ff = 256;  // 256-blocks
  for (cpu::Isa isa : cpu::supported_isas()) {
    auto m = tiny(s, isa);
    ASSERT_NE(m, nullptr);
    const int64_t V = m->config().n_vocab, T = (int64_t)kTokens.size();
    auto kv = m->new_kv_cache(T, DType::F32);
    ASSERT_TRUE(kv.ok());
    auto pre = m->prefill(kv.value(), kTokens, true);
    ASSERT_TRUE(pre.ok()) << pre.error().message;
    const std::vector<float> prefill(pre->begin(), pre->end());
    EXPECT_EQ(kv->size(), T);

    auto kv2 = m->new_kv_cache(T, DType::F32);
    for (int64_t t = 0; t < T; t++) {
      auto dec = m->decode(kv2.value(), kTokens[t]);
      ASSERT_TRUE(dec.ok()) << dec.error().message;
      const std::span<const float> row(prefill.data() + t * V, V);
      EXPECT_LT(max_abs_diff(*dec, row), 2e-4f) << dtype_name(s.weight_type) << " " << cpu::isa_name(isa) << " position " << t;
      auto naive = m->forward_no_cache(std::span<const int32_t>(kTokens.data(), t + 1), DType::F32);
      ASSERT_TRUE(naive.ok());
      EXPECT_LT(max_abs_diff(*naive, row), 2e-4f) << dtype_name(s.weight_type) << " naive, position " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, ModelPaths,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                                           DType::Q4_K, DType::Q6_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Model, ScalarAndSimdKernelsAgree) {
  TinyShape s;
  s.weight_type = DType::Q4_1;
  auto scalar = tiny(s, cpu::Isa::Scalar);
  auto best = tiny(s, cpu::best_isa());
  auto kv1 = scalar->new_kv_cache(16), kv2 = best->new_kv_cache(16);
  auto a = scalar->prefill(kv1.value(), kTokens, true);
  const std::vector<float> av(a->begin(), a->end());
  auto b = best->prefill(kv2.value(), kTokens, true);
  EXPECT_LT(max_abs_diff(av, *b), 1e-3f);
}

TEST(Model, ChunkedPrefillEqualsOnePass) {
  TinyShape s;
  auto whole = tiny(s);
  auto chunked = tiny(s, cpu::best_isa(), 5);
  auto kv1 = whole->new_kv_cache(16), kv2 = chunked->new_kv_cache(16);
  auto a = whole->prefill(kv1.value(), kTokens, true);
  const std::vector<float> av(a->begin(), a->end());
  auto b = chunked->prefill(kv2.value(), kTokens, true);
  ASSERT_TRUE(b.ok());
  EXPECT_LT(max_abs_diff(av, *b), 1e-5f);
}

TEST(Model, TiedOutputUsesTokenEmbedding) {
  TinyShape s;
  s.tied = true;
  auto m = tiny(s);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->config().tied_output);
  EXPECT_EQ(m->weights().output.impl, m->weights().token_embd.impl);  // the same prepared weight
}

TEST(Model, BadInputIsAnErrorNotACrash) {
  auto m = tiny(TinyShape{});
  auto kv = m->new_kv_cache(4);
  auto r = m->prefill(kv.value(), std::vector<int32_t>{1, 2, 999});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("outside the vocabulary"), std::string::npos) << r.error().message;
  r = m->prefill(kv.value(), std::vector<int32_t>{1, 2, 3, 4, 5});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("does not fit"), std::string::npos) << r.error().message;
  EXPECT_EQ(kv->size(), 0);  // nothing half-written
  ASSERT_TRUE(m->prefill(kv.value(), std::vector<int32_t>{1, 2, 3, 4}).ok());
  auto d = m->decode(kv.value(), 5);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("context full"), std::string::npos);
  EXPECT_FALSE(m->prefill(kv.value(), std::vector<int32_t>{}).ok());
}

TEST(Model, LoaderNamesWhatIsWrong) {
  auto bytes = test::tiny_model_bytes(TinyShape{});
  // Unsupported architecture.
  const std::string from = "llama", to = "gemma";
  auto it = std::search(bytes.begin(), bytes.end(), from.begin(), from.end());
  auto patched = bytes;
  std::copy(to.begin(), to.end(), patched.begin() + (it - bytes.begin()));
  auto f = GgufFile::from_bytes(patched.data(), patched.size());
  ASSERT_TRUE(f.ok());
  auto m = LlamaModel::from_gguf(std::move(f.value()));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("architecture 'gemma'"), std::string::npos) << m.error().message;
  auto missing = LlamaModel::load("/nonexistent.gguf");
  EXPECT_FALSE(missing.ok());
}

// Overwrites the scalar value stored under `key` in a GGUF image (the value follows the key's
// bytes and its 4-byte type id).
template <typename T>
std::vector<uint8_t> with_value(std::vector<uint8_t> bytes, const std::string& key, T value) {
  auto it = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  EXPECT_NE(it, bytes.end()) << key;
  if (it != bytes.end()) std::memcpy(&*(it + (ptrdiff_t)key.size() + 4), &value, sizeof(T));
  return bytes;
}

// The load error for a GGUF image ("" when it loads).
std::string load_error(const std::vector<uint8_t>& bytes) {
  auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
  if (!f.ok()) return "parse: " + f.error().message;
  auto m = LlamaModel::from_gguf(std::move(f.value()));
  return m.ok() ? "" : m.error().message;
}

// Hyper-parameters that disagree with the tensors, or make no sense, are refused at load with
// the key and the values, instead of running with garbage.
TEST(Model, RefusesNonsenseHyperparameters) {
  const auto good = test::tiny_model_bytes(TinyShape{});  // 2 layers, 4 heads, 2 kv heads, vocab 96
  ASSERT_EQ(load_error(good), "");
  struct Case {
    std::vector<uint8_t> bytes;
    std::vector<std::string> says;
  };
  const float nan = std::nanf(""), inf = INFINITY;
  const std::string eps = "llama.attention.layer_norm_rms_epsilon", base = "llama.rope.freq_base";
  std::vector<Case> cases = {
      {with_value<uint32_t>(good, "llama.block_count", 1), {"'llama.block_count' = 1", "block 1 (blk.1."}},
      {with_value<uint32_t>(good, "llama.block_count", 3), {"'llama.block_count' = 3", "no tensors for block 2"}},
      {with_value<uint32_t>(good, "llama.block_count", 1000000), {"'llama.block_count' = 1000000", "no tensors for block 2"}},
      {with_value(good, eps, nan), {eps, "= nan"}},
      {with_value(good, eps, inf), {eps, "= inf"}},
      {with_value(good, eps, -inf), {eps, "= -inf"}},
      {with_value(good, eps, 0.0f), {eps, "= 0 "}},
      {with_value(good, eps, -1e-5f), {eps, "= -1e-05"}},
      {with_value(good, eps, 0.5f), {eps, "= 0.5"}},
      {with_value(good, base, nan), {base, "= nan"}},
      {with_value(good, base, 0.0f), {base, "= 0 "}},
      {with_value(good, base, -10000.0f), {base, "= -10000"}},
      {with_value(good, base, inf), {base, "= inf"}},
      {with_value<uint32_t>(good, "llama.attention.head_count", 3), {"head_count 3", "embedding_length 64"}},
      {with_value<uint32_t>(good, "llama.attention.head_count_kv", 3), {"head_count_kv 3", "head_count 4"}},
      {with_value<uint32_t>(good, "llama.attention.head_count_kv", 8), {"head_count_kv 8", "head_count 4"}},
      {with_value<uint32_t>(good, "llama.context_length", 0), {"'llama.context_length' = 0"}},
  };
  TinyShape short_vocab;
  short_vocab.n_tokens = 95;
  cases.push_back({test::tiny_model_bytes(short_vocab), {"tokenizer.ggml.tokens has 95 tokens", "token_embd.weight has 96 rows"}});
  for (size_t i = 0; i < cases.size(); i++) {
    const std::string err = load_error(cases[i].bytes);
    ASSERT_NE(err, "") << "case " << i << " loaded";
    for (const auto& part : cases[i].says) EXPECT_NE(err.find(part), std::string::npos) << "case " << i << ": " << err;
  }
}

// Greedy, never stopping early: every run generates exactly n tokens.
GenerationConfig greedy(int n) {
  GenerationConfig cfg;
  cfg.max_new_tokens = n;
  cfg.sampling.temperature = 0;
  cfg.stop_at_eog = false;
  return cfg;
}

TEST(Model, GreedyGenerationSameWithAndWithoutCache) {
  auto m = tiny(TinyShape{});
  Generator gen(*m);
  GenerationConfig cfg = greedy(24);
  std::vector<int32_t> cached, naive;
  auto a = gen.generate({3, 4, 5}, cfg, [&](int32_t t) { return cached.push_back(t), true; });
  ASSERT_TRUE(a.ok()) << a.error().message;
  cfg.use_kv_cache = false;
  auto b = gen.generate({3, 4, 5}, cfg, [&](int32_t t) { return naive.push_back(t), true; });
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(cached.size(), 24u);
  EXPECT_EQ(cached, naive);
  EXPECT_EQ(a->n_decode_steps, 23);
  EXPECT_EQ(a->kv_bytes, kv_cache_bytes(2, 2, 3 + 24, 16, 2));
  EXPECT_EQ(b->kv_bytes, 0u);
}

TEST(Model, MultiTurnReusesTheCachedPrefix) {
  auto m = tiny(TinyShape{});
  Generator gen(*m);
  const GenerationConfig cfg = greedy(4);
  auto kv = m->new_kv_cache(64);
  std::vector<int32_t> history;
  auto noop = [](int32_t) { return true; };
  auto first = gen.generate_in(kv.value(), history, {3, 4, 5, 6}, cfg, noop);
  ASSERT_TRUE(first.ok());
  std::vector<int32_t> second_prompt = history;
  second_prompt.insert(second_prompt.end(), {9, 10});
  auto second = gen.generate_in(kv.value(), history, second_prompt, cfg, noop);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->n_reused, (int)second_prompt.size() - 2);
}

TEST(Model, GenerationRejectsAbsurdRequests) {
  auto m = tiny(TinyShape{});  // context 64
  Generator gen(*m);
  GenerationConfig cfg;
  auto noop = [](int32_t) { return true; };
  EXPECT_FALSE(gen.generate({}, cfg, noop).ok());
  EXPECT_FALSE(gen.generate(std::vector<int32_t>(65, 3), cfg, noop).ok());
  cfg.max_new_tokens = -1;
  EXPECT_FALSE(gen.generate({1}, cfg, noop).ok());
  // A huge max_new_tokens is capped by the context, not allocated.
  cfg.max_new_tokens = 1 << 30;
  cfg.stop_at_eog = false;
  int n = 0;
  auto r = gen.generate({1, 2}, cfg, [&](int32_t) { return ++n, true; });
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(n, 63);  // 62 decode steps fill the 64 positions; the last token needs no slot
}

}  // namespace
}  // namespace tandem
