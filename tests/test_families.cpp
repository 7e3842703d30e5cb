// The model families as data: each family's reader fills the ArchSpec its GGUF keys and
// tensors describe, and one forward pass runs every family with prefill == decode == no-cache
// (the independent numpy reference checks the numbers themselves: tests/reference/). Plus the
// ops the families added: NeoX RoPE, the GELU-tanh gate, sliding-window attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/ops.h"
#include "model/model.h"
#include "test_sequence.h"
#include "tiny_model.h"

namespace tandem {
namespace {

using test::TinyShape;

TinyShape family_shape(const std::string& family) {
  TinyShape s;
  s.family = family;
  if (family == "qwen3") s.head_dim = 32;  // key_length != n_embd / n_head
  if (family == "gemma3") s.head_dim = 32, s.n_layer = 6, s.window = 4;  // layer 5 global, 0-4 windowed
  return s;
}

Result<std::unique_ptr<Model>> load(const TinyShape& s, cpu::Isa isa = cpu::best_isa()) {
  auto f = test::tiny_model_file(s);
  if (!f) return make_error("tiny model bytes do not parse");
  ModelOptions o;
  o.backend = std::make_shared<CpuBackend>(CpuBackendOptions{isa});
  return Model::from_gguf(std::move(f), o);
}

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); i++) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

const std::vector<int32_t> kTokens = {5, 17, 3, 88, 42, 42, 7, 1, 60, 33, 21, 9, 70, 2};

std::vector<float> prefill_logits(Model& m, std::span<const int32_t> tokens, int chunk = 0) {
  test::OneSequence seq(m, (int64_t)tokens.size(), DType::F32, chunk);
  auto r = seq.prefill(tokens, true);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? std::vector<float>(r->begin(), r->end()) : std::vector<float>{};
}

