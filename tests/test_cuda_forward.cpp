// A whole forward pass of a small random-weight Llama on the GPU against the CPU backend (f32
// activations): a 64-token prompt in three prefill chunks with every position's logits, greedy
// decode steps (graph replays), then a serving step that batches a decode token of one sequence
// with a prompt chunk of another, all over shuffled KV blocks. For every weight type the CUDA
// products take, and for the other families' tiny shapes (Gemma 3: sandwich norms, QK-norm,
// GELU gate, NeoX RoPE, two RoPE sets, head_dim 256, sliding windows, embedding scale, logit
// soft-cap; Granite: its four scales; Qwen2: QKV bias). Both run Model's own pass (model/
// unchanged: the backend is the choice).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include <fmt/core.h>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "kv/block_pool.h"
#include "model/model.h"
#include "tiny_model.h"

namespace tandem {
namespace {

// One model on one backend (the real Model and its one forward pass), with a KV pool of
// `blocks` blocks of 16 positions in that backend's memory.
struct Runner {
  std::unique_ptr<Model> m;
  std::unique_ptr<BlockPool> pool;

  Runner(Backend& backend, std::unique_ptr<GgufFile> f, DType kv_dtype, int64_t blocks = 16) {
    ModelOptions o;
    o.backend = std::shared_ptr<Backend>(&backend, [](Backend*) {});  // the test owns it
    auto lm = Model::from_gguf(std::move(f), o);
    EXPECT_TRUE(lm.ok()) << lm.error().message;
    if (!lm.ok()) return;
    m = std::move(lm.value());
    auto p = m->new_kv_pool(blocks, kv_dtype, 16);
    EXPECT_TRUE(p.ok()) << p.error().message;
    if (p.ok()) pool = std::move(p.value());
  }
  const ModelConfig& c() const { return m->config(); }

