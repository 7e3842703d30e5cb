// A whole forward pass of a small random-weight Llama on the GPU against the CPU backend (f32
// activations): a 64-token prompt in three prefill chunks with every position's logits, greedy
// decode steps (graph replays), then a serving step that batches a decode token of one sequence
// with a prompt chunk of another, all over shuffled KV blocks. For every weight type the CUDA
// products take, and for every family's tiny model (Gemma 3: sandwich norms, QK-norm, GELU
// gate, NeoX RoPE, two RoPE sets, head_dim 256, sliding windows, embedding scale; Granite: its
// four scales; Qwen2: QKV bias; Qwen3: QK-norm; Phi-3: fused matrices, head_dim 96). Both run
// Model's own pass (model/ unchanged: the backend is the choice).
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
#include "cuda_gpu.h"
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

// Each family's tiny model (tests/tiny_model.h) in a shape that reaches the kernels its spec
// needs: Gemma 3 with heads of 256 (wider than n_embd / n_head, as the 270M's), windows of 12
// on five local layers and a global sixth with its own RoPE base; Phi-3 with heads of 96.
test::TinyShape family_shape(const std::string& family, DType t) {
  test::TinyShape s;
  s.family = family;
  s.n_vocab = 384, s.n_embd = 128, s.n_layer = 2, s.n_head = 4, s.n_kv_head = 2, s.n_ff = 256, s.n_ctx = 256;
  s.weight_type = t;
  if (family == "gemma3") s.head_dim = 256, s.n_kv_head = 1, s.n_layer = 6, s.window = 12, s.tied = true;
  if (family == "phi3") s.head_dim = 96, s.n_head = 2, s.n_kv_head = 2;
  return s;
}
const char* const kFamilies[] = {"llama", "qwen2", "qwen3", "gemma3", "phi3", "granite"};

using FileMaker = std::function<std::unique_ptr<GgufFile>()>;

void run_model(CudaBackend& g, const FileMaker& make_file, const std::string& label, DType kv_dtype);

void run_model(CudaBackend& g, DType weights, DType kv_dtype) {
  test::TinyShape s;
  s.n_vocab = 512, s.n_embd = 256, s.n_layer = 2, s.n_head = 4, s.n_kv_head = 2, s.n_ff = 512, s.n_ctx = 256;
  s.weight_type = weights;
  run_model(g, [s] { return test::tiny_model_file(s, 7); }, std::string(dtype_name(weights)) + " weights", kv_dtype);
}

void run_model(CudaBackend& g, const FileMaker& make_file, const std::string& label, DType kv_dtype) {
  CpuBackend cpu(CpuBackendOptions{cpu::best_isa(), 2, false, {}});
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
    if (i > 0) {
      EXPECT_TRUE(g.last_pass().graph && !g.last_pass().captured) << "decode step " << i << " was not a replay";
    }
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
  NEED_GPU(gpu);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q6_K}) {
    SCOPED_TRACE(dtype_name(t));
    run_model(gpu, t, DType::F16);
  }
}

TEST(CudaForward, LogitsEqualCpuForEveryKvType) {
  NEED_GPU(gpu);
  for (DType kv : {DType::F32, DType::F16, DType::Q8_0}) {
    SCOPED_TRACE(dtype_name(kv));
    run_model(gpu, DType::Q4_0, kv);
  }
}

// Every family's pass: what the spec turns on reaches the CUDA kernels and gives the CPU's logits.
TEST(CudaForward, LogitsEqualCpuForEveryFamily) {
  NEED_GPU(gpu);
  for (const char* family : kFamilies)
    for (DType t : {DType::F32, DType::Q8_0}) {
      SCOPED_TRACE(fmt::format("{}, {} weights", family, dtype_name(t)));
      const test::TinyShape s = family_shape(family, t);
      run_model(gpu, [s] { return test::tiny_model_file(s, 13); },
                fmt::format("{} ({} weights)", family, dtype_name(t)), DType::F16);
    }
}

// Without a GPU: the shapes above hold what the GPU test means to exercise (it compares with
// the CPU, so a shape that lost a feature would still pass there).
TEST(CudaForward, FamilyShapesReachTheNewKernels) {
  CpuBackend cpu(CpuBackendOptions{cpu::best_isa(), 1, false, {}});
  ModelOptions o;
  o.backend = std::shared_ptr<Backend>(&cpu, [](Backend*) {});
  for (const char* family : kFamilies) {
    SCOPED_TRACE(family);
    auto m = Model::from_gguf(test::tiny_model_file(family_shape(family, DType::F32), 13), o);
    ASSERT_TRUE(m.ok()) << m.error().message;
    const ModelConfig& c = m.value()->config();
    EXPECT_EQ(c.spec.family, family);
    if (c.spec.family == "gemma3") {
      EXPECT_EQ(c.head_dim, 256);
      EXPECT_EQ(c.spec.windowed_layers(), 5);
      EXPECT_EQ(c.spec.max_window(), 12);
      EXPECT_EQ(c.spec.rope_sets.size(), 2u);
      EXPECT_EQ(c.spec.activation, GateActivation::GeluTanh);
      EXPECT_EQ(c.spec.norms, NormPlacement::Sandwich);
      EXPECT_GT(c.spec.embedding_scale, 1.0f);
    }
    if (c.spec.family == "phi3") {
      EXPECT_EQ(c.head_dim, 96);
    }
    if (c.spec.family == "granite") {
      EXPECT_NE(c.spec.residual_scale, 1.0f);
    }
    if (c.spec.family == "qwen2") {
      EXPECT_TRUE(c.spec.qkv_bias);
    }
    if (c.spec.family != "llama" && c.spec.family != "granite") {
      EXPECT_EQ(c.spec.rope_style, RopeStyle::NeoxHalves);
    }
  }
}

// The GPU session's check against an independent reference: scripts/gpu/torch_reference.py
// writes a model's float32 logits for a seeded 64-token prompt into the folder that
// TANDEM_TORCH_REF names; the CUDA pass (and the CPU's, for scale) must match them.
TEST(CudaForward, MatchesTorchReference) {
  const char* dir = std::getenv("TANDEM_TORCH_REF");
  if (!dir) GTEST_SKIP() << "TANDEM_TORCH_REF is not set (scripts/gpu_check.sh sets it)";
  NEED_GPU(gpu);
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
  CudaBackend& g = gpu;
  CpuBackend cpu(CpuBackendOptions{cpu::best_isa(), 0, false, {}});
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
