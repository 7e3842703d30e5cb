// One HTTP connection of HttpTransport (internal to server/http_transport.cpp and
// server/http_session.cpp). Everything here runs on the connection's strand.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "server/http_transport.h"

namespace tandem::server {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

class Session;

// What the sessions share with the transport: limits, the handler, the worker pool, and the
// registry stop() walks to close every connection.
struct TransportShared {
  TransportShared(HttpHandler& h, HttpLimits l, std::shared_ptr<WorkQueue> w) : handler(h), limits(l), work(std::move(w)) {}
  HttpHandler& handler;
  HttpLimits limits;
  std::shared_ptr<WorkQueue> work;
  std::mutex mu;
  std::condition_variable cv;
  std::list<std::weak_ptr<Session>> sessions;  // guarded by mu
  int open = 0;                                // guarded by mu
  int open_reserved = 0;                       // guarded by mu: of `open`, in reserved slots
  std::map<std::string, int> open_per_peer;   // guarded by mu: connections in ordinary slots, by peer address
  std::atomic<bool> stopping{false};
  std::atomic<size_t> body_bytes{0};  // reserved by bodies being read or held (max_inflight_body_bytes)
  std::atomic<size_t> unsent_bytes{0};  // in the sessions' out_ and writing_, not yet written (max_unsent_answer_bytes)
  std::atomic<size_t> freed_bytes{0};   // large output buffers freed since the transport last gave memory back
  bool over_unsent_budget() const { return unsent_bytes.load() >= limits.max_unsent_answer_bytes; }
  std::atomic<int64_t> last_shed_ms{0};  // when shed_stalled_writers last walked the sessions
};

// Reserves `n` bytes of the in-flight body budget; null when it would pass the limit. The
// reservation ends with the last copy of the returned pointer.
std::shared_ptr<const void> reserve_body_bytes(const std::shared_ptr<TransportShared>& shared, size_t n);

// With the unsent budget spent: closes the connections whose client has not taken a write for a
// while (kStalledWriteMs, well under write_timeout), so that clients that never read free the
// budget for those that do. At most once per 250 ms; any thread.
void shed_stalled_writers(const std::shared_ptr<TransportShared>& shared);

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<TransportShared> shared);
  ~Session();
  void start();
  void close();  // at once: sockets closed, the active handler told the client is gone
  std::list<std::weak_ptr<Session>>::iterator registry_pos;
  std::string peer;          // the peer's address (open_per_peer's key)
  bool reserved_slot = false;  // in HttpLimits::reserved_connections: privileged requests only

  // From a ResponseWriter, on the strand.
  class Writer;
  void writer_respond(Writer* w, HttpResponse r);
  void writer_begin(Writer* w, int status, std::string content_type, HttpHeaders headers);
  void writer_write(Writer* w, std::string chunk);
  void writer_end(Writer* w);
  net::any_io_executor executor() { return socket_.get_executor(); }
  // Since when (steady ms) the write in flight (a piece of at most 64 KiB) has waited; 0: none.
  std::atomic<int64_t> write_waiting_since_ms{0};

 private:
  enum class ReadPhase { None, Idle, Header, Body, Drain };
  struct Pending {
    HttpRequest req;
    std::optional<HttpResponse> ready;  // answered without a handler (an error, a refusal)
    bool keep_alive = true;
    bool head = false;  // a HEAD request: its answer goes without its body
  };

  void do_read();
  void on_readable(boost::beast::error_code ec);
  void read_header();
  void on_header(boost::beast::error_code ec);
  void on_body(boost::beast::error_code ec, HttpRequest req, bool keep_alive);
  void fail_read(boost::beast::error_code ec);
  void refuse(HttpResponse r);  // answers with `r` after the queued ones and stops reading
  void drain_read();
  void arm_read_timer(std::chrono::milliseconds d, ReadPhase phase);
  std::chrono::milliseconds idle_limit() const;  // the keep-alive wait (short in a reserved slot)
  void maybe_dispatch();
  void complete_slot(bool keep_alive);
  bool admit_unsent(size_t n);
  void append(std::string bytes, bool reserved = false);
  void uncount_unsent(size_t n);
  void drop_written();
  void release_output();
  void flush();
  void linger();

  tcp::socket socket_;
  std::shared_ptr<TransportShared> shared_;  // shared: a session may outlive the transport in a dropped handler
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  net::steady_timer read_timer_, write_timer_;
  ReadPhase phase_ = ReadPhase::None;
  bool read_timed_out_ = false;
  std::deque<Pending> queue_;          // read, not yet answered; the front is being answered
  std::shared_ptr<Writer> active_;     // the writer of queue_.front() once dispatched
  std::shared_ptr<Session> self_;      // alive while a handler answers
  std::string out_, writing_;          // bytes to write; bytes being written
  size_t write_off_ = 0;               // how much of writing_ is written
  size_t counted_unsent_ = 0;          // this session's share of shared_->unsent_bytes
  bool writing_now_ = false, reading_ = false, stop_reading_ = false, closed_ = false;
  bool close_when_flushed_ = false, lingering_ = false, streaming_ = false;
  size_t drained_bytes_ = 0;
  std::array<char, 16384> scratch_;
};

}  // namespace tandem::server