class FamilyPaths : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyPaths, PrefillEqualsDecodeEqualsNoCache) {
  const TinyShape s = family_shape(GetParam());
  for (cpu::Isa isa : cpu::supported_isas()) {
    auto m = load(s, isa);
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_EQ((*m)->config().spec.family, GetParam() == "mistral" ? "llama" : GetParam());
    const int64_t V = (*m)->config().n_vocab, T = (int64_t)kTokens.size();
    const std::vector<float> prefill = prefill_logits(**m, kTokens);
    ASSERT_EQ(prefill.size(), (size_t)(T * V));
    test::OneSequence seq(**m, T, DType::F32);
    for (int64_t t = 0; t < T; t++) {
      auto dec = seq.decode(kTokens[(size_t)t]);
      ASSERT_TRUE(dec.ok()) << dec.error().message;
      const std::span<const float> row(prefill.data() + t * V, (size_t)V);
      EXPECT_LT(max_abs_diff(*dec, row), 2e-4f) << GetParam() << " " << cpu::isa_name(isa) << " position " << t;
      const auto naive = test::no_cache_logits(**m, std::span<const int32_t>(kTokens.data(), (size_t)t + 1), DType::F32);
      ASSERT_EQ(naive.size(), (size_t)V);
      EXPECT_LT(max_abs_diff(naive, row), 2e-4f) << GetParam() << " naive, position " << t;
    }
    // A prompt in passes of 5 tokens: the window and the RoPE sets see the same positions.
    EXPECT_LT(max_abs_diff(prefill_logits(**m, kTokens, 5), prefill), 1e-5f) << GetParam() << " chunked";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyPaths,
                         ::testing::Values("llama", "mistral", "granite", "qwen2", "qwen3", "gemma3", "phi3"),
                         [](const auto& info) { return info.param; });

TEST(Families, EachReaderFillsItsSpec) {
  struct Want {
    std::string family;
    NormPlacement norms;
    GateActivation act;
    RopeStyle rope;
    bool fused_qkv, fused_gate_up, bias, qk_norm;
  };
  using N = NormPlacement;
  using G = GateActivation;
  using R = RopeStyle;
  const std::vector<Want> wants = {
      {"llama", N::PreNorm, G::Silu, R::AdjacentPairs, false, false, false, false},
      {"granite", N::PreNorm, G::Silu, R::AdjacentPairs, false, false, false, false},
      {"qwen2", N::PreNorm, G::Silu, R::NeoxHalves, false, false, true, false},
      {"qwen3", N::PreNorm, G::Silu, R::NeoxHalves, false, false, false, true},
      {"gemma3", N::Sandwich, G::GeluTanh, R::NeoxHalves, false, false, false, true},
      {"phi3", N::PreNorm, G::Silu, R::NeoxHalves, true, true, false, false},
  };
  for (const Want& w : wants) {
    auto m = load(family_shape(w.family));
    ASSERT_TRUE(m.ok()) << w.family << ": " << m.error().message;
    const ModelConfig& c = (*m)->config();
    const ArchSpec& a = c.spec;
    EXPECT_EQ(a.norms, w.norms) << w.family;
    EXPECT_EQ(a.activation, w.act) << w.family;
    EXPECT_EQ(a.rope_style, w.rope) << w.family;
    EXPECT_EQ(a.fused_qkv, w.fused_qkv) << w.family;
    EXPECT_EQ(a.fused_gate_up, w.fused_gate_up) << w.family;
    EXPECT_EQ(a.qkv_bias, w.bias) << w.family;
    EXPECT_EQ(a.qk_norm, w.qk_norm) << w.family;
    ASSERT_EQ(a.layers.size(), (size_t)c.n_layer);
    if (w.family == "granite") {
      EXPECT_FLOAT_EQ(a.embedding_scale, 4.0f);
      EXPECT_FLOAT_EQ(a.residual_scale, 0.5f);
      EXPECT_FLOAT_EQ(a.attention_scale, 0.2f);
      EXPECT_FLOAT_EQ(a.logit_scale, 1.0f / 3.0f);
    } else if (w.family == "gemma3") {
      EXPECT_FLOAT_EQ(a.embedding_scale, 8.0f);  // sqrt(64)
      EXPECT_FLOAT_EQ(a.attention_scale, 1.0f / std::sqrt(32.0f));
      ASSERT_EQ(a.rope_sets.size(), 2u);
      EXPECT_EQ(a.rope_sets[1].base, 10000.0);
      for (int l = 0; l < 6; l++) {  // every sixth layer is global
        EXPECT_EQ(a.layers[(size_t)l].window, l == 5 ? 0 : 4) << "layer " << l;
        EXPECT_EQ(a.layers[(size_t)l].rope_set, l == 5 ? 0 : 1) << "layer " << l;
      }
      EXPECT_EQ(a.max_window(), 4);
      EXPECT_EQ(a.windowed_layers(), 5);
    } else {
      EXPECT_FLOAT_EQ(a.embedding_scale, 1.0f);
      EXPECT_FLOAT_EQ(a.attention_scale, 1.0f / std::sqrt((float)c.head_dim));
      EXPECT_EQ(a.max_window(), 0);
    }
  }
}

// Granite's attention.scale of 0 means the default, and rope.scaling.finetuned = false turns
// RoPE off (llama.cpp reads both so): without RoPE, a one-layer model's attention sees its keys
// as a set, so two prompts that differ only in the order of earlier tokens give the same last
// logits.
TEST(Families, GraniteDefaultsAndRopeSwitch) {
  TinyShape s = family_shape("granite");
  s.n_layer = 1;  // one layer: its keys and values come straight from the embeddings
  s.granite_attention_scale = 0.0f;
  s.granite_rope = false;
  auto m = load(s);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const ArchSpec& a = (*m)->config().spec;
  EXPECT_FLOAT_EQ(a.attention_scale, 1.0f / std::sqrt(16.0f));
  EXPECT_FALSE(a.use_rope);
  EXPECT_NE(a.describe().find("no RoPE"), std::string::npos) << a.describe();
  const std::vector<int32_t> abc = {5, 9, 7}, bac = {9, 5, 7};
  const int64_t V = (*m)->config().n_vocab;
  auto last = [&](Model& model, const std::vector<int32_t>& t) {
    const std::vector<float> l = prefill_logits(model, t);
    return std::vector<float>(l.end() - V, l.end());
  };
  EXPECT_LT(max_abs_diff(last(**m, abc), last(**m, bac)), 1e-5f);
  s.granite_rope = true;  // with RoPE the order shows
  auto r = load(s);
  ASSERT_TRUE(r.ok());
  EXPECT_GT(max_abs_diff(last(**r, abc), last(**r, bac)), 1e-3f);
}

// The window binds: positions whose keys all lie inside it match the same model without a
// window bit for bit; later positions differ.
TEST(Families, SlidingWindowBindsOnlyPastTheWindow) {
  TinyShape windowed = family_shape("gemma3"), global = windowed;
  global.window = 0;  // no sliding_window key: every layer global
  auto a = load(windowed), b = load(global);
  ASSERT_TRUE(a.ok() && b.ok());
  const int64_t V = (*a)->config().n_vocab;
  const std::vector<float> la = prefill_logits(**a, kTokens), lb = prefill_logits(**b, kTokens);
  // The local layers' RoPE base (10000) equals the tiny file's global base, so the RoPE
  // sets agree and only the window differs.
  for (int64_t t = 0; t < (int64_t)kTokens.size(); t++) {
    const float d = max_abs_diff(std::span<const float>(la.data() + t * V, (size_t)V),
                                 std::span<const float>(lb.data() + t * V, (size_t)V));
    if (t < 4)
      EXPECT_EQ(d, 0.0f) << "position " << t;
    else
      EXPECT_GT(d, 1e-4f) << "position " << t;
  }
}

TEST(Families, BadFamilyFilesAreClearErrors) {
  {
    TinyShape s;
    s.family = "mamba";
    auto m = load(s);
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.error().message.find("architecture 'mamba' is not supported"), std::string::npos) << m.error().message;
    EXPECT_NE(m.error().message.find("gemma3"), std::string::npos) << m.error().message;
  }
  {  // a qwen2 file without its biases
    TinyShape s = family_shape("qwen3");
    auto bytes = test::tiny_model_bytes(s);
    // Rename the architecture in place: "qwen3" and "qwen2" have the same length, so the
    // file stays valid, with qwen3's tensors (no biases) under qwen2's name.
    std::string text(bytes.begin(), bytes.end());
    for (size_t at = text.find("qwen3"); at != std::string::npos; at = text.find("qwen3", at + 1)) bytes[at + 4] = '2';
    auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
    ASSERT_TRUE(f.ok()) << f.error().message;
    ModelOptions o;
    o.backend = std::make_shared<CpuBackend>(CpuBackendOptions{});
    auto m = Model::from_gguf(std::move(f.value()), o);
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.error().message.find("attn_q.bias"), std::string::npos) << m.error().message;
  }
}

