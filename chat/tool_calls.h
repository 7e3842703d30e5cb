// Tool calls in the formats chat models write them, and back to OpenAI's shape.
//
// Families (what the model writes when it calls a function):
//   Hermes  (Qwen 2.5/3, Hermes, most ChatML tool templates):
//           <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   (one block per call)
//   Llama3  (Llama 3.1/3.2/3.3): {"name": "f", "parameters": {...}} as the whole answer, or
//           after <|python_tag|>; several calls separated by ';' or whitespace
//   Mistral (Mistral v0.3, Nemo, Small): [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]
//           or, in newer templates, [TOOL_CALLS]f[ARGS]{...} per call (parsed; a forced call
//           is written in the first form)
// The family is read from the chat template (the markers it writes when it renders a past
// call), else from the vocabulary's tokens; a template that takes tools but names no known
// marker is taken as Hermes, the most common convention.
//
// Parsing is forgiving of what small models write and never throws: a call whose JSON does
// not parse, has no string "name", or whose arguments are not an object stays in the text.
// "arguments" and "parameters" are accepted in every family; a call without either has {}.
#pragma once

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/vocab.h"

namespace tandem {

// Generic: no format of the template's own (it reads no tools); chat/generic_tools.h.
enum class ToolCallFamily { Hermes, Llama3, Mistral, Generic };

const char* tool_call_family_name(ToolCallFamily f);

struct ToolCallFormat {
  bool accepts_tools = false;  // the template reads a `tools` variable
  ToolCallFamily family = ToolCallFamily::Hermes;
};

// Whether `name` is used as a variable inside the template's {{ }} / {% %} blocks (string
// literals and comments do not count).
bool template_reads_variable(std::string_view source, std::string_view name);
// `vocab` may be null (the template alone decides).
ToolCallFormat detect_tool_call_format(std::string_view template_source, const Vocab* vocab);

// The marker strings the family's calls begin with. Some are control tokens (Llama's
// <|python_tag|>, Mistral's [TOOL_CALLS]) whose text a detokenizer drops by default: the
// server renders these tokens as text so that the parser sees them.
std::vector<std::string> tool_call_markers(ToolCallFamily f);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object as compact text, as OpenAI returns it
};

// {"name": "f", "arguments" | "parameters": {...} or "{...}"} -> a call; false when malformed.
bool tool_call_from_json(const nlohmann::ordered_json& j, ToolCall* call);

// The model's output split into the text outside calls and the calls, in order. Whitespace
// next to a call is dropped (content is "" when the answer was only calls).
struct ToolCallOutput {
  std::string content;
  std::vector<ToolCall> calls;
};

// Incremental parsing for streaming: push() returns the text that is now certainly not part
// of a call, and the calls completed so far. Text that may still be the start of a call (a
// partial marker, an open call, Llama's leading '{') is held until it is decided. The pieces
// from any split of the same text join to what parse_tool_calls() returns for the whole.
class ToolCallStream {
 public:
  // After `max_calls` calls everything else is dropped (parallel_tool_calls: false -> 1).
  explicit ToolCallStream(ToolCallFamily family, size_t max_calls = SIZE_MAX);
  ToolCallOutput push(std::string_view text);
  // At the end of generation: what was held back, an unterminated last call included when
  // its JSON is complete.
  ToolCallOutput finish();
  bool saturated() const { return n_calls_ >= max_calls_; }
  size_t calls_so_far() const { return n_calls_; }

 private:
  enum class Step { NeedMore, Calls, Text };
  struct Segment {
    Step step = Step::NeedMore;
    size_t length = 0;  // bytes of buf_ it covers
    std::vector<ToolCall> calls;
  };
  void process(bool final, ToolCallOutput* out);
  void emit_text(std::string_view s, ToolCallOutput* out);
  void add_calls(std::vector<ToolCall> calls, ToolCallOutput* out);
  Segment marker_segment(bool final) const;
  Segment bare_json_segment(bool final) const;
  Segment mistral_args_segment(bool final) const;
  void process_generic(bool final, ToolCallOutput* out);  // chat/generic_tools.cpp
  void add_generic_calls(std::vector<ToolCall> calls, ToolCallOutput* out);
  bool generic_decide(bool final);
  void generic_response_text(bool final, ToolCallOutput* out);
  bool generic_call_object(bool final, ToolCallOutput* out);
  enum class GenericState { Undecided, InResponse, CallObject, Text, Done };
  GenericState generic_ = GenericState::Undecided;
  std::set<std::string> generic_seen_;  // name + '\0' + arguments of the calls returned

  ToolCallFamily family_;
  size_t max_calls_;
  size_t n_calls_ = 0;
  std::string buf_;     // undecided text
  std::string ws_;      // whitespace held: dropped if a call follows
  bool after_call_ = false;  // drop the whitespace (and Llama's ';') that follows a call
  bool bare_json_ok_;        // Llama: a '{' here may start a call (at the start, after a call)
};

ToolCallOutput parse_tool_calls(ToolCallFamily family, std::string_view text, size_t max_calls = SIZE_MAX);

// An id for a call: Mistral's templates require 9 alphanumerics; others get "call_" + 24.
std::string make_tool_call_id(ToolCallFamily family, std::mt19937_64& rng);

// OpenAI messages as chat templates expect them: a tool call's "arguments" (a JSON string in
// the API) becomes the object it encodes, since templates write it with `| tojson`. Arguments
// that are not a JSON object stay a string. An earlier answer's "reasoning_content" is also its
// "thinking" (gpt-oss's template reads that name).
nlohmann::ordered_json messages_for_template(const nlohmann::ordered_json& messages);

// GBNF text for output that is a call (or, with `parallel`, one to kMaxParallelCalls calls) in the family's
// format, to one of `functions`; each function's arguments are the rule `args_rule` the caller
// defines elsewhere in the same grammar (e.g. from a JSON Schema). Rules defined here: "root",
// "tool-call". Function names must already be valid (letters, digits, '_', '-').
struct ToolGrammarFunction {
  std::string name;
  std::string args_rule;
};
constexpr int kMaxParallelCalls = 8;
std::string tool_call_gbnf(ToolCallFamily family, const std::vector<ToolGrammarFunction>& functions, bool parallel);

// A GBNF string literal ("...", escaped) for `text`.
std::string gbnf_literal(std::string_view text);

}  // namespace tandem
