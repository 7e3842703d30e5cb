// `tandem bench`: prompt processing (ppN: one prefill of N tokens) and text generation (tgN:
// N decode steps from an empty cache) in tok/s, as llama-bench reports them, plus each phase's
// GFLOP/s, GB/s and share of this machine's measured roofs; --sweep writes the SVG plots.
#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "apps/bench_runs.h"
#include "apps/bench_sweep.h"
#include "apps/commands.h"
#include "apps/common.h"
#include "apps/generation_options.h"
#include "apps/phase_report.h"
#include "core/units.h"
#include "model/param_count.h"

namespace tandem::apps {

namespace {

struct Stat {
  double mean = 0, sd = 0;
};

Stat stat_of(const std::vector<double>& v) {
  Stat s;
  for (double x : v) s.mean += x;
  s.mean /= std::max<size_t>(1, v.size());
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / (v.size() - 1)) : 0;
  return s;
}

struct BenchArgs {
  ModelLoadOptions load;
  std::string kv_dtype = "f16", sweep;
  int64_t p = 512, n = 128, depth = 0, max_context = 4096, max_naive = 128;
  int reps = 3;
  bool json = false;
  SpeculativeOptions speculative;
  std::string spec_prompt;
};

void add_bench_options(CLI::App* sub, BenchArgs& a) {
  a.load.add_to(sub);
  sub->add_option("-p,--n-prompt", a.p, "prompt tokens for the pp test (0 = skip)")->check(CLI::Range(0, 1 << 20));
  sub->add_option("-n,--n-gen", a.n, "generated tokens for the tg test (0 = skip)")->check(CLI::Range(0, 1 << 20));
  sub->add_option("-d,--n-depth", a.depth, "context tokens already in the cache before each test (untimed prefill)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("-r,--repetitions", a.reps, "repetitions of each test")->check(CLI::Range(1, 1000));
  add_kv_dtype_option(sub, a.kv_dtype);
  sub->add_flag("--json", a.json, "print one JSON object");
  sub->add_option("--sweep", a.sweep, "also sweep context lengths and cache/no-cache, writing SVG plots into this folder");
  sub->add_option("--sweep-max-context", a.max_context, "longest prompt of the sweep")->check(CLI::Range(64, 1 << 20));
  a.speculative.add_to(sub);
  sub->add_option("--spec-prompt", a.spec_prompt,
                  "with --speculative: the prompt of the sdN test (default: a paragraph to repeat with one change)");
  sub->add_option("--sweep-max-naive", a.max_naive, "most tokens generated without cache in the sweep")->check(CLI::Range(8, 4096));
}

struct Test {
  std::string name;
  std::vector<double> tok_s;
  PhaseMeasure best;  // the mean run's cost and time
  cpu::MachinePeaks peaks;  // the roofs its % columns compare with
  CollectiveStats comm;     // tensor parallel: what its runs moved between the ranks
  int64_t tokens = 0;       // over all its runs
};

// What every test of a run shares: the model, its costs, and the roofs measured at start.
struct Bench {
  const BenchArgs& a;
  Model& model;
  const ModelConfig& c;
  DType kv;
  ModelShape shape;
  cpu::MachinePeaks peaks;
  const CpuBackend* cpu_be;  // null on a GPU
  bool int8;
  Collectives* ranks;  // null: one process

  // Named as llama-bench names them: "tg128", or "tg128 @ d4096" after a context.
  std::string test_name(const char* kind, int64_t n) const {
    return a.depth > 0 ? fmt::format("{}{} @ d{}", kind, n, a.depth) : fmt::format("{}{}", kind, n);
  }
  void begin_comm() const {
    if (ranks) ranks->reset_stats();
  }
  void end_comm(Test& t, int64_t tokens) const {
    if (ranks) t.comm = ranks->stats(), t.tokens = tokens;
  }
};

void add_run(TimedRun& total, const TimedRun& r) {
  total.seconds += r.seconds;
  total.attention_s = r.attention_s < 0 ? -1 : std::max(total.attention_s, 0.0) + r.attention_s;
}
double mean_attention(const TimedRun& total, int reps) { return total.attention_s < 0 ? -1 : total.attention_s / reps; }

Result<Test> run_pp(const Bench& b) {
  const BenchArgs& a = b.a;
  Test t{b.test_name("pp", a.p), {}, {}, b.peaks, {}};
  TimedRun total;
  b.begin_comm();
  for (int r = 0; r < a.reps; r++) {
    auto s = time_prefill(b.model, a.p, b.kv, a.depth);
    if (!s.ok()) return s.error();
    t.tok_s.push_back(a.p / s->seconds);
    add_run(total, s.value());
  }
  t.best = {t.name, a.p, total.seconds / a.reps, prefill_cost(b.shape, a.p, a.depth), b.int8, mean_attention(total, a.reps)};
  b.end_comm(t, (int64_t)a.p * a.reps);
  return t;
}

Result<Test> run_tg(const Bench& b) {
  const BenchArgs& a = b.a;
  Test t{b.test_name("tg", a.n), {}, {}, b.peaks, {}};
  // Decode's roof is probed beside its runs (short passes before each, after the last): the
  // host's bandwidth drifts too much between minutes for the probe at start to stand for
  // them. The probe reads decode's working set, each thread its own range in several streams.
  std::unique_ptr<cpu::ReadProbe> probe;
  if (b.cpu_be) probe = std::make_unique<cpu::ReadProbe>(b.cpu_be->threads(), cpu::probe_bytes_for(b.shape.matmul_bytes));
  std::vector<double> read_rates;
  TimedRun total;
  b.begin_comm();
  for (int r = 0; r < a.reps; r++) {
    if (probe) probe->best(5, &read_rates);
    auto s = time_decode(b.model, a.n, b.kv, a.depth);
    if (!s.ok()) return s.error();
    t.tok_s.push_back(a.n / s->seconds);
    add_run(total, s.value());
  }
  if (probe) {
    probe->best(5, &read_rates);
    const cpu::ReadRates rr = cpu::summarize_rates(read_rates);
    t.peaks.read_bytes_per_s = rr.best, t.peaks.read_median = rr.median, t.peaks.read_min = rr.least;
  }
  b.end_comm(t, (int64_t)a.n * a.reps);
  t.best = {t.name, a.n, total.seconds / a.reps, decode_cost(b.shape, a.n, a.depth), b.int8, mean_attention(total, a.reps)};
  // The fastest repetition read this many bytes/s: if the probes read less, they are not
  // the roof (decode cannot beat the memory), so the roof becomes that rate.
  if (!t.tok_s.empty())
    t.peaks.raise_read_roof(t.best.cost.bytes() / a.n * *std::max_element(t.tok_s.begin(), t.tok_s.end()));
  return t;
}

// sdN: N greedy tokens decoded after a real prompt, plain and speculative alternately (tg's
// forced tokens give a draft nothing to agree with); the speed-up is of decode tok/s.
Result<std::optional<SpecResult>> run_sd(const Bench& b, const Tokenizer& tok) {
  const BenchArgs& a = b.a;
  if (!a.speculative.enabled() || a.n <= 0) return std::optional<SpecResult>{};
  auto draft = a.speculative.load_draft(a.load, b.model);
  if (!draft.ok()) return draft.error();
  const std::string text = a.spec_prompt.empty() ? default_spec_prompt() : a.spec_prompt;
  auto r = time_speculative(b.model, draft.value().get(), tok.encode(text, true, true), a.n, a.reps,
                            a.speculative.params(), b.kv);
  if (!r.ok()) return r.error();
  return std::optional<SpecResult>{r.value()};
}

// The file's size and parameter count, and the name the rows give the model.
// (A mixture of experts': also those a token runs.)
struct ModelFacts {
  uint64_t file_bytes = 0, params = 0;
  double active_params = 0;
  std::string name;
  std::string params_cell() const {
    return active_params < (double)params ? fmt::format("{:.2f} M ({:.2f} M active)", params / 1e6, active_params / 1e6)
                                          : fmt::format("{:.2f} M", params / 1e6);
  }
};

ModelFacts model_facts(const Model& model) {
  ModelFacts f;
  f.file_bytes = model.gguf().tensor_bytes();
  const ParamCount p = count_params(model.gguf());
  f.params = p.total;
  f.active_params = p.active(model.config().spec.moe);
  f.name = model.config().name.empty() ? model.config().arch : model.config().name;
  return f;
}

nlohmann::ordered_json test_json(const Bench& b, const Test& t) {
  const Stat s = stat_of(t.tok_s);
  nlohmann::ordered_json e = phase_json(t.best, t.peaks);
  e["probe_read_gb_s"] = t.peaks.read_bytes_per_s / 1e9;
  e["probe_read_gb_s_median"] = t.peaks.read_median / 1e9;
  e["probe_read_gb_s_least"] = t.peaks.read_min / 1e9;
  e["read_roof_raised_from_gb_s"] = t.peaks.raised_from / 1e9;
  e["tok_s"] = s.mean;
  e["tok_s_stddev"] = s.sd;
  if (b.ranks && t.tokens > 0)
    e["tensor_parallel"] = {{"ranks", b.ranks->size()},
                            {"collectives_per_token", (double)t.comm.calls / t.tokens},
                            {"bytes_per_token", (double)t.comm.bytes / t.tokens},
                            {"gathered_bytes_per_layer_per_token", communication_cost(b.c, b.model.shard(), 1, 0).per_layer_bytes},
                            {"collective_ms_per_token", 1e3 * t.comm.seconds / t.tokens},
                            {"collective_share", t.best.seconds > 0 ? t.comm.seconds / (t.best.seconds * b.a.reps) : 0.0}};
  return e;
}

nlohmann::ordered_json spec_json(const BenchArgs& a, const SpecResult& spec) {
  const Stat p = stat_of(spec.plain_tok_s), s = stat_of(spec.spec_tok_s);
  return {{"mode", speculative_mode_name(a.speculative.params().mode)},
          {"draft_max", a.speculative.draft_max},
          {"plain_tok_s", p.mean},
          {"plain_tok_s_stddev", p.sd},
          {"tok_s", s.mean},
          {"tok_s_stddev", s.sd},
          {"speedup", p.mean > 0 ? s.mean / p.mean : 0.0},
          {"drafted", spec.drafted},
          {"accepted", spec.accepted},
          {"acceptance_rate", spec.drafted ? (double)spec.accepted / spec.drafted : 0.0}};
}

void print_bench_json(const Bench& b, const std::vector<Test>& tests, const std::optional<SpecResult>& spec) {
  const ModelFacts m = model_facts(b.model);
  nlohmann::ordered_json j = {{"model", m.name},
                              {"size_bytes", m.file_bytes},
                              {"params", m.params},
                              {"active_params", m.active_params},
                              {"backend", b.model.backend().describe()},
                              {"threads", b.cpu_be ? b.cpu_be->threads() : 0},
                              {"isa", b.cpu_be ? std::string(cpu::isa_name(b.cpu_be->isa())) : std::string("cuda")},
                              {"activations", b.a.load.activations},
                              {"repetitions", b.a.reps},
                              {"depth", b.a.depth}};
  for (const Test& t : tests) j[t.name] = test_json(b, t);
  if (spec) j[fmt::format("sd{}", b.a.n)] = spec_json(b.a, *spec);
  j["machine"] = machine_json(b.peaks);
  fmt::print("{}\n", j.dump(2));
}

// The llama-bench table: a row per test, then the sdN row under its own header.
void print_bench_rows(const Bench& b, const std::vector<Test>& tests, const std::optional<SpecResult>& spec) {
  const ModelFacts m = model_facts(b.model);
  fmt::print("| model | size | params | backend | test | t/s | GFLOP/s | GB/s | % peak | peak of | % BW |\n");
  fmt::print("| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | --- | ---: |\n");
  for (const Test& t : tests) {
    const Stat s = stat_of(t.tok_s);
    fmt::print("| {} | {} | {} | {} | {} | {:.2f} ± {:.2f} | {:.1f} | {:.2f} | {:.1f}% | {} | {:.1f}% |\n", m.name,
               format_bytes_binary((double)m.file_bytes), m.params_cell(), b.model.backend().describe(), t.name, s.mean, s.sd,
               t.best.flops_per_s() / 1e9, t.best.bytes_per_s() / 1e9,
               100 * t.best.flops_per_s() / t.best.compute_roof(t.peaks), t.best.roof_name(),
               100 * t.best.bytes_per_s() / t.peaks.read_bytes_per_s);
  }
  if (spec) {
    const BenchArgs& a = b.a;
    const Stat p = stat_of(spec->plain_tok_s), s = stat_of(spec->spec_tok_s);
    fmt::print("\n| model | test | plain t/s | {} t/s | speed-up | accepted |\n| --- | --- | ---: | ---: | ---: | ---: |\n",
               speculative_mode_name(a.speculative.params().mode));
    fmt::print("| {} | sd{} (draft-max {}) | {:.2f} ± {:.2f} | {:.2f} ± {:.2f} | {:.2f}x | {} of {} ({:.1f}%) |\n", m.name, a.n,
               a.speculative.draft_max, p.mean, p.sd, s.mean, s.sd, p.mean > 0 ? s.mean / p.mean : 0.0, spec->accepted,
               spec->drafted, spec->drafted ? 100.0 * spec->accepted / spec->drafted : 0.0);
  }
}

// Under the table: the ranks' traffic per test, the machine's roofs, and decode's read roof.
void print_bench_notes(const Bench& b, const std::vector<Test>& tests) {
  if (b.ranks) {
    fmt::print("\ntensor parallel over {} ({}): each layer gathers {} per token into rank 0 (the attention output and\n"
               "gated activation before attn_output and ffn_down, their outputs after)\n",
               b.ranks->size(), b.ranks->describe(), format_bytes(communication_cost(b.c, b.model.shard(), 1, 0).per_layer_bytes));
    for (const Test& t : tests)
      if (t.tokens > 0)
        fmt::print("{}: {:.1f} collectives, {} per token; {:.3f} ms per token in them, waits included ({:.1f}% of its time)\n",
                   t.name, (double)t.comm.calls / t.tokens, format_bytes((double)t.comm.bytes / t.tokens),
                   1e3 * t.comm.seconds / t.tokens,
                   t.best.seconds > 0 ? 100 * t.comm.seconds / (t.best.seconds * b.a.reps) : 0.0);
  }
  for (const Test& t : tests)
    if (t.best.splits()) fmt::print("\n{}", attention_lines(t.best, t.peaks));
  fmt::print("\n{}\n", machine_line(b.peaks));
  if (b.a.n > 0 && b.cpu_be) {
    const cpu::MachinePeaks& tg = tests.back().peaks;
    fmt::print("decode's % BW is of {:.1f} GB/s, the best of the probes of its working set run between its repetitions "
               "(median {:.1f}, least {:.1f}){}\n",
               tg.read_bytes_per_s / 1e9, tg.read_median / 1e9, tg.read_min / 1e9,
               tg.raised_from > 0
                   ? fmt::format("; raised from the probes' {:.1f}: its fastest repetition read faster than they did",
                                 tg.raised_from / 1e9)
                   : "");
  }
}

// The pp and tg tests asked for, in that order.
Result<std::vector<Test>> run_tests(const Bench& b) {
  std::vector<Test> tests;
  if (b.a.p > 0) {
    auto t = run_pp(b);
    if (!t.ok()) return t.error();
    tests.push_back(t.value());
  }
  if (b.a.n > 0) {
    auto t = run_tg(b);
    if (!t.ok()) return t.error();
    tests.push_back(t.value());
  }
  return tests;
}

int run_bench(const BenchArgs& a) {
  auto lm = load_model(a.load);
  if (!lm.ok()) return fail(lm.error().message);
  Model& model = *lm->model;
  const ModelConfig& c = model.config();
  const DType kv = kv_dtype_of(a.kv_dtype);
  if (a.depth + a.p > c.n_ctx_train || a.depth + a.n > c.n_ctx_train)
    return fail(fmt::format("-d + -p or -d + -n past the model's context of {} tokens", c.n_ctx_train));
  const ModelShape shape = ModelShape::of(c, model.weights(), kv_element_bytes(kv));
  auto roofs = measure_roofs(model, shape.matmul_bytes);
  if (!roofs.ok()) return fail(roofs.error().message);
  const Bench b{a, model, c, kv, shape, roofs.value(), cpu_backend(model), runs_int8_products(model), model.collectives()};
  if (auto w = time_prefill(model, std::min<int64_t>(16, c.n_ctx_train), kv); !w.ok()) return fail(w.error().message);  // warm-up
  auto tests = run_tests(b);
  if (!tests.ok()) return fail(tests.error().message);
  auto spec = run_sd(b, *lm->tokenizer);
  if (!spec.ok()) return fail(spec.error().message);
  if (a.json) {
    print_bench_json(b, tests.value(), spec.value());
  } else {
    print_bench_rows(b, tests.value(), spec.value());
    print_bench_notes(b, tests.value());
  }
  if (!a.sweep.empty()) {
    PhaseMeasure pp = tests->size() > 0 && a.p > 0 ? tests->front().best : PhaseMeasure{};
    PhaseMeasure tg = a.n > 0 ? tests->back().best : PhaseMeasure{};
    Status st = run_sweep(model, {a.sweep, a.max_context, a.max_naive, kv}, b.peaks, pp, tg);
    if (!st.ok()) return fail(st.error().message);
  }
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  return subcommand(app, "bench", "pp/tg tok/s like llama-bench, with GFLOP/s, GB/s and % of measured roofs", add_bench_options,
                    run_bench);
}

}  // namespace tandem::apps