  // Logits of the batch's logit rows, [rows, n_vocab].
  std::vector<float> pass(const ForwardBatch& b) {
    auto r = m->forward(*pool, b);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? std::vector<float>(r->begin(), r->end()) : std::vector<float>{};
  }
};

struct Compare {
  float worst = 0, scale = 0;
  void add(const std::vector<float>& gpu, const std::vector<float>& cpu) {
    ASSERT_EQ(gpu.size(), cpu.size());
    for (size_t i = 0; i < gpu.size(); i++) {
      const float d = std::fabs(gpu[i] - cpu[i]);
      worst = std::isnan(d) ? INFINITY : std::max(worst, d);
      scale = std::max(scale, std::fabs(cpu[i]));
    }
  }
};

int argmax(const float* p, int n) { return (int)(std::max_element(p, p + n) - p); }

// A tiny random-weight model of another family, in the GGUF keys and tensor names its
// llama.cpp converter writes (model/arch_readers.cpp reads them).
enum class Family { Gemma3, Granite, Qwen2 };

std::unique_ptr<GgufFile> family_model_file(Family fam, DType t, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::string arch = fam == Family::Gemma3 ? "gemma3" : fam == Family::Granite ? "granite" : "qwen2";
  // Gemma 3's heads are wider than n_embd / n_head (270M: 4 heads of 256 over 640).
  const int E = 128, n_head = 2, n_kv = 1, hd = fam == Family::Gemma3 ? 256 : 64, F = 256, V = 384, n_layer = 3;
  const int qd = n_head * hd, kvd = n_kv * hd;
  test::GgufBuilder b;
  const std::string p = arch + ".";
  b.kv_str("general.architecture", arch);
  b.kv_str("general.name", "tiny-random-" + arch);
  b.kv_u32(p + "context_length", 256);
  b.kv_u32(p + "embedding_length", E);
  b.kv_u32(p + "block_count", n_layer);
  b.kv_u32(p + "feed_forward_length", F);
  b.kv_u32(p + "attention.head_count", n_head);
  b.kv_u32(p + "attention.head_count_kv", n_kv);
  b.kv_f32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  if (fam == Family::Gemma3) {
    b.kv_u32(p + "attention.key_length", hd);
    b.kv_u32(p + "attention.value_length", hd);
    b.kv_f32(p + "rope.freq_base", 1000000.0f);
    b.kv_u32(p + "attention.sliding_window", 12);  // the 64-token prompt crosses it many times
    b.kv_u32(p + "attention.sliding_window_pattern", 3);  // layers 0, 1 local; 2 global
    b.kv_f32(p + "final_logit_softcapping", 4.0f);
  } else if (fam == Family::Granite) {
    b.kv_f32(p + "rope.freq_base", 10000.0f);
    b.kv_f32(p + "embedding_scale", 12.0f);
    b.kv_f32(p + "residual_scale", 0.22f);
    b.kv_f32(p + "attention.scale", 0.0078125f);
    b.kv_f32(p + "logit_scale", 8.0f);
  } else {
    b.kv_f32(p + "rope.freq_base", 1000000.0f);
  }
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int i = 0; i < V; i++) {
    tokens.push_back(i == 0 ? "<|endoftext|>" : std::string(1, (char)('!' + (i - 1) % 90)) + std::string((size_t)((i - 1) / 90), 'x'));
    types.push_back(i == 0 ? 3 : 1);
  }
  b.kv_str("tokenizer.ggml.model", "gpt2");
  b.kv_str("tokenizer.ggml.pre", "gpt-2");
  b.kv_str_array("tokenizer.ggml.tokens", tokens);
  b.kv_i32_array("tokenizer.ggml.token_type", types);
  b.kv_str_array("tokenizer.ggml.merges", {});
  b.kv_u32("tokenizer.ggml.eos_token_id", 0);
  const uint64_t e = E, f = F, v = V, q = (uint64_t)qd, kv = (uint64_t)kvd;
  // Gemma's embeddings are scaled up by sqrt(n_embd): smaller rows keep the activations tame.
  b.tensor("token_embd.weight", t, {e, v}, test::random_weights(t, V, E, rng, fam == Family::Gemma3 ? 0.1f : 1.0f));
  b.tensor("output_norm.weight", DType::F32, {e}, test::f32_vector(E, rng, 1.0f, 0.1f));
  if (fam != Family::Gemma3) b.tensor("output.weight", t, {e, v}, test::random_weights(t, V, E, rng, 0.2f));  // Gemma: tied
  for (int l = 0; l < n_layer; l++) {
    const std::string bp = "blk." + std::to_string(l) + ".";
    b.tensor(bp + "attn_norm.weight", DType::F32, {e}, test::f32_vector(E, rng, 1.0f, 0.1f));
    b.tensor(bp + "attn_q.weight", t, {e, q}, test::random_weights(t, qd, E, rng, 0.3f));
    b.tensor(bp + "attn_k.weight", t, {e, kv}, test::random_weights(t, kvd, E, rng, 0.3f));
    b.tensor(bp + "attn_v.weight", t, {e, kv}, test::random_weights(t, kvd, E, rng, 0.3f));
    if (fam == Family::Qwen2) {
      b.tensor(bp + "attn_q.bias", DType::F32, {q}, test::f32_vector(qd, rng, 0.0f, 0.5f));
      b.tensor(bp + "attn_k.bias", DType::F32, {kv}, test::f32_vector(kvd, rng, 0.0f, 0.5f));
      b.tensor(bp + "attn_v.bias", DType::F32, {kv}, test::f32_vector(kvd, rng, 0.0f, 0.5f));
    }
    if (fam == Family::Gemma3) {
      b.tensor(bp + "attn_q_norm.weight", DType::F32, {(uint64_t)hd}, test::f32_vector(hd, rng, 1.0f, 0.1f));
      b.tensor(bp + "attn_k_norm.weight", DType::F32, {(uint64_t)hd}, test::f32_vector(hd, rng, 1.0f, 0.1f));
      b.tensor(bp + "post_attention_norm.weight", DType::F32, {e}, test::f32_vector(E, rng, 1.0f, 0.1f));
      b.tensor(bp + "post_ffw_norm.weight", DType::F32, {e}, test::f32_vector(E, rng, 1.0f, 0.1f));
    }
    b.tensor(bp + "attn_output.weight", t, {q, e}, test::random_weights(t, E, qd, rng, 0.1f));
    b.tensor(bp + "ffn_norm.weight", DType::F32, {e}, test::f32_vector(E, rng, 1.0f, 0.1f));
    b.tensor(bp + "ffn_gate.weight", t, {e, f}, test::random_weights(t, F, E, rng, 0.2f));
    b.tensor(bp + "ffn_up.weight", t, {e, f}, test::random_weights(t, F, E, rng, 0.2f));
    b.tensor(bp + "ffn_down.weight", t, {f, e}, test::random_weights(t, E, F, rng, 0.1f));
  }
  const std::vector<uint8_t> bytes = b.build();
  auto file = GgufFile::from_bytes(bytes.data(), bytes.size());
  EXPECT_TRUE(file.ok()) << file.error().message;
  return file.ok() ? std::move(file.value()) : nullptr;
}

using FileMaker = std::function<std::unique_ptr<GgufFile>()>;

void run_model(CudaBackend& g, const FileMaker& make_file, const std::string& label, DType kv_dtype);

void run_model(CudaBackend& g, DType weights, DType kv_dtype) {
  test::TinyShape s;
  s.n_vocab = 512, s.n_embd = 256, s.n_layer = 2, s.n_head = 4, s.n_kv_head = 2, s.n_ff = 512, s.n_ctx = 256;
  s.weight_type = weights;
  run_model(g, [s] { return test::tiny_model_file(s, 7); }, std::string(dtype_name(weights)) + " weights", kv_dtype);
}

void run_model(CudaBackend& g, const FileMaker& make_file, const std::string& label, DType kv_dtype) {
  CpuBackend cpu(CpuBackendOptions{cpu::best_isa(), 2, false});
  // Both caches hold kv_dtype: the CPU's q8_0 store rounds as GGML's quantizer, as the GPU's.
  Runner rc(cpu, make_file(), kv_dtype), rg(g, make_file(), kv_dtype);
  ASSERT_TRUE(rc.m && rg.m && rc.pool && rg.pool);
  ASSERT_TRUE(g.error().ok()) << g.error().error().message;
  const ModelConfig& c = rc.c();
  const int bt = 16;
  std::vector<int32_t> perm(16);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
  const std::vector<int32_t> table_a(perm.begin(), perm.begin() + 6), table_b(perm.begin() + 6, perm.begin() + 10);

  std::mt19937 rng(11);
  std::vector<int32_t> prompt(64);
  for (int32_t& t : prompt) t = (int32_t)(rng() % (uint32_t)c.n_vocab);
  Compare cmp;
  const int V = c.n_vocab;
  int greedy_mismatch = 0;
  auto step = [&](const ForwardBatch& b) {
    const std::vector<float> lc = rc.pass(b), lg = rg.pass(b);
    cmp.add(lg, lc);
    for (size_t r = 0; r < lc.size() / (size_t)V; r++) {
      const int a = argmax(lc.data() + r * V, V), bg = argmax(lg.data() + r * V, V);
      // A near tie may flip within the tolerance; anything else is a wrong token.
      if (a != bg && lc[r * V + (size_t)a] - lc[r * V + (size_t)bg] > 1e-2f) greedy_mismatch++;
    }
    return lc;
  };
  // Prefill: three chunks, every position's logits.
  int64_t pos = 0;
  for (int64_t n : {24, 24, 16}) {
    ForwardBatch b(bt);
    ASSERT_TRUE(b.add_sequence(std::span<const int32_t>(prompt).subspan((size_t)pos, (size_t)n), pos, table_a,
                               ForwardBatch::Logits::All)
                    .ok());
    step(b);
    pos += n;
  }
  // Greedy decode (the CPU's token feeds both), 8 steps.
  int32_t next = 1;
  for (int i = 0; i < 8; i++, pos++) {
    ForwardBatch b(bt);
    ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{next}, pos, table_a, ForwardBatch::Logits::Last).ok());
    const std::vector<float> lc = step(b);
    next = argmax(lc.data(), V);
    if (i > 0) EXPECT_TRUE(g.last_pass().graph && !g.last_pass().captured) << "decode step " << i << " was not a replay";
  }
  fmt::print("[ cuda vs cpu ] {}: one decode token launches {} kernels ({} layers)\n", label, g.last_pass().kernels,
             c.n_layer);
  // A serving step: sequence A's next decode token and sequence B's 5-token prompt.
  ForwardBatch b(bt);
  ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{next}, pos, table_a, ForwardBatch::Logits::Last).ok());
  ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{3, 1, 4, 1, 5}, 0, table_b, ForwardBatch::Logits::All).ok());
  step(b);
  ASSERT_TRUE(g.error().ok()) << g.error().error().message;
  fmt::print("[ cuda vs cpu ] {}, {} KV: max |logit diff| {:.3g} (logits up to {:.3g})\n", label, dtype_name(kv_dtype),
             cmp.worst, cmp.scale);
  // q8_0 KV: a K or V value on either side of a rounding boundary lands one step apart.
  const float tol = kv_dtype == DType::Q8_0 ? 5e-2f : 1e-2f;
  EXPECT_LE(cmp.worst, tol * std::max(1.0f, cmp.scale));
  EXPECT_EQ(greedy_mismatch, 0);
}

