// Chat requests with tools, between the request and the engine: whether the model's template
// takes tools (a 400 when it cannot), the prompt rendered with them, the constraint a forced
// call follows (tool_choice "required" or a named function), and the control tokens whose text
// the answer's parser must see. The parsing itself is chat/tool_calls.h.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/tool_calls.h"
#include "core/error.h"
#include "server/openai_request.h"

namespace tandem::server {

// Which format serves tool calls (`serve --tool-format`): Auto, the template's own when it
// reads `tools`, else the generic one (chat/generic_tools.h); Template, the template's own or
// a 400; Generic, always the generic one.
enum class ToolFormatMode { Auto, Template, Generic };
Result<ToolFormatMode> parse_tool_format_mode(std::string_view name);

// The format of the request's calls. An error (for the request's 'tools') when tools are
// active, the mode is Template and the template does not read a `tools` variable. `vocab`
// may be null.
Result<ToolCallFormat> tool_format_for(const ParsedRequest& pr, const ChatTemplate& chat, const Vocab* vocab,
                                       ToolFormatMode mode = ToolFormatMode::Auto);

// The chat prompt: messages as templates expect them (tool-call arguments as objects), and
// {"tools": [...]} when tools are active (tool_choice "none" renders none). With the Generic
// family the tools are described in the system message and calls and results are plain turns.
Result<RenderedPrompt> render_chat_prompt(const ChatTemplate& chat, const ParsedRequest& pr, bool add_generation_prompt,
                                          ToolCallFamily family = ToolCallFamily::Hermes);

// Request fields only some templates read: reasoning_effort (gpt-oss's) is an error (for that
// parameter) when the template never reads it.
Status check_template_fields(const ChatTemplate& chat, const ParsedRequest& pr);

// JSON Schema -> GBNF rules named `prefix` + ..., entry `prefix` + "root"
// (grammar::json_schema_to_gbnf; a parameter so that this is testable on its own).
using SchemaToGbnf = std::function<Result<std::string>(const nlohmann::ordered_json& schema, const std::string& prefix)>;

// For a forced call, sets pr->constraint to GBNF for a call in `family`'s format whose
// arguments follow the function's `parameters` (no parameters: {}). One call, or one or more
// when parallel_tool_calls allows (Llama: always one). With `harmony` (gpt-oss's template) the
// call is harmony's, one message to functions.NAME (chat/harmony_tools.h), whatever the family.
// The Generic family is constrained with tool_choice "auto" too: a call or a {"response": ...}.
// An unsupported schema is an error naming the function.
Status add_tool_call_constraint(ParsedRequest* pr, ToolCallFamily family, const SchemaToGbnf& schema_to_gbnf,
                                bool harmony = false);

// Ids of the vocabulary's tokens that spell the family's markers, rendered as text for the parser.
std::vector<int32_t> tool_marker_tokens(const Vocab& vocab, ToolCallFamily family);

}  // namespace tandem::server
