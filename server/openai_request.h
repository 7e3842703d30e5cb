// Parsing and validation of OpenAI request bodies into what the engine needs. Every field
// tandem reads is type- and range-checked; a bad one is an error naming it (the server turns
// it into a 400 with an OpenAI error object).
//
// A field tandem does not honour is never silently ignored: every top-level key is checked
// against the OpenAI fields of its endpoint. Honoured ones are parsed; fields whose default
// changes nothing (frequency_penalty 0, presence_penalty 0, logit_bias {}, store false,
// service_tier "auto", modalities ["text"], best_of 1, echo false; user, metadata,
// prompt_cache_key, safety_identifier, which are informational) are accepted at that value
// only; anything else, unknown fields included, is a 400 "'X' is not supported". A null value
// is the field's default, as in OpenAI's API.
//
// tandem's extensions: "speculative" (below), "ignore_eos" (as vLLM's and llama-server's),
// "grammar": GBNF text the output must follow
// (engine/grammar/gbnf_parser.h; docs/grammars.md), and "cache_salt" (as vLLM's): cached
// prompt blocks are shared only between requests with the same salt (within the server's
// --prefix-cache-scope).
//
// Nested objects are checked the same way: an unknown key at any depth (a per-message
// "temperature", "speculative.draftmax", "response_format.schema") is a 400 whose param is its
// JSON path ("messages[0].temperature"). Every list is capped before work that grows faster
// than its length (tools: 128, unique names checked by hashing; messages: 4096; parts: 256).
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/sampler.h"
#include "engine/speculative.h"

namespace tandem::server {

struct ParsedRequest {
  // What the output must follow; the sampler masks every token that cannot continue it. At
  // most one source per request: response_format, grammar, or a forced tool call.
  struct OutputConstraint {
    enum class Kind { None, JsonObject, JsonSchema, Gbnf } kind = Kind::None;
    nlohmann::ordered_json schema;  // JsonSchema: the schema object
    std::string gbnf;               // Gbnf: grammar text whose entry rule is "root"
    std::string name;               // for messages: the schema's name, "grammar", or "tool_choice"
  };
  // tool_choice: Auto (the model may call), None (tools are not rendered and output is not
  // parsed for calls: the model answers in text), Required (at least one call, constrained),
  // Function (a call to tool_choice_function, constrained).
  enum class ToolChoice { Auto, None, Required, Function };

  bool chat = false;
  std::string prompt;                 // completions: the prompt text
  nlohmann::ordered_json messages;    // chat: the messages array
  nlohmann::ordered_json tools;       // chat: the tools (validated; null when none were given)
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string tool_choice_function;   // ToolChoice::Function: its name (one of `tools`)
  bool parallel_tool_calls = true;    // false: at most one call per answer
  OutputConstraint constraint;
  int max_tokens = 16;
  bool max_tokens_given = false;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with token counts
  bool logprobs = false;
  int top_logprobs = 0;  // completions: logprobs N (0..5); chat: top_logprobs (0..20)
  // tandem's extension "speculative": "lookup" | "draft" | "off" | {"mode": ..., "draft_max": N};
  // unset: the server's --speculative setting. "draft" needs a server started with --draft-model.
  std::optional<SpeculativeParams> speculative;
  std::string cache_salt;   // "" when not given
  // "low" | "medium" | "high" ("" when not given): for templates that read reasoning_effort
  // (gpt-oss's); a template that does not is a 400 (tool_use.h: check_template_fields).
  std::string reasoning_effort;
  // vLLM's and llama-server's "ignore_eos": end-of-generation tokens do not end the answer
  // (it runs to max_tokens or a stop string): benchmarks, and streams of a known length.
  bool ignore_eos = false;
  std::string error_param;  // which field was wrong, for the error object

  // Tools go to the template and the output is parsed for calls.
  bool tools_active() const { return chat && tools.is_array() && !tools.empty() && tool_choice != ToolChoice::None; }
  // tool_choice "required" or a named function: the output is a constrained call.
  bool tool_call_forced() const {
    return tools_active() && (tool_choice == ToolChoice::Required || tool_choice == ToolChoice::Function);
  }
};

// `seed_if_absent` is used when the body has no seed (so that unseeded requests differ).
// `also_allowed`: top-level keys an endpoint reads itself (/apply-template's
// add_generation_prompt), accepted here unread.
Result<ParsedRequest> parse_request(const nlohmann::ordered_json& body, bool chat, uint64_t seed_if_absent, std::string* bad_param,
                                    std::initializer_list<std::string_view> also_allowed = {});

}  // namespace tandem::server
