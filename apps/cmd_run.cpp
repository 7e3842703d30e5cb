// `tandem run`: generate from a raw prompt, streaming text, then report both phases.
#include <fstream>
#include <iterator>

#include <fmt/core.h>

#include "apps/commands.h"
#include "apps/common.h"
#include "apps/generation_options.h"
#include "tokenizer/utf8.h"

namespace tandem::apps {

Command add_run_command(CLI::App& app) {
  struct Args {
    GenerationOptions gen;
    ConstraintOptions constraint;
    std::string prompt, prompt_file;
    bool print_ids = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("run", "Generate text from a prompt (streams; reports TTFT, TPOT, KV bytes)");
  a->gen.add_to(sub);
  a->constraint.add_to(sub);
  auto* p = sub->add_option("-p,--prompt", a->prompt, "prompt text");
  auto* f = sub->add_option("-f,--file", a->prompt_file, "read the prompt from a file");
  p->excludes(f);
  sub->add_flag("--print-token-ids", a->print_ids, "after the text, print the generated token ids");
  return [a]() -> int {
    if (!a->prompt_file.empty()) {
      std::ifstream in(a->prompt_file, std::ios::binary);
      if (!in) return fail(fmt::format("cannot read prompt file {}", a->prompt_file));
      a->prompt.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    if (a->prompt.empty()) return fail("give a prompt with -p or -f");
    auto lm = load_model(a->gen);
    if (!lm.ok()) return fail(lm.error().message);
    Model& model = *lm->model;
    const Tokenizer& tok = *lm->tokenizer;
    const std::vector<int32_t> prompt = tok.encode(a->prompt, true, true);
    auto draft = a->gen.speculative.load_draft(a->gen, model);
    if (!draft.ok()) return fail(draft.error().message);
    GenerationConfig cfg = a->gen.config(tok.vocab());
    cfg.draft_model = draft.value().get();
    if (Status c = a->constraint.apply(tok, cfg); !c.ok()) return fail(c.error().message);
    a->gen.constrained = a->constraint.any();

    fmt::print("{}", a->prompt);
    std::fflush(stdout);
    Utf8Streamer out;
    std::vector<int32_t> generated;
    Generator gen(model);
    auto st = gen.generate(prompt, cfg, [&](int32_t t) {
      generated.push_back(t);
      fmt::print("{}", out.push(tok.token_to_piece(t)));
      std::fflush(stdout);
      return true;
    });
    fmt::print("{}", out.flush());
    std::fflush(stdout);
    if (!st.ok()) return fail(st.error().message);
    if (a->print_ids) {
      fmt::print("\n[prompt ids]");
      for (int32_t t : prompt) fmt::print(" {}", t);
      fmt::print("\n[generated ids]");
      for (int32_t t : generated) fmt::print(" {}", t);
      fmt::print("\n");
    }
    print_stats(st.value(), model, a->gen);
    return 0;
  };
}

}  // namespace tandem::apps
