#include "server/http_session.h"

#include <fmt/format.h>

#include "server/http_framing.h"

namespace tandem::server {

namespace beast = boost::beast;

namespace {
// Transport-level errors in OpenAI's shape (messages here are fixed text: no escaping needed).
HttpResponse error_response(int status, const std::string& message, const char* type = "invalid_request_error") {
  HttpResponse r;
  r.status = status;
  r.body = fmt::format(R"({{"error":{{"message":"{}","type":"{}","param":null,"code":null}}}})", message, type);
  return r;
}

// The answer when too many answers wait for their clients: retry once some are out.
HttpResponse busy_answer() {
  HttpResponse r = error_response(503, "the server holds too many unsent answers (clients not reading); retry shortly", "server_error");
  r.headers.emplace_back("Retry-After", "1");
  return r;
}

// How long a connection in a reserved slot may wait for a header or idle (HttpLimits::reserved_connections).
constexpr std::chrono::milliseconds kReservedSlotWait{1000};

// Answers up to this size are sent whatever the unsent budget says.
constexpr size_t kAlwaysSentAnswerBytes = 4096;

// An output buffer past this is freed once written rather than kept for the connection's life.
constexpr size_t kKeptBufferBytes = 64u << 10;

// A client that has not taken a 64 KiB piece of its answer in this long, while the unsent budget
// is spent, is taken for one that does not read (32 KiB/s: slower than any live link).
constexpr int64_t kStalledWriteMs = 2000;

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

// A handler's view of its connection. It holds the session weakly: a request the engine still
// holds after its client left must not keep the socket (or the io context) alive.
class Session::Writer : public ResponseWriter, public std::enable_shared_from_this<Writer> {
 public:
  explicit Writer(std::weak_ptr<Session> s) : session_(std::move(s)) {}

  void respond(HttpResponse r) override {
    post([r = std::move(r)](Session& s, Writer* w) mutable { s.writer_respond(w, std::move(r)); });
  }
  void begin_stream(int status, std::string content_type, HttpHeaders headers) override {
    post([=](Session& s, Writer* w) mutable { s.writer_begin(w, status, std::move(content_type), std::move(headers)); });
  }
  void write(std::string chunk) override {
    if (gone()) return;
    post([c = std::move(chunk)](Session& s, Writer* w) mutable { s.writer_write(w, std::move(c)); });
  }
  void end_stream() override {
    post([](Session& s, Writer* w) { s.writer_end(w); });
  }
  bool gone() const override { return gone_.load(); }
  void on_gone(std::function<void()> f) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!gone_) {
        on_gone_ = std::move(f);
        return;
      }
    }
    f();
  }
  // On the strand: the client left before the response was complete.
  void mark_gone() {
    std::function<void()> f;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (gone_ || done_) return;
      gone_ = true;
      f.swap(on_gone_);
    }
    if (f) f();
  }
  void mark_done() {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    on_gone_ = nullptr;  // it may hold the handler's state, which may hold this writer
  }

 private:
  template <class F>
  void post(F f) {
    auto s = session_.lock();
    if (!s) return;
    net::post(s->executor(), [s, w = shared_from_this(), f = std::move(f)]() mutable { f(*s, w.get()); });
  }
  std::weak_ptr<Session> session_;
  std::mutex mu_;
  std::atomic<bool> gone_{false};
  bool done_ = false;
  std::function<void()> on_gone_;
};

std::shared_ptr<const void> reserve_body_bytes(const std::shared_ptr<TransportShared>& shared, size_t n) {
  size_t cur = shared->body_bytes.load();
  do {
    if (cur + n > shared->limits.max_inflight_body_bytes) return nullptr;
  } while (!shared->body_bytes.compare_exchange_weak(cur, cur + n));
  return std::shared_ptr<const void>(shared.get(), [shared, n](const void*) { shared->body_bytes -= n; });
}

void shed_stalled_writers(const std::shared_ptr<TransportShared>& shared) {
  const int64_t now = steady_ms();
  int64_t last = shared->last_shed_ms.load();
  if (now - last < 250 || !shared->last_shed_ms.compare_exchange_strong(last, now)) return;
  std::vector<std::shared_ptr<Session>> stalled;
  {
    std::lock_guard<std::mutex> l(shared->mu);
    for (auto& w : shared->sessions) {
      auto s = w.lock();
      const int64_t since = s ? s->write_waiting_since_ms.load() : 0;
      if (since > 0 && now - since >= kStalledWriteMs) stalled.push_back(std::move(s));
    }
  }
  for (auto& s : stalled) net::post(s->executor(), [s] { s->close(); });
}

