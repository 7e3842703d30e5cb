// `tandem logits`: writes the logits of every position of a token sequence, computed by one of
// the three paths (prefill, decode one token at a time, no-cache), for reference checks.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/core.h>

#include "apps/commands.h"
#include "apps/common.h"
#include "model/llama_model.h"

namespace tandem::apps {

Command add_logits_command(CLI::App& app) {
  struct Args {
    std::string model, tokens, out, mode = "prefill", kv_dtype = "f16", isa = "auto", activations = "q8";
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("logits", "Write [T, n_vocab] float32 logits of a token sequence (diagnostics)");
  sub->add_option("-m,--model", a->model, "GGUF model file")->required();
  sub->add_option("--tokens", a->tokens, "space-separated token ids")->required();
  sub->add_option("-o,--out", a->out, "output file (raw little-endian float32)")->required();
  sub->add_option("--mode", a->mode, "prefill | decode | naive")->check(CLI::IsMember({"prefill", "decode", "naive"}));
  sub->add_option("--kv-dtype", a->kv_dtype, "f16 | f32")->check(CLI::IsMember({"f16", "f32"}));
  sub->add_option("--isa", a->isa, "kernel level: auto | avx2 | scalar");
  sub->add_option("--activations", a->activations, "q8 (8-bit activations, fast) | f32 (exact products)")
      ->check(CLI::IsMember({"q8", "f32"}));
  sub->add_option("-t,--threads", a->threads, "threads (0 = all cores)");
  return [a]() -> int {
    std::vector<int32_t> tokens;
    std::istringstream in(a->tokens);
    for (int32_t t; in >> t;) tokens.push_back(t);
    if (tokens.empty()) return fail("no tokens given");
    auto backend = make_cpu_backend(a->isa, a->threads, a->activations == "q8");
    if (!backend.ok()) return fail(backend.error().message);
    ModelOptions opts;
    opts.backend = backend.value();
    auto model = LlamaModel::load(a->model, opts);
    if (!model.ok()) return fail(model.error().message);
    LlamaModel& m = *model.value();
    const DType kv_dtype = a->kv_dtype == "f32" ? DType::F32 : DType::F16;
    const int64_t V = m.config().n_vocab;
    std::vector<float> out(tokens.size() * V);
    if (a->mode == "naive") {
      for (size_t t = 0; t < tokens.size(); t++) {
        auto r = m.forward_no_cache(std::span<const int32_t>(tokens.data(), t + 1), kv_dtype);
        if (!r.ok()) return fail(r.error().message);
        std::copy(r->begin(), r->end(), out.begin() + t * V);
      }
    } else {
      auto kv = m.new_kv_cache((int64_t)tokens.size(), kv_dtype);
      if (!kv.ok()) return fail(kv.error().message);
      if (a->mode == "prefill") {
        auto r = m.prefill(kv.value(), tokens, true);
        if (!r.ok()) return fail(r.error().message);
        std::copy(r->begin(), r->end(), out.begin());
      } else {
        for (size_t t = 0; t < tokens.size(); t++) {
          auto r = m.decode(kv.value(), tokens[t]);
          if (!r.ok()) return fail(r.error().message);
          std::copy(r->begin(), r->end(), out.begin() + t * V);
        }
      }
    }
    std::ofstream f(a->out, std::ios::binary);
    f.write(reinterpret_cast<const char*>(out.data()), (std::streamsize)(out.size() * sizeof(float)));
    if (!f) return fail(fmt::format("cannot write {}", a->out));
    return 0;
  };
}

}  // namespace tandem::apps
