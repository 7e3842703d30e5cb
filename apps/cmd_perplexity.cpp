// `tandem perplexity`: perplexity of a text file under the model (llama-perplexity's method:
// windows of --ctx tokens, the second half of each scored), and with --kl-divergence, how far
// this configuration's next-token distributions are from a base one's on the same windows
// (default base: f32 activations and an f16 KV cache, the exact configuration): mean, median,
// p99 and max KL, and top-1 agreement. That is how to judge 8-bit activations, a q8_0 KV cache
// or a smaller quantization.
#include <fstream>
#include <iterator>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/common.h"
#include "apps/generation_options.h"
#include "core/timer.h"
#include "engine/perplexity.h"
#include "engine/sequence_runner.h"

namespace tandem::apps {

namespace {

// One configuration: a model on its backend, and a pool and runner for one window.
struct Config {
  LoadedModel lm;
  std::unique_ptr<BlockPool> pool;
  std::unique_ptr<SequenceRunner> runner;
};

Result<Config> load_config(const ModelLoadOptions& o, const std::string& kv_dtype, int64_t ctx) {
  auto lm = load_model(o);
  if (!lm.ok()) return lm.error();
  Config c{std::move(lm.value()), nullptr, nullptr};
  auto pool = c.lm.model->new_kv_pool((ctx + 15) / 16, kv_dtype_of(kv_dtype));
  if (!pool.ok()) return pool.error();
  c.pool = std::move(pool.value());
  c.runner = std::make_unique<SequenceRunner>(*c.lm.model, *c.pool, 512);
  return c;
}

std::string clock(double s) {
  const int64_t t = (int64_t)(s + 0.5);
  return fmt::format("{}:{:02}", t / 60, t % 60);
}

struct PerplexityArgs {
  ModelLoadOptions load;
  std::string file, kv_dtype = "f16", base_activations = "f32", base_kv_dtype = "f16";
  int64_t ctx = 512, chunks = 0;
  bool kl = false, json = false;
};

void add_perplexity_options(CLI::App* sub, PerplexityArgs& a) {
  a.load.add_to(sub);
  sub->add_option("-f,--file", a.file, "text file to score")->required();
  sub->add_option("-c,--ctx", a.ctx, "tokens per window (the second half of each is scored)")->check(CLI::Range(8, 1 << 20));
  sub->add_option("--chunks", a.chunks, "score only the first N windows (0 = all)")->check(CLI::Range(0, 1 << 30));
  add_kv_dtype_option(sub, a.kv_dtype);
  sub->add_flag("--kl-divergence", a.kl, "also run the base configuration and report KL(base || this) per scored token");
  sub->add_option("--base-activations", a.base_activations, "the base configuration's activations")
      ->check(CLI::IsMember({"q8", "f32"}));
  sub->add_option("--base-kv-dtype", a.base_kv_dtype, "the base configuration's KV cache type")
      ->check(CLI::IsMember({"f16", "f32", "q8_0"}));
  sub->add_flag("--json", a.json, "print one JSON object instead of the report");
}

std::string config_name(const std::string& activations, const std::string& kv_dtype) {
  return fmt::format("{} activations, {} KV", activations, kv_dtype);
}

// What the scored tokens add up to: this configuration's NLL, and with --kl-divergence the
// base's and how far the two distributions are apart.
struct Scores {
  NllStats nll, base_nll;
  KlStats kl;
};

// Runs every window through this configuration (and the base), scoring the second half of
// each, with a progress line on stderr.
Status score_windows(const PerplexityArgs& a, Config& cfg, Config* base, const std::vector<std::vector<int32_t>>& windows,
                     const Timer& t, Scores& s) {
  const int64_t V = cfg.lm.model->config().n_vocab, first = first_scored(a.ctx);
  std::vector<float> logits;
  for (size_t w = 0; w < windows.size(); w++) {
    const std::vector<int32_t>& win = windows[w];
    cfg.runner->clear();
    auto r = cfg.runner->run(win, true);
    if (!r.ok()) return r.error();
    logits.assign(r->begin(), r->end());
    std::span<const float> base_rows;
    if (base) {
      base->runner->clear();
      auto b = base->runner->run(win, true);
      if (!b.ok()) return b.error();
      base_rows = b.value();
    }
    for (int64_t i = first; i + 1 < (int64_t)win.size(); i++) {
      const std::span<const float> row(logits.data() + i * V, (size_t)V);
      s.nll.add(-log_softmax_at(row, win[(size_t)i + 1]));
      if (!base) continue;
      const std::span<const float> brow = base_rows.subspan((size_t)(i * V), (size_t)V);
      s.base_nll.add(-log_softmax_at(brow, win[(size_t)i + 1]));
      s.kl.add(kl_divergence(brow, row), Sampler::argmax(brow) == Sampler::argmax(row));
    }
    const double el = t.seconds(), eta = el / (double)(w + 1) * (double)(windows.size() - w - 1);
    fmt::print(stderr, "\r[{}/{}] {:3.0f}%  elapsed {}  ETA {}  PPL {:.4f}", w + 1, windows.size(),
               100.0 * (double)(w + 1) / (double)windows.size(), clock(el), clock(eta), s.nll.perplexity());
  }
  fmt::print(stderr, "\n");
  return Status::Ok();
}

void print_perplexity_json(const PerplexityArgs& a, const Model& model, size_t windows, const Scores& s) {
  const std::string this_cfg = config_name(a.load.activations, a.kv_dtype);
  const std::string base_cfg = config_name(a.base_activations, a.base_kv_dtype);
  nlohmann::ordered_json j = {{"model", model.config().name},  {"file", a.file},
                              {"ctx", a.ctx},                  {"windows", windows},
                              {"scored_tokens", s.nll.count()}, {"config", this_cfg},
                              {"ppl", s.nll.perplexity()},      {"ppl_error", s.nll.perplexity_error()}};
  if (a.kl)
    j["kl"] = {{"base", base_cfg},
               {"base_ppl", s.base_nll.perplexity()},
               {"base_ppl_error", s.base_nll.perplexity_error()},
               {"mean", s.kl.mean()},
               {"median", s.kl.quantile(0.5)},
               {"p99", s.kl.quantile(0.99)},
               {"max", s.kl.max()},
               {"same_top", s.kl.same_top_fraction()}};
  fmt::print("{}\n", j.dump(2));
}

void print_perplexity_text(const PerplexityArgs& a, size_t windows, const Scores& s, const Timer& t) {
  const std::string this_cfg = config_name(a.load.activations, a.kv_dtype);
  const std::string base_cfg = config_name(a.base_activations, a.base_kv_dtype);
  fmt::print("{} windows of {} tokens, {} tokens scored, {:.1f} s\n", windows, a.ctx, s.nll.count(), t.seconds());
  fmt::print("PPL ({})  {:.4f} +/- {:.4f}\n", this_cfg, s.nll.perplexity(), s.nll.perplexity_error());
  if (a.kl) {
    fmt::print("PPL ({})  {:.4f} +/- {:.4f}   (base)\n", base_cfg, s.base_nll.perplexity(), s.base_nll.perplexity_error());
    fmt::print("KL divergence vs base: mean {:.6f}  median {:.6f}  p99 {:.6f}  max {:.6f}\n", s.kl.mean(),
               s.kl.quantile(0.5), s.kl.quantile(0.99), s.kl.max());
    fmt::print("same top token as base: {:.2f}%\n", 100.0 * s.kl.same_top_fraction());
  }
}

int run_perplexity(const PerplexityArgs& a) {
  std::ifstream in(a.file, std::ios::binary);
  if (!in) return fail(fmt::format("cannot read {}", a.file));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto cfg = load_config(a.load, a.kv_dtype, a.ctx);
  if (!cfg.ok()) return fail(cfg.error().message);
  Model& model = *cfg->lm.model;
  const Tokenizer& tok = *cfg->lm.tokenizer;
  if (a.ctx > model.config().n_ctx_train)
    return fail(fmt::format("--ctx {} is past the model's context of {}", a.ctx, model.config().n_ctx_train));
  const std::vector<int32_t> ids = tok.encode(text, false, false);
  const int32_t bos = tok.vocab().add_bos ? tok.vocab().bos : -1;
  const auto windows = perplexity_windows(ids, a.ctx, bos, a.chunks);
  if (windows.empty())
    return fail(fmt::format("{} holds {} tokens: fewer than one window of --ctx {}", a.file, ids.size(), a.ctx));
  Result<Config> base = make_error("unused");
  if (a.kl) {
    ModelLoadOptions bo = a.load;
    bo.activations = a.base_activations;
    base = load_config(bo, a.base_kv_dtype, a.ctx);
    if (!base.ok()) return fail(base.error().message);
  }

  Scores s;
  Timer t;
  if (Status st = score_windows(a, cfg.value(), a.kl ? &base.value() : nullptr, windows, t, s); !st.ok())
    return fail(st.error().message);
  if (a.json) {
    print_perplexity_json(a, model, windows.size(), s);
    return 0;
  }
  print_perplexity_text(a, windows.size(), s, t);
  return 0;
}

}  // namespace

Command add_perplexity_command(CLI::App& app) {
  return subcommand(app, "perplexity", "Perplexity of a text, and KL divergence of this configuration against an exact one",
                    add_perplexity_options, run_perplexity);
}

}  // namespace tandem::apps
