// The OpenAI-compatible server: the HTTP transport (server/http_transport.h) plus the routes.
// It only translates: JSON requests become token prompts and sampling parameters for the
// serving loop, whose events become JSON responses or SSE chunks. It never schedules.
//   POST /v1/completions, POST /v1/chat/completions (stream or not), GET /v1/models,
//   POST /v1/responses and GET/DELETE /v1/responses/{id} (server/responses_api.h), POST
//   /v1/messages (Anthropic's; server/anthropic_messages.h), POST /v1/embeddings (server/embeddings.h),
//   GET /health (always open), GET /metrics (Prometheus text; behind the API key when set),
//   llama-server's POST /tokenize, /detokenize, /apply-template (server/token_endpoints.h; behind
//   the key), and the chat page at GET / (server/chat_page.h; open, its API calls need the key).
//
// Graceful drain (drain()): new work gets 503 + Retry-After and /health answers 503
// {"status":"draining"} (a load balancer stops sending), while the requests already in the
// engine finish; past the deadline the rest end with an error event and [DONE] (a 503 when not
// streamed). Then stop().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/model.h"
#include "server/access_policy.h"
#include "server/completion_run.h"
#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/responses_store.h"
#include "server/serving_loop.h"
#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tandem::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (see port())
  // When set, /v1/*, /metrics and the token endpoints need "Authorization: Bearer <one of them>";
  // each key is a tenant for --prefix-cache-scope key.
  std::vector<std::string> api_keys;
  // Keys that also read the server-wide /metrics (with api_keys, a key's /metrics shows only
  // its own requests).
  std::vector<std::string> operator_keys;
  PrefixCacheScope prefix_cache_scope = PrefixCacheScope::Key;
  size_t max_body_bytes = 4u << 20;   // larger bodies get 413 (copied into limits)
  std::string model_name = "tandem";
  int io_threads = 2;                 // sockets (async: idle and slow connections hold none)
  int worker_threads = 4;             // parsing, templates, tokenizing, formatting answers
  HttpLimits limits;                  // deadlines, header/connection limits
  std::vector<std::string> allowed_origins;  // cross-origin pages allowed to call the API
  std::vector<std::string> allowed_hosts;    // Host names served besides the bound address and localhost
  bool allow_special_in_messages = false;    // message text may write control tokens (role forgery)
  ToolFormatMode tool_format = ToolFormatMode::Auto;  // tool calls: the template's format or the generic one
  size_t responses_store_bytes = 64u << 20;  // the Responses API's stored answers (responses_store.h)
};

class HttpServer : public HttpHandler {
 public:
  HttpServer(const Model& model, const Tokenizer& tok, const ChatTemplate* chat, ServingLoop& loop, Metrics& metrics,
             ServerOptions opts);
  ~HttpServer() override;

  Status bind();  // binds host:port (port 0 picks one)
  int port() const { return transport_.port(); }
  void start();    // serves on background threads; returns at once
  Status listen(); // start(), then serves until stop()
  // Closes the listener and every connection (never waiting on a client), joins all threads.
  // Not for signal handlers: call it from a thread.
  void stop();
  // Stops admitting work and waits up to `timeout` for the requests in flight to be answered;
  // those still running then end with "the server is shutting down". Returns once every answer
  // is handed to the transport, or early when `interrupted` says so (a second signal).
  void drain(std::chrono::milliseconds timeout, const std::function<bool()>& interrupted);
  bool draining() const { return draining_.load(); }

  std::optional<HttpResponse> check_header(const HttpRequest& r) override;
  HttpResponse role_health(const RouterStats& routed);
  std::optional<HttpResponse> answer_inline(const HttpRequest& r) override;
  bool privileged(const HttpRequest& header_only) override;
  void handle(HttpRequest r, std::shared_ptr<ResponseWriter> w) override;

 private:
  HttpResponse error(int status, const std::string& message, const std::string& type, const HttpRequest& r);

  ServerOptions opts_;
  Metrics& metrics_;
  AccessPolicy access_;
  ResponsesStore responses_;
  HttpTransport transport_;
  EndpointContext ctx_;
  std::atomic<bool> draining_{false};
  std::shared_ptr<std::atomic<int64_t>> in_flight_ = std::make_shared<std::atomic<int64_t>>(0);  // answers not yet handed over
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopped_ = false;
};

}  // namespace tandem::server
