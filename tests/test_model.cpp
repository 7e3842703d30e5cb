// Forward-pass consistency on tiny random models of every weight type: prefill logits equal
// decode-one-at-a-time logits and the no-cache logits. (Agreement with an independent
// reference is checked by tests/reference/check_logits.py on the real model.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#include "kv/kv_planner.h"
#include "model/model.h"
#include "test_sequence.h"
#include "tiny_model.h"

namespace tandem {
namespace {

using test::TinyShape;

std::unique_ptr<Model> tiny(const TinyShape& s, cpu::Isa isa = cpu::best_isa()) {
  auto f = test::tiny_model_file(s);
  if (!f) return nullptr;
  ModelOptions o;
  o.backend = std::make_shared<CpuBackend>(CpuBackendOptions{isa});
  auto m = Model::from_gguf(std::move(f), o);
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
    test::OneSequence kv(*m, T, DType::F32);
    auto pre = kv.prefill(kTokens, true);
    ASSERT_TRUE(pre.ok()) << pre.error().message;
    const std::vector<float> prefill(pre->begin(), pre->end());
    EXPECT_EQ(kv.size(), T);

    test::OneSequence kv2(*m, T, DType::F32);
    for (int64_t t = 0; t < T; t++) {
      auto dec = kv2.decode(kTokens[t]);
      ASSERT_TRUE(dec.ok()) << dec.error().message;
      const std::span<const float> row(prefill.data() + t * V, V);
      EXPECT_LT(max_abs_diff(*dec, row), 2e-4f) << dtype_name(s.weight_type) << " " << cpu::isa_name(isa) << " position " << t;
      const auto naive = test::no_cache_logits(*m, std::span<const int32_t>(kTokens.data(), t + 1), DType::F32);
      ASSERT_EQ(naive.size(), (size_t)V);
      EXPECT_LT(max_abs_diff(naive, row), 2e-4f) << dtype_name(s.weight_type) << " naive, position " << t;
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
  test::OneSequence kv1(*scalar, 16), kv2(*best, 16);
  auto a = kv1.prefill(kTokens, true);
  const std::vector<float> av(a->begin(), a->end());
  auto b = kv2.prefill(kTokens, true);
  EXPECT_LT(max_abs_diff(av, *b), 1e-3f);
}

TEST(Model, ChunkedPrefillEqualsOnePass) {
  TinyShape s;
  auto m = tiny(s);
  test::OneSequence kv1(*m, 16), kv2(*m, 16, DType::F16, 5);  // the second in passes of 5 tokens
  auto a = kv1.prefill(kTokens, true);
  const std::vector<float> av(a->begin(), a->end());
  auto b = kv2.prefill(kTokens, true);
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
  test::OneSequence kv(*m, 4, DType::F16, 512, 4);  // one block of 4 positions
  auto r = kv.prefill(std::vector<int32_t>{1, 2, 999});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("outside the vocabulary"), std::string::npos) << r.error().message;
  EXPECT_EQ(kv.size(), 0);  // nothing half-written
  r = kv.prefill(std::vector<int32_t>{1, 2, 3, 4, 5});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("do not fit"), std::string::npos) << r.error().message;
  EXPECT_EQ(kv.size(), 0);
  ASSERT_TRUE(kv.prefill(std::vector<int32_t>{1, 2, 3, 4}).ok());
  auto d = kv.decode(5);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("do not fit"), std::string::npos) << d.error().message;
  EXPECT_FALSE(kv.prefill(std::vector<int32_t>{}).ok());
  // A position past the model's context is refused even where the pool has room.
  test::OneSequence big(*m, 80);
  EXPECT_FALSE(big.prefill(std::vector<int32_t>(65, 3)).ok());
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
  auto m = Model::from_gguf(std::move(f.value()));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("architecture 'gemma'"), std::string::npos) << m.error().message;
  auto missing = Model::load("/nonexistent.gguf");
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
  auto m = Model::from_gguf(std::move(f.value()));
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
  // 3 + 24 positions and one more for the scheduler's admission, in blocks of 16.
  EXPECT_EQ(a->kv_bytes, kv_cache_bytes(2, 2, 32, 16, 2));
  EXPECT_EQ(a->kv_tokens, 32);
  EXPECT_EQ(b->kv_bytes, a->kv_bytes);  // naive mode's scratch blocks
}

