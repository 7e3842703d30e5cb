// Parsing and validation of OpenAI request bodies into what the engine needs. Every field
// tandem reads is type- and range-checked; a bad one is an error naming it (the server turns
// it into a 400 with an OpenAI error object). Unknown fields are ignored, as OpenAI does.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/sampler.h"
#include "engine/speculative.h"

namespace tandem::server {

struct ParsedRequest {
  bool chat = false;
  std::string prompt;                 // completions: the prompt text
  nlohmann::ordered_json messages;    // chat: the messages array
  nlohmann::ordered_json tools;       // chat: optional tools for the template
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
  std::string error_param;  // which field was wrong, for the error object
};

// `seed_if_absent` is used when the body has no seed (so that unseeded requests differ).
Result<ParsedRequest> parse_request(const nlohmann::ordered_json& body, bool chat, uint64_t seed_if_absent, std::string* bad_param);

}  // namespace tandem::server
