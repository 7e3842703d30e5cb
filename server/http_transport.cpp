#include "server/http_transport.h"

#include <fmt/format.h>

#include <boost/beast/core/string.hpp>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "server/http_session.h"

namespace tandem::server {

namespace beast = boost::beast;

std::optional<std::string_view> HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (beast::iequals(k, name)) return std::string_view(v);
  return std::nullopt;
}

std::string_view HttpRequest::path() const {
  std::string_view t = target;
  return t.substr(0, t.find('?'));
}

const char* status_reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 421: return "Misdirected Request";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

std::string serialize_response(const HttpResponse& r, bool keep_alive, bool with_body) {
  std::string s = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: {}\r\n", r.status,
                              status_reason(r.status), r.content_type, r.body.size(), keep_alive ? "keep-alive" : "close");
  for (const auto& [k, v] : r.headers) s += k + ": " + v + "\r\n";
  s += "\r\n";
  if (with_body) s += r.body;
  return s;
}

namespace {

// Worker threads behind a door that closes at stop(); the door outlives the transport.
class WorkerPool : public WorkQueue {
 public:
  explicit WorkerPool(int threads) : pool_((size_t)std::max(1, threads)) {}
  bool post(std::function<void()> f) override {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return false;
    net::post(pool_, std::move(f));
    return true;
  }
  void close_and_join() {
    {
      std::lock_guard<std::mutex> l(mu_);
      closed_ = true;
    }
    pool_.join();  // queued work still runs; nothing new is accepted
  }

 private:
  std::mutex mu_;
  bool closed_ = false;
  net::thread_pool pool_;
};

// Sent to connections past the maximum without blocking: it fits any socket buffer.
const std::string& busy_response() {
  static const std::string s = serialize_response(
      {503, "application/json", R"({"error":{"message":"too many open connections","type":"server_error","param":null,"code":null}})", {}, true},
      false);
  return s;
}

}  // namespace

struct HttpTransport::Impl {
  Impl(HttpHandler& h, HttpLimits l, int io, int workers)
      : pool(std::make_shared<WorkerPool>(workers)), shared(std::make_shared<TransportShared>(h, l, pool)), io_threads(std::max(1, io)), acceptor(net::make_strand(ioc)),
        retry_timer(acceptor.get_executor()), trim_timer(acceptor.get_executor()) {}

  // Large answers freed (a client that never read, a closed connection) go back to the system:
  // those past HttpLimits::malloc_mmap_threshold at once, the heap's free pages (smaller answers,
  // fragments, other threads' arenas) by this trim. Batched: one trim for all that was freed in
  // the last half second.
  void give_memory_back_periodically() {
    trim_timer.expires_after(std::chrono::milliseconds(500));
    trim_timer.async_wait([this](beast::error_code ec) {
      if (ec || stopping) return;
      if (shared->freed_bytes.load() >= kTrimAfterFreedBytes) {
        shared->freed_bytes = 0;
#if defined(__GLIBC__)
        malloc_trim(0);
#endif
      }
      give_memory_back_periodically();
    });
  }
  static constexpr size_t kTrimAfterFreedBytes = size_t{4} << 20;

