// A POST /v1/messages body (Anthropic's Messages API) as the chat request it asks for:
// `system` (a string or text blocks) and `messages` (text, tool_use, tool_result and thinking
// blocks) become chat messages, `tools` (input_schema) and `tool_choice` (auto, any, tool, none)
// their chat counterparts, and `max_tokens` (required, as Anthropic requires it),
// `stop_sequences`, `temperature`, `top_p` and `top_k` the sampling. The chat request then goes
// through the same parser (openai_request.h) and preparation as /v1/chat/completions; its error
// paths are rewritten into this API's ("messages[1].content[0]").
//
// Every key at every depth is one tandem reads, or accepts where it changes nothing
// (cache_control, metadata.user_id, thinking {"type": "disabled"}): anything else is a 400
// naming its JSON path.
#pragma once

#include <string>

#include "core/error.h"
#include "server/openai_json.h"
#include "server/openai_request.h"

namespace tandem::server {

// `bad`: the failing JSON path.
Result<ParsedRequest> parse_anthropic_request(const ojson& body, uint64_t seed_if_absent, std::string* bad);

// A chat request's field (a Rejection's param after preparation) as this API names it.
std::string anthropic_param(const std::string& chat_param);

}  // namespace tandem::server
