// A backend that fails mid-run (as a GPU does after a fault: every later op skipped, reads NaN)
// must surface as an error everywhere above it, never as NaN logits, a NaN token or a NaN
// tok/s: Model::forward returns the error, the bench's timers return it (so `tandem bench`
// exits non-zero), and the server answers that request with an error, then reports itself
// unhealthy (/health and new requests answer 503 naming the failure). No GPU needed: a CPU
// backend wrapped to fail after a number of passes stands in for the device.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "apps/bench_runs.h"
#include "backend/cpu/cpu_backend.h"
#include "chat/chat_template.h"
#include "engine/sequence_runner.h"
#include "kv/block_pool.h"
#include "model/model.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/serving_loop.h"
#include "tiny_model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

// The CPU backend until `healthy_passes` passes have run; from the next pass on it keeps an
// error, skips every op and reads NaN, as CudaBackend does after a sticky fault.
class FailingBackend final : public Backend {
 public:
  explicit FailingBackend(int healthy_passes)
      : cpu_(CpuBackendOptions{cpu::best_isa(), 1, false, {}}), healthy_passes_(healthy_passes) {}

  Status error() const override { return failed_ ? make_error("CUDA: an illegal memory access (a test's fault)") : Status::Ok(); }
  int passes() const { return passes_; }

  std::string describe() const override { return "failing " + cpu_.describe(); }
  Tensor new_tensor(int64_t rows, int64_t cols) override { return cpu_.new_tensor(rows, cols); }
  Tensor upload(std::span<const float> host, int64_t rows, int64_t cols) override { return cpu_.upload(host, rows, cols); }
  std::span<const float> read(const Tensor& t) override {
    if (!failed_) return cpu_.read(t);
    nan_.assign((size_t)(t.rows * t.cols), std::numeric_limits<float>::quiet_NaN());
    return nan_;
  }
  Result<KvStore> new_kv_store(DType dtype, int n_layer, int block_tokens, int64_t n_blocks, size_t row_bytes) override {
    return cpu_.new_kv_store(dtype, n_layer, block_tokens, n_blocks, row_bytes);
  }
  Result<Weight> prepare_weight(const WeightSource& src, bool products) override { return cpu_.prepare_weight(src, products); }
  Result<Tensor> prepare_vector(const WeightSource& src) override { return cpu_.prepare_vector(src); }
  void run_pass(int64_t n_tokens, const std::function<void()>& body) override {
    if (passes_++ >= healthy_passes_) failed_ = true;
    if (!failed_) cpu_.run_pass(n_tokens, body);
  }
  void embed(const Weight& table, const ForwardBatch& b, const Tensor& out, float scale) override {
    if (!failed_) cpu_.embed(table, b, out, scale);
  }
  void matmul(std::span<const Product> group, const Tensor& in) override {
    if (!failed_) cpu_.matmul(group, in);
  }
  void rmsnorm(const Tensor& x, const Tensor& weight, const Tensor& out, float eps, int head_dim) override {
    if (!failed_) cpu_.rmsnorm(x, weight, out, eps, head_dim);
  }
  void add_residual(const Tensor& x, const Tensor& delta, const Tensor* norm, const Tensor* out, float eps,
                    float delta_scale) override {
    if (!failed_) cpu_.add_residual(x, delta, norm, out, eps, delta_scale);
  }
  void rope_angles(const ForwardBatch& b, std::span<const double> inv_freq, int rope_dim, const Tensor& out) override {
    if (!failed_) cpu_.rope_angles(b, inv_freq, rope_dim, out);
  }
  void rope(const Tensor& q, const Tensor& k, const Tensor& angles, const HeadShape& h, int rope_dim,
            RopeStyle style) override {
    if (!failed_) cpu_.rope(q, k, angles, h, rope_dim, style);
  }
  void gated_activation(const Tensor& gate, const Tensor& up, GateActivation act) override {
    if (!failed_) cpu_.gated_activation(gate, up, act);
  }
  void store_kv(const Tensor& k, const Tensor& v, const KvStore& kv, int layer, const ForwardBatch& b) override {
    if (!failed_) cpu_.store_kv(k, v, kv, layer, b);
  }
  void attention(const Tensor& q, const KvStore& kv, int layer, const ForwardBatch& b, const HeadShape& h,
                 const AttentionParams& p, const Tensor& out) override {
    if (!failed_) cpu_.attention(q, kv, layer, b, h, p, out);
  }
  void logits(const Tensor& x, std::span<const int64_t> rows, const Tensor& norm, float eps, const Weight& w,
              const Tensor& scratch, const Tensor& out, const LogitsParams& p) override {
    if (!failed_) cpu_.logits(x, rows, norm, eps, w, scratch, out, p);
  }

 private:
  CpuBackend cpu_;
  int healthy_passes_;
  int passes_ = 0;
  bool failed_ = false;
  std::vector<float> nan_;
};