// When the first token sampled is a stop token, prefill still ran: its time and TTFT are
// recorded (they were lost, and `tandem explain` printed prefill in 0.00 ms; issue 35).
TEST(Model, AStopTokenFirstKeepsPrefillTime) {
  auto m = tiny(TinyShape{});
  Generator gen(*m);
  std::vector<int32_t> first;
  ASSERT_TRUE(gen.generate({3, 4, 5, 6, 7}, greedy(1), [&](int32_t t) { return first.push_back(t), true; }).ok());
  ASSERT_EQ(first.size(), 1u);
  GenerationConfig cfg = greedy(8);
  cfg.stop_at_eog = true;
  cfg.stop_tokens = first;  // the greedy first token ends generation at once
  int events = 0;
  auto st = gen.generate({3, 4, 5, 6, 7}, cfg, [&](int32_t) { return ++events, true; });
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(events, 0);
  EXPECT_TRUE(st->stopped_by_eog);
  EXPECT_EQ(st->n_generated, 1);
  EXPECT_EQ(st->n_decode_tokens, 0);
  EXPECT_GT(st->prefill_s, 0.0);
  EXPECT_GE(st->ttft_s, st->prefill_s);
}

// A chat's next turn: the Generator's pool persists, and the prefix cache hands the earlier
// turn's full blocks (prompt and generated tokens alike) to the next prompt that starts with
// them. The partial last block is recomputed; the answer is the same as from scratch.
TEST(Model, MultiTurnReusesTheCachedPrefix) {
  auto m = tiny(TinyShape{});  // context 64
  Generator gen(*m, 64);
  const GenerationConfig cfg = greedy(8);
  std::vector<int32_t> history = {3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22};
  auto first = gen.generate(history, cfg, [&](int32_t t) { return history.push_back(t), true; });
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->n_reused, 0);
  std::vector<int32_t> second_prompt = history;  // 28 tokens: 27 of them computed, one full block
  second_prompt.insert(second_prompt.end(), {9, 10});
  std::vector<int32_t> cached_answer, fresh_answer;
  auto second = gen.generate(second_prompt, cfg, [&](int32_t t) { return cached_answer.push_back(t), true; });
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_EQ(second->n_reused, 16);
  Generator fresh(*m);
  ASSERT_TRUE(fresh.generate(second_prompt, cfg, [&](int32_t t) { return fresh_answer.push_back(t), true; }).ok());
  EXPECT_EQ(cached_answer, fresh_answer);
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
  EXPECT_EQ(n, 62);  // prompt and generated tokens fill the 64 positions of the context, as serve's
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Kilobytes of this process's resident pages mapped from `path` (/proc/self/smaps).
int64_t resident_kb_of(const std::string& path) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_file = false;
  int64_t kb = 0;
  while (std::getline(smaps, line)) {
    if (!line.empty() && std::isxdigit((unsigned char)line[0]) && line.find('-') < 16) {
      in_file = line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
    } else if (in_file && line.rfind("Rss:", 0) == 0) {
      kb += std::stoll(line.substr(4));
    }
  }
  return kb;
}

// After loading, the file's pages of every repacked matrix are released: the model is resident
// once (repacked), not twice (mapped and repacked). Only what the engine still reads from the
// file (the token embedding's rows, the norms, the header) stays mapped in.
TEST(Model, RepackedTensorsDoNotStayMapped) {
  TinyShape s;
  s.weight_type = DType::Q4_0;
  s.n_embd = 256, s.n_ff = 1024, s.n_vocab = 256;
  const auto bytes = test::tiny_model_bytes(s);
  const std::string path = ::testing::TempDir() + "tandem_release_pages.gguf";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), (std::streamsize)bytes.size());
  }
  auto m = Model::load(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  uint64_t packed = 0;
  for (const auto& l : m.value()->weights().layers)
    for (const Weight* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      EXPECT_FALSE(w->reads_source);
      packed += w->bytes;
    }
  const int64_t resident = resident_kb_of(path) * 1024;
  // Without the release every byte of the file would be resident (packing reads it all).
  EXPECT_GT(packed, bytes.size() / 2);
  EXPECT_LT(resident, (int64_t)(bytes.size() - packed) + 16 * 2 * 4096) << "resident " << resident << " of " << bytes.size();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Products named by exact_products run on f32 activations: naming them all gives exactly the
// f32-activation model's logits; naming the head alone moves 8-bit logits toward them.
TEST(Model, ExactProductsRunOnFloatActivations) {
  TinyShape s;
  s.weight_type = DType::Q8_0;
  auto with = [&](bool q8, std::vector<std::string> exact) {
    ModelOptions o;
    o.backend = std::make_shared<CpuBackend>(CpuBackendOptions{cpu::best_isa(), 0, q8, std::move(exact)});
    auto m = Model::from_gguf(test::tiny_model_file(s), o);
    EXPECT_TRUE(m.ok());
    test::OneSequence seq(*m.value(), 16);
    auto r = seq.prefill(kTokens, true);
    EXPECT_TRUE(r.ok());
    return std::vector<float>(r->begin(), r->end());
  };
  const auto f32 = with(false, {}), q8 = with(true, {}), all = with(true, {"blk", "output", "token_embd"}),
             head = with(true, {"output", "token_embd"});
  EXPECT_EQ(all, f32);
  EXPECT_NE(q8, f32);
  EXPECT_LT(max_abs_diff(head, f32), max_abs_diff(q8, f32));
}

}  // namespace
}  // namespace tandem
