// One /v1/completions or /v1/chat/completions request from body to answer: validation, the
// prompt (template, byte bound, tokens), the engine, and the JSON or SSE answer. Nothing here
// blocks a thread while the engine works: engine events are queued per request and drained
// on a worker thread, and a client that leaves (seen by the transport) cancels its sequence.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "server/access_policy.h"
#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/serving_loop.h"
#include "server/tool_use.h"
#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tandem::server {

// Which requests share cached prompt blocks (the engine's cache scopes, kv/block_allocator.h):
// Global: all of them; Key: those presenting the same API key (a server with none is one
// tenant, as Global); Request: none (a request reuses only its own blocks, after a preemption).
// Under Global and Key, a request's "cache_salt" narrows sharing to requests with the same salt.
enum class PrefixCacheScope { Global, Key, Request };
Result<PrefixCacheScope> parse_prefix_cache_scope(std::string_view name);
// The scope name the engine keys its prefix cache by ("" is the shared one). `api_key`: the key
// the request presented, "" on a server without keys.
std::string cache_scope_for(PrefixCacheScope scope, std::string_view api_key, std::string_view salt);

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
  PrefixCacheScope cache_scope = PrefixCacheScope::Key;
  bool keyed = false;  // the server has API keys (Key scope tells tenants apart by them)
  // Set while the server drains: a request the engine ends for shutdown is answered 503.
  const std::atomic<bool>* draining = nullptr;
  // Who presented which key: a request's tenant, for its metrics and fair scheduling.
  const AccessPolicy* access = nullptr;
  // Which format serves tool calls (`--tool-format`): the template's, or the generic one.
  ToolFormatMode tool_format = ToolFormatMode::Auto;
};

struct PreparedRequest;
class AnswerWire;

// On a worker thread. `extra` fields go on every response (CORS).
void run_completion(EndpointContext& ctx, bool chat, const HttpRequest& req, std::shared_ptr<ResponseWriter> w, HttpHeaders extra);

// Submits a request made ready (server/request_prompt.h); its answer goes out through `wire`
// (the endpoint's API). `tenant`: the request's API key's tenant.
void start_completion(EndpointContext& ctx, PreparedRequest&& p, std::unique_ptr<AnswerWire> wire, std::shared_ptr<ResponseWriter> w,
                      HttpHeaders extra, const std::string& tenant);

// The longest byte string any token stands for (special tokens included).
size_t longest_token_bytes(const Tokenizer& tok);

}  // namespace tandem::server
