// One /v1/completions or /v1/chat/completions request from body to answer: validation, the
// prompt (template, byte bound, tokens), the engine, and the JSON or SSE answer. Nothing here
// blocks a thread while the engine works: engine events are queued per request and drained
// on a worker thread, and a client that leaves (seen by the transport) cancels its sequence.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/serving_loop.h"
#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tandem::server {

// What every request needs; owned by HttpServer, alive until its workers are joined.
struct EndpointContext {
  const Model& model;
  const Tokenizer& tok;
  const ChatTemplate* chat;  // null: no usable template, chat is refused
  ServingLoop& loop;
  Metrics& metrics;
  std::string model_name;
  std::shared_ptr<WorkQueue> work;
  size_t longest_token_bytes = 1;  // a prompt of more than this x context bytes is past the context
  // Chat: control-token text inside message content stays text unless this is set (see
  // tokenizer/rendered_prompt.h); completions prompts are the caller's own and parse it.
  bool allow_special_in_messages = false;
};

// On a worker thread. `extra` fields go on every response (CORS).
void run_completion(EndpointContext& ctx, bool chat, const HttpRequest& req, std::shared_ptr<ResponseWriter> w, HttpHeaders extra);

// The longest byte string any token stands for (special tokens included).
size_t longest_token_bytes(const Tokenizer& tok);

}  // namespace tandem::server
