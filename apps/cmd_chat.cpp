// `tandem chat`: a conversation in the model's chat template. One turn with -p, or one user
// message per stdin line. The KV cache persists across turns, so each turn prefills only
// the new part of the conversation: its KV pool persists, and the prefix cache finds the
// earlier turns' full blocks (as `serve` finds a shared system prompt).
#include <iostream>

#include <fmt/core.h>

#include "apps/commands.h"
#include "apps/common.h"
#include "apps/generation_options.h"
#include "chat/chat_template.h"
#include "tokenizer/utf8.h"

namespace tandem::apps {

Command add_chat_command(CLI::App& app) {
  struct Args {
    GenerationOptions gen;
    std::string prompt, system;
    int64_t ctx = 4096;
    bool allow_special_in_messages = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("chat", "Chat using the model's chat template (-p for one turn, else stdin lines)");
  a->gen.add_to(sub);
  sub->add_option("-p,--prompt", a->prompt, "a single user message (otherwise read one per line from stdin)");
  sub->add_option("--system", a->system, "system message (default: the template's own, if any)");
  sub->add_flag("--allow-special-in-messages", a->allow_special_in_messages,
                "let special-token text typed in a message (e.g. <|im_end|>) become control tokens");
  sub->add_option("-c,--ctx", a->ctx, "context size in tokens for the conversation's KV cache")->check(CLI::Range(16, 1 << 22));
  return [a]() -> int {
    auto lm = load_model(a->gen);
    if (!lm.ok()) return fail(lm.error().message);
    Model& model = *lm->model;
    const Tokenizer& tok = *lm->tokenizer;
    auto tmpl = ChatTemplate::from_gguf(model.gguf(), tok.vocab());
    if (!tmpl.ok()) return fail(tmpl.error().message);
    if (a->gen.no_kv_cache) return fail("chat keeps its KV cache across turns; use `tandem run --no-kv-cache` for naive mode");
    const int64_t ctx = std::min<int64_t>(a->ctx, model.config().n_ctx_train);

    std::vector<ChatMessage> messages;
    if (!a->system.empty()) messages.push_back({"system", a->system});
    auto draft = a->gen.speculative.load_draft(a->gen, model);
    if (!draft.ok()) return fail(draft.error().message);
    GenerationConfig cfg = a->gen.config(tok.vocab());
    cfg.draft_model = draft.value().get();
    Generator gen(model, ctx);
    const bool interactive = a->prompt.empty();
    std::string line;
    while (true) {
      if (interactive) {
        fmt::print(stderr, "> ");
        if (!std::getline(std::cin, line) || line == "/exit") break;
        if (line.empty()) continue;
      } else {
        line = a->prompt;
      }
      messages.push_back({"user", line});
      auto text = tmpl->render(messages, true);
      if (!text.ok()) return fail(text.error().message);
      const auto prompt = tok.encode_chat(text.value(), a->allow_special_in_messages);
      std::string reply;
      Utf8Streamer out;
      auto st = gen.generate(prompt, cfg, [&](int32_t t) {
        const std::string piece = tok.token_to_piece(t);
        reply += piece;
        fmt::print("{}", out.push(piece));
        std::fflush(stdout);
        return true;
      });
      fmt::print("{}\n", out.flush());
      if (!st.ok()) return fail(st.error().message);
      messages.push_back({"assistant", reply});
      print_stats(st.value(), model, a->gen);
      if (!interactive) break;
      cfg.sampling.seed++;  // a fresh draw each turn, still reproducible from --seed
    }
    return 0;
  };
}

}  // namespace tandem::apps
