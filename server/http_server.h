// The OpenAI-compatible server: the HTTP transport (server/http_transport.h) plus the routes.
// It only translates: JSON requests become token prompts and sampling parameters for the
// serving loop, whose events become JSON responses or SSE chunks. It never schedules.
//   POST /v1/completions, POST /v1/chat/completions (stream or not), GET /v1/models,
//   GET /health (always open), GET /metrics (Prometheus text; behind the API key when set),
//   llama-server's POST /tokenize, /detokenize, /apply-template (server/token_endpoints.h; behind
//   the key), and the chat page at GET / (server/chat_page.h; open, its API calls need the key).
#pragma once

#include <condition_variable>
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
#include "server/serving_loop.h"
#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tandem::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (see port())
  std::string api_key;                // when set, /v1/* and /metrics need "Authorization: Bearer <key>"
  size_t max_body_bytes = 4u << 20;   // larger bodies get 413 (copied into limits)
  std::string model_name = "tandem";
  int io_threads = 2;                 // sockets (async: idle and slow connections hold none)
  int worker_threads = 4;             // parsing, templates, tokenizing, formatting answers
  HttpLimits limits;                  // deadlines, header/connection limits
  std::vector<std::string> allowed_origins;  // cross-origin pages allowed to call the API
  std::vector<std::string> allowed_hosts;    // Host names served besides the bound address and localhost
  bool allow_special_in_messages = false;    // message text may write control tokens (role forgery)
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

  std::optional<HttpResponse> check_header(const HttpRequest& r) override;
  std::optional<HttpResponse> answer_inline(const HttpRequest& r) override;
  void handle(HttpRequest r, std::shared_ptr<ResponseWriter> w) override;

 private:
  HttpResponse error(int status, const std::string& message, const std::string& type, const HttpRequest& r);

  ServerOptions opts_;
  Metrics& metrics_;
  AccessPolicy access_;
  HttpTransport transport_;
  EndpointContext ctx_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopped_ = false;
};

}  // namespace tandem::server
