#include "apps/bench_sweep.h"
#include "apps/generation_options.h"

#include <filesystem>

#include <fmt/core.h>

#include "apps/bench_runs.h"
#include "apps/svg_chart.h"

namespace tandem::apps {

namespace {

const char* kBlue = "#1f77b4";
const char* kOrange = "#ff7f0e";
const char* kGreen = "#2ca02c";
const char* kRed = "#d62728";
const char* kGray = "#7f7f7f";

// What every section of the sweep reads: the model, the options, the machine's roofs and the
// model's shape for the cost counts.
struct SweepInputs {
  Model& m;
  const SweepOptions& o;
  const cpu::MachinePeaks& peaks;
  const ModelShape& shape;
  const std::string& model;
};

// 1. TTFT over prompt length and TPOT over context length; the points measured go on to the roofline.
Status sweep_latency(const SweepInputs& in, const PhaseMeasure& pp, std::vector<PhaseMeasure>* sweep_prefill,
                     std::vector<PhaseMeasure>* sweep_decode) {
  const SweepOptions& o = in.o;
  std::vector<int64_t> lengths;
  for (int64_t l = 64; l <= std::min<int64_t>(o.max_context, in.m.config().n_ctx_train); l *= 2) lengths.push_back(l);
  fmt::print(stderr, "sweep: prefill and decode at {} context lengths...\n", lengths.size());
  auto ctx = sweep_context(in.m, lengths, 8, o.kv_dtype);
  if (!ctx.ok()) return ctx.error();
  Series ttft{"TTFT (measured)", {}, kBlue}, ttft_lin{"linear at the pp speed", {}, kGray, true, false, true};
  Series tpot{"TPOT (measured)", {}, kOrange}, tpot_bw{"bandwidth floor", {}, kGray, true, false, true};
  fmt::print("{:>8} {:>10} {:>10} {:>12}\n", "context", "TTFT ms", "TPOT ms", "decode GB/s");
  for (const ContextPoint& p : ctx.value()) {
    ttft.points.emplace_back((double)p.context, p.ttft_s * 1e3);
    ttft_lin.points.emplace_back((double)p.context, p.context / pp.tok_s() * 1e3);
    tpot.points.emplace_back((double)p.context, p.tpot_s * 1e3);
    const PhaseCost dc = decode_cost(in.shape, 1, p.context);
    tpot_bw.points.emplace_back((double)p.context, dc.bytes() / in.peaks.read_bytes_per_s * 1e3);
    sweep_prefill->push_back({"prefill", p.context, p.ttft_s, prefill_cost(in.shape, p.context)});
    sweep_decode->push_back({"decode", 1, p.tpot_s, dc});
    fmt::print("{:>8} {:>10.2f} {:>10.3f} {:>12.2f}\n", p.context, p.ttft_s * 1e3, p.tpot_s * 1e3, dc.bytes() / p.tpot_s / 1e9);
  }
  Chart ttft_chart{"Time to first token vs prompt length", in.model + ": prefill is batched; its cost grows with the prompt",
                   "prompt tokens", "TTFT (ms)", true, true, {ttft, ttft_lin}};
  TANDEM_TRY(write_svg(ttft_chart, o.dir + "/ttft_vs_prompt.svg"));
  Chart tpot_chart{"Time per output token vs context length",
                   in.model + ": each step reads all weights + the whole KV cache; dashed: that many bytes at the probe's GB/s",
                   "context tokens", "TPOT (ms)", true, false, {tpot, tpot_bw}};
  tpot_chart.y_min = 0;
  return write_svg(tpot_chart, o.dir + "/tpot_vs_context.svg");
}

// 2. Generating n tokens with and without the KV cache: measured times and counted FLOPs, each
// with its fitted exponent.
Status sweep_cache_chart(const SweepInputs& in) {
  std::vector<int64_t> ns;
  for (int64_t n = 8; n <= in.o.max_naive; n *= 2) ns.push_back(n);
  fmt::print(stderr, "sweep: generation with and without the KV cache...\n");
  auto gen = sweep_cache_vs_naive(in.m, ns, in.o.kv_dtype);
  if (!gen.ok()) return gen.error();
  Series cached{"with KV cache", {}, kGreen}, naive{"no cache (naive)", {}, kRed};
  std::vector<double> xs, t_cached, t_naive, f_cached, f_naive;
  fmt::print("{:>6} {:>12} {:>12} {:>8}\n", "n", "cached s", "no-cache s", "ratio");
  for (const GenerationPoint& p : gen.value()) {
    cached.points.emplace_back((double)p.n, p.cached_s);
    naive.points.emplace_back((double)p.n, p.no_cache_s);
    xs.push_back((double)p.n);
    t_cached.push_back(p.cached_s);
    t_naive.push_back(p.no_cache_s);
    PhaseCost cc = prefill_cost(in.shape, 1);
    cc += decode_cost(in.shape, p.n - 1, 1);
    f_cached.push_back(cc.flops);
    f_naive.push_back(no_cache_cost(in.shape, 1, p.n).flops);
    fmt::print("{:>6} {:>12.3f} {:>12.3f} {:>7.1f}x\n", p.n, p.cached_s, p.no_cache_s, p.no_cache_s / p.cached_s);
  }
  const double e_cached = fitted_exponent(xs, t_cached), e_naive = fitted_exponent(xs, t_naive);
  const double w_cached = fitted_exponent(xs, f_cached), w_naive = fitted_exponent(xs, f_naive);
  fmt::print("fitted exponents (time ~ n^k): cached {:.2f}, no cache {:.2f}; counted FLOPs: cached {:.2f}, no cache {:.2f}\n",
             e_cached, e_naive, w_cached, w_naive);
  cached.name = fmt::format("KV cache: t ~ n^{:.2f}", e_cached);
  naive.name = fmt::format("no cache: t ~ n^{:.2f}", e_naive);
  Chart cache_chart{"Generating n tokens: KV cache vs recomputing",
                    fmt::format("{}; FLOPs counted: n^{:.2f} vs n^{:.2f} (attention alone: n^2 vs n^3 as n grows)", in.model,
                                w_cached, w_naive),
                    "tokens generated", "total time (s)", true, true, {cached, naive}};
  return write_svg(cache_chart, in.o.dir + "/kv_cache_vs_naive.svg");
}

// 3. Roofline: both roofs, and where each phase ran (the sweep's points and the pp/tg runs, labelled).
Status write_roofline(const SweepInputs& in, const PhaseMeasure& pp, const PhaseMeasure& tg,
                      const std::vector<PhaseMeasure>& sweep_prefill, const std::vector<PhaseMeasure>& sweep_decode) {
  const cpu::MachinePeaks& peaks = in.peaks;
  Series roof{"roof: min(peak, GB/s x I)", {}, "#333"};
  for (int k = 0; k <= 60; k++) {
    const double i = std::pow(10.0, -1.0 + k * 5.0 / 60);
    roof.points.emplace_back(i, std::min(peaks.compute_roof(pp.int8), peaks.read_bytes_per_s * i) / 1e9);
  }
  roof.markers = false;
  Series pre_pts{"prefill (sweep)", {}, kBlue, false}, dec_pts{"decode (sweep)", {}, kOrange, false};
  for (const auto& p : sweep_prefill) pre_pts.points.emplace_back(p.cost.intensity(), p.flops_per_s() / 1e9);
  for (const auto& p : sweep_decode) dec_pts.points.emplace_back(p.cost.intensity(), p.flops_per_s() / 1e9);
  pre_pts.points.emplace_back(pp.cost.intensity(), pp.flops_per_s() / 1e9);
  dec_pts.points.emplace_back(tg.cost.intensity(), tg.flops_per_s() / 1e9);
  Chart rl{"Roofline: where prefill and decode run",
           fmt::format("{}; {:.0f} GFLOP/s {} peak, {:.1f} GB/s read bandwidth, ridge {:.1f} FLOP/byte", in.model,
                       peaks.compute_roof(pp.int8) / 1e9, pp.roof_name(), peaks.read_bytes_per_s / 1e9, peaks.ridge(pp.int8)),
           "arithmetic intensity (FLOP/byte)", "GFLOP/s", true, true, {roof, pre_pts, dec_pts}};
  rl.labels.push_back({pp.cost.intensity(), pp.flops_per_s() / 1e9, pp.name, kBlue});
  rl.labels.push_back({tg.cost.intensity(), tg.flops_per_s() / 1e9, tg.name, kOrange});
  rl.x_min = 0.1;
  rl.x_max = 10000;
  return write_svg(rl, in.o.dir + "/roofline.svg");
}

}  // namespace

Status run_sweep(Model& m, const SweepOptions& o, const cpu::MachinePeaks& peaks, const PhaseMeasure& pp,
                 const PhaseMeasure& tg) {
  std::error_code ec;
  std::filesystem::create_directories(o.dir, ec);
  if (ec) return make_error("cannot create {}: {}", o.dir, ec.message());
  const ModelConfig& c = m.config();
  const std::string model = c.name.empty() ? c.arch : c.name;
  const double kv_elem = kv_element_bytes(o.kv_dtype);
  const ModelShape shape = ModelShape::of(c, m.weights(), kv_elem);
  const SweepInputs in{m, o, peaks, shape, model};

  std::vector<PhaseMeasure> sweep_prefill, sweep_decode;
  TANDEM_TRY(sweep_latency(in, pp, &sweep_prefill, &sweep_decode));
  TANDEM_TRY(sweep_cache_chart(in));
  TANDEM_TRY(write_roofline(in, pp, tg, sweep_prefill, sweep_decode));
  fmt::print(stderr, "sweep: wrote {}/ttft_vs_prompt.svg, tpot_vs_context.svg, kv_cache_vs_naive.svg, roofline.svg\n", o.dir);
  return Status::Ok();
}

}  // namespace tandem::apps
