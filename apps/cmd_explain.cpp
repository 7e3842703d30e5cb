// `tandem explain`: runs one request and shows why each phase is as fast as it is. Per phase:
// FLOPs done, bytes read (weights, KV), arithmetic intensity, achieved GFLOP/s and GB/s, next
// to this machine's measured roofs (an FMA probe and a read-bandwidth probe).
#include <algorithm>
#include <cmath>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "apps/explain_experts.h"
#include "apps/commands.h"
#include "apps/common.h"
#include "apps/generation_options.h"
#include "apps/phase_report.h"
#include "core/units.h"
#include "engine/disaggregation.h"
#include "model/tensor_parallel.h"
#include "tokenizer/utf8.h"

namespace tandem::apps {

namespace {

// One width of verify pass, modelled: its cost, and the speed the roofs allow for it.
struct VerifyRow {
  int k = 0;
  PhaseCost cost;        // one pass of 1 + k tokens
  double pass_s = 0;     // the least time the roofs allow: max(bytes / bandwidth, FLOPs / compute)
  double kept = 0;       // tokens a pass keeps at the run's acceptance rate (1 + k when all accepted)
  double tok_s(double tokens) const { return pass_s > 0 ? tokens / pass_s : 0; }
};

// Tokens a pass of k drafts keeps when each draft is accepted with probability r, independently,
// until the first rejection: 1 + r + r^2 + ... + r^k. r < 0: unknown, all accepted.
double tokens_kept(int k, double r) {
  if (r < 0) return 1.0 + k;
  double t = 0, rk = 1;
  for (int i = 0; i <= k; i++) t += rk, rk *= r;
  return t;
}

std::vector<VerifyRow> verify_rows(const ModelShape& shape, int width, int64_t pos, double rate, const cpu::MachinePeaks& peaks,
                                   bool int8) {
  std::vector<VerifyRow> rows;
  if (width <= 0) return rows;
  std::vector<int> ks = {0};
  for (int k = 1; k < width; k *= 2) ks.push_back(k);
  ks.push_back(width);
  for (int k : ks) {
    VerifyRow r;
    r.k = k;
    r.cost = verify_cost(shape, 1, k, pos);
    const double bw = peaks.read_bytes_per_s, fl = peaks.compute_roof(int8);
    r.pass_s = std::max(bw > 0 ? r.cost.bytes() / bw : 0.0, fl > 0 ? r.cost.flops / fl : 0.0);
    r.kept = tokens_kept(k, rate);
    rows.push_back(r);
  }
  return rows;
}

nlohmann::ordered_json verify_json(const std::vector<VerifyRow>& rows, const GenerationStats& st) {
  nlohmann::ordered_json j = {{"drafted", st.n_drafted},
                              {"accepted", st.n_accepted},
                              {"acceptance_rate", st.acceptance_rate()},
                              {"verify_passes", st.n_verify_steps},
                              {"draft_model_passes", st.n_draft_passes},
                              {"draft_model_s", st.draft_s}};
  j["verify_model"] = nlohmann::ordered_json::array();
  for (const VerifyRow& r : rows)
    j["verify_model"].push_back({{"k", r.k},
                                 {"tokens_per_pass", 1 + r.k},
                                 {"flops", r.cost.flops},
                                 {"bytes", r.cost.bytes()},
                                 {"intensity", r.cost.intensity()},
                                 {"bound_s_per_pass", r.pass_s},
                                 {"bound_tok_s_all_accepted", r.tok_s(1.0 + r.k)},
                                 {"tokens_kept", r.kept},
                                 {"bound_tok_s_at_rate", r.tok_s(r.kept)}});
  return j;
}

std::string verify_text(const std::vector<VerifyRow>& rows, const GenerationStats& st, double ridge, const ModelShape& shape) {
  const bool measured = st.n_drafted > 0;
  std::string out = fmt::format(
      "\nSpeculative decoding: a verify pass puts the decode token and k drafted tokens through one read of the\n"
      "weights (k = 0 is plain decode). Modelled per pass at this run's context, with the roofs above{}:\n\n"
      "| k | tokens/pass | GFLOP/pass | MB/pass | FLOP/byte | of ridge | bound tok/s, all accepted |{}\n"
      "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |{}\n",
      measured ? fmt::format("\n(this run: acceptance {:.1f}%, {} of {} drafts; tokens kept assume independent acceptances)", 100 * st.acceptance_rate(), st.n_accepted, st.n_drafted) : "",
      measured ? " tokens kept | bound tok/s |" : "", measured ? " ---: | ---: |" : "");
  for (const VerifyRow& r : rows)
    out += fmt::format("| {} | {} | {:.3f} | {:.1f} | {:.2f} | {:.0f}% | {:.0f} |{}\n", r.k, 1 + r.k, r.cost.flops / 1e9,
                       r.cost.bytes() / 1e6, r.cost.intensity(), ridge > 0 ? 100 * r.cost.intensity() / ridge : 0.0,
                       r.tok_s(1.0 + r.k), measured ? fmt::format(" {:.2f} | {:.0f} |", r.kept, r.tok_s(r.kept)) : "");
  const VerifyRow& d = rows.front();
  const VerifyRow& w = rows.back();
  int k_ridge = -1;  // the narrowest pass at or past the ridge
  for (int k = 0; k <= 256 && ridge > 0; k++)
    if (verify_cost(shape, 1, k, 0).intensity() >= ridge) {
      k_ridge = k;
      break;
    }
  out += fmt::format(
      "\nWhy: at k = {} a pass does {:.1f}x the FLOPs of a decode step for {:.2f}x its bytes (the weights are read once;\n"
      "the KV cache grows a little): its intensity rises from {:.2f} to {:.2f} FLOP/byte against a ridge of {:.1f}, so\n"
      "the compute decode leaves idle does the checking.{}\n"
      "A drafted token is only worth its share of the pass if it is accepted: the tokens a pass keeps, not the ones\n"
      "it checks, are the speed-up{}.\n",
      w.k, w.cost.flops / d.cost.flops, w.cost.bytes() / d.cost.bytes(), d.cost.intensity(), w.cost.intensity(), ridge,
      k_ridge >= 0 ? fmt::format(" From k = {} on a pass is past the ridge: wider ones stop being nearly free.", k_ridge) : "",
      st.n_draft_passes ? fmt::format(" (the draft model's {} passes took {:.1f} ms of decode's {:.1f} ms)", st.n_draft_passes,
                                      st.draft_s * 1e3, st.decode_s * 1e3)
                        : "");
  return out;
}

struct ExplainArgs {
  GenerationOptions gen;
  std::string prompt;
  bool json = false;
};

void add_explain_options(CLI::App* sub, ExplainArgs& a) {
  a.gen.temp = 0;  // greedy unless asked: the numbers, not the text, are the point
  a.gen.n_predict = 32;
  a.gen.speculative_width = true;
  a.gen.add_to(sub);
  sub->add_option("-p,--prompt", a.prompt, "prompt text")->required();
  sub->add_flag("--json", a.json, "print one JSON object instead of the report");
}

// The request's run: the text it generated, its stats, and the configuration (with the draft
// model it names) it ran under.
struct ExplainRun {
  std::unique_ptr<Model> draft;
  GenerationConfig cfg;
  std::string text;
  GenerationStats st;
};

Result<ExplainRun> run_request(const ExplainArgs& a, const LoadedModel& lm) {
  Model& model = *lm.model;
  const Tokenizer& tok = *lm.tokenizer;
  const std::vector<int32_t> prompt = tok.encode(a.prompt, true, true);
  auto draft = a.gen.speculative.load_draft(a.gen, model);
  if (!draft.ok()) return draft.error();
  ExplainRun r{std::move(draft.value()), a.gen.config(tok.vocab()), "", {}};
  r.cfg.draft_model = r.draft.get();
  if (Collectives* ranks = model.collectives()) ranks->reset_stats();  // the request's traffic only
  Generator gen(model);
  auto st = gen.generate(prompt, r.cfg, [&](int32_t t) {
    r.text += tok.token_to_piece(t);
    return true;
  });
  if (!st.ok()) return st.error();
  r.st = st.value();
  return r;
}

// The run's phases against the roofs, and the models of wider verify passes and of the
// tensor-parallel traffic.
struct Explained {
  ModelShape shape;
  bool int8 = false;
  PhaseMeasure pre, dec;
  cpu::MachinePeaks peaks;
  std::vector<VerifyRow> verify;
  const Collectives* ranks = nullptr;
  int n_ranks = 1;
  CommunicationCost pre_comm, dec_comm;
  std::vector<ExpertRow> experts;  // a mixture of experts' batched decode roofline
};

Result<Explained> explain_phases(const ExplainArgs& a, Model& model, const ExplainRun& run) {
  const GenerationStats& st = run.st;
  Explained e;
  const double kv_elem = kv_element_bytes(run.cfg.kv_dtype);
  e.shape = ModelShape::of(model.config(), model.weights(), kv_elem);
  const ModelShape& shape = e.shape;
  e.int8 = runs_int8_products(model);
  e.pre = {"prefill", st.n_prompt, st.prefill_s, prefill_cost(shape, st.n_prompt), e.int8, st.prefill_attention_s};
  e.dec = {"decode", st.n_decode_steps, st.decode_s, decode_cost(shape, st.n_decode_steps, st.n_prompt), e.int8,
           st.decode_attention_s};
  auto roofs = measure_roofs(model, shape.matmul_bytes);
  if (!roofs.ok()) return roofs.error();
  e.peaks = roofs.value();
  if (st.n_decode_steps > 0) e.peaks.raise_read_roof(e.dec.bytes_per_s());
  if (st.n_verify_steps > 0) {
    // The target's passes of the run: plain decode steps, and verify passes of 1 + k tokens
    // (k: the mean draft) each keeping the accepted drafts and one token of its own. The
    // draft model's passes are in the time, not in these counts.
    const int64_t plain = st.n_decode_steps - st.n_verify_steps;
    const int k = (int)std::lround((double)st.n_drafted / (double)st.n_verify_steps);
    const double kept = 1.0 + (double)st.n_accepted / (double)st.n_verify_steps;
    e.dec.name = fmt::format("decode ({})", speculative_mode_name(run.cfg.speculative.mode));
    e.dec.tokens = st.n_decode_tokens;
    e.dec.cost = decode_cost(shape, plain, st.n_prompt);
    e.dec.cost += verify_cost(shape, st.n_verify_steps, k, st.n_prompt + plain, kept);
  }
  e.verify = verify_rows(shape, a.gen.speculative.width(), st.n_prompt + st.n_generated / 2,
                         st.n_drafted ? st.acceptance_rate() : -1.0, e.peaks, e.int8);
  e.ranks = model.collectives();
  e.n_ranks = e.ranks ? e.ranks->size() : 1;
  e.pre_comm = communication_cost(model.config(), model.shard(), st.n_prompt, 1);
  e.dec_comm = communication_cost(model.config(), model.shard(), 1, 1);
  auto experts = expert_rows(model, shape, e.peaks);
  if (!experts.ok()) return experts.error();
  e.experts = std::move(experts.value());
  return e;
}

nlohmann::ordered_json handoff_json(const GenerationStats& st, const Explained& e) {
  const HandoffCost c = handoff_cost(e.shape.kv_bytes_per_position, st.n_prompt, 16);
  return {{"blocks", c.blocks}, {"bytes", c.bytes}, {"seconds_at_1_25_GBps", c.seconds_at(1.25)},
          {"seconds_at_12_5_GBps", c.seconds_at(12.5)}, {"seconds_at_50_GBps", c.seconds_at(50)}, {"prefill_s", st.prefill_s}};
}

void print_explain_json(const Model& model, const ExplainRun& run, const Explained& e) {
  const GenerationStats& st = run.st;
  nlohmann::ordered_json j = {{"model", model.config().name},
                              {"prompt_tokens", st.n_prompt},
                              {"generated_tokens", st.n_generated},
                              {"ttft_s", st.ttft_s},
                              {"tpot_s", st.tpot_s()},
                              {"kv_bytes", st.kv_bytes},
                              {"weights_matmul_bytes", e.shape.matmul_bytes},
                              {"prefill", phase_json(e.pre, e.peaks)},
                              {"decode", phase_json(e.dec, e.peaks)},
                              {"machine", machine_json(e.peaks)},
                              {"speculative", verify_json(e.verify, st)},
                              {"experts", experts_json(e.experts)},
                              {"handoff", handoff_json(st, e)},
                              {"text", run.text}};
  if (e.ranks)
    j["tensor_parallel"] = {{"ranks", e.n_ranks},
                            {"collectives_per_pass", e.dec_comm.collectives},
                            {"gathered_bytes_per_layer_per_token", e.dec_comm.per_layer_bytes},
                            {"prefill_gathered_bytes", e.pre_comm.gathered_bytes},
                            {"decode_bytes_per_token", e.dec_comm.gathered_bytes + e.dec_comm.all_reduce_bytes},
                            {"decode_wire_bytes_per_rank_per_token", e.dec_comm.wire_bytes_per_rank(e.n_ranks)},
                            {"collectives", e.ranks->stats().calls},
                            {"collective_bytes", e.ranks->stats().bytes},
                            {"collective_s", e.ranks->stats().seconds}};
  fmt::print("{}\n", j.dump(2));
}

// Why each phase is as fast as it is: the weights' reads, each phase's intensity against the
// ridge, and decode's best possible speed.
void print_why(const GenerationStats& st, const Explained& e) {
  const ModelShape& shape = e.shape;
  const cpu::MachinePeaks& peaks = e.peaks;
  const double wb = shape.matmul_bytes / shape.matmul_elements_per_token;
  // A short prompt puts too few tokens through a pass to reach the ridge: say so, not "compute-bound".
  const bool prefill_past_ridge = e.pre.cost.intensity() >= peaks.ridge(e.int8);
  fmt::print(
      "\nWhy: every weight ({} in all, {:.3f} bytes per element) is read once per forward pass and used for 2 FLOPs\n"
      "per token in that pass. Prefill puts {} tokens through each pass, {:.1f} FLOP per byte: {} the ridge point\n"
      "({:.1f}), so it is {} (TTFT {:.1f} ms). Decode puts 1 token through each pass, {:.2f} FLOP per byte,\n"
      "far below the ridge: it waits on memory, and its best possible speed is {:.1f} GB/s / {} per token = {:.0f} tok/s\n"
      "(it reached {:.1f} tok/s, TPOT {:.2f} ms). The KV cache adds {} per token of context to decode's reads.\n",
      format_bytes(shape.matmul_bytes), wb, std::min<int64_t>(st.n_prompt, 512), e.pre.cost.intensity(),
      prefill_past_ridge ? "past" : "below", peaks.ridge(e.int8),
      prefill_past_ridge ? "compute-bound" : "still bound by memory: too few tokens share each weight read",
      st.ttft_s * 1e3, e.dec.cost.intensity(), peaks.read_bytes_per_s / 1e9, format_bytes(shape.matmul_bytes),
      peaks.read_bytes_per_s / shape.matmul_bytes, e.dec.tok_s(), st.tpot_s() * 1e3,
      format_bytes(shape.kv_bytes_per_position));
}

// The third roof: each pass gathers the attention output, the gated activation and both
// branch outputs per layer (what rank 0 receives: the other ranks' shares), all-reduces
// the embedding once, and gathers the logits.
void print_network(const Model& model, const GenerationStats& st, const Explained& e) {
  const CollectiveStats& cs = e.ranks->stats();
  const CommunicationCost& dec_comm = e.dec_comm;
  const double wire = dec_comm.wire_bytes_per_rank(e.n_ranks), weights_s = e.shape.matmul_bytes / e.peaks.read_bytes_per_s;
  fmt::print("\nNetwork: the weights above are this rank's 1/{} share. Each pass makes {} collectives: per layer 4\n"
             "all-gathers (the attention output and gated activation before attn_output and ffn_down, their\n"
             "[tokens, {}] outputs after: rank 0 receives {} per token), the embedding's all-reduce and the\n"
             "logits' gather. Prefill received {}, decode {} per token ({} with the all-reduce's ring share).\n"
             "This run: {} collectives, {}, {:.2f} ms in them, waits included ({:.1f}% of prefill + decode).\n"
             "Over a link, decode pays that per token besides its {:.2f} ms of weight reads:\n",
             e.n_ranks, dec_comm.collectives, model.config().n_embd, format_bytes(dec_comm.per_layer_bytes),
             format_bytes(e.pre_comm.gathered_bytes), format_bytes(dec_comm.gathered_bytes), format_bytes(wire), cs.calls,
             format_bytes((double)cs.bytes), cs.seconds * 1e3,
             st.prefill_s + st.decode_s > 0 ? 100 * cs.seconds / (st.prefill_s + st.decode_s) : 0.0, weights_s * 1e3);
  for (double gbit : {10.0, 25.0, 100.0}) {
    const double latency = 20e-6;  // per collective on Ethernet (TCP): an assumption, not measured here
    const double net_s = wire / (gbit * 1e9 / 8) + (double)dec_comm.collectives * latency;
    fmt::print("  {:>5.0f} Gb/s (+{:.0f} us per collective): {:.2f} ms per token, {:.0f}% of the weight reads\n", gbit,
               latency * 1e6, net_s * 1e3, 100 * net_s / weights_s);
  }
}

// Disaggregated serving moves the prompt's K,V from a prefill rank to a decode rank: its bytes
// and their time over three links (an Ethernet, a fast NIC, NVLink-class) beside the prefill
// time, so a reader sees when the link, not the phases, would be the limit.
void print_handoff(const GenerationStats& st, const Explained& e) {
  const HandoffCost c = handoff_cost(e.shape.kv_bytes_per_position, st.n_prompt, 16);
  fmt::print("\nHand-off (serve --disaggregate): the prompt's K,V is {} block{} of 16 positions = {}; moving it takes\n",
             c.blocks, c.blocks == 1 ? "" : "s", format_bytes(c.bytes));
  for (double gbps : {1.25, 12.5, 50.0}) {
    const double s = c.seconds_at(gbps);
    fmt::print("  {:>5.2f} GB/s: {:8.3f} ms ({:.0f}% of the prefill's {:.2f} ms){}\n", gbps, s * 1e3,
               st.prefill_s > 0 ? 100 * s / st.prefill_s : 0.0, st.prefill_s * 1e3,
               s > st.prefill_s ? ": the link, not the prefill, is the limit" : "");
  }
}

int run_explain(const ExplainArgs& a) {
  if (a.gen.no_kv_cache) return fail("explain compares the two phases of cached inference; run without --no-kv-cache");
  auto lm = load_model(a.gen);
  if (!lm.ok()) return fail(lm.error().message);
  Model& model = *lm->model;
  auto run = run_request(a, lm.value());
  if (!run.ok()) return fail(run.error().message);
  auto e = explain_phases(a, model, run.value());
  if (!e.ok()) return fail(e.error().message);
  if (a.json) {
    print_explain_json(model, run.value(), e.value());
    return 0;
  }
  fmt::print("{}{}\n\n", a.prompt, run->text);
  fmt::print("{}", phase_table({e->pre, e->dec}, e->peaks));
  print_why(run->st, e.value());
  if (!e->verify.empty()) fmt::print("{}", verify_text(e->verify, run->st, e->peaks.ridge(e->int8), e->shape));
  if (e->ranks) print_network(model, run->st, e.value());
  print_handoff(run->st, e.value());
  fmt::print("{}", experts_text(e->experts, e->shape));
  return 0;
}

}  // namespace

Command add_explain_command(CLI::App& app) {
  return subcommand(app, "explain", "Run one request and explain each phase against the machine's roofs", add_explain_options,
                    run_explain);
}

}  // namespace tandem::apps
