#include "server/tool_use.h"

#include <fmt/format.h>

#include "chat/generic_tools.h"
#include "chat/harmony_tools.h"
#include "chat/tool_calls.h"

namespace tandem::server {

using ojson = nlohmann::ordered_json;

Result<ToolFormatMode> parse_tool_format_mode(std::string_view name) {
  if (name == "auto") return ToolFormatMode::Auto;
  if (name == "template") return ToolFormatMode::Template;
  if (name == "generic") return ToolFormatMode::Generic;
  return make_error("--tool-format takes auto, template or generic, not '{}'", name);
}

Result<ToolCallFormat> tool_format_for(const ParsedRequest& pr, const ChatTemplate& chat, const Vocab* vocab, ToolFormatMode mode) {
  ToolCallFormat f = detect_tool_call_format(chat.source(), vocab);
  if (!pr.tools_active()) return f;
  if (mode == ToolFormatMode::Generic || (mode == ToolFormatMode::Auto && !f.accepts_tools)) {
    f.family = ToolCallFamily::Generic;
    return f;
  }
  if (!f.accepts_tools)
    return make_error("the model's chat template does not accept tools (it never reads a 'tools' variable) and this "
                      "server uses only the template's format (--tool-format template); serve it with --tool-format "
                      "auto or generic, or a template that reads tools (--chat-template-file), or send tool_choice \"none\"");
  return f;
}

Result<RenderedPrompt> render_chat_prompt(const ChatTemplate& chat, const ParsedRequest& pr, bool add_generation_prompt,
                                          ToolCallFamily family) {
  if (family == ToolCallFamily::Generic && pr.tools_active()) {
    GenericToolPrompt p;
    p.tools = &pr.tools;
    p.required = pr.tool_call_forced();
    p.forced_function = pr.tool_choice == ParsedRequest::ToolChoice::Function ? pr.tool_choice_function : "";
    p.parallel = pr.parallel_tool_calls;
    const ojson vars = pr.reasoning_effort.empty() ? ojson::object() : ojson{{"reasoning_effort", pr.reasoning_effort}};
    return chat.render_json(generic_tool_messages(pr.messages, p), add_generation_prompt, &vars);
  }
  ojson vars = pr.tools_active() ? ojson{{"tools", pr.tools}} : ojson::object();
  if (!pr.reasoning_effort.empty()) vars["reasoning_effort"] = pr.reasoning_effort;
  return chat.render_json(messages_for_template(pr.messages), add_generation_prompt, &vars);
}

Status check_template_fields(const ChatTemplate& chat, const ParsedRequest& pr) {
  if (!pr.reasoning_effort.empty() && !template_reads_variable(chat.source(), "reasoning_effort"))
    return make_error("'reasoning_effort' is not supported by this model's chat template (it never reads it)");
  return Status::Ok();
}

Status add_tool_call_constraint(ParsedRequest* pr, ToolCallFamily family, const SchemaToGbnf& schema_to_gbnf,
                                bool harmony) {
  const bool generic = family == ToolCallFamily::Generic && pr->tools_active();
  if (!pr->tool_call_forced() && !generic) return Status::Ok();
  if (generic && pr->constraint.kind != ParsedRequest::OutputConstraint::Kind::None)
    return make_error("tools on this model are served in the generic format, whose answer is already constrained "
                      "(a call or a response): they cannot be combined with '{}'", pr->constraint.name);
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
  const std::string calls = generic   ? generic_tool_gbnf(fns, parallel, !pr->tool_call_forced())
                            : harmony ? harmony_tool_call_gbnf(fns)
                                      : tool_call_gbnf(family, fns, parallel);
  pr->constraint.gbnf = calls + rules;
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
