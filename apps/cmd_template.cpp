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

struct TemplateArgs {
  std::string model, template_file, messages_file, bos, eos, tools_file;
  bool no_generation_prompt = false, ids = false, allow_special_in_messages = false;
};

void add_template_options(CLI::App* sub, TemplateArgs& a) {
  sub->add_option("-m,--model", a.model, "GGUF file whose tokenizer.chat_template and vocabulary to use");
  sub->add_option("--template-file", a.template_file, "a Jinja template file instead of the model's");
  sub->add_option("--messages", a.messages_file, "JSON file with the messages array (default: stdin)");
  sub->add_option("--tools", a.tools_file, "JSON file with a tools array for the template");
  sub->add_option("--bos-token", a.bos, "bos_token text when no model is given");
  sub->add_option("--eos-token", a.eos, "eos_token text when no model is given");
  sub->add_flag("--no-generation-prompt", a.no_generation_prompt, "do not open the assistant's turn");
  sub->add_flag("--ids", a.ids, "print the token ids of the prompt (needs -m)");
  sub->add_flag("--allow-special-in-messages", a.allow_special_in_messages,
                "with --ids: special-token text inside messages becomes control tokens (default: text)");
}

// -m's file and tokenizer (both null without -m).
struct TemplateModel {
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<Tokenizer> tok;
};

Result<TemplateModel> open_model(const std::string& model) {
  TemplateModel m;
  if (model.empty()) return m;
  auto f = GgufFile::open(model);
  if (!f.ok()) return f.error();
  m.gguf = std::move(f.value());
  auto t = Tokenizer::from_gguf(*m.gguf);
  if (!t.ok()) return t.error();
  m.tok = std::move(t.value());
  return m;
}

// --template-file's template (its bos/eos text from the options, else from the vocabulary),
// or the model's own.
Result<ChatTemplate> load_template(const TemplateArgs& a, const TemplateModel& m) {
  if (a.template_file.empty()) {
    auto tmpl = ChatTemplate::from_gguf(*m.gguf, m.tok->vocab());
    if (tmpl.ok() && tmpl->origin() != "tokenizer.chat_template") fmt::print(stderr, "note: chat template: {}\n", tmpl->origin());
    return tmpl;
  }
  std::ifstream in(a.template_file, std::ios::binary);
  if (!in) return make_error("cannot read {}", a.template_file);
  std::string bos = a.bos, eos = a.eos;
  if (m.tok) {
    const Vocab& v = m.tok->vocab();
    if (bos.empty() && v.bos >= 0) bos = v.tokens[v.bos];
    if (eos.empty() && v.eos >= 0) eos = v.tokens[v.eos];
  }
  return ChatTemplate::from_source(read_all(in), bos, eos);
}

Result<nlohmann::ordered_json> parse_json(const std::string& what, const std::string& text) {
  auto j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (j.is_discarded()) return make_error("{} is not valid JSON", what);
  return j;
}

// The messages array, from --messages or stdin (an object's "messages" too).
Result<nlohmann::ordered_json> read_messages(const std::string& file) {
  std::string text;
  if (file.empty()) {
    text = read_all(std::cin);
  } else {
    std::ifstream in(file, std::ios::binary);
    if (!in) return make_error("cannot read {}", file);
    text = read_all(in);
  }
  auto messages = parse_json("the messages input", text);
  if (!messages.ok()) return messages.error();
  if (messages->is_object() && messages->contains("messages")) messages = (*messages)["messages"];
  if (!messages->is_array()) return make_error("the messages must be a JSON array of {{\"role\": ..., \"content\": ...}}");
  return messages;
}

// The template's variables besides the messages: --tools' array.
Result<nlohmann::ordered_json> read_extra(const std::string& tools_file) {
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  if (!tools_file.empty()) {
    std::ifstream in(tools_file, std::ios::binary);
    auto tools = parse_json("the tools input", read_all(in));
    if (!tools.ok()) return tools.error();
    extra["tools"] = tools.value();
  }
  return extra;
}

int run_template(const TemplateArgs& a) {
  if (a.model.empty() && a.template_file.empty()) return fail("give -m MODEL or --template-file FILE");
  if (a.ids && a.model.empty()) return fail("--ids needs -m MODEL for its vocabulary");
  auto m = open_model(a.model);
  if (!m.ok()) return fail(m.error().message);
  auto tmpl = load_template(a, m.value());
  if (!tmpl.ok()) return fail(tmpl.error().message);
  auto messages = read_messages(a.messages_file);
  if (!messages.ok()) return fail(messages.error().message);
  auto extra = read_extra(a.tools_file);
  if (!extra.ok()) return fail(extra.error().message);
  // As the server renders them: OpenAI tool-call arguments (JSON strings) as objects.
  auto prompt = tmpl->render_json(messages_for_template(messages.value()), !a.no_generation_prompt, &extra.value());
  if (!prompt.ok()) return fail(prompt.error().message);
  if (a.ids) {
    const auto ids = m->tok->encode_chat(prompt.value(), a.allow_special_in_messages);
    for (size_t i = 0; i < ids.size(); i++) fmt::print("{}{}", i ? " " : "", ids[i]);
    fmt::print("\n");
  } else {
    fmt::print("{}", prompt->text);
  }
  return 0;
}

}  // namespace

Command add_template_command(CLI::App& app) {
  return subcommand(app, "template", "Render chat messages (JSON) with a model's chat template", add_template_options,
                    run_template);
}

}  // namespace tandem::apps
