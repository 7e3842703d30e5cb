#include "server/http_server.h"

#include <ctime>
#include <thread>

#include "server/anthropic_messages.h"
#include "server/chat_page.h"
#include "server/embeddings.h"
#include "server/openai_json.h"
#include "server/responses_api.h"
#include "server/token_endpoints.h"

namespace tandem::server {

namespace {

// The transport's limits as this server uses them: its body cap, and with API keys (tenants who
// may share nothing else), a cap per client address unless one was set.
HttpLimits transport_limits(HttpLimits l, size_t max_body, bool keyed) {
  l.max_body_bytes = max_body;
  if (keyed && l.max_connections_per_peer == 0) l.max_connections_per_peer = std::max(1, l.max_connections / 2);
  return l;
}

enum class Route {
  Unknown, Health, Metrics, Models, Completions, Chat, Responses, StoredResponse, Messages, Embeddings, Tokenize, Detokenize, ApplyTemplate, Page, Preflight
};

Route route(const HttpRequest& r) {
  const std::string_view p = r.path();
  if (r.method == "OPTIONS") return Route::Preflight;
  if (p == "/health") return Route::Health;
  if (p == "/metrics") return Route::Metrics;
  if (p == "/v1/models") return Route::Models;
  if (p == "/v1/completions") return Route::Completions;
  if (p == "/v1/chat/completions") return Route::Chat;
  if (p == "/v1/responses") return Route::Responses;
  if (p == "/v1/messages") return Route::Messages;
  if (p == "/v1/embeddings") return Route::Embeddings;
  if (p.size() > 14 && p.substr(0, 14) == "/v1/responses/" && p.find('/', 14) == std::string_view::npos) return Route::StoredResponse;
  if (p == "/tokenize") return Route::Tokenize;
  if (p == "/detokenize") return Route::Detokenize;
  if (p == "/apply-template") return Route::ApplyTemplate;
  if (is_chat_page_path(p)) return Route::Page;
  return Route::Unknown;
}

// Counts a request as in flight from its handler's start until its answer is handed to the
// transport (respond, or the end of a stream), so drain() knows when every answer is out.
class TrackedWriter : public ResponseWriter {
 public:
  TrackedWriter(std::shared_ptr<ResponseWriter> w, std::shared_ptr<std::atomic<int64_t>> count) : w_(std::move(w)), count_(std::move(count)) {
    ++*count_;
  }
  ~TrackedWriter() override { done(); }
  void respond(HttpResponse r) override {
    w_->respond(std::move(r));
    done();
  }
  void begin_stream(int status, std::string content_type, HttpHeaders headers) override {
    w_->begin_stream(status, std::move(content_type), std::move(headers));
  }
  void write(std::string chunk) override { w_->write(std::move(chunk)); }
  void end_stream() override {
    w_->end_stream();
    done();
  }
  bool gone() const override { return w_->gone(); }
  void on_gone(std::function<void()> f) override { w_->on_gone(std::move(f)); }

