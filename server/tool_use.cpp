#include "server/tool_use.h"

#include <fmt/format.h>

#include "chat/tool_calls.h"

namespace tandem::server {

using ojson = nlohmann::ordered_json;

Result<ToolCallFormat> tool_format_for(const ParsedRequest& pr, const ChatTemplate& chat, const Vocab* vocab) {
  ToolCallFormat f = detect_tool_call_format(chat.source(), vocab);
  if (pr.tools_active() && !f.accepts_tools)
    return make_error("the model's chat template does not accept tools (it never reads a 'tools' variable); "
                      "serve it with a template that does (--chat-template-file), or send tool_choice \"none\"");
  return f;
}

Result<RenderedPrompt> render_chat_prompt(const ChatTemplate& chat, const ParsedRequest& pr, bool add_generation_prompt) {
  const ojson vars = pr.tools_active() ? ojson{{"tools", pr.tools}} : ojson::object();
  return chat.render_json(messages_for_template(pr.messages), add_generation_prompt, &vars);
}

Status add_tool_call_constraint(ParsedRequest* pr, ToolCallFamily family, const SchemaToGbnf& schema_to_gbnf) {
  if (!pr->tool_call_forced()) return Status::Ok();
  std::vector<ToolGrammarFunction> fns;
  std::string rules;
  for (const auto& t : pr->tools) {
    const ojson& fn = t["function"];
    const std::string name = fn["name"].get<std::string>();
    if (pr->tool_choice == ParsedRequest::ToolChoice::Function && name != pr->tool_choice_function) continue;
    const std::string prefix = fmt::format("fn{}-", fns.size());
    fns.push_back({name, prefix + "root"});
    if (!fn.contains("parameters") || fn["parameters"].is_null()) {  // a function without parameters takes {}
      rules += prefix + "root ::= \"{}\"\n";
      continue;
    }
    auto g = schema_to_gbnf(fn["parameters"], prefix);
    if (!g.ok()) return make_error("function '{}': its parameters cannot constrain a call: {}", name, g.error().message);
    rules += g.value();
    if (!rules.empty() && rules.back() != '\n') rules += '\n';
  }
  pr->constraint.kind = ParsedRequest::OutputConstraint::Kind::Gbnf;
  // A named function is one call to it (OpenAI's forced function); "required" is one or more
  // calls, when parallel calls are allowed.
  const bool parallel = pr->parallel_tool_calls && pr->tool_choice != ParsedRequest::ToolChoice::Function;
  pr->constraint.gbnf = tool_call_gbnf(family, fns, parallel) + rules;
  pr->constraint.name = "tool_choice";
  return Status::Ok();
}

std::vector<int32_t> tool_marker_tokens(const Vocab& vocab, ToolCallFamily family) {
  std::vector<int32_t> ids;
  for (const std::string& m : tool_call_markers(family)) {
    const int32_t id = vocab.find(m);
    if (id >= 0) ids.push_back(id);
  }
  return ids;
}

}  // namespace tandem::server