TEST(CudaForward, LogitsEqualCpuForEveryWeightType) {
  auto made = CudaBackend::create();
  if (!made.ok()) GTEST_SKIP() << "no GPU here: " << made.error().message;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q6_K}) {
    SCOPED_TRACE(dtype_name(t));
    run_model(*made.value(), t, DType::F16);
  }
}

TEST(CudaForward, LogitsEqualCpuForEveryKvType) {
  auto made = CudaBackend::create();
  if (!made.ok()) GTEST_SKIP() << "no GPU here: " << made.error().message;
  for (DType kv : {DType::F32, DType::F16, DType::Q8_0}) {
    SCOPED_TRACE(dtype_name(kv));
    run_model(*made.value(), DType::Q4_0, kv);
  }
}

// Every family's pass: what the spec turns on reaches the CUDA kernels and gives the CPU's logits.
TEST(CudaForward, LogitsEqualCpuForEveryFamily) {
  auto made = CudaBackend::create();
  if (!made.ok()) GTEST_SKIP() << "no GPU here: " << made.error().message;
  const std::pair<Family, const char*> families[] = {
      {Family::Gemma3, "gemma3"}, {Family::Granite, "granite"}, {Family::Qwen2, "qwen2"}};
  for (auto [fam, name] : families)
    for (DType t : {DType::F32, DType::Q8_0}) {
      SCOPED_TRACE(fmt::format("{}, {} weights", name, dtype_name(t)));
      run_model(*made.value(), [fam, t] { return family_model_file(fam, t, 13); },
                fmt::format("{} ({} weights)", name, dtype_name(t)), DType::F16);
    }
}