Session::Session(tcp::socket socket, std::shared_ptr<TransportShared> shared)
    : socket_(std::move(socket)),
      shared_(shared),
      buffer_(shared->limits.max_header_bytes + 65536),  // never grows past this: a long line ends in 431
      read_timer_(socket_.get_executor()),
      write_timer_(socket_.get_executor()) {}

Session::~Session() {
  shared_->unsent_bytes -= counted_unsent_;  // ended without close() (the io context stopped)
  std::lock_guard<std::mutex> l(shared_->mu);
  shared_->sessions.erase(registry_pos);
  shared_->open--;
  if (reserved_slot) shared_->open_reserved--;
  else if (auto it = shared_->open_per_peer.find(peer); it != shared_->open_per_peer.end() && --it->second <= 0)
    shared_->open_per_peer.erase(it);
  shared_->cv.notify_all();
}

void Session::start() {
  if (shared_->stopping) return close();
  beast::error_code ec;
  socket_.set_option(tcp::no_delay(true), ec);  // SSE chunks are small and latency matters
  if (shared_->limits.socket_send_buffer > 0) socket_.set_option(net::socket_base::send_buffer_size(shared_->limits.socket_send_buffer), ec);
  do_read();
}

// A reserved slot is for a client that has its request ready, not for one that dawdles or
// idles between requests: its waits are short, so a flood cannot sit on the kept slots.
std::chrono::milliseconds Session::idle_limit() const {
  return reserved_slot ? std::min(shared_->limits.idle_timeout, kReservedSlotWait) : shared_->limits.idle_timeout;
}

void Session::arm_read_timer(std::chrono::milliseconds d, ReadPhase phase) {
  phase_ = phase;
  read_timed_out_ = false;
  read_timer_.expires_after(d);
  read_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec || self->closed_ || self->read_timer_.expiry() > net::steady_timer::clock_type::now()) return;
    self->read_timed_out_ = true;
    if (self->phase_ == ReadPhase::Idle || self->phase_ == ReadPhase::Drain) return self->close();
    beast::error_code ignored;
    self->socket_.cancel(ignored);  // the pending read ends with operation_aborted: fail_read sends 408
  });
}

void Session::do_read() {
  if (closed_ || reading_) return;
  if (stop_reading_) return drain_read();
  if ((int)queue_.size() >= shared_->limits.max_pipelined) return;  // resumed by complete_slot
  reading_ = true;
  if (buffer_.size() > 0) return read_header();  // a pipelined request is already here
  // Wait for the first byte without a header deadline: while a request is being answered the
  // client may wait as long as it likes (and its leaving shows up here), otherwise idleness ends it.
  if (queue_.empty()) arm_read_timer(idle_limit(), ReadPhase::Idle);
  else {
    read_timer_.cancel();
    phase_ = ReadPhase::None;
  }
  socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) { self->on_readable(ec); });
}

void Session::on_readable(beast::error_code ec) {
  if (closed_) return;
  if (ec) {
    reading_ = false;
    return close();
  }
  read_header();
}

