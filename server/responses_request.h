// A POST /v1/responses body (OpenAI's Responses API) as the chat request it asks for: `input`
// (a string, or message, function_call, function_call_output and reasoning items) and
// `instructions` become chat messages, after the conversation of `previous_response_id`;
// function `tools`, `tool_choice`, `text.format`, `max_output_tokens`, `temperature`, `top_p`
// and `reasoning.effort` become their chat counterparts. The chat request then goes through
// the same parser (openai_request.h) and preparation as /v1/chat/completions, so the budgets
// and checks are the same; its error paths are rewritten into this API's ("input[2].content").
//
// Like the chat parser, every key at every depth is one tandem reads or accepts at the value
// that changes nothing (store, metadata, truncation "disabled", ...): anything else is a 400
// naming its JSON path.
#pragma once

#include <string>

#include "core/error.h"
#include "server/openai_json.h"
#include "server/openai_request.h"
#include "server/responses_store.h"

namespace tandem::server {

struct ResponsesRequest {
  ParsedRequest pr;           // the chat request
  ojson conversation;         // its messages without the instructions: kept with the answer
  bool store = true;          // OpenAI's default: the answer is kept for previous_response_id
  // The request's fields a response object repeats (instructions, tools, tool_choice, text,
  // temperature, ...), in OpenAI's shape, with their defaults filled in.
  ojson echo;
};

// `store`: where previous_response_id is looked up (for `tenant` only). `bad`: the failing
// JSON path. An unknown or evicted previous_response_id is an error naming it.
Result<ResponsesRequest> parse_responses_request(const ojson& body, ResponsesStore& store, const std::string& tenant,
                                                 uint64_t seed_if_absent, std::string* bad);

// A chat request's field (a Rejection's param after preparation) as this API names it.
std::string responses_param(const std::string& chat_param);

}  // namespace tandem::server