// Without a GPU the family models above are still checked for what they claim to be (the
// GPU test compares against the CPU, so a builder that lost a feature would pass silently).
TEST(CudaForward, FamilyModelsCarryTheirFeatures) {
  CpuBackend cpu(CpuBackendOptions{cpu::best_isa(), 1, false});
  ModelOptions o;
  o.backend = std::shared_ptr<Backend>(&cpu, [](Backend*) {});
  auto gemma = Model::from_gguf(family_model_file(Family::Gemma3, DType::F32, 13), o);
  ASSERT_TRUE(gemma.ok()) << gemma.error().message;
  const ArchSpec& gs = gemma.value()->config().spec;
  EXPECT_EQ(gemma.value()->config().head_dim, 256);
  EXPECT_EQ(gs.norms, NormPlacement::Sandwich);
  EXPECT_EQ(gs.activation, GateActivation::GeluTanh);
  EXPECT_EQ(gs.rope_style, RopeStyle::NeoxHalves);
  EXPECT_TRUE(gs.qk_norm);
  EXPECT_EQ(gs.rope_sets.size(), 2u);
  EXPECT_EQ(gs.windowed_layers(), 2);
  EXPECT_EQ(gs.max_window(), 12);
  EXPECT_GT(gs.embedding_scale, 1.0f);
  EXPECT_EQ(gs.logit_softcap, 4.0f);
  {  // its CPU pass runs, and the soft-cap bounds its logits
    Runner r(cpu, family_model_file(Family::Gemma3, DType::F32, 13), DType::F16);
    ASSERT_TRUE(r.m && r.pool);
    ForwardBatch b(16);
    std::vector<int32_t> prompt(40);
    for (size_t i = 0; i < prompt.size(); i++) prompt[i] = (int32_t)(i * 37 % 384);
    ASSERT_TRUE(b.add_sequence(prompt, 0, std::vector<int32_t>{4, 1, 0}, ForwardBatch::Logits::All).ok());
    const std::vector<float> logits = r.pass(b);
    ASSERT_EQ(logits.size(), 40u * 384u);
    float most = 0;
    for (float v : logits) most = std::isfinite(v) ? std::max(most, std::fabs(v)) : INFINITY;
    EXPECT_LE(most, 4.0f);
    EXPECT_GT(most, 0.5f);
  }
  auto granite = Model::from_gguf(family_model_file(Family::Granite, DType::F32, 13), o);
  ASSERT_TRUE(granite.ok()) << granite.error().message;
  const ArchSpec& rs = granite.value()->config().spec;
  EXPECT_EQ(rs.embedding_scale, 12.0f);
  EXPECT_EQ(rs.residual_scale, 0.22f);
  EXPECT_EQ(rs.attention_scale, 0.0078125f);
  EXPECT_EQ(rs.logit_scale, 0.125f);
  auto qwen = Model::from_gguf(family_model_file(Family::Qwen2, DType::F32, 13), o);
  ASSERT_TRUE(qwen.ok()) << qwen.error().message;
  EXPECT_TRUE(qwen.value()->config().spec.qkv_bias);
  EXPECT_EQ(qwen.value()->config().spec.rope_style, RopeStyle::NeoxHalves);
}