void Session::read_header() {
  parser_.emplace();
  parser_->header_limit((std::uint32_t)shared_->limits.max_header_bytes);
  parser_->body_limit(shared_->limits.max_body_bytes);
  arm_read_timer(reserved_slot ? std::min(shared_->limits.header_timeout, kReservedSlotWait) : shared_->limits.header_timeout,
                 ReadPhase::Header);
  http::async_read_header(socket_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void Session::on_header(beast::error_code ec) {
  if (closed_) return;
  if (ec) return fail_read(ec);
  const auto& h = parser_->get();
  HttpRequest req;
  req.method = std::string(h.method_string());
  req.target = std::string(h.target());
  req.version = (int)h.version();
  for (const auto& f : h) {
    if (req.headers.size() >= shared_->limits.max_header_count) {
      reading_ = false;
      return refuse(error_response(431, fmt::format("more than {} header fields", shared_->limits.max_header_count)));
    }
    req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  }
  if (auto bad = check_framing(req)) {  // the body's length or the request's meaning is uncertain: answer and close
    reading_ = false;
    return refuse(error_response(bad->status, bad->message));
  }
  if (reserved_slot) {  // the last slots: only for requests with a valid key, and health checks
    bool ok = false;
    try {
      ok = shared_->handler.privileged(req);
    } catch (const std::exception&) {
    }
    if (!ok) {
      reading_ = false;
      HttpResponse busy = error_response(503, "too many open connections (the last slots are kept for authenticated clients)",
                                         "server_error");
      busy.headers.emplace_back("Retry-After", "1");
      return refuse(std::move(busy));
    }
  }
  const bool keep_alive = h.keep_alive();
  const bool head = req.method == "HEAD";
  std::optional<HttpResponse> refusal;
  try {
    refusal = shared_->handler.check_header(req);
  } catch (const std::exception&) {
    refusal = error_response(500, "internal error", "server_error");
  }
  if (refusal) {
    reading_ = false;
    if (!parser_->is_done()) return refuse(std::move(*refusal));  // its body stays unread: the connection ends
    read_timer_.cancel();
    phase_ = ReadPhase::None;
    parser_.reset();
    queue_.push_back({std::move(req), std::move(refusal), keep_alive, head});  // nothing to skip: carry on
    if (!keep_alive) stop_reading_ = true;
    maybe_dispatch();
    return do_read();
  }
  const auto expect = req.header("Expect");
  if (expect && beast::iequals(*expect, "100-continue") && queue_.empty() && out_.empty() && !writing_now_)
    append("HTTP/1.1 100 Continue\r\n\r\n");
  if (parser_->is_done()) return on_body({}, std::move(req), keep_alive);
  // (A HEAD with a body is still a HEAD: on_body tells from the method.)
  const auto length = parser_->content_length();  // none: chunked, up to the body limit
  req.body_budget = reserve_body_bytes(shared_, length ? (size_t)*length : shared_->limits.max_body_bytes);
  if (!req.body_budget) {
    reading_ = false;
    return refuse(error_response(503, "the server is receiving too many request bodies at once; retry shortly"));
  }
  arm_read_timer(shared_->limits.body_timeout, ReadPhase::Body);
  http::async_read(socket_, buffer_, *parser_,
                   [self = shared_from_this(), req = std::move(req), keep_alive](beast::error_code ec, size_t) mutable {
                     self->on_body(ec, std::move(req), keep_alive);
                   });
}

void Session::on_body(beast::error_code ec, HttpRequest req, bool keep_alive) {
  if (closed_) return;
  if (ec) return fail_read(ec);
  reading_ = false;
  read_timer_.cancel();
  phase_ = ReadPhase::None;
  req.body = parser_->release().body();
  parser_.reset();
  const bool head = req.method == "HEAD";
  queue_.push_back({std::move(req), std::nullopt, keep_alive, head});
  if (!keep_alive) stop_reading_ = true;
  maybe_dispatch();
  do_read();
}

void Session::fail_read(beast::error_code ec) {
  reading_ = false;
  const bool started = parser_ && parser_->got_some();
  if (read_timed_out_) {
    if (phase_ == ReadPhase::Header || phase_ == ReadPhase::Body)
      return refuse(error_response(408, phase_ == ReadPhase::Header ? "the request header took too long" : "the request body took too long"));
    return close();
  }
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow)
    return refuse(error_response(431, fmt::format("the request header is larger than {} bytes", shared_->limits.max_header_bytes)));
  if (ec == http::error::body_limit)
    return refuse(error_response(413, fmt::format("the request body is larger than {} bytes", shared_->limits.max_body_bytes)));
  if (ec == http::error::bad_transfer_encoding || ec == http::error::bad_content_length || ec == http::error::multiple_content_length)
    return refuse(error_response(400, "the body length is uncertain (Content-Length and Transfer-Encoding conflict or repeat)"));
  if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
      ec == net::error::operation_aborted || ec == net::error::broken_pipe || !started)
    return close();  // the client left
  refuse(error_response(400, "malformed HTTP request"));
}

void Session::refuse(HttpResponse r) {
  r.close = true;
  stop_reading_ = true;
  parser_.reset();
  queue_.push_back({HttpRequest{}, std::move(r), false});
  maybe_dispatch();
  do_read();
}