 private:
  void done() {
    if (!done_.exchange(true)) --*count_;
  }
  std::shared_ptr<ResponseWriter> w_;
  std::shared_ptr<std::atomic<int64_t>> count_;
  std::atomic<bool> done_{false};
};

bool is_post(Route r) {
  return r == Route::Completions || r == Route::Chat || r == Route::Responses || r == Route::Messages || r == Route::Embeddings || r == Route::Tokenize || r == Route::Detokenize ||
         r == Route::ApplyTemplate;
}
bool method_fits(Route r, std::string_view method) {
  if (r == Route::StoredResponse) return method == "GET" || method == "DELETE";
  return method == (is_post(r) ? "POST" : "GET");
}
const char* method_of(Route r) { return r == Route::StoredResponse ? "GET or DELETE" : is_post(r) ? "POST" : "GET"; }

}  // namespace

HttpServer::HttpServer(const Model& model, const Tokenizer& tok, const ChatTemplate* chat, ServingLoop& loop, Metrics& metrics,
                       ServerOptions opts)
    : opts_(std::move(opts)),
      metrics_(metrics),
      access_(AccessOptions{opts_.api_keys, opts_.operator_keys, opts_.host, opts_.port, opts_.allowed_origins,
                            opts_.allowed_hosts}),
      responses_(opts_.responses_store_bytes),
      transport_(*this, transport_limits(opts_.limits, opts_.max_body_bytes, access_.keyed()), opts_.io_threads,
                 opts_.worker_threads),
      ctx_{model, tok, chat, loop, metrics, opts_.model_name, transport_.work_queue(), longest_token_bytes(tok),
           opts_.allow_special_in_messages, opts_.prefix_cache_scope, access_.keyed(), &draining_, &access_,
           opts_.tool_format} {}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::bind() {
  TANDEM_TRY(transport_.bind(opts_.host, opts_.port));
  access_.set_port(transport_.port());
  return Status::Ok();
}

void HttpServer::start() { transport_.start(); }

Status HttpServer::listen() {
  start();
  std::unique_lock<std::mutex> l(stop_mu_);
  stop_cv_.wait(l, [&] { return stopped_; });
  return Status::Ok();
}

void HttpServer::drain(std::chrono::milliseconds timeout, const std::function<bool()>& interrupted) {
  draining_ = true;
  using clock = std::chrono::steady_clock;
  auto wait_until = [&](clock::time_point deadline) {
    while (in_flight_->load() > 0 && clock::now() < deadline && !interrupted())
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return in_flight_->load() == 0;
  };
  if (!wait_until(clock::now() + timeout) && !interrupted()) {
    ctx_.loop.abort_all("the server is shutting down (its drain timeout passed)");
    wait_until(clock::now() + std::chrono::seconds(5));
  }
  // The last answers are handed over; give the io threads a moment to write them out.
  if (!interrupted()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

void HttpServer::stop() {
  transport_.stop();
  std::lock_guard<std::mutex> l(stop_mu_);
  stopped_ = true;
  stop_cv_.notify_all();
}

HttpResponse HttpServer::error(int status, const std::string& message, const std::string& type, const HttpRequest& r) {
  if (status >= 400 && status < 500) metrics_.request_rejected();
  // Anthropic's clients read their own error shape (its types: anthropic_error).
  const ojson body = route(r) == Route::Messages ? anthropic_error(message, status == 404 ? "not_found_error" : type) : error_body(message, type);
  return {status, "application/json", dump_json(body), access_.cors_headers(r)};
}

std::optional<HttpResponse> HttpServer::check_header(const HttpRequest& r) {
  const Route rt = route(r);
  if (rt == Route::Unknown) return error(404, fmt::format("no such endpoint: {} {}", r.method, r.path()), "invalid_request_error", r);
  if (rt == Route::Health)  // open to any monitor, but only to read
    return r.method == "GET" || r.method == "HEAD" ? std::nullopt
                                                   : std::optional(error(405, "/health needs GET", "invalid_request_error", r));
  if (is_post(rt))
    if (auto failed = ctx_.loop.backend_failure())
      return error(503, "the model's backend failed and cannot compute until the server restarts: " + *failed,
                   "service_unavailable", r);
  if (const Collectives* ranks = ctx_.model.collectives(); ranks && ranks->failed() && is_post(rt)) {
    // A tensor-parallel peer is gone: no pass can run again, so nothing waits for one.
    HttpResponse refusal = error(503, ranks->error(), "service_unavailable", r);
    return refusal;
  }
  if (draining_ && is_post(rt)) {
    HttpResponse refusal = error(503, "the server is shutting down; retry on another instance", "service_unavailable", r);
    refusal.headers.emplace_back("Retry-After", "5");
    return refusal;
  }
  if (rt != Route::Preflight && !method_fits(rt, r.method))
    return error(405, fmt::format("{} needs {}", r.path(), method_of(rt)), "invalid_request_error", r);
  // The page is open (it holds nothing; its API calls carry the key), but Host and Origin are
  // still checked: a rebinding page must not read it from this origin either.
  const bool needs_key = rt != Route::Preflight && rt != Route::Page;
  if (auto refusal = access_.check(r, needs_key)) return error(refusal->status, refusal->message, refusal->type, r);
  if (rt == Route::Preflight && access_.cors_headers(r).empty())
    return error(403, "cross-origin requests are not allowed (start the server with --allow-origin ORIGIN)", "permission_error", r);
  return std::nullopt;
}

bool HttpServer::privileged(const HttpRequest& r) {
  if (route(r) == Route::Health) return true;  // a monitor must always get its answer
  return access_.keyed() && access_.match_key(r).known;
}

// Disaggregated serving: every role and whether it answers. Degraded (200) while a prefill rank
// is up and some rank is down; 503 when no prefill rank is up (no prompt can be computed).
// Rank 0 routes and decodes: while it answers, a decode rank is up.
HttpResponse HttpServer::role_health(const RouterStats& routed) {
  ojson roles = ojson::array(), down = ojson::array();
  bool any_up = false;
  auto add = [&](const char* name, int rank, bool up, const std::string& why) {
    ojson role{{"role", name}, {"rank", rank}, {"up", up}};
    if (!up) role["error"] = why, down.push_back(role);
    roles.push_back(role);
  };
  for (const DecodeRankState& d : routed.decoders) add(d.rank == 0 ? "router+decode" : "decode", d.rank, d.up, d.why_down);
  for (const PrefillRankState& p : routed.ranks) add("prefill", p.rank, p.up, p.why_down), any_up = any_up || p.up;
  const char* status = !any_up ? "unhealthy" : down.empty() ? "ok" : "degraded";
  return HttpResponse{any_up ? 200 : 503, "application/json",
                      dump_json(ojson{{"status", status}, {"roles", roles}, {"roles_down", down}}), {}, false};
}

std::optional<HttpResponse> HttpServer::answer_inline(const HttpRequest& r) {
  switch (route(r)) {
    case Route::Health:  // 503 while draining: a load balancer stops sending here
      if (draining_) return HttpResponse{503, "application/json", R"({"status":"draining"})", {{"Retry-After", "5"}}, false};
      if (auto failed = ctx_.loop.backend_failure())  // a device fault: send no more work here
        return HttpResponse{503, "application/json", dump_json(ojson{{"status", "unhealthy"}, {"error", *failed}}), {}, false};
      if (const Collectives* ranks = ctx_.model.collectives(); ranks && ranks->failed())
        return HttpResponse{503, "application/json", R"({"status":"a tensor-parallel rank failed"})", {}, false};
      if (auto routed = ctx_.loop.router_stats()) return role_health(*routed);
      return HttpResponse{200, "application/json", R"({"status":"ok"})", {}, false};
    case Route::Metrics: {  // a tenant sees its own requests; the server-wide view is an operator's
      // A server with one API key (or none) has one tenant: its view is the whole server's (the
      // chat page's KV view reads the pool's gauges there).
      const KeyMatch key = access_.match_key(r);
      const bool whole = opts_.api_keys.size() <= 1 || key.operator_key;
      return HttpResponse{200, "text/plain; version=0.0.4", whole ? metrics_.render() : metrics_.render_tenant(key.tenant),
                          access_.cors_headers(r), false};
    }
    case Route::Models: {
      const ojson j = {{"object", "list"},
                       {"data", ojson::array({{{"id", opts_.model_name}, {"object", "model"}, {"created", (int64_t)std::time(nullptr)},
                                               {"owned_by", "tandem"}}})}};
      return HttpResponse{200, "application/json", dump_json(j), access_.cors_headers(r), false};
    }
    case Route::Page:
      return chat_page_file(r.path());
    case Route::Preflight: {
      HttpHeaders h = access_.cors_headers(r);
      h.emplace_back("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
      h.emplace_back("Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key, anthropic-version");
      h.emplace_back("Access-Control-Max-Age", "600");
      return HttpResponse{200, "text/plain", "", h, false};
    }
    default:
      return std::nullopt;
  }
}

void HttpServer::handle(HttpRequest r, std::shared_ptr<ResponseWriter> plain) {
  auto w = std::make_shared<TrackedWriter>(std::move(plain), in_flight_);
  const HttpHeaders extra = access_.cors_headers(r);
  try {
    switch (const Route rt = route(r)) {
      case Route::Tokenize:
        return w->respond(run_token_endpoint(TokenEndpoint::Tokenize, ctx_, r, extra));
      case Route::Detokenize:
        return w->respond(run_token_endpoint(TokenEndpoint::Detokenize, ctx_, r, extra));
      case Route::ApplyTemplate:
        return w->respond(run_token_endpoint(TokenEndpoint::ApplyTemplate, ctx_, r, extra));
      case Route::Responses:
        return run_responses(ctx_, responses_, r, w, extra);
      case Route::StoredResponse:
        return w->respond(stored_response(ctx_, responses_, r, extra));
      case Route::Messages:
        return run_messages(ctx_, r, w, extra);
      case Route::Embeddings:
        return run_embeddings(ctx_, r, w, extra);
      default:
        run_completion(ctx_, rt == Route::Chat, r, w, extra);
    }
  } catch (const std::exception& e) {  // no exception leaves a handler
    w->respond({500, "application/json", dump_json(error_body(fmt::format("internal error: {}", e.what()), "server_error")), extra});
  }
}

}  // namespace tandem::server