  void accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (stopping) return;
      if (ec) {  // e.g. out of file descriptors: try again shortly instead of spinning
        retry_timer.expires_after(std::chrono::milliseconds(50));
        retry_timer.async_wait([this](beast::error_code e) {
          if (!e && !stopping) accept();
        });
        return;
      }
      std::shared_ptr<Session> s;
      beast::error_code addr_ec;
      const auto remote = socket.remote_endpoint(addr_ec);
      const std::string peer = addr_ec ? std::string() : remote.address().to_string();
      {
        // Ordinary slots (max_connections - reserved), at most max_connections_per_peer per
        // address; past either, a reserved slot (privileged requests only) if one is free.
        std::lock_guard<std::mutex> l(shared->mu);
        const HttpLimits& lim = shared->limits;
        const int reserved = std::min(lim.max_connections, lim.reserved_connections > 0 ? lim.reserved_connections
                                                                                          : std::max(1, lim.max_connections / 8));
        const int ordinary_open = shared->open - shared->open_reserved;
        const auto mine = shared->open_per_peer.find(peer);
        const int held = mine == shared->open_per_peer.end() ? 0 : mine->second;
        const bool ordinary = ordinary_open < lim.max_connections - reserved &&
                              (lim.max_connections_per_peer <= 0 || held < lim.max_connections_per_peer);
        if (ordinary || shared->open_reserved < reserved) {
          s = std::make_shared<Session>(std::move(socket), shared);
          s->peer = peer;
          s->reserved_slot = !ordinary;
          shared->open++;
          if (ordinary) shared->open_per_peer[peer]++;
          else shared->open_reserved++;
          s->registry_pos = shared->sessions.insert(shared->sessions.end(), s);
        }
      }
      if (s) {
        net::post(s->executor(), [s] { s->start(); });
      } else {
        beast::error_code ignored;
        socket.non_blocking(true, ignored);
        socket.write_some(net::buffer(busy_response()), ignored);
        socket.shutdown(tcp::socket::shutdown_both, ignored);
        socket.close(ignored);
      }
      accept();
    });
  }

  net::io_context ioc;
  std::shared_ptr<WorkerPool> pool;
  std::shared_ptr<TransportShared> shared;
  int io_threads;
  tcp::acceptor acceptor;
  net::steady_timer retry_timer, trim_timer;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> guard;
  std::vector<std::thread> threads;
  std::atomic<bool> stopping{false};
  bool stopped = false;
  int port = 0;
};

HttpTransport::HttpTransport(HttpHandler& handler, HttpLimits limits, int io_threads, int worker_threads)
    : impl_(std::make_unique<Impl>(handler, limits, io_threads, worker_threads)) {}

HttpTransport::~HttpTransport() { stop(); }

Status HttpTransport::bind(const std::string& host, int port) {
  beast::error_code ec;
  const auto addr = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return make_error("cannot bind {}: not an IP address ({})", host, ec.message());
  const tcp::endpoint ep(addr, (unsigned short)port);
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return make_error("cannot bind {}:{}: {}", host, port, ec.message());
  impl_->port = a.local_endpoint().port();
  return Status::Ok();
}

int HttpTransport::port() const { return impl_->port; }

void HttpTransport::start() {
  Impl& m = *impl_;
#if defined(__GLIBC__)
  if (m.shared->limits.malloc_mmap_threshold > 0) mallopt(M_MMAP_THRESHOLD, (int)std::min<size_t>(m.shared->limits.malloc_mmap_threshold, 32u << 20));
#endif
  m.guard.emplace(m.ioc.get_executor());
  net::post(m.acceptor.get_executor(), [&m] {
    m.accept();
    m.give_memory_back_periodically();
  });
  for (int i = 0; i < m.io_threads; i++) m.threads.emplace_back([&m] { m.ioc.run(); });
}

void HttpTransport::stop() {
  Impl& m = *impl_;
  if (m.stopped) return;
  m.stopped = true;
  m.stopping = true;
  m.shared->stopping = true;
  net::post(m.acceptor.get_executor(), [&m] {
    beast::error_code ignored;
    m.acceptor.close(ignored);
    m.retry_timer.cancel();
    m.trim_timer.cancel();
  });
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard<std::mutex> l(m.shared->mu);
    for (auto& w : m.shared->sessions)
      if (auto s = w.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) net::post(s->executor(), [s] { s->close(); });
  live.clear();
  // Closing never waits on a client; this only lets the closes run (bounded, in case a handler
  // still holds a session).
  {
    std::unique_lock<std::mutex> l(m.shared->mu);
    m.shared->cv.wait_for(l, std::chrono::seconds(2), [&] { return m.shared->open == 0; });
  }
  m.guard.reset();
  m.ioc.stop();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
  m.pool->close_and_join();
}

size_t HttpTransport::unsent_answer_bytes() const { return impl_->shared->unsent_bytes.load(); }

std::shared_ptr<WorkQueue> HttpTransport::work_queue() const { return impl_->pool; }

int HttpTransport::open_connections() const {
  std::lock_guard<std::mutex> l(impl_->shared->mu);
  return impl_->shared->open;
}

}  // namespace tandem::server