// After Connection: close, a refusal or an error nothing more is parsed, but the socket is
// still read (and discarded, bounded) so that a client that leaves is noticed and its unread
// body does not turn our close into a reset that loses the response.
void Session::drain_read() {
  if (closed_ || reading_) return;
  reading_ = true;
  if (phase_ != ReadPhase::Drain && !lingering_) {
    read_timer_.cancel();
    phase_ = ReadPhase::None;
  }
  socket_.async_read_some(net::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->reading_ = false;
    if (self->closed_) return;
    self->drained_bytes_ += n;
    // Up to twice the body limit: a polite client sending a too-large body still gets to read
    // its 413; one that sends on and on is cut off.
    if (ec || self->drained_bytes_ > 2 * self->shared_->limits.max_body_bytes) return self->close();
    self->drain_read();
  });
}

void Session::maybe_dispatch() {
  if (closed_ || active_ || queue_.empty()) return;
  Pending& p = queue_.front();
  if (p.ready) {
    const bool keep = p.keep_alive && !p.ready->close;
    append(serialize_response(*p.ready, keep, !p.head));
    return complete_slot(keep);
  }
  active_ = std::make_shared<Writer>(weak_from_this());
  self_ = shared_from_this();
  std::optional<HttpResponse> now;
  try {
    now = shared_->handler.answer_inline(p.req);
  } catch (const std::exception&) {
    now = error_response(500, "internal error", "server_error");
  }
  if (now) return writer_respond(active_.get(), std::move(*now));
  // Decided before any work, as the body budget is (here and again when a worker takes it up,
  // as the queue may be long): the answer would have nowhere to wait.
  if (shared_->over_unsent_budget()) {
    shed_stalled_writers(shared_);
    return writer_respond(active_.get(), busy_answer());
  }
  auto w = active_;
  const bool posted = shared_->work->post([shared = shared_, req = std::move(p.req), w]() mutable {
    if (shared->over_unsent_budget()) {
      shed_stalled_writers(shared);
      return w->respond(busy_answer());
    }
    try {
      shared->handler.handle(std::move(req), w);
    } catch (const std::exception&) {
      w->respond(error_response(500, "internal error", "server_error"));
    }
  });
  if (!posted) writer_respond(active_.get(), error_response(503, "the server is shutting down"));
}

void Session::writer_respond(Writer* w, HttpResponse r) {
  if (closed_ || w != active_.get() || streaming_) return;
  const Pending& p = queue_.front();
  if (r.body.size() > shared_->limits.max_answer_bytes)
    r = error_response(500, fmt::format("the answer is {} bytes, more than the {} this server sends at once; ask for less", r.body.size(),
                                        shared_->limits.max_answer_bytes), "server_error");
  const bool keep = p.keep_alive && !r.close;
  std::string bytes = serialize_response(r, keep, !p.head);
  r = HttpResponse{};  // its body is copied: free it before the bytes wait for the client
  // Small answers (errors, /health, a short completion) always go out: counted, past the
  // budget or not. A spike of unread answers must not make a health check fail.
  bool reserved = false;
  if (bytes.size() > kAlwaysSentAnswerBytes) {
    reserved = admit_unsent(bytes.size());
    if (!reserved) {
      shed_stalled_writers(shared_);
      bytes = serialize_response(busy_answer(), keep, !p.head);
    }
  }
  append(std::move(bytes), reserved);
  complete_slot(keep);
}

void Session::writer_begin(Writer* w, int status, std::string content_type, HttpHeaders headers) {
  if (closed_ || w != active_.get() || streaming_) return;
  streaming_ = true;
  std::string h = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nTransfer-Encoding: chunked\r\nConnection: {}\r\n", status,
                              status_reason(status), content_type, queue_.front().keep_alive ? "keep-alive" : "close");
  for (const auto& [k, v] : headers) h += k + ": " + v + "\r\n";
  append(h + "\r\n");
}

void Session::writer_write(Writer* w, std::string chunk) {
  if (closed_ || w != active_.get() || !streaming_ || chunk.empty() || queue_.front().head) return;
  append(fmt::format("{:x}\r\n", chunk.size()) + chunk + "\r\n");
}

void Session::writer_end(Writer* w) {
  if (closed_ || w != active_.get() || !streaming_) return;
  streaming_ = false;
  if (!queue_.front().head) append("0\r\n\r\n");
  complete_slot(queue_.front().keep_alive);
}

