// A /v1/completions or /v1/chat/completions body made ready for the engine, before anything
// is queued: validated, rendered (tools in the template's format or the generic one),
// measured against the context, tokenized, and its constraint compiled. A request that cannot
// run is a Rejection (a 400 naming the field) and costs the engine nothing.
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "chat/tool_calls.h"
#include "engine/scheduler.h"
#include "server/completion_run.h"
#include "server/http_transport.h"
#include "server/openai_request.h"

namespace tandem::server {

// How a chat answer with tools active is read: the family's parser, and the marker tokens
// rendered as text for it.
struct ToolOutput {
  ToolCallFamily family = ToolCallFamily::Hermes;
  std::vector<int32_t> marker_tokens;
};

struct PreparedRequest {
  ParsedRequest pr;
  RequestParams params;                 // what the scheduler runs (its tenant set)
  std::optional<ToolOutput> tools;      // tools active: how the answer is read
  HttpHeaders headers;                  // fields for the answer (X-Tandem-Tool-Format)
  int n_prompt = 0;
};

struct Rejection {
  int status = 400;
  std::string message, param;
};

// On a worker thread (templates render, schemas compile and prompts tokenize here, not on the
// engine's thread). `tenant`: the request's API key's tenant ("" without keys).
std::variant<PreparedRequest, Rejection> prepare_request(EndpointContext& ctx, bool chat, const HttpRequest& req,
                                                         const std::string& tenant);

// The same for a request already parsed: the Responses and Messages endpoints translate theirs
// into a chat request (a Rejection's param then names the chat request's field).
std::variant<PreparedRequest, Rejection> prepare_parsed(EndpointContext& ctx, ParsedRequest pr, const HttpRequest& req,
                                                        const std::string& tenant);

// The request parameter a constraint came from (OutputConstraint::name: a schema's name,
// "json_object", "grammar" or "tool_choice").
std::string constraint_param(const std::string& name);

}  // namespace tandem::server
