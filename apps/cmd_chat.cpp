// `tandem chat`: a conversation in the model's chat template. One turn with -p, or one user
// message per stdin line. The KV cache persists across turns, so each turn prefills only
// the new part of the conversation: its KV pool persists, and the prefix cache finds the
// earlier turns' full blocks (as `serve` finds a shared system prompt).
#include <algorithm>
#include <iostream>

#include <fmt/core.h>

#include "apps/commands.h"
#include "apps/common.h"
#include "apps/generation_options.h"
#include "chat/chat_template.h"
#include "chat/reasoning.h"
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
    // A template with reasoning (gpt-oss's channels, <think> tags): the reasoning goes to
    // stderr, the answer to stdout and into the conversation.
    const ReasoningFormat rf = detect_reasoning_format(tmpl->source());
    std::vector<int32_t> markers;
    for (const std::string& m : reasoning_markers(rf))
      if (int32_t id = tok.vocab().find(m); id >= 0) markers.push_back(id);
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
      Utf8Streamer out, thought;
      const std::string& rendered = text.value().text;
      ReasoningStream reasoning(rf, std::string_view(rendered).substr(rendered.size() > 32 ? rendered.size() - 32 : 0));
      auto show = [&](const ReasoningOutput& o) {
        if (!o.reasoning.empty()) fmt::print(stderr, "{}", thought.push(o.reasoning));
        reply += o.content;
        fmt::print("{}", out.push(o.content));
        std::fflush(stdout);
      };
      auto st = gen.generate(prompt, cfg, [&](int32_t t) {
        const bool marker = std::find(markers.begin(), markers.end(), t) != markers.end();
        show(reasoning.push(tok.token_to_piece(t, marker)));
        return true;
      });
      show(reasoning.finish());
      const std::string thought_rest = thought.flush();
      if (!thought_rest.empty()) fmt::print(stderr, "{}\n", thought_rest);
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
