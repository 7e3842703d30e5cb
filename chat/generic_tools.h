// Tool calls for models whose chat template has no tools (SmolLM2, Gemma 3, most small and
// older models): the generic format, as llama-server serves them. The tools are described in
// the system message, and the answer is one JSON object, constrained by a grammar:
//   {"tool_call": {"name": "f", "arguments": {...}}}                 one call
//   {"tool_calls": [{"name": "f", "arguments": {...}}, ...]}          several (parallel calls)
//   {"response": "text"}                                              an answer (tool_choice auto)
// The conversation is rendered as plain messages any template reads: a past assistant call as
// the JSON the model would have written, a tool result as a user message naming the call id
// and the function. ToolCallStream (family Generic) turns the answer back into calls or text.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/tool_calls.h"

namespace tandem {

struct GenericToolPrompt {
  const nlohmann::ordered_json* tools = nullptr;  // the request's tools (OpenAI shape)
  std::string forced_function;                    // a named tool_choice: "" for none
  bool required = false;                          // tool_choice "required" (or a named function)
  bool parallel = true;                           // parallel_tool_calls
};

// The request's messages for a template without tools: the tools' description merged into the
// system message (one is added first when there is none), assistant tool calls as their JSON,
// and tool results (consecutive ones joined) as user messages. Every message is {role, content}
// with string content.
nlohmann::ordered_json generic_tool_messages(const nlohmann::ordered_json& messages, const GenericToolPrompt& p);

// GBNF for the answer: calls only (required, named) or a call or a response (auto); one call,
// or up to kMaxParallelCalls with `parallel`. Each function's arguments are the rule
// `args_rule` the caller defines in the same grammar. Rules defined here: "root", "tool-call",
// "generic-*".
std::string generic_tool_gbnf(const std::vector<ToolGrammarFunction>& functions, bool parallel, bool allow_response);

}  // namespace tandem