// ---- the ops the families added ----

TEST(FamilyOps, NeoxRopeRotatesHalves) {
  const int hd = 8, rope_dim = 6;  // dims 6, 7 are not rotated
  std::vector<double> inv = {1.0, 0.1, 0.01};
  std::vector<float> cs(rope_dim);
  cpu::rope_angles(3, inv.data(), rope_dim, cs.data());
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8}, y = x;
  cpu::rope_neox(y.data(), 1, hd, rope_dim, cs.data());
  for (int i = 0; i < rope_dim / 2; i++) {
    const double th = 3 * inv[(size_t)i], a = x[(size_t)i], b = x[(size_t)i + 3];
    EXPECT_NEAR(y[(size_t)i], a * std::cos(th) - b * std::sin(th), 1e-5) << i;
    EXPECT_NEAR(y[(size_t)i + 3], a * std::sin(th) + b * std::cos(th), 1e-5) << i;
  }
  EXPECT_EQ(y[6], 7.0f);
  EXPECT_EQ(y[7], 8.0f);
}

TEST(FamilyOps, GeluTanhGateMatchesItsDefinitionOnEveryIsa) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int n = 203;  // a tail past the vectors
  std::vector<float> g(n), u(n);
  for (int i = 0; i < n; i++) g[(size_t)i] = nd(rng), u[(size_t)i] = nd(rng);
  g[0] = 0.0f, g[1] = -30.0f, g[2] = 30.0f;
  for (cpu::Isa isa : cpu::supported_isas()) {
    std::vector<float> out = g;
    cpu::kernels_for(isa).gelu_tanh_mul(out.data(), u.data(), n);
    for (int i = 0; i < n; i++) {
      const double x = g[(size_t)i];
      const double want = 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) * u[(size_t)i];
      EXPECT_NEAR(out[(size_t)i], want, 2e-6 * (1.0 + std::fabs(want))) << cpu::isa_name(isa) << " x=" << x;
    }
  }
}

