// HTTP/1.1 for hostile networks (Boost.Beast on Asio), knowing nothing of OpenAI. Sockets are
// served asynchronously by a few io threads, so idle or slow connections cost memory, not
// threads. Every connection has deadlines (the whole header, the body, keep-alive idleness, each
// write), the header and body limits are enforced while parsing (chunked bodies too), pipelined
// requests are answered in order, and connections past a maximum get a quick 503. A request
// whose framing is uncertain (RFC 9112) is refused and its connection closed, and the answers
// waiting for slow or absent readers are bounded across all connections.
//
// Handlers see a small interface: HttpRequest in, a ResponseWriter out. Work that may take time
// runs on a separate worker pool, never on an io thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace tandem::server {

struct HttpLimits {
  size_t max_header_bytes = 16u << 10;  // request line + fields: 431 past it
  size_t max_header_count = 100;        // fields: 431 past it
  size_t max_body_bytes = 4u << 20;     // decoded body, chunked or not: 413 past it
  // Request bodies held at once, all connections together, from the header until the handler
  // drops the request (a chunked body counts as max_body_bytes): past it, 503. Without it, 1024
  // connections could each hold a 4 MiB body.
  size_t max_inflight_body_bytes = size_t{256} << 20;
  int max_connections = 1024;           // open at once; more get a 503 and are closed
  // The last slots (0: max_connections / 8, at least 1) serve only requests the handler calls
  // privileged (a valid API key, /health), with 1 s to send a header or to idle: an
  // unauthenticated flood that takes every other slot leaves these to tenants and monitors.
  int reserved_connections = 0;
  // The other slots one peer address may hold (0: no cap; `serve` with API keys: half of
  // max_connections). Past it, a peer's connections go to the reserved slots. A proxy in front
  // of the server is one peer: raise it there.
  int max_connections_per_peer = 0;
  int max_pipelined = 8;                // requests read ahead of their answers on one connection
  std::chrono::milliseconds header_timeout{10'000};  // whole header, from its first byte: 408
  std::chrono::milliseconds body_timeout{60'000};    // whole body, from the end of the header: 408
  std::chrono::milliseconds idle_timeout{30'000};    // keep-alive wait for the next request
  std::chrono::milliseconds write_timeout{30'000};   // one write (up to the cap below) unfinished: the client is gone
  size_t max_pending_write_bytes = 1u << 20;         // unsent output past this: the client is gone
  // Answers waiting to be sent, all connections together (whole answers and stream chunks, from
  // the handler's respond() until the socket takes them): past it, new requests get a quick 503
  // with Retry-After before any work, and an answer made meanwhile is replaced by one. Without
  // it, 60 clients that never read could each pin a 21 MB /detokenize answer (1.3 GB).
  size_t max_unsent_answer_bytes = size_t{256} << 20;
  size_t max_answer_bytes = size_t{64} << 20;  // one non-streamed answer: past it, a 500 instead (also bounds the overshoot above)
  // glibc (process-wide, set by start()): allocations from this size up are mapped and unmapped
  // on free. glibc's own threshold grows with the largest block freed (up to 32 MiB), after which
  // freed answers stay in the heap and RSS stays at its peak. 0: leave glibc's.
  size_t malloc_mmap_threshold = 1u << 20;
  // The kernel's send buffer per socket (0: its own autotuning, up to tcp_wmem's 4 MiB). Fixed
  // and modest, it bounds the kernel memory a client that stops reading can pin, and how much
  // output it can swallow before the write deadline notices it.
  int socket_send_buffer = 128 << 10;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // "/v1/completions?x=1"
  int version = 11;    // 10 or 11
  HttpHeaders headers;
  std::string body;
  // The body's share of HttpLimits::max_inflight_body_bytes, given back when the last copy of
  // this request is gone.
  std::shared_ptr<const void> body_budget;
  // The first value of a field (name compared case-insensitively); nullopt when absent.
  std::optional<std::string_view> header(std::string_view name) const;
  std::string_view path() const;  // the target without its query
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  HttpHeaders headers;
  bool close = false;  // Connection: close after this response
};

// Where a handler writes its one response: respond() once, or begin_stream(), write()..., end_stream().
// Any thread may call it; the bytes go out on the connection's own strand. Calls after the
// client left are ignored.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  virtual void respond(HttpResponse r) = 0;
  virtual void begin_stream(int status, std::string content_type, HttpHeaders headers) = 0;
  virtual void write(std::string chunk) = 0;
  virtual void end_stream() = 0;
  // True once the client left (closed, reset, timed out, stopped reading) before the end.
  virtual bool gone() const = 0;
  // Runs `f` once, on an io thread, when the client leaves before the response is complete
  // (at once if it already has). It must not block.
  virtual void on_gone(std::function<void()> f) = 0;
};

class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // On an io thread, once the header is read and before any of the body: a response refuses
  // the request without reading its body (the connection is closed after it).
  virtual std::optional<HttpResponse> check_header(const HttpRequest& header_only) = 0;
  // On an io thread, for a connection in a reserved slot (HttpLimits::reserved_connections):
  // whether this request may use it (an authenticated client, a health check).
  virtual bool privileged(const HttpRequest& header_only) { (void)header_only; return false; }
  // On an io thread: the answer to a cheap request (/health), or nullopt to run handle().
  virtual std::optional<HttpResponse> answer_inline(const HttpRequest& r) = 0;
  // On a worker thread. It may return before answering: the writer outlives it.
  virtual void handle(HttpRequest r, std::shared_ptr<ResponseWriter> w) = 0;
};

// The worker pool's door. It outlives the transport (whoever holds it may post after the
// server stopped: post() then refuses).
class WorkQueue {
 public:
  virtual ~WorkQueue() = default;
  // Runs `f` on a worker thread; false (and `f` dropped) once the transport is stopping.
  virtual bool post(std::function<void()> f) = 0;
};

class HttpTransport {
 public:
  HttpTransport(HttpHandler& handler, HttpLimits limits, int io_threads, int worker_threads);
  ~HttpTransport();  // stop()
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  Status bind(const std::string& host, int port);  // port 0: any free port
  int port() const;
  void start();  // io and worker threads; returns at once
  // Closes the listener and every connection (without waiting on any client), lets queued
  // work finish, joins all threads. Idempotent.
  void stop();
  std::shared_ptr<WorkQueue> work_queue() const;
  int open_connections() const;
  size_t unsent_answer_bytes() const;  // answers waiting for their clients, all connections (HttpLimits::max_unsent_answer_bytes)

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The bytes of a whole response (status line, fields, body); exposed for tests.
// `with_body` false: the fields only, Content-Length still the body's (the answer to HEAD).
std::string serialize_response(const HttpResponse& r, bool keep_alive, bool with_body = true);
const char* status_reason(int status);

}  // namespace tandem::server
