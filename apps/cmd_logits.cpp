// `tandem logits`: writes the logits of every position of a token sequence, computed by one of
// the three ways through the KV pool (prefill in one batch, decode one token at a time, or
// naive: each position's prefix recomputed from scratch), for reference checks.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/core.h>

#include "apps/commands.h"
#include "apps/common.h"
#include "apps/generation_options.h"
#include "engine/sequence_runner.h"
#include "model/model.h"

namespace tandem::apps {

Command add_logits_command(CLI::App& app) {
  struct Args {
    ModelLoadOptions load;
    std::string tokens, out, mode = "prefill", kv_dtype = "f16";
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("logits", "Write [T, n_vocab] float32 logits of a token sequence (diagnostics)");
  a->load.add_to(sub);
  sub->add_option("--tokens", a->tokens, "space-separated token ids")->required();
  sub->add_option("-o,--out", a->out, "output file (raw little-endian float32)")->required();
  sub->add_option("--mode", a->mode, "prefill | decode | naive")->check(CLI::IsMember({"prefill", "decode", "naive"}));
  add_kv_dtype_option(sub, a->kv_dtype);
  return [a]() -> int {
    std::vector<int32_t> tokens;
    std::istringstream in(a->tokens);
    for (int32_t t; in >> t;) tokens.push_back(t);
    if (tokens.empty()) return fail("no tokens given");
    auto lm = load_model(a->load);
    if (!lm.ok()) return fail(lm.error().message);
    Model& m = *lm->model;
    const int64_t V = m.config().n_vocab;
    auto pool = m.new_kv_pool(((int64_t)tokens.size() + 15) / 16, kv_dtype_of(a->kv_dtype));
    if (!pool.ok()) return fail(pool.error().message);
    SequenceRunner seq(m, *pool.value());
    std::vector<float> out(tokens.size() * V);
    if (a->mode == "prefill") {  // every position's logits from one batch
      auto all = seq.run(tokens, true);
      if (!all.ok()) return fail(all.error().message);
      std::copy(all->begin(), all->end(), out.begin());
    }
    for (size_t t = 0; a->mode != "prefill" && t < tokens.size(); t++) {
      if (a->mode == "naive") seq.clear();  // position t's K,V and those of all before it, again
      auto l = a->mode == "naive" ? seq.run(std::span<const int32_t>(tokens.data(), t + 1))
                                  : seq.run(std::span<const int32_t>(&tokens[t], 1));
      if (!l.ok()) return fail(l.error().message);
      std::copy(l->begin(), l->end(), out.begin() + t * V);
    }
    std::ofstream f(a->out, std::ios::binary);
    f.write(reinterpret_cast<const char*>(out.data()), (std::streamsize)(out.size() * sizeof(float)));
    if (!f) return fail(fmt::format("cannot write {}", a->out));
    return 0;
  };
}

}  // namespace tandem::apps