void Session::complete_slot(bool keep_alive) {
  if (closed_) return;
  if (active_) active_->mark_done();
  active_.reset();
  queue_.pop_front();
  if (!keep_alive) {
    close_when_flushed_ = true;
    stop_reading_ = true;
    queue_.clear();  // pipelined requests after a close are not answered
    flush();
  } else {
    maybe_dispatch();
    if (queue_.empty() && reading_ && phase_ == ReadPhase::None) arm_read_timer(idle_limit(), ReadPhase::Idle);
    do_read();
  }
  if (!active_) self_.reset();  // pending operations keep this alive from here
}

// Counts an answer's `n` bytes in the unsent budget unless it is already spent. The last answer
// admitted may pass it (by at most one answer per io thread, each under max_answer_bytes): then
// new requests are refused before any work, rather than after it.
bool Session::admit_unsent(size_t n) {
  size_t cur = shared_->unsent_bytes.load();
  do {
    if (cur >= shared_->limits.max_unsent_answer_bytes) return false;
  } while (!shared_->unsent_bytes.compare_exchange_weak(cur, cur + n));
  return true;
}

// `reserved`: the bytes are already counted in the unsent budget (admit_unsent); otherwise they
// are counted now, past the budget or not (stream chunks are bounded per connection instead).
void Session::append(std::string bytes, bool reserved) {
  if (closed_) {
    if (reserved) shared_->unsent_bytes -= bytes.size();
    return;
  }
  if (!reserved) shared_->unsent_bytes += bytes.size();
  counted_unsent_ += bytes.size();
  const size_t unsent = out_.size() + writing_.size() - write_off_;
  if (unsent > 0 && unsent + bytes.size() > shared_->limits.max_pending_write_bytes) return close();  // it stopped reading
  if (out_.empty()) out_ = std::move(bytes);  // a whole answer is not copied once more
  else out_ += bytes;
  flush();
}

void Session::uncount_unsent(size_t n) {
  shared_->unsent_bytes -= n;
  counted_unsent_ -= n;
}

// The written buffer is done with: a large one is freed (and its memory given back to the system
// soon, see HttpTransport) rather than kept by an idle keep-alive connection.
void Session::drop_written() {
  if (writing_.capacity() > kKeptBufferBytes) {
    shared_->freed_bytes += writing_.capacity();
    std::string().swap(writing_);
  } else {
    writing_.clear();
  }
  write_off_ = 0;
}

// The connection is closed: nothing more is sent, its share of the budget is given back.
void Session::release_output() {
  uncount_unsent(counted_unsent_);
  shared_->freed_bytes += out_.capacity();
  std::string().swap(out_);
  if (!writing_now_) drop_written();  // else the write in flight still points into it: dropped when it ends
}

// Writes in pieces of at most 64 KiB, each with its own deadline: a slow but live reader
// makes progress, one that stopped reading is cut off after write_timeout.
void Session::flush() {
  if (closed_ || writing_now_) return;
  if (write_off_ == writing_.size()) {
    drop_written();
    writing_.swap(out_);
  }
  if (writing_.empty()) {
    if (close_when_flushed_ && !lingering_) linger();
    return;
  }
  writing_now_ = true;
  write_timer_.expires_after(shared_->limits.write_timeout);
  write_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (!ec && self->writing_now_ && self->write_timer_.expiry() <= net::steady_timer::clock_type::now()) self->close();
  });
  const size_t n = std::min<size_t>(writing_.size() - write_off_, 65536);
  write_waiting_since_ms = steady_ms();
  net::async_write(socket_, net::buffer(writing_.data() + write_off_, n), [self = shared_from_this()](beast::error_code ec, size_t done) {
    self->writing_now_ = false;
    self->write_waiting_since_ms = 0;
    self->write_timer_.cancel();
    if (self->closed_) return self->drop_written();
    if (ec) return self->close();
    self->write_off_ += done;
    self->uncount_unsent(done);
    self->flush();
  });
}

// The last response is out: half-close, then read what the client still sends for a moment.
void Session::linger() {
  lingering_ = true;
  beast::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  arm_read_timer(std::chrono::milliseconds(2000), ReadPhase::Drain);
  stop_reading_ = true;
  drain_read();
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  beast::error_code ignored;
  read_timer_.cancel();
  write_timer_.cancel();
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  release_output();
  if (active_) {
    auto w = active_;
    active_.reset();
    w->mark_gone();
  }
  queue_.clear();
  self_.reset();
}

}  // namespace tandem::server