TEST(FamilyOps, ScaledAddScaleAndSoftcap) {
  std::vector<float> y = {1, 2, 3}, x = {4, 5, 6};
  cpu::add_scaled_inplace(y.data(), x.data(), 0.5f, 3);
  EXPECT_EQ(y, (std::vector<float>{3, 4.5f, 6}));
  cpu::scale_inplace(y.data(), 2.0f, 3);
  EXPECT_EQ(y, (std::vector<float>{6, 9, 12}));
  std::vector<float> z = {0.0f, 10.0f, -1000.0f};
  cpu::softcap_inplace(z.data(), 30.0f, 3);
  EXPECT_EQ(z[0], 0.0f);
  EXPECT_NEAR(z[1], 30.0 * std::tanh(10.0 / 30.0), 1e-5);
  EXPECT_NEAR(z[2], -30.0, 1e-4);
}

// Sliding-window attention against a float64 softmax over exactly the window's keys, on every
// ISA and path (one segment, split segments, the generic kernel), and decode == prefill.
TEST(FamilyOps, SlidingWindowAttentionMatchesReference) {
  for (int hd : {64, 32}) {  // 64: the SIMD kernels; 32: the generic path
    const int n_head = 4, n_kv = 2, n_ctx = 700;
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q((size_t)n_ctx * n_head * hd), k((size_t)n_ctx * n_kv * hd), v(k.size());
    for (auto* a : {&q, &k, &v})
      for (float& e : *a) e = nd(rng);
    for (int64_t window : {1, 5, 300, 5000}) {
      const cpu::AttentionShape shape{n_head, n_kv, hd, 0.3f, window};
      for (cpu::Isa isa : cpu::supported_isas()) {
        const cpu::CpuKernels kern = cpu::kernels_for(isa);
        std::vector<float> pre((size_t)n_ctx * n_head * hd);
        cpu::attention(q.data(), k.data(), v.data(), DType::F32, n_ctx, 0, shape, pre.data(), kern);
        for (int64_t p : {0L, 3L, 4L, 299L, 300L, 301L, 555L, 699L}) {
          std::vector<float> dec((size_t)n_head * hd);
          cpu::attention(q.data() + p * n_head * hd, k.data(), v.data(), DType::F32, 1, p, shape, dec.data(), kern);
          for (size_t i = 0; i < dec.size(); i++)
            ASSERT_EQ(dec[i], pre[(size_t)p * n_head * hd + i]) << "decode != prefill, window " << window << " pos " << p;
          const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
          for (int h = 0; h < n_head; h++) {
            const int kvh = h / (n_head / n_kv);
            const float* qh = q.data() + (p * n_head + h) * hd;
            std::vector<double> sc;
            double mx = -1e300;
            for (int64_t t = lo; t <= p; t++) {
              double d = 0;
              for (int e = 0; e < hd; e++) d += (double)qh[e] * k[(size_t)((t * n_kv + kvh) * hd + e)];
              sc.push_back(d * 0.3);
              mx = std::max(mx, sc.back());
            }
            double sum = 0;
            for (double& s : sc) sum += (s = std::exp(s - mx));
            for (int e = 0; e < hd; e++) {
              double o = 0;
              for (int64_t t = lo; t <= p; t++) o += sc[(size_t)(t - lo)] / sum * v[(size_t)((t * n_kv + kvh) * hd + e)];
              EXPECT_NEAR(pre[(size_t)((p * n_head + h) * hd + e)], o, 2e-5)
                  << "hd " << hd << " window " << window << " pos " << p << " " << cpu::isa_name(isa);
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem
