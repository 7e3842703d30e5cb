// The KV planner (known answers, and the bytes the engine really allocates), the phase cost
// model, the roofline probes, and the SVG chart writer behind `tandem bench --sweep`.
#include <gtest/gtest.h>

#include "apps/bench_runs.h"
#include "apps/phase_report.h"
#include "backend/cpu/cpu_backend.h"
#include "apps/svg_chart.h"
#include "core/units.h"
#include "engine/phase_cost.h"
#include "kernels/cpu/probe.h"
#include "kv/block_pool.h"
#include "kv/kv_planner.h"
#include "model/model.h"
#include "tiny_model.h"

namespace tandem {
namespace {

KvPlan plan(int layers, int heads, int dim, int64_t ctx, DType dt = DType::F16, int64_t batch = 1) {
  KvPlanInput in;
  in.n_layer = layers;
  in.n_kv_head = heads;
  in.head_dim = dim;
  in.ctx = ctx;
  in.batch = batch;
  in.dtype = dt;
  auto p = plan_kv(in);
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.value();
}

TEST(KvPlanner, Llama2_70bKnownAnswers) {
  // The seed's example: 80 layers, 8 KV heads (GQA), head dim 128, 4096 tokens, fp16.
  const KvPlan gqa = plan(80, 8, 128, 4096);
  EXPECT_EQ(gqa.bytes_per_sequence, 1342177280u);
  EXPECT_EQ(format_bytes((double)gqa.bytes_per_sequence), "1.34 GB");
  // Without GQA every one of the 64 heads keeps its K and V: 8x more.
  const KvPlan mha = plan(80, 64, 128, 4096);
  EXPECT_EQ(mha.bytes_per_sequence, 10737418240u);
  EXPECT_EQ(format_bytes((double)mha.bytes_per_sequence), "10.7 GB");
  EXPECT_EQ(plan(80, 8, 128, 4096, DType::F16, 16).bytes_batch, 16 * 1342177280ull);
}

TEST(KvPlanner, BlockTypesAndBudgets) {
  // q8_0: 34 bytes per 32 elements.
  const KvPlan q8 = plan(30, 3, 64, 1000, DType::Q8_0);
  EXPECT_EQ(q8.bytes_per_token, 2u * 30 * (3 * 64 / 32) * 34);
  EXPECT_DOUBLE_EQ(q8.bytes_per_element, 34.0 / 32);
  KvPlanInput in;
  in.n_layer = 80, in.n_kv_head = 8, in.head_dim = 128, in.ctx = 4096;
  in.weights_bytes = 140'000'000'000ull;
  in.memory_bytes = 160'000'000'000ull;
  auto p = plan_kv(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->max_sequences, (int64_t)(20'000'000'000ull / 1342177280ull));  // 14
  in.memory_bytes = 100'000'000'000ull;
  EXPECT_EQ(plan_kv(in)->max_sequences, 0);
  in.n_kv_head = 0;
  EXPECT_FALSE(plan_kv(in).ok());
  in.n_kv_head = 3, in.head_dim = 10, in.dtype = DType::Q8_0;  // 30 elements: not whole q8_0 blocks
  EXPECT_FALSE(plan_kv(in).ok());
  EXPECT_EQ(dtype_from_name("q8_0").value(), DType::Q8_0);
  EXPECT_FALSE(dtype_from_name("q9").ok());
}

// What `tandem kv` plans for each --kv-dtype is what the engine's KV pool allocates (the pool
// every command uses), byte for byte: q8_0 counts its 34-byte blocks of 32 elements.
TEST(KvPlanner, EqualsWhatTheEngineAllocates) {
  test::TinyShape s;
  s.n_embd = 128;  // head_dim 32: one q8_0 block per head
  auto m = Model::from_gguf(test::tiny_model_file(s));
  ASSERT_TRUE(m.ok()) << m.error().message;
  const ModelConfig& c = m.value()->config();
  ASSERT_EQ(c.head_dim, 32);
  for (DType dt : {DType::F16, DType::F32, DType::Q8_0}) {
    auto pool = m.value()->new_kv_pool(3, dt, 16);  // 48 positions
    ASSERT_TRUE(pool.ok()) << pool.error().message;
    EXPECT_EQ(plan(c.n_layer, c.n_kv_head, c.head_dim, 48, dt).bytes_per_sequence, pool.value()->bytes()) << dtype_name(dt);
    EXPECT_EQ(BlockPool::blocks_for_bytes(pool.value()->shape(), pool.value()->bytes()), 3);
  }
  EXPECT_EQ(plan(c.n_layer, c.n_kv_head, c.head_dim, 48, DType::Q8_0).bytes_per_sequence * 32,
            plan(c.n_layer, c.n_kv_head, c.head_dim, 48, DType::F16).bytes_per_sequence * 17);  // 34/32 vs 2 bytes
  // A head that is not a whole number of q8_0 blocks is refused, naming why.
  auto small = Model::from_gguf(test::tiny_model_file(test::TinyShape{}));  // head_dim 16
  ASSERT_TRUE(small.ok());
  auto bad = small.value()->new_kv_pool(3, DType::Q8_0, 16);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("multiple of 32"), std::string::npos) << bad.error().message;
  EXPECT_FALSE(small.value()->new_kv_pool(3, DType::Q4_0, 16).ok());
}

TEST(Units, ParseAndFormatSizes) {
  EXPECT_EQ(parse_bytes("24GiB").value(), 24ull << 30);
  EXPECT_EQ(parse_bytes("1.5 GB").value(), 1'500'000'000ull);
  EXPECT_EQ(parse_bytes("800MiB").value(), 800ull << 20);
  EXPECT_EQ(parse_bytes("4096").value(), 4096u);
  EXPECT_FALSE(parse_bytes("lots").ok());
  EXPECT_FALSE(parse_bytes("5 parsecs").ok());
  EXPECT_EQ(format_bytes(999), "999 bytes");
  EXPECT_EQ(format_bytes(327680), "328 kB");
  EXPECT_EQ(format_bytes_binary(24.0 * (1ull << 30)), "24.0 GiB");
}

TEST(PhaseCost, CountsMatchTheShape) {
  test::TinyShape s;
  s.weight_type = DType::Q8_0;
  auto m = Model::from_gguf(test::tiny_model_file(s));
  ASSERT_TRUE(m.ok());
  const ModelConfig& c = m.value()->config();
  const ModelShape shape = ModelShape::of(c, m.value()->weights(), 2);
  // Per layer: q, k, v, o, gate, up, down; plus the output matrix.
  const double per_layer = (double)c.n_embd * (c.q_dim() + 2 * c.kv_dim() + c.q_dim()) + 3.0 * c.n_embd * c.n_ff;
  EXPECT_DOUBLE_EQ(shape.matmul_elements_per_token, c.n_layer * per_layer + (double)c.n_vocab * c.n_embd);
  EXPECT_DOUBLE_EQ(shape.matmul_bytes, shape.matmul_elements_per_token * 34 / 32);
  // Decode at position p: 2 FLOPs per weight element plus attention over p + 1 keys.
  const PhaseCost d = decode_cost(shape, 1, 9);
  EXPECT_DOUBLE_EQ(d.flops, 2 * shape.matmul_elements_per_token + 4.0 * c.n_layer * c.n_head * c.head_dim * 10);
  EXPECT_DOUBLE_EQ(d.kv_read_bytes, shape.kv_bytes_per_position * 10);
  EXPECT_DOUBLE_EQ(d.weight_bytes, shape.matmul_bytes);
  // Prefill of n tokens in one chunk reads the weights once: intensity grows ~ n.
  const PhaseCost p1 = prefill_cost(shape, 1), p32 = prefill_cost(shape, 32);
  EXPECT_DOUBLE_EQ(p32.weight_bytes, shape.matmul_bytes);
  EXPECT_GT(p32.intensity(), 20 * p1.intensity());
  EXPECT_DOUBLE_EQ(prefill_cost(shape, 40, 0, 16).weight_bytes, 3 * shape.matmul_bytes);  // chunks of 16
  // Prefill's attention sum equals decode's, token by token.
  EXPECT_NEAR(prefill_cost(shape, 5, 3).flops, decode_cost(shape, 5, 3).flops, 1e-6 * decode_cost(shape, 5, 3).flops);
  // The two halves: products (weights) and attention (K,V), each with its own FLOPs and bytes.
  EXPECT_DOUBLE_EQ(d.attn_flops, 4.0 * c.n_layer * c.n_head * c.head_dim * 10);
  EXPECT_DOUBLE_EQ(d.products().flops, 2 * shape.matmul_elements_per_token);
  EXPECT_DOUBLE_EQ(d.products().bytes(), shape.matmul_bytes);
  EXPECT_DOUBLE_EQ(d.attention().bytes(), d.kv_read_bytes + d.kv_write_bytes);
  const PhaseCost deep = prefill_cost(shape, 8, 100);  // positions 100..107: keys 101..108 per layer
  EXPECT_NEAR(deep.attn_flops, 4.0 * c.n_layer * c.n_head * c.head_dim * (101 + 108) * 8 / 2, 1e-9 * deep.attn_flops);
  EXPECT_DOUBLE_EQ(deep.products().flops + deep.attention().flops, deep.flops);
  // Naive mode: step k is a prefill of k tokens.
  EXPECT_DOUBLE_EQ(no_cache_cost(shape, 1, 3).flops,
                   prefill_cost(shape, 1).flops + prefill_cost(shape, 2).flops + prefill_cost(shape, 3).flops);
}

// Speculative decoding's verify pass: 1 + k tokens for one read of the weights.
TEST(PhaseCost, VerifyPassesMultiplyFlopsForTheSameWeightBytes) {
  test::TinyShape s;
  s.weight_type = DType::Q8_0;
  auto m = Model::from_gguf(test::tiny_model_file(s));
  ASSERT_TRUE(m.ok());
  const ModelShape shape = ModelShape::of(m.value()->config(), m.value()->weights(), 2);
  const PhaseCost d = decode_cost(shape, 3, 9), v0 = verify_cost(shape, 3, 0, 9);
  EXPECT_NEAR(v0.flops, d.flops, 1e-9 * d.flops);  // k = 0 is decode
  EXPECT_DOUBLE_EQ(v0.bytes(), d.bytes());
  const PhaseCost v4 = verify_cost(shape, 1, 4, 9), d1 = decode_cost(shape, 1, 9);
  EXPECT_DOUBLE_EQ(v4.weight_bytes, d1.weight_bytes);
  EXPECT_NEAR(v4.flops, decode_cost(shape, 5, 9).flops, 1e-9 * v4.flops);  // the 5 tokens' FLOPs
  EXPECT_GT(v4.intensity(), 4 * d1.intensity());
  // Steps advance by the tokens kept: two passes that kept 3 each start at 9 and 12.
  EXPECT_NEAR(verify_cost(shape, 2, 2, 9, 3.0).flops, decode_cost(shape, 3, 9).flops + decode_cost(shape, 3, 12).flops,
              1e-9 * v4.flops);
}

TEST(Probes, ReturnPlausiblePeaks) {
  for (cpu::Isa isa : cpu::supported_isas()) {
    const double f = cpu::measure_peak_flops(isa, 1, 0.02);
    EXPECT_GT(f, 1e8) << cpu::isa_name(isa);   // any CPU of this century
    EXPECT_LT(f, 1e13) << cpu::isa_name(isa);  // one core
  }
  const double bw = cpu::measure_read_bandwidth(1, size_t(16) << 20, 2).best;
  EXPECT_GT(bw, 1e8);
  EXPECT_LT(bw, 1e13);
  // A kept probe reads its whole buffer on every pass (what bench runs between decode reps).
  cpu::ReadProbe probe(2, size_t(8) << 20);
  EXPECT_EQ(probe.bytes(), size_t(8) << 20);
  for (int pass = 0; pass < 2; pass++) {
    const double r = probe.pass();
    EXPECT_GT(r, 1e8);
    EXPECT_LT(r, 1e13);
  }
}

TEST(Probes, MedianRateSkipsFailedPasses) {
  EXPECT_EQ(cpu::median_rate({3e9, 0.0, 1e9, 2e9}), 2e9);  // a pass too short to time reads 0
  EXPECT_EQ(cpu::median_rate({5e9, 4e9}), 5e9);            // even counts take the upper middle
  EXPECT_EQ(cpu::median_rate({}), 0.0);
  // The read roof is the best pass; the median and the least say how far the passes spread.
  const cpu::ReadRates r = cpu::summarize_rates({3e9, 0.0, 1e9, 2e9, 7e9});
  EXPECT_EQ(r.best, 7e9);
  EXPECT_EQ(r.median, 3e9);
  EXPECT_EQ(r.least, 1e9);
}

// Each phase's % of peak is of the roof of the instructions it runs: 8-bit dot products for
// 8-bit activations against quantized weights (VPDPBUSD does 64 multiply-adds an instruction
// where a 512-bit FMA does 16, so its roof is several times the f32 one), f32 FMA otherwise.
TEST(Probe, Int8RoofIsTheRoofOfQuantizedProducts) {
  const cpu::Isa isa = cpu::best_isa();
  const double f32 = cpu::measure_peak_flops(isa, 1, 0.05), int8 = cpu::measure_peak_int8_ops(isa, 1, 0.05);
  EXPECT_GT(f32, 1e8);
  EXPECT_GT(int8, 1e8);
  if (cpu::has_avx2(isa)) {
    EXPECT_GT(int8, f32) << cpu::isa_name(isa);
  }
  cpu::MachinePeaks m;
  m.flops_per_s = f32, m.int8_ops_per_s = int8, m.read_bytes_per_s = 1e10;
  EXPECT_EQ(m.compute_roof(true), int8);
  EXPECT_EQ(m.compute_roof(false), f32);
  EXPECT_DOUBLE_EQ(m.ridge(true), int8 / 1e10);
  m.int8_ops_per_s = 0;  // not probed: the float roof
  EXPECT_EQ(m.compute_roof(true), f32);
  // Which roof a model's products meet: Q8_0 weights with 8-bit activations run int8 dots;
  // F16 weights, or exact activations, run f32 FMA.
  auto model = [](DType wt, bool q8) {
    test::TinyShape s;
    s.weight_type = wt;
    ModelOptions o;
    o.backend = std::make_shared<CpuBackend>(CpuBackendOptions{cpu::best_isa(), 1, q8});
    return std::move(Model::from_gguf(test::tiny_model_file(s), o).value());
  };
  EXPECT_TRUE(apps::runs_int8_products(*model(DType::Q8_0, true)));
  EXPECT_FALSE(apps::runs_int8_products(*model(DType::Q8_0, false)));
  EXPECT_FALSE(apps::runs_int8_products(*model(DType::F16, true)));
}

// bench's sdN: plain and speculative runs alternate, reps of each, counting the drafts.
TEST(BenchRuns, SpeculativeRunsAlternateAndCountDrafts) {
  test::TinyShape s;
  s.n_ctx = 256;
  auto m = Model::from_gguf(test::tiny_model_file(s));
  auto d = Model::from_gguf(test::tiny_model_file(s));  // its twin drafts: every draft accepted
  ASSERT_TRUE(m.ok() && d.ok());
  SpeculativeParams spec;
  spec.mode = SpeculativeMode::Draft;
  spec.draft_p_min = 0;
  auto r = apps::time_speculative(*m.value(), d.value().get(), {5, 6, 7, 8, 5, 6, 7}, 24, 2, spec, DType::F16);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->plain_tok_s.size(), 2u);
  EXPECT_EQ(r->spec_tok_s.size(), 2u);
  for (double t : r->plain_tok_s) EXPECT_GT(t, 0);
  for (double t : r->spec_tok_s) EXPECT_GT(t, 0);
  EXPECT_GT(r->drafted, 20);
  EXPECT_EQ(r->accepted, r->drafted);
  spec.mode = SpeculativeMode::Lookup;
  r = apps::time_speculative(*m.value(), nullptr, {5, 6, 7, 8, 5, 6, 7}, 24, 1, spec, DType::F16);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(apps::default_spec_prompt().empty());
  spec.mode = SpeculativeMode::Draft;  // without a draft model: an error, not a crash
  EXPECT_FALSE(apps::time_speculative(*m.value(), nullptr, {5, 6}, 4, 1, spec, DType::F16).ok());
}

TEST(BenchRuns, FittedExponent) {
  EXPECT_NEAR(apps::fitted_exponent({1, 2, 4, 8}, {3, 12, 48, 192}), 2.0, 1e-12);
  EXPECT_NEAR(apps::fitted_exponent({10, 100, 1000}, {5, 50, 500}), 1.0, 1e-12);
  EXPECT_TRUE(std::isnan(apps::fitted_exponent({1}, {1})));
}

TEST(SvgChart, DrawsSeriesAxesAndLegend) {
  apps::Chart c{"T <&> title", "sub", "x", "y", true, true, {}};
  c.series.push_back({"measured", {{64, 10}, {128, 20}, {256, 41}, {-1, 5}}, "#ff0000"});
  c.series.push_back({"floor", {{64, 1}, {4096, 2}}, "#00ff00", true, false, true});
  c.labels.push_back({128, 20, "here"});
  const std::string svg = apps::render_svg(c);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("T &lt;&amp;&gt; title"), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);
  EXPECT_NE(svg.find(">measured<"), std::string::npos);
  EXPECT_NE(svg.find(">here<"), std::string::npos);
  EXPECT_NE(svg.find(">1000<"), std::string::npos);  // a log-axis tick
  size_t circles = 0;
  for (size_t at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1)) circles++;
  EXPECT_EQ(circles, 3u);  // the x = -1 point cannot sit on a log axis
  apps::Chart empty{"nothing", "", "x", "y"};
  EXPECT_NE(apps::render_svg(empty).find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace tandem
