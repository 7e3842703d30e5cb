// The OpenAI-compatible HTTP front end (cpp-httplib + nlohmann-json). It only translates:
// JSON requests become token prompts and sampling parameters for the serving loop, whose
// events become JSON responses or SSE chunks. It never schedules.
//   POST /v1/completions, POST /v1/chat/completions (stream or not), GET /v1/models,
//   GET /health, GET /metrics (Prometheus text).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "core/error.h"
#include "model/llama_model.h"
#include "server/metrics.h"
#include "server/serving_loop.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
}

namespace tandem::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0: any free port (see port())
  std::string api_key;                  // when set, /v1/* needs "Authorization: Bearer <key>"
  size_t max_body_bytes = 4u << 20;     // larger bodies get 413
  std::string model_name = "tandem";
  int http_threads = 160;               // each streaming request holds one
};

class HttpServer {
 public:
  HttpServer(const LlamaModel& model, const Tokenizer& tok, const ChatTemplate* chat, ServingLoop& loop, Metrics& metrics,
             ServerOptions opts);
  ~HttpServer();

  Status bind();       // binds host:port (port 0 picks one)
  int port() const { return port_; }
  Status listen();     // serves until stop()
  void stop();

 private:
  void routes();
  const LlamaModel& model_;
  const Tokenizer& tok_;
  const ChatTemplate* chat_;
  ServingLoop& loop_;
  Metrics& metrics_;
  ServerOptions opts_;
  std::unique_ptr<httplib::Server> http_;
  std::mutex tokenizer_mu_;  // the pre-tokenizer reuses match buffers: one encode at a time
  int port_ = 0;
};

}  // namespace tandem::server
