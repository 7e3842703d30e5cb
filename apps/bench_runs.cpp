#include "apps/bench_runs.h"

#include <cmath>

#include "core/timer.h"
#include "engine/generator.h"
#include "engine/sequence_runner.h"

namespace tandem::apps {

std::vector<int32_t> bench_tokens(int64_t n, int n_vocab, uint64_t salt) {
  std::vector<int32_t> t((size_t)n);
  uint64_t x = 0x9E3779B97F4A7C15ull ^ salt;
  for (auto& id : t) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    id = (int32_t)(x % (uint64_t)n_vocab);
  }
  return t;
}

namespace {

// A KV pool for `tokens` positions, in 16-token blocks as every command's.
Result<std::unique_ptr<BlockPool>> pool_for(Model& m, int64_t tokens, DType kv_dtype) {
  return m.new_kv_pool(std::max<int64_t>(1, (tokens + 15) / 16), kv_dtype);
}

// Prefills `depth` tokens (their own id sequence, so the timed tokens are the same at every
// depth) into the runner, untimed.
Status fill_to_depth(Model& m, SequenceRunner& seq, int64_t depth) {
  if (depth <= 0) return Status::Ok();
  const auto context = bench_tokens(depth, m.config().n_vocab, 2);
  auto r = seq.run(context);
  if (!r.ok()) return r.error();
  return Status::Ok();
}

// Times what runs between its making and done(), and the backend's attention share of it.
class RunClock {
 public:
  explicit RunClock(const Backend& be) : be_(be), attention0_(be.attention_seconds()) {}
  TimedRun done() const {
    const double a = be_.attention_seconds();
    return {t_.seconds(), a >= 0 && attention0_ >= 0 ? a - attention0_ : -1};
  }

 private:
  const Backend& be_;
  double attention0_;
  Timer t_;
};

}  // namespace

Result<TimedRun> time_prefill(Model& m, int64_t n, DType kv_dtype, int64_t depth) {
  auto pool = pool_for(m, depth + n, kv_dtype);
  if (!pool.ok()) return pool.error();
  SequenceRunner seq(m, *pool.value());
  TANDEM_TRY(fill_to_depth(m, seq, depth));
  const auto tokens = bench_tokens(n, m.config().n_vocab);
  const RunClock clock(m.backend());
  auto r = seq.run(tokens);
  if (!r.ok()) return r.error();
  return clock.done();
}

Result<TimedRun> time_decode(Model& m, int64_t n, DType kv_dtype, int64_t depth) {
  auto pool = pool_for(m, depth + n, kv_dtype);
  if (!pool.ok()) return pool.error();
  SequenceRunner seq(m, *pool.value());
  TANDEM_TRY(fill_to_depth(m, seq, depth));
  const auto tokens = bench_tokens(n, m.config().n_vocab, 1);
  const RunClock clock(m.backend());
  for (int64_t i = 0; i < n; i++) {
    auto r = seq.run(std::span<const int32_t>(&tokens[(size_t)i], 1));
    if (!r.ok()) return r.error();
  }
  return clock.done();
}

Result<SpecResult> time_speculative(Model& m, Model* draft, const std::vector<int32_t>& prompt, int64_t n, int reps,
                                    const SpeculativeParams& spec, DType kv_dtype) {
  GenerationConfig cfg;
  cfg.max_new_tokens = (int)n;
  cfg.kv_dtype = kv_dtype;
  cfg.stop_at_eog = false;
  cfg.sampling.temperature = 0;
  cfg.draft_model = draft;
  Generator gen(m);
  SpecResult r;
  for (int i = 0; i < reps; i++)
    for (bool speculative : {false, true}) {
      cfg.speculative = speculative ? spec : SpeculativeParams{};
      auto st = gen.generate(prompt, cfg, [](int32_t) { return true; });
      if (!st.ok()) return st.error();
      (speculative ? r.spec_tok_s : r.plain_tok_s).push_back(st->decode_tok_s());
      if (speculative) r.drafted += st->n_drafted, r.accepted += st->n_accepted;
    }
  return r;
}

std::string default_spec_prompt() {
  const std::string para =
      "The history of the bicycle begins in the early nineteenth century, when inventors in Europe experimented with "
      "two-wheeled machines pushed along by the rider's feet. Later designs added pedals, chains and pneumatic tyres, "
      "and within a few decades cycling had become a popular pastime and an affordable way to travel to work.";
  return "Here is a paragraph:\n\n" + para + "\n\nRepeat the paragraph word for word, replacing 'Europe' with 'France'.\n\n";
}

Result<std::vector<ContextPoint>> sweep_context(Model& m, const std::vector<int64_t>& lengths, int decode_steps,
                                                DType kv_dtype) {
  std::vector<ContextPoint> out;
  for (int64_t len : lengths) {
    auto pool = pool_for(m, len + decode_steps, kv_dtype);
    if (!pool.ok()) return pool.error();
    SequenceRunner seq(m, *pool.value());
    const auto tokens = bench_tokens(len + decode_steps, m.config().n_vocab, (uint64_t)len);
    ContextPoint p{len, 0, 0};
    Timer t;
    auto r = seq.run(std::span<const int32_t>(tokens.data(), (size_t)len));
    if (!r.ok()) return r.error();
    p.ttft_s = t.seconds();
    t.reset();
    for (int k = 0; k < decode_steps; k++) {
      auto d = seq.run(std::span<const int32_t>(&tokens[(size_t)(len + k)], 1));
      if (!d.ok()) return d.error();
    }
    p.tpot_s = decode_steps ? t.seconds() / decode_steps : 0;
    out.push_back(p);
  }
  return out;
}

Result<std::vector<GenerationPoint>> sweep_cache_vs_naive(Model& m, const std::vector<int64_t>& ns, DType kv_dtype) {
  std::vector<GenerationPoint> out;
  for (int64_t n : ns) {
    const auto tokens = bench_tokens(n, m.config().n_vocab, 99);
    GenerationPoint p{n, 0, 0};
    auto pool = pool_for(m, n, kv_dtype);
    if (!pool.ok()) return pool.error();
    {
      SequenceRunner seq(m, *pool.value());
      Timer t;
      auto r = seq.run(std::span<const int32_t>(tokens.data(), 1));
      if (!r.ok()) return r.error();
      for (int64_t k = 1; k < n; k++) {
        auto d = seq.run(std::span<const int32_t>(&tokens[(size_t)k], 1));
        if (!d.ok()) return d.error();
      }
      p.cached_s = t.seconds();
    }
    SequenceRunner naive(m, *pool.value());
    Timer t;
    for (int64_t k = 1; k <= n; k++) {  // step k sees the first k tokens and recomputes them all
      naive.clear();
      auto f = naive.run(std::span<const int32_t>(tokens.data(), (size_t)k));
      if (!f.ok()) return f.error();
    }
    p.no_cache_s = t.seconds();
    out.push_back(p);
  }
  return out;
}

double fitted_exponent(const std::vector<double>& x, const std::vector<double>& y) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  int n = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); i++) {
    if (x[i] <= 0 || y[i] <= 0) continue;
    const double lx = std::log(x[i]), ly = std::log(y[i]);
    sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly, n++;
  }
  const double den = n * sxx - sx * sx;
  return n >= 2 && den != 0 ? (n * sxy - sx * sy) / den : NAN;
}

}  // namespace tandem::apps
