// `tandem template`: renders a conversation (OpenAI-style JSON messages on stdin or a file)
// with a model's chat template, or with a template file, and prints the prompt text, or its
// token ids with --ids. Shows exactly what the model will be fed.
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/common.h"
#include "gguf/gguf_file.h"
#include "chat/chat_template.h"
#include "chat/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace tandem::apps {

namespace {

std::string read_all(std::istream& in) { return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()); }

}  // namespace

Command add_template_command(CLI::App& app) {
  struct Args {
    std::string model, template_file, messages_file, bos, eos, tools_file;
    bool no_generation_prompt = false, ids = false, allow_special_in_messages = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("template", "Render chat messages (JSON) with a model's chat template");
  sub->add_option("-m,--model", a->model, "GGUF file whose tokenizer.chat_template and vocabulary to use");
  sub->add_option("--template-file", a->template_file, "a Jinja template file instead of the model's");
  sub->add_option("--messages", a->messages_file, "JSON file with the messages array (default: stdin)");
  sub->add_option("--tools", a->tools_file, "JSON file with a tools array for the template");
  sub->add_option("--bos-token", a->bos, "bos_token text when no model is given");
  sub->add_option("--eos-token", a->eos, "eos_token text when no model is given");
  sub->add_flag("--no-generation-prompt", a->no_generation_prompt, "do not open the assistant's turn");
  sub->add_flag("--ids", a->ids, "print the token ids of the prompt (needs -m)");
  sub->add_flag("--allow-special-in-messages", a->allow_special_in_messages,
                "with --ids: special-token text inside messages becomes control tokens (default: text)");
  return [a]() -> int {
    if (a->model.empty() && a->template_file.empty()) return fail("give -m MODEL or --template-file FILE");
    if (a->ids && a->model.empty()) return fail("--ids needs -m MODEL for its vocabulary");
    std::unique_ptr<GgufFile> gguf;
    std::unique_ptr<Tokenizer> tok;
    if (!a->model.empty()) {
      auto f = GgufFile::open(a->model);
      if (!f.ok()) return fail(f.error().message);
      gguf = std::move(f.value());
      auto t = Tokenizer::from_gguf(*gguf);
      if (!t.ok()) return fail(t.error().message);
      tok = std::move(t.value());
    }
    Result<ChatTemplate> tmpl = make_error("no template");
    if (!a->template_file.empty()) {
      std::ifstream in(a->template_file, std::ios::binary);
      if (!in) return fail(fmt::format("cannot read {}", a->template_file));
      std::string bos = a->bos, eos = a->eos;
      if (tok) {
        const Vocab& v = tok->vocab();
        if (bos.empty() && v.bos >= 0) bos = v.tokens[v.bos];
        if (eos.empty() && v.eos >= 0) eos = v.tokens[v.eos];
      }
      tmpl = ChatTemplate::from_source(read_all(in), bos, eos);
    } else {
      tmpl = ChatTemplate::from_gguf(*gguf, tok->vocab());
      if (tmpl.ok() && tmpl->origin() != "tokenizer.chat_template") fmt::print(stderr, "note: chat template: {}\n", tmpl->origin());
    }
    if (!tmpl.ok()) return fail(tmpl.error().message);

    auto parse = [](const std::string& what, const std::string& text) -> Result<nlohmann::ordered_json> {
      auto j = nlohmann::ordered_json::parse(text, nullptr, false);
      if (j.is_discarded()) return make_error("{} is not valid JSON", what);
      return j;
    };
    std::string text;
    if (a->messages_file.empty()) {
      text = read_all(std::cin);
    } else {
      std::ifstream in(a->messages_file, std::ios::binary);
      if (!in) return fail(fmt::format("cannot read {}", a->messages_file));
      text = read_all(in);
    }
    auto messages = parse("the messages input", text);
    if (!messages.ok()) return fail(messages.error().message);
    if (messages->is_object() && messages->contains("messages")) messages = (*messages)["messages"];
    if (!messages->is_array()) return fail("the messages must be a JSON array of {\"role\": ..., \"content\": ...}");
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();
    if (!a->tools_file.empty()) {
      std::ifstream in(a->tools_file, std::ios::binary);
      auto tools = parse("the tools input", read_all(in));
      if (!tools.ok()) return fail(tools.error().message);
      extra["tools"] = tools.value();
    }
    // As the server renders them: OpenAI tool-call arguments (JSON strings) as objects.
    auto prompt = tmpl->render_json(messages_for_template(messages.value()), !a->no_generation_prompt, &extra);
    if (!prompt.ok()) return fail(prompt.error().message);
    if (a->ids) {
      const auto ids = tok->encode_chat(prompt.value(), a->allow_special_in_messages);
      for (size_t i = 0; i < ids.size(); i++) fmt::print("{}{}", i ? " " : "", ids[i]);
      fmt::print("\n");
    } else {
      fmt::print("{}", prompt->text);
    }
    return 0;
  };
}

}  // namespace tandem::apps