// The GPU session's check against an independent reference: scripts/gpu/torch_reference.py
// writes a model's float32 logits for a seeded 64-token prompt into the folder that
// TANDEM_TORCH_REF names; the CUDA pass (and the CPU's, for scale) must match them.
TEST(CudaForward, MatchesTorchReference) {
  const char* dir = std::getenv("TANDEM_TORCH_REF");
  if (!dir) GTEST_SKIP() << "TANDEM_TORCH_REF is not set (scripts/gpu_check.sh sets it)";
  auto made = CudaBackend::create();
  if (!made.ok()) GTEST_SKIP() << "no GPU here: " << made.error().message;
  const std::string d = dir;
  std::vector<int32_t> tokens;
  {
    std::ifstream f(d + "/tokens.txt");
    int32_t t;
    while (f >> t) tokens.push_back(t);
  }
  ASSERT_EQ(tokens.size(), 64u);
  std::vector<float> want;
  {
    std::ifstream bf(d + "/logits.f32", std::ios::binary | std::ios::ate);
    const size_t bytes = (size_t)bf.tellg();
    want.assign(bytes / 4, 0.0f);
    bf.seekg(0);
    bf.read(reinterpret_cast<char*>(want.data()), (std::streamsize)bytes);
  }
  CudaBackend& g = *made.value();
  CpuBackend cpu(CpuBackendOptions{cpu::best_isa(), 0, false});
  Compare cmp[2];
  for (int i = 0; i < 2; i++) {
    Backend& be = i == 0 ? (Backend&)g : (Backend&)cpu;
    auto file = GgufFile::open(d + "/model.gguf");
    ASSERT_TRUE(file.ok()) << file.error().message;
    Runner r(be, std::move(file.value()), DType::F32, 4);
    ASSERT_TRUE(r.m && r.pool);
    ASSERT_EQ(want.size(), tokens.size() * (size_t)r.c().n_vocab);
    ForwardBatch b(16);
    ASSERT_TRUE(b.add_sequence(tokens, 0, std::vector<int32_t>{2, 0, 3, 1}, ForwardBatch::Logits::All).ok());
    cmp[i].add(r.pass(b), want);
  }
  fmt::print("[ vs torch ] cuda: max |logit diff| {:.3g}; cpu: {:.3g} (logits up to {:.3g})\n", cmp[0].worst,
             cmp[1].worst, cmp[0].scale);
  EXPECT_LE(cmp[0].worst, 1e-2f * std::max(1.0f, cmp[0].scale));
}

}  // namespace
}  // namespace tandem
