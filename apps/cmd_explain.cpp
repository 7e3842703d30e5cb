// `tandem explain`: runs one request and shows why each phase is as fast as it is. Per phase:
// FLOPs done, bytes read (weights, KV), arithmetic intensity, achieved GFLOP/s and GB/s, next
// to this machine's measured roofs (an FMA probe and a read-bandwidth probe).
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/common.h"
#include "apps/generation_options.h"
#include "apps/phase_report.h"
#include "core/units.h"
#include "tokenizer/utf8.h"

namespace tandem::apps {

Command add_explain_command(CLI::App& app) {
  struct Args {
    GenerationOptions gen;
    std::string prompt;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  a->gen.temp = 0;  // greedy unless asked: the numbers, not the text, are the point
  a->gen.n_predict = 32;
  CLI::App* sub = app.add_subcommand("explain", "Run one request and explain each phase against the machine's roofs");
  a->gen.add_to(sub);
  sub->add_option("-p,--prompt", a->prompt, "prompt text")->required();
  sub->add_flag("--json", a->json, "print one JSON object instead of the report");
  return [a]() -> int {
    if (a->gen.no_kv_cache) return fail("explain compares the two phases of cached inference; run without --no-kv-cache");
    // Its decode cost model is one token per pass; verify passes are not modelled yet.
    if (a->gen.speculative.mode != "off") return fail("explain measures plain decode; run without --speculative");
    auto lm = load_model(a->gen);
    if (!lm.ok()) return fail(lm.error().message);
    Model& model = *lm->model;
    const Tokenizer& tok = *lm->tokenizer;
    const std::vector<int32_t> prompt = tok.encode(a->prompt, true, true);
    const GenerationConfig cfg = a->gen.config(tok.vocab());
    std::string text;
    Generator gen(model);
    auto st = gen.generate(prompt, cfg, [&](int32_t t) {
      text += tok.token_to_piece(t);
      return true;
    });
    if (!st.ok()) return fail(st.error().message);
    auto roofs = measure_roofs(model);
    if (!roofs.ok()) return fail(roofs.error().message);
    const cpu::MachinePeaks& peaks = roofs.value();

    const double kv_elem = kv_element_bytes(cfg.kv_dtype);
    const ModelShape shape = ModelShape::of(model.config(), model.weights(), kv_elem);
    const bool int8 = runs_int8_products(model);
    PhaseMeasure pre{"prefill", st->n_prompt, st->prefill_s, prefill_cost(shape, st->n_prompt), int8};
    PhaseMeasure dec{"decode", st->n_decode_steps, st->decode_s, decode_cost(shape, st->n_decode_steps, st->n_prompt), int8};
    if (a->json) {
      nlohmann::ordered_json j = {{"model", model.config().name},
                                  {"prompt_tokens", st->n_prompt},
                                  {"generated_tokens", st->n_generated},
                                  {"ttft_s", st->ttft_s},
                                  {"tpot_s", st->tpot_s()},
                                  {"kv_bytes", st->kv_bytes},
                                  {"weights_matmul_bytes", shape.matmul_bytes},
                                  {"prefill", phase_json(pre, peaks)},
                                  {"decode", phase_json(dec, peaks)},
                                  {"machine", machine_json(peaks)},
                                  {"text", text}};
      fmt::print("{}\n", j.dump(2));
      return 0;
    }
    fmt::print("{}{}\n\n", a->prompt, text);
    fmt::print("{}", phase_table({pre, dec}, peaks));
    const double wb = shape.matmul_bytes / shape.matmul_elements_per_token;
    // A short prompt puts too few tokens through a pass to reach the ridge: say so, not "compute-bound".
    const bool prefill_past_ridge = pre.cost.intensity() >= peaks.ridge(int8);
    fmt::print(
        "\nWhy: every weight ({} in all, {:.3f} bytes per element) is read once per forward pass and used for 2 FLOPs\n"
        "per token in that pass. Prefill puts {} tokens through each pass, {:.1f} FLOP per byte: {} the ridge point\n"
        "({:.1f}), so it is {} (TTFT {:.1f} ms). Decode puts 1 token through each pass, {:.2f} FLOP per byte,\n"
        "far below the ridge: it waits on memory, and its best possible speed is {:.1f} GB/s / {} per token = {:.0f} tok/s\n"
        "(it reached {:.1f} tok/s, TPOT {:.2f} ms). The KV cache adds {} per token of context to decode's reads.\n",
        format_bytes(shape.matmul_bytes), wb, std::min<int64_t>(st->n_prompt, 512), pre.cost.intensity(),
        prefill_past_ridge ? "past" : "below", peaks.ridge(int8),
        prefill_past_ridge ? "compute-bound" : "still bound by memory: too few tokens share each weight read",
        st->ttft_s * 1e3, dec.cost.intensity(), peaks.read_bytes_per_s / 1e9, format_bytes(shape.matmul_bytes),
        peaks.read_bytes_per_s / shape.matmul_bytes, dec.tok_s(), st->tpot_s() * 1e3,
        format_bytes(shape.kv_bytes_per_position));
    return 0;
  };
}

}  // namespace tandem::apps