std::unique_ptr<Model> failing_model(int healthy_passes, std::shared_ptr<FailingBackend>* be_out = nullptr) {
  test::TinyShape s;
  s.n_ctx = 128;
  auto be = std::make_shared<FailingBackend>(healthy_passes);
  if (be_out) *be_out = be;
  auto m = Model::from_gguf(test::tiny_model_file(s), ModelOptions{be, {}});
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

TEST(BackendFailure, ModelForwardReturnsTheBackendsError) {
  std::shared_ptr<FailingBackend> be;
  auto model = failing_model(2, &be);
  ASSERT_TRUE(model);
  auto pool = model->new_kv_pool(8, DType::F16);
  ASSERT_TRUE(pool.ok());
  SequenceRunner seq(*model, *pool.value());
  for (int32_t t : {65, 66}) {  // the healthy passes: finite logits
    auto r = seq.run(std::vector<int32_t>{t});
    ASSERT_TRUE(r.ok()) << r.error().message;
    for (float v : r.value()) ASSERT_TRUE(std::isfinite(v));
  }
  auto r = seq.run(std::vector<int32_t>{67});
  ASSERT_FALSE(r.ok()) << "a failed pass gave logits (NaN) instead of an error";
  EXPECT_NE(r.error().message.find("the forward pass failed"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("illegal memory access"), std::string::npos) << r.error().message;
  EXPECT_EQ(be->passes(), 3);
}

// `tandem bench` times these; their error is its non-zero exit (cmd_bench's fail()).
TEST(BackendFailure, BenchTimersReturnTheErrorNotATime) {
  auto model = failing_model(3);
  ASSERT_TRUE(model);
  auto decode = apps::time_decode(*model, 8, DType::F16);
  ASSERT_FALSE(decode.ok()) << "timed " << decode->seconds << " s of failed passes";
  EXPECT_NE(decode.error().message.find("illegal memory access"), std::string::npos);
  auto prefill = apps::time_prefill(*model, 16, DType::F16);
  EXPECT_FALSE(prefill.ok());
}

// The CPU backend times its attention, and the bench's runs split their time by it: a
// positive part of the run, growing with the context.
TEST(BenchTimers, SplitOffAttentionsTime) {
  test::TinyShape s;
  s.n_ctx = 1024;
  auto model = Model::from_gguf(test::tiny_model_file(s));
  ASSERT_TRUE(model.ok());
  auto shallow = apps::time_decode(*model.value(), 8, DType::F16);
  auto deep = apps::time_decode(*model.value(), 8, DType::F16, 900);
  ASSERT_TRUE(shallow.ok()) << shallow.error().message;
  ASSERT_TRUE(deep.ok()) << deep.error().message;
  for (const apps::TimedRun& r : {shallow.value(), deep.value()}) {
    EXPECT_GT(r.attention_s, 0);
    EXPECT_LT(r.attention_s, r.seconds);
  }
  EXPECT_GT(deep->attention_s, shallow->attention_s);
  auto prefill = apps::time_prefill(*model.value(), 32, DType::F16);
  ASSERT_TRUE(prefill.ok());
  EXPECT_GT(prefill->attention_s, 0);
  EXPECT_LT(prefill->attention_s, prefill->seconds);
}

// One request over a fresh connection (Connection: close): the whole response.
std::string http(int port, const std::string& method, const std::string& path, const std::string& body = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "";
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nConnection: close\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\n";
  if (method == "POST") req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  for (size_t sent = 0; sent < req.size();) {
    const ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += (size_t)n;
  }
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, (size_t)n);
  ::close(fd);
  return got;
}

int status_of(const std::string& response) { return response.size() > 12 ? std::stoi(response.substr(9, 3)) : 0; }

TEST(BackendFailure, ServerAnswersTheErrorThenReportsUnhealthy) {
  using namespace server;
  auto model = failing_model(4);
  ASSERT_TRUE(model);
  test::TinyShape s;
  s.n_ctx = 128;
  auto vocab_file = test::tiny_model_file(s);
  auto tok = Tokenizer::from_gguf(*vocab_file);
  ASSERT_TRUE(tok.ok());
  auto chat = ChatTemplate::from_source("{% for m in messages %}{{ m.content }}{% endfor %}", "", "");
  ASSERT_TRUE(chat.ok());
  const ModelConfig& cfg = model->config();
  auto pool = BlockPool::create({cfg.n_layer, cfg.n_kv_head, cfg.head_dim, 16, 32, DType::F16}, model->backend());
  ASSERT_TRUE(pool.ok());
  Metrics metrics;
  ServingLoop loop(*model, *pool.value(), SchedulerOptions{}, metrics);
  ServerOptions o;
  o.port = 0;
  HttpServer server(*model, *tok.value(), &chat.value(), loop, metrics, o);
  ASSERT_TRUE(server.bind().ok());
  server.start();
  const int port = server.port();
  EXPECT_EQ(status_of(http(port, "GET", "/health")), 200);
  // Four healthy passes (a prefill, three decode steps), then the fault: the request fails.
  const std::string body = R"({"prompt":"abc","max_tokens":16,"temperature":0})";
  const std::string first = http(port, "POST", "/v1/completions", body);
  EXPECT_EQ(status_of(first), 500) << first;
  EXPECT_NE(first.find("illegal memory access"), std::string::npos) << first;
  EXPECT_EQ(first.find("NaN"), std::string::npos) << first;
  const std::string health = http(port, "GET", "/health");
  EXPECT_EQ(status_of(health), 503) << health;
  EXPECT_NE(health.find(R"("status":"unhealthy")"), std::string::npos) << health;
  EXPECT_NE(health.find("illegal memory access"), std::string::npos) << health;
  const std::string next = http(port, "POST", "/v1/completions", body);
  EXPECT_EQ(status_of(next), 503) << next;
  EXPECT_NE(next.find("backend failed"), std::string::npos) << next;
  server.stop();
}

}  // namespace
}  // namespace tandem
