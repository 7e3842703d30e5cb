// The server's parts: request validation, JSON depth and UTF-8 handling, stop strings over a
// token stream, metrics text, the access policy, the HTTP transport's limits and deadlines
// (over real loopback sockets), llama-server's tokenizer endpoints, and the chat page and the
// routes of the whole server on a tiny model.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "chat/chat_template.h"
#include "core/json_brackets.h"
#include "engine/draft_model.h"
#include "kv/block_pool.h"
#include "model/model.h"
#include "server/access_policy.h"
#include "server/chat_page.h"
#include "server/http_framing.h"
#include "server/http_server.h"
#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/openai_json.h"
#include "server/openai_request.h"
#include "server/text_stream.h"
#include "server/token_endpoints.h"
#include "tiny_model.h"

namespace tandem::server {
namespace {

using json = nlohmann::ordered_json;

TEST(OpenAiRequest, ParsesAndValidates) {
  std::string bad;
  auto r = parse_request(json{{"prompt", "hi"}, {"max_tokens", 5}, {"temperature", 0.5}, {"top_p", 0.9}, {"seed", 3},
                              {"stop", {"a", "b"}}, {"stream", true}, {"logprobs", 2}},
                         false, 99, &bad);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->prompt, "hi");
  EXPECT_EQ(r->max_tokens, 5);
  EXPECT_FLOAT_EQ(r->sampling.temperature, 0.5f);
  EXPECT_EQ(r->sampling.seed, 3u);
  EXPECT_EQ(r->stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(parse_request(json{{"prompt", "hi"}}, false, 99, &bad)->sampling.seed, 99u);
  const std::vector<std::pair<json, std::string>> bad_bodies = {
      {json{{"max_tokens", 5}}, "prompt"},
      {json{{"prompt", "x"}, {"max_tokens", -3}}, "max_tokens"},
      {json{{"prompt", "x"}, {"max_tokens", 1.5}}, "max_tokens"},
      {json{{"prompt", "x"}, {"temperature", 7}}, "temperature"},
      {json{{"prompt", "x"}, {"stop", {1, 2}}}, "stop"},
      {json{{"prompt", "x"}, {"stop", {"a", "b", "c", "d", "e"}}}, "stop"},
      {json{{"prompt", "x"}, {"stream", "yes"}}, "stream"},
      {json{{"prompt", "x"}, {"n", 3}}, "n"},
      {json{{"prompt", {"a", "b"}}}, "prompt"},
      {json{{"prompt", "x"}, {"echo", true}}, "echo"},
      {json{{"prompt", "x"}, {"unknown_field", {1, 2}}}, "unknown_field"},  // never silently ignored
  };
  for (const auto& [body, param] : bad_bodies) {
    auto b = parse_request(body, false, 1, &bad);
    EXPECT_FALSE(b.ok()) << body.dump();
    EXPECT_EQ(bad, param) << body.dump();
  }
  // tandem's "speculative" extension: unset by default, a mode name or an object.
  EXPECT_FALSE(parse_request(json{{"prompt", "hi"}}, false, 1, &bad)->speculative.has_value());
  auto spec = parse_request(json{{"prompt", "hi"}, {"speculative", "lookup"}}, false, 1, &bad);
  ASSERT_TRUE(spec.ok() && spec->speculative);
  EXPECT_EQ(spec->speculative->mode, SpeculativeMode::Lookup);
  spec = parse_request(json{{"prompt", "hi"}, {"speculative", {{"mode", "lookup"}, {"draft_max", 6}}}}, false, 1, &bad);
  ASSERT_TRUE(spec.ok() && spec->speculative);
  EXPECT_EQ(spec->speculative->draft_max, 6);
  spec = parse_request(json{{"prompt", "hi"}, {"speculative", "off"}}, false, 1, &bad);
  ASSERT_TRUE(spec.ok() && spec->speculative);
  EXPECT_EQ(spec->speculative->mode, SpeculativeMode::Off);
  spec = parse_request(json{{"prompt", "hi"}, {"speculative", {{"mode", "draft"}}}}, false, 1, &bad);
  ASSERT_TRUE(spec.ok() && spec->speculative);
  EXPECT_EQ(spec->speculative->mode, SpeculativeMode::Draft);
  for (const json& v : {json("draft-model"), json(3), json{{"draft_max", 4}}, json{{"mode", "lookup"}, {"draft_max", 0}}}) {
    EXPECT_FALSE(parse_request(json{{"prompt", "hi"}, {"speculative", v}}, false, 1, &bad).ok()) << v.dump();
    EXPECT_EQ(bad, "speculative");
  }
  EXPECT_FALSE(parse_request(json::array(), false, 1, &bad).ok());
  EXPECT_FALSE(parse_request(json{{"messages", json::array()}}, true, 1, &bad).ok());
  EXPECT_FALSE(parse_request(json{{"messages", {{{"content", "no role"}}}}}, true, 1, &bad).ok());
  auto chat = parse_request(json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"logprobs", true}}, true, 1, &bad);
  ASSERT_TRUE(chat.ok());
  EXPECT_TRUE(chat->logprobs);
  EXPECT_FALSE(parse_request(json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"logprobs", 3}}, true, 1, &bad).ok());
}

TEST(OpenAiRequest, TopLogprobs) {
  std::string bad;
  auto c = parse_request(json{{"prompt", "x"}, {"logprobs", 5}}, false, 1, &bad);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->logprobs);
  EXPECT_EQ(c->top_logprobs, 5);
  EXPECT_EQ(parse_request(json{{"prompt", "x"}, {"logprobs", 0}}, false, 1, &bad)->top_logprobs, 0);
  EXPECT_FALSE(parse_request(json{{"prompt", "x"}, {"logprobs", 6}}, false, 1, &bad).ok());
  const json msgs = {{{"role", "user"}, {"content", "hi"}}};
  auto chat = parse_request(json{{"messages", msgs}, {"logprobs", true}, {"top_logprobs", 20}}, true, 1, &bad);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->top_logprobs, 20);
  EXPECT_FALSE(parse_request(json{{"messages", msgs}, {"logprobs", true}, {"top_logprobs", 21}}, true, 1, &bad).ok());
  EXPECT_EQ(bad, "top_logprobs");
  EXPECT_FALSE(parse_request(json{{"messages", msgs}, {"top_logprobs", 2}}, true, 1, &bad).ok());  // needs logprobs
}

// The bracket scan both the request bound and tool-call parsing stand on.
TEST(JsonBrackets, FindsTheCloseAndStopsPastTheLimit) {
  const std::string text = R"(x {"a":["]}",{"b":[]}],"c":"\"}"} tail)";  // brackets in strings, an escaped quote
  const JsonBrackets whole = scan_json_brackets(text, 2, 64, true);
  EXPECT_EQ(whole.deepest, 4);
  EXPECT_EQ(text.substr(2, whole.end - 2), R"({"a":["]}",{"b":[]}],"c":"\"}"})");
  EXPECT_EQ(whole.too_deep, std::string::npos);
  const JsonBrackets open = scan_json_brackets(R"({"a":[1,2)", 0, 64, true);  // not closed yet
  EXPECT_EQ(open.end, std::string::npos);
  EXPECT_EQ(open.deepest, 2);
  const JsonBrackets deep = scan_json_brackets("[[[[]]]]", 0, 2, true);
  EXPECT_EQ(deep.too_deep, 2u);
  EXPECT_EQ(deep.deepest, 3);
  EXPECT_EQ(deep.end, std::string::npos);
  // Without stop_at_close the scan runs on over later values and stray closing brackets.
  EXPECT_EQ(scan_json_brackets("[] [[[ ]]] ]", 0, 64, false).deepest, 3);
  EXPECT_EQ(scan_json_brackets("[] [[[ ]]] ]", 0, 64, true).end, 2u);
}

TEST(OpenAiJson, NestingDepthIsBoundedBeforeParsing) {
  EXPECT_EQ(json_nesting_depth(R"({"a":[1,{"b":[]}]})", 64), 4);
  EXPECT_EQ(json_nesting_depth(R"({"a":"[[[[{{{{\"[[["})", 64), 1);  // brackets in strings (and escaped quotes) do not count
  const std::string deep = std::string(30000, '[') + std::string(30000, ']');
  auto r = parse_json_body(deep);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("64"), std::string::npos) << r.error().message;
  const std::string at_limit = std::string(64, '[') + std::string(64, ']');
  EXPECT_TRUE(parse_json_body(at_limit).ok());
  EXPECT_FALSE(parse_json_body("[" + at_limit + "]").ok());
  const std::string objects = "{\"messages\":" + std::string(30000, '[') + "1" + std::string(30000, ']') + "}";
  EXPECT_FALSE(parse_json_body(objects).ok());
  EXPECT_FALSE(parse_json_body(std::string(4 << 20, '[')).ok());  // unbalanced and deep: refused by the scan, quickly
  EXPECT_FALSE(parse_json_body("{\"prompt\": \"\xff\"}").ok());  // invalid UTF-8 is not JSON
  EXPECT_FALSE(parse_json_body("{not json").ok());
}

TEST(OpenAiJson, TokenBytesBecomeValidText) {
  EXPECT_EQ(token_display("hello"), "hello");
  EXPECT_EQ(token_display("\xe4\xbd"), "\\xe4\\xbd");        // half of 你
  EXPECT_EQ(token_display("a\xe4\xbd\xa0" "b"), "a\xe4\xbd\xa0" "b");  // whole characters kept
  EXPECT_EQ(token_display("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate is not UTF-8
  EXPECT_EQ(token_display("\xc0\xaf"), "\\xc0\\xaf");          // nor an overlong '/'
  EXPECT_TRUE(is_valid_utf8("\xf0\x9f\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xf0\x9f\x98"));
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF

  std::vector<TokenLogprob> toks = {{"\xe4\xbd", -0.5f, {{"\xe4", -1.0f}, {"x", -2.0f}}}, {"\xa0!", -0.25f, {}}};
  const json chat = chat_logprobs(toks);
  EXPECT_EQ(chat["content"][0]["token"], "\\xe4\\xbd");
  EXPECT_EQ(chat["content"][0]["bytes"], json({228, 189}));
  EXPECT_EQ(chat["content"][0]["top_logprobs"][0]["bytes"], json({228}));
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1]["token"], "x");
  EXPECT_EQ(chat["content"][1]["bytes"], json({160, 33}));
  const json cmpl = completion_logprobs(toks, true);
  EXPECT_EQ(cmpl["tokens"][0], "bytes:\\xe4\\xbd");  // OpenAI's legacy spelling
  EXPECT_EQ(cmpl["top_logprobs"][0]["bytes:\\xe4"], -1.0f);
  EXPECT_EQ(cmpl["top_logprobs"][1], json::object());
  EXPECT_EQ(cmpl["text_offset"], json({0, 2}));
  EXPECT_TRUE(completion_logprobs(toks, false)["top_logprobs"].is_null());
  EXPECT_NO_THROW((void)dump_json(chat));
  EXPECT_NO_THROW((void)dump_json(cmpl));
  // Defence in depth: a raw invalid string still dumps (replaced), never throws.
  EXPECT_EQ(dump_json(json("a\xe4")), "\"a\xef\xbf\xbd\"");
}

TEST(TextStream, StopStringsAcrossTokensAndHeldBackPrefixes) {
  TextStream t({"STOP", "\n\n"});
  std::string out;
  for (const char* piece : {"Hello", " wor", "ld", " ST", "O"}) out += t.push(piece);
  EXPECT_EQ(out, "Hello world ");  // " ST" and "O" are held: they may start "STOP"
  out += t.push("P and more");
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(out, "Hello world ");
  EXPECT_EQ(t.push("ignored"), "");
  TextStream u({"END"});
  std::string v = u.push("a\xe2\x82");  // half a euro sign is not sent
  v += u.push("\xac");
  v += u.push("EN");
  v += u.flush();  // the run ended without the stop string: the held text is sent
  EXPECT_EQ(v, "a\xe2\x82\xac" "EN");
  EXPECT_FALSE(u.stopped());
}

TEST(TextStream, AlwaysValidUtf8) {
  TextStream t({});
  std::string out = t.push("\xe4\xbd");  // half of 你: held
  EXPECT_EQ(out, "");
  out += t.push("\xa0\xe5");              // completes 你, starts 好
  EXPECT_EQ(out, "\xe4\xbd\xa0");
  out += t.flush();                       // generation ended inside 好: U+FFFD, not a broken byte
  EXPECT_EQ(out, "\xe4\xbd\xa0\xef\xbf\xbd");
  TextStream u({});
  EXPECT_EQ(u.push("a\x80" "b"), "a\xef\xbf\xbd" "b");  // a stray continuation byte
  // Any byte soup, in any pieces, comes out as valid UTF-8 that JSON accepts.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; trial++) {
    TextStream s(trial % 2 ? std::vector<std::string>{"\xe5\xa5\xbd"} : std::vector<std::string>{});
    std::string all;
    for (int k = 0; k < 20; k++) {
      std::string piece;
      for (int n = (int)(rng() % 4); n >= 0; n--) piece += (char)(rng() % 3 ? 0x80 + rng() % 0x80 : rng() % 0x100);
      all += s.push(piece);
      ASSERT_TRUE(is_valid_utf8(all)) << trial;
    }
    all += s.flush();
    ASSERT_TRUE(is_valid_utf8(all)) << trial;
    ASSERT_NO_THROW((void)json(all).dump());
  }
}

TEST(Metrics, PrometheusText) {
  Metrics m;
  m.request_started();
  m.request_finished("stop");
  m.observe_ttft(0.03);
  m.observe_tpot(0.004);
  Gauges g;
  g.prompt_tokens = 100;
  g.cached_prompt_tokens = 25;
  g.kv_blocks_total = 10;
  g.drafted_tokens = 40;
  g.accepted_tokens = 30;
  m.set_gauges(g);
  const std::string t = m.render();
  EXPECT_NE(t.find("\ntandem_draft_tokens_total 40\n"), std::string::npos) << t;
  EXPECT_NE(t.find("\ntandem_draft_accepted_tokens_total 30\n"), std::string::npos);
  EXPECT_NE(t.find("\ntandem_draft_acceptance_rate 0.75\n"), std::string::npos);
  EXPECT_NE(t.find("tandem_time_to_first_token_seconds_bucket{le=\"0.05\"} 1"), std::string::npos) << t;
  EXPECT_NE(t.find("tandem_time_to_first_token_seconds_bucket{le=\"0.025\"} 0"), std::string::npos);
  EXPECT_NE(t.find("tandem_requests_finished_total{reason=\"stop\"} 1"), std::string::npos);
  EXPECT_NE(t.find("tandem_prefix_cache_hit_rate 0.25"), std::string::npos);
  EXPECT_NE(t.find("# TYPE tandem_kv_blocks_total gauge"), std::string::npos);
}

TEST(AccessPolicy, KeyHostOriginContentType) {
  EXPECT_TRUE(constant_time_equal("sekrit", "sekrit"));
  EXPECT_FALSE(constant_time_equal("sekrit", "sekriT"));
  EXPECT_FALSE(constant_time_equal("sekrit", "sekrit2"));
  EXPECT_FALSE(constant_time_equal("sekrit", ""));
  EXPECT_FALSE(constant_time_equal("sekrit", "sek"));
  AccessPolicy p(AccessOptions{{"k"}, "127.0.0.1", 8080, {"https://app.example"}, {"llm.lan"}});
  for (const char* ok : {"127.0.0.1:8080", "localhost:8080", "LOCALHOST:8080", "[::1]:8080", "llm.lan", "llm.lan:443"})
    EXPECT_TRUE(p.host_allowed(ok)) << ok;
  for (const char* bad : {"evil.example:8080", "127.0.0.1:8081", "127.0.0.1", "", "[::1", "127.0.0.1:80a", "10.0.0.1:8080"})
    EXPECT_FALSE(p.host_allowed(bad)) << bad;
  AccessPolicy any(AccessOptions{{}, "0.0.0.0", 8080, {}, {}});
  EXPECT_TRUE(any.host_allowed("10.0.0.1:8080"));  // bound to every interface: IP literals are fine
  EXPECT_FALSE(any.host_allowed("rebind.evil.example:8080"));
  EXPECT_TRUE(p.origin_allowed("http://127.0.0.1:8080"));
  EXPECT_TRUE(p.origin_allowed("https://app.example"));
  EXPECT_FALSE(p.origin_allowed("http://evil.example"));
  EXPECT_FALSE(p.origin_allowed("null"));

  auto req = [](std::string method, HttpHeaders h) {
    HttpRequest r;
    r.method = std::move(method);
    r.target = "/v1/completions";
    r.headers = std::move(h);
    return r;
  };
  const HttpHeaders good = {{"Host", "127.0.0.1:8080"}, {"Authorization", "Bearer k"}, {"Content-Type", "application/json; charset=utf-8"}};
  EXPECT_FALSE(p.check(req("POST", good), true));
  auto status = [&](HttpRequest r, bool needs_key = true) { auto x = p.check(r, needs_key); return x ? x->status : 0; };
  EXPECT_EQ(status(req("POST", {{"Authorization", "Bearer k"}, {"Content-Type", "application/json"}})), 400);  // no Host
  EXPECT_EQ(status(req("POST", {{"Host", "evil.example:8080"}, {"Authorization", "Bearer k"}, {"Content-Type", "application/json"}})), 403);
  HttpHeaders h = good;
  h.emplace_back("Origin", "http://evil.example");
  EXPECT_EQ(status(req("POST", h)), 403);
  EXPECT_EQ(status(req("POST", {{"Host", "127.0.0.1:8080"}, {"Authorization", "Bearer x"}, {"Content-Type", "application/json"}})), 401);
  EXPECT_EQ(status(req("POST", {{"Host", "127.0.0.1:8080"}, {"Content-Type", "application/json"}})), 401);
  EXPECT_EQ(status(req("POST", {{"Host", "127.0.0.1:8080"}, {"Content-Type", "application/json"}}), false), 0);  // an open endpoint
  EXPECT_EQ(status(req("POST", {{"Host", "127.0.0.1:8080"}, {"Authorization", "Bearer k"}, {"Content-Type", "text/plain"}})), 415);
  EXPECT_EQ(status(req("POST", {{"Host", "127.0.0.1:8080"}, {"Authorization", "Bearer k"}})), 415);
  EXPECT_EQ(status(req("GET", {{"Host", "127.0.0.1:8080"}, {"Authorization", "Bearer k"}})), 0);
  h = good;
  h.emplace_back("Origin", "https://app.example");
  EXPECT_EQ(status(req("POST", h)), 0);
  EXPECT_EQ(p.cors_headers(req("POST", h)).at(0).second, "https://app.example");
  EXPECT_TRUE(p.cors_headers(req("POST", good)).empty());
}

// ---- the HTTP transport over loopback sockets ----

class TestHandler : public HttpHandler {
 public:
  std::atomic<int> bodies_read{0};
  std::atomic<bool> gone_seen{false};
  std::shared_ptr<ResponseWriter> held;
  std::mutex mu;
  size_t big_answer_bytes = 1u << 20;  // the answer to /big

  std::optional<HttpResponse> check_header(const HttpRequest& r) override {
    if (r.path() == "/refuse") return HttpResponse{401, "application/json", R"({"error":"no"})", {}, false};
    return std::nullopt;
  }
  std::optional<HttpResponse> answer_inline(const HttpRequest& r) override {
    if (r.path() == "/inline") return HttpResponse{200, "text/plain", "inline", {}, false};
    return std::nullopt;
  }
  void handle(HttpRequest r, std::shared_ptr<ResponseWriter> w) override {
    bodies_read++;
    if (r.path() == "/throw") throw std::runtime_error("boom");
    if (r.path() == "/big") return w->respond({200, "text/plain", std::string(big_answer_bytes, 'x'), {}, false});
    if (r.path() == "/stream") {
      w->begin_stream(200, "text/event-stream", {});
      for (const char* c : {"one", "two", "three"}) w->write(c);
      return w->end_stream();
    }
    if (r.path() == "/hang") {  // answers never; notices when the client leaves
      w->on_gone([this] { gone_seen = true; });
      std::lock_guard<std::mutex> l(mu);
      held = w;
      return;
    }
    w->respond({200, "text/plain", r.target + ":" + r.body, {}, false});
  }
};

// A loopback connection; `receive_window` > 0 shrinks its receive buffer (a client that
// never reads then stalls the server's writes at once).
int dial(int port, int receive_window = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (receive_window > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_window, sizeof receive_window);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, (sockaddr*)&a, sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += (size_t)n;
  }
}

// Everything the server sends until it closes or `ms` pass without a byte.
std::string read_until_quiet(int fd, int ms) {
  std::string out;
  char buf[65536];
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, ms) > 0) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, (size_t)n);
  }
  return out;
}

bool closed_by_peer(int fd, int ms) {
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, ms) > 0) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
  }
  return false;
}

struct TransportFixture : ::testing::Test {
  TestHandler handler;
  std::unique_ptr<HttpTransport> t;
  void start(HttpLimits l) {
    t = std::make_unique<HttpTransport>(handler, l, 2, 2);
    ASSERT_TRUE(t->bind("127.0.0.1", 0).ok());
    t->start();
  }
  static HttpLimits small() {
    HttpLimits l;
    l.max_header_bytes = 1024;
    l.max_header_count = 10;
    l.max_body_bytes = 1024;
    l.header_timeout = std::chrono::milliseconds(400);
    l.idle_timeout = std::chrono::milliseconds(600);
    l.max_connections = 8;
    return l;
  }
};

TEST_F(TransportFixture, AnswersPipelinedRequestsInOrder) {
  start(small());
  const int fd = dial(t->port());
  std::string blob;
  for (int i = 0; i < 5; i++) blob += "POST /echo" + std::to_string(i) + " HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nb" + std::to_string(i);
  blob += "GET /inline HTTP/1.1\r\nHost: x\r\n\r\nGET /refuse HTTP/1.1\r\nHost: x\r\n\r\nGET /stream HTTP/1.1\r\nHost: x\r\n\r\n";
  send_all(fd, blob);
  const std::string got = read_until_quiet(fd, 1000);
  size_t pos = 0;
  for (int i = 0; i < 5; i++) {
    const size_t p = got.find("/echo" + std::to_string(i) + ":b" + std::to_string(i));
    ASSERT_NE(p, std::string::npos) << got;
    EXPECT_GT(p, pos);
    pos = p;
  }
  EXPECT_GT(got.find("inline"), pos);
  EXPECT_GT(got.find("HTTP/1.1 401"), got.find("inline"));  // a refusal without a body keeps the connection
  EXPECT_NE(got.find("Transfer-Encoding: chunked\r\n"), std::string::npos);
  EXPECT_NE(got.find("\r\n\r\n3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n0\r\n\r\n"), std::string::npos) << got;
  ::close(fd);
}

TEST_F(TransportFixture, LimitsWhileParsing) {
  start(small());
  auto answer = [&](const std::string& req) {
    const int fd = dial(t->port());
    send_all(fd, req);
    std::string got = read_until_quiet(fd, 1000);
    ::close(fd);
    return got.substr(0, 12);
  };
  EXPECT_EQ(answer("GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(5000, 'a') + "\r\n\r\n"), "HTTP/1.1 431");
  std::string many = "GET /x HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 11; i++) many += "X-" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(answer(many + "\r\n"), "HTTP/1.1 431");
  EXPECT_EQ(answer("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1025\r\n\r\n"), "HTTP/1.1 413");
  std::string chunked = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 3; i++) chunked += "200\r\n" + std::string(512, 'x') + "\r\n";  // 1536 bytes in 512-byte chunks
  EXPECT_EQ(answer(chunked + "0\r\n\r\n"), "HTTP/1.1 413");
  EXPECT_EQ(answer("POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"), "HTTP/1.1 401");  // body never sent
  EXPECT_EQ(answer("NOT HTTP\r\n\r\n"), "HTTP/1.1 400");
  EXPECT_EQ(answer("GET /throw HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 500");
  EXPECT_EQ(handler.bodies_read.load(), 1);  // only /throw reached a handler
}

TEST_F(TransportFixture, BodiesHeldAtOnceAreBounded) {
  HttpLimits l = small();
  l.max_inflight_body_bytes = 1500;
  start(l);
  // A holds 1000 bytes of the budget while its body trickles in; B's 1000 do not fit.
  const int a = dial(t->port());
  send_all(a, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + std::string(10, 'a'));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string b_req = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n";
  int b = dial(t->port());
  send_all(b, b_req);
  EXPECT_EQ(read_until_quiet(b, 1000).substr(0, 12), "HTTP/1.1 503");
  ::close(b);
  // A small body still fits beside it; once A's request is answered its share is back.
  b = dial(t->port());
  send_all(b, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 400\r\n\r\n" + std::string(400, 'b'));
  EXPECT_EQ(read_until_quiet(b, 1000).substr(0, 12), "HTTP/1.1 200");
  ::close(b);
  send_all(a, std::string(990, 'a'));
  EXPECT_EQ(read_until_quiet(a, 1000).substr(0, 12), "HTTP/1.1 200");
  ::close(a);
  b = dial(t->port());
  send_all(b, b_req + std::string(1000, 'b'));
  EXPECT_EQ(read_until_quiet(b, 1000).substr(0, 12), "HTTP/1.1 200");
  ::close(b);
}

TEST_F(TransportFixture, DeadlinesAndConnectionLimit) {
  start(small());
  // A header that trickles in is cut at the header deadline with a 408.
  const int slow = dial(t->port());
  const auto t0 = std::chrono::steady_clock::now();
  send_all(slow, "GET /x HTTP/1.1\r\n");
  std::string got;
  for (int i = 0; i < 20 && got.empty(); i++) {
    send_all(slow, "X-a: b\r\n");
    got = read_until_quiet(slow, 100);
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(got.substr(0, 12), "HTTP/1.1 408");
  EXPECT_LT(waited, 1.5);
  ::close(slow);
  // An idle keep-alive connection is closed after the idle timeout.
  const int idle = dial(t->port());
  send_all(idle, "GET /inline HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(closed_by_peer(idle, 3000));
  ::close(idle);
  // Past max_connections: a quick 503, while the open ones are still served. (A closed
  // session leaves the count when its last pending operation ends: wait for the two above.)
  for (int i = 0; i < 300 && t->open_connections() > 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(t->open_connections(), 0);
  std::vector<int> fds;
  for (int i = 0; i < 8; i++) fds.push_back(dial(t->port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int extra = dial(t->port());
  EXPECT_EQ(read_until_quiet(extra, 1000).substr(0, 12), "HTTP/1.1 503");
  ::close(extra);
  send_all(fds[0], "GET /inline HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(read_until_quiet(fds[0], 300).find("inline"), std::string::npos);
  for (int fd : fds) ::close(fd);
}

TEST_F(TransportFixture, ClientThatLeavesIsNoticedAndStopDoesNotWait) {
  start(small());
  const int fd = dial(t->port());
  send_all(fd, "GET /hang HTTP/1.1\r\nHost: x\r\n\r\n");
  for (int i = 0; i < 100 && !handler.held; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  {
    std::lock_guard<std::mutex> l(handler.mu);
    ASSERT_TRUE(handler.held);
    EXPECT_FALSE(handler.held->gone());
  }
  ::close(fd);
  for (int i = 0; i < 100 && !handler.gone_seen; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(handler.gone_seen.load());
  EXPECT_TRUE(handler.held->gone());
  handler.held->respond({200, "text/plain", "late", {}, false});  // ignored, no crash
  // stop() with a stuck client (half a header, never finished) returns at once.
  const int stuck = dial(t->port());
  send_all(stuck, "GET /x HTTP/1.1\r\n");
  const auto t0 = std::chrono::steady_clock::now();
  t->stop();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  EXPECT_FALSE(t->work_queue()->post([] {}));  // the worker door is closed
  ::close(stuck);
}

HttpRequest header_of(std::string method, int version, HttpHeaders h) { return HttpRequest{std::move(method), "/x", version, std::move(h), "", nullptr}; }

int framing_status(std::string method, HttpHeaders h, int version = 11) {
  const auto r = check_framing(header_of(std::move(method), version, std::move(h)));
  return r ? r->status : 0;
}

TEST(HttpFraming, BodyLengthHostMethodExpect) {
  const HttpHeaders host = {{"Host", "x"}};
  auto with = [&](HttpHeaders more) {
    HttpHeaders h = host;
    h.insert(h.end(), more.begin(), more.end());
    return h;
  };
  EXPECT_EQ(framing_status("GET", host), 0);
  EXPECT_EQ(framing_status("POST", with({{"Transfer-Encoding", "chunked"}})), 0);
  EXPECT_EQ(framing_status("POST", with({{"Transfer-Encoding", " Chunked "}})), 0);
  EXPECT_EQ(framing_status("POST", with({{"Content-Length", "5"}})), 0);
  // chunked must be the final coding, once, alone with no Content-Length, on HTTP/1.1.
  EXPECT_EQ(framing_status("POST", with({{"Transfer-Encoding", "chunked, identity"}})), 400);
  EXPECT_EQ(framing_status("POST", with({{"Transfer-Encoding", "identity"}})), 400);
  EXPECT_EQ(framing_status("POST", with({{"Transfer-Encoding", ""}})), 400);
  EXPECT_EQ(framing_status("POST", with({{"Transfer-Encoding", "chunked;x=1"}})), 400);
  EXPECT_EQ(framing_status("POST", with({{"Transfer-Encoding", "chunked, chunked"}})), 400);
  EXPECT_EQ(framing_status("POST", with({{"Transfer-Encoding", "chunked"}, {"Content-Length", "5"}})), 400);
  EXPECT_EQ(framing_status("POST", with({{"Transfer-Encoding", "chunked"}}), 10), 400);
  EXPECT_EQ(framing_status("POST", with({{"Transfer-Encoding", "gzip, chunked"}})), 501);  // well framed, not decoded
  EXPECT_EQ(framing_status("POST", with({{"Transfer-Encoding", "gzip"}, {"Transfer-Encoding", "chunked"}})), 501);  // lines combine
  // One Host; none is fine on HTTP/1.0 only.
  EXPECT_EQ(framing_status("GET", {{"Host", "x"}, {"host", "y"}}), 400);
  EXPECT_EQ(framing_status("GET", {{"Host", "x, y"}}), 400);
  EXPECT_EQ(framing_status("GET", {}), 400);
  EXPECT_EQ(framing_status("GET", {}, 10), 0);
  // Unknown methods (case matters) are 501; known ones are left to the handler (405 or routed).
  EXPECT_EQ(framing_status("FOOBAR", host), 501);
  EXPECT_EQ(framing_status("get", host), 501);
  for (const char* m : {"HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "CONNECT"}) EXPECT_EQ(framing_status(m, host), 0) << m;
  EXPECT_EQ(framing_status("POST", with({{"Expect", "100-Continue"}})), 0);
  EXPECT_EQ(framing_status("POST", with({{"Expect", "999-bogus"}})), 417);
  EXPECT_EQ(framing_status("POST", with({{"Expect", "100-continue, x"}})), 417);
}

// The status codes of every response in `s`, in order (bodies skipped by their Content-Length).
std::vector<int> statuses_of(const std::string& s) {
  std::vector<int> out;
  size_t pos = 0;
  while (s.compare(pos, 9, "HTTP/1.1 ") == 0) {
    out.push_back(std::atoi(s.c_str() + pos + 9));
    const size_t end = s.find("\r\n\r\n", pos);
    if (end == std::string::npos) break;
    const size_t cl = s.find("Content-Length: ", pos);
    pos = end + 4 + (cl < end ? std::strtoul(s.c_str() + cl + 16, nullptr, 10) : 0);
  }
  return out;
}

TEST_F(TransportFixture, FramingErrorsCloseTheConnection) {
  start(small());
  // Each is answered, the connection closed, and the bytes after the header (a whole request,
  // as a smuggler would send) never answered.
  const std::string smuggled = "GET /inline HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::pair<std::string, int> cases[] = {
      {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n", 400},
      {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 36\r\n\r\n", 400},
      {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 36\r\nContent-Length: 3\r\n\r\n", 400},
      {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
      {"GET /inline HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400},
      {"GET /inline HTTP/1.1\r\n\r\n", 400},
      {"FOOBAR /inline HTTP/1.1\r\nHost: x\r\n\r\n", 501},
      {"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 999-bogus\r\nContent-Length: 36\r\n\r\n", 417},
  };
  for (const auto& [head, status] : cases) {
    const int fd = dial(t->port());
    send_all(fd, head + smuggled);
    const std::string got = read_until_quiet(fd, 1000);
    EXPECT_EQ(statuses_of(got), std::vector<int>{status}) << head << got;
    EXPECT_NE(got.find("Connection: close"), std::string::npos) << head;
    EXPECT_TRUE(closed_by_peer(fd, 500)) << head;
    ::close(fd);
  }
  EXPECT_EQ(handler.bodies_read.load(), 0);
  // An unknown Expect is refused before the body is sent (417 at once, not a body deadline).
  const int fd = dial(t->port());
  const auto t0 = std::chrono::steady_clock::now();
  send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 999-bogus\r\nContent-Length: 1000\r\n\r\n");
  EXPECT_EQ(read_until_quiet(fd, 300).substr(0, 12), "HTTP/1.1 417");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5);
  ::close(fd);
}

TEST_F(TransportFixture, HeadAnswersWithoutTheBody) {
  start(small());
  const int fd = dial(t->port());
  send_all(fd, "HEAD /inline HTTP/1.1\r\nHost: x\r\n\r\nGET /inline HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string got = read_until_quiet(fd, 500);
  const size_t second = got.find("HTTP/1.1 200", 1);
  ASSERT_NE(second, std::string::npos) << got;
  EXPECT_EQ(got.substr(0, second).find("inline"), std::string::npos) << got;  // no body after HEAD's fields
  EXPECT_NE(got.substr(0, second).find("Content-Length: 6"), std::string::npos) << got;  // but the GET's length
  EXPECT_NE(got.find("inline", second), std::string::npos);
  ::close(fd);
}

// A client that sends its request and never reads (its receive window as small as the kernel allows).
int dial_never_reading(int port) { return dial(port, 1024); }

TEST_F(TransportFixture, UnsentAnswersAreBoundedAcrossConnections) {
  HttpLimits l = small();
  l.socket_send_buffer = 4096;
  l.idle_timeout = std::chrono::milliseconds(10'000);  // (it would close A, whose answer is all queued)
  l.max_unsent_answer_bytes = 1u << 20;
  l.max_answer_bytes = 3u << 20;
  handler.big_answer_bytes = 2u << 20;
  start(l);
  // A's 2 MiB answer is admitted (the budget was free) and waits: the kernel takes a few KiB.
  const int a = dial_never_reading(t->port());
  send_all(a, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n");
  for (int i = 0; i < 200 && t->unsent_answer_bytes() < (1u << 20); i++) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_GT(t->unsent_answer_bytes(), size_t{1} << 20);
  // Past the budget a new request gets a quick 503 with Retry-After, before its handler runs.
  const int before = handler.bodies_read.load();
  int b = dial(t->port());
  send_all(b, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi");
  std::string got = read_until_quiet(b, 500);
  EXPECT_EQ(got.substr(0, 12), "HTTP/1.1 503");
  EXPECT_NE(got.find("Retry-After: 1\r\n"), std::string::npos);
  EXPECT_EQ(handler.bodies_read.load(), before);
  ::close(b);
  // Once A has taken nothing for 2 s, a request refused for the budget has A's connection closed
  // (not at write_timeout): its share comes back and requests are served again.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  b = dial(t->port());
  send_all(b, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_EQ(read_until_quiet(b, 500).substr(0, 12), "HTTP/1.1 503");
  ::close(b);
  for (int i = 0; i < 200 && t->unsent_answer_bytes() > 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(t->unsent_answer_bytes(), 0u);
  EXPECT_TRUE(closed_by_peer(a, 1000));
  ::close(a);
  b = dial(t->port());
  send_all(b, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_EQ(read_until_quiet(b, 500).substr(0, 12), "HTTP/1.1 200");
  ::close(b);
  // An answer past max_answer_bytes is not sent at all: a 500 says why.
  handler.big_answer_bytes = 4u << 20;
  b = dial(t->port());
  send_all(b, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n");
  got = read_until_quiet(b, 1000);
  EXPECT_EQ(got.substr(0, 12), "HTTP/1.1 500");
  EXPECT_NE(got.find("more than the 3145728"), std::string::npos) << got.substr(0, 300);
  ::close(b);
  // A reading client gets its whole answer, and the budget is all given back after it.
  handler.big_answer_bytes = 2u << 20;
  b = dial(t->port());
  send_all(b, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_GT(read_until_quiet(b, 1000).size(), size_t{2} << 20);
  ::close(b);
  EXPECT_EQ(t->unsent_answer_bytes(), 0u);
}

}  // namespace
}  // namespace tandem::server

namespace tandem::server {
namespace {

// ---- llama-server's /tokenize, /detokenize, /apply-template ----

// The tiny model's byte-ish BPE vocabulary ('a' is 65, 'b' 66, 'c' 67, '<' 28, control
// "<|endoftext|>" 0) plus the GPT-2 byte-alphabet tokens of bytes 0xC3 ("Ã") and 0xBF ("¿"):
// "ÿ" (C3 BF) is those two tokens, each of them not UTF-8 on its own.
constexpr int32_t kByteC3 = 96, kByteBF = 97;
std::unique_ptr<Tokenizer> tiny_tokenizer(bool add_bos = false) {
  auto f = test::tiny_model_file(test::TinyShape{});
  auto v = Vocab::from_gguf(*f);
  EXPECT_TRUE(v.ok());
  Vocab vocab = std::move(v.value());
  EXPECT_EQ(vocab.size(), kByteC3);
  for (const char* t : {"\xC3\x83", "\xC2\xBF"}) {
    vocab.add_token(t, TokenType::Normal);
  }
  if (add_bos) vocab.bos = 0, vocab.add_bos = true;
  auto t = Tokenizer::create(std::move(vocab));
  EXPECT_TRUE(t.ok());
  return std::move(t.value());
}

TEST(TokenEndpoints, TokenizeAsLlamaServer) {
  const auto tok = tiny_tokenizer();
  std::string bad;
  auto answer = [&](const json& body) {
    auto r = tokenize_answer(body, *tok, &bad);
    return r.ok() ? r.value() : "error: " + r.error().message;
  };
  EXPECT_EQ(answer({{"content", "abc"}}), R"({"tokens":[65,66,67]})");
  EXPECT_EQ(answer({{"content", ""}}), R"({"tokens":[]})");
  // parse_special (default true): control-token text becomes the token, or stays text.
  EXPECT_EQ(answer({{"content", "<|endoftext|>a"}}), R"({"tokens":[0,65]})");
  const json as_text = json::parse(answer({{"content", "<|endoftext|>"}, {"parse_special", false}}))["tokens"];
  EXPECT_GT(as_text.size(), 1u);
  EXPECT_EQ(as_text[0], 28);
  // with_pieces: text when the piece is UTF-8, its bytes when not.
  EXPECT_EQ(answer({{"content", "a<|endoftext|>"}, {"with_pieces", true}}),
            R"({"tokens":[{"id":65,"piece":"a"},{"id":0,"piece":"<|endoftext|>"}]})");
  EXPECT_EQ(answer({{"content", "\xC3\xBF"}, {"with_pieces", true}}),
            R"({"tokens":[{"id":96,"piece":[195]},{"id":97,"piece":[191]}]})");
  EXPECT_EQ(answer({{"content", "\"\\"}, {"with_pieces", true}}), R"({"tokens":[{"id":2,"piece":"\""},{"id":60,"piece":"\\"}]})");
  // add_special (default false): BOS as the vocabulary asks.
  const auto with_bos = tiny_tokenizer(true);
  auto r = tokenize_answer({{"content", "a"}, {"add_special", true}}, *with_bos, &bad);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), R"({"tokens":[0,65]})");
  EXPECT_EQ(tokenize_answer({{"content", "a"}}, *with_bos, &bad).value(), R"({"tokens":[65]})");
  // Bad input names its field.
  for (const json& b : {json{{"text", "a"}}, json{{"content", 5}}, json{{"content", json::array({"a"})}}, json{{"content", nullptr}}}) {
    bad.clear();
    EXPECT_FALSE(tokenize_answer(b, *tok, &bad).ok()) << b.dump();
    EXPECT_EQ(bad, "content") << b.dump();
  }
  for (const char* flag : {"add_special", "parse_special", "with_pieces"}) {
    EXPECT_FALSE(tokenize_answer({{"content", "a"}, {flag, "yes"}}, *tok, &bad).ok());
    EXPECT_EQ(bad, flag);
  }
  EXPECT_FALSE(tokenize_answer(json::array({"a"}), *tok, &bad).ok());
  // One answer holds at most kMaxTokensPerAnswer tokens.
  const std::string many(kMaxTokensPerAnswer + 1, 'a');
  auto big = tokenize_answer({{"content", many}}, *tok, &bad);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("send it in parts"), std::string::npos) << big.error().message;
  EXPECT_TRUE(tokenize_answer({{"content", many.substr(1)}}, *tok, &bad).ok());
}

TEST(TokenEndpoints, DetokenizeValidatesEveryId) {
  const auto tok = tiny_tokenizer();
  std::string bad;
  auto content = [&](const json& body) {
    auto r = detokenize_answer(body, *tok, &bad);
    return r.ok() ? json::parse(r.value()).at("content").get<std::string>() : "error: " + r.error().message;
  };
  EXPECT_EQ(content({{"tokens", {65, 66, 67}}}), "abc");
  EXPECT_EQ(content({{"tokens", json::array()}}), "");
  EXPECT_EQ(content({{"tokens", {0, 65}}}), "<|endoftext|>a");  // control tokens give their text
  EXPECT_EQ(content({{"tokens", {kByteC3, kByteBF}}}), "\xC3\xBF");   // bytes joined across tokens
  EXPECT_EQ(content({{"tokens", {kByteC3}}}), "\xEF\xBF\xBD");         // half a character: U+FFFD
  const json bad_ids[] = {json{{"tokens", {65, 98}}}, json{{"tokens", {-1}}}, json{{"tokens", {1.5}}},
                          json{{"tokens", {"65"}}},   json{{"tokens", {nullptr}}}, json{{"tokens", {UINT64_MAX}}},
                          json{{"tokens", 65}},       json{{"tokens", "abc"}},  json{{"content", "abc"}},
                          json{{"tokens", {json::array({65})}}}};
  for (const json& b : bad_ids) {
    bad.clear();
    const std::string got = content(b);
    EXPECT_EQ(got.substr(0, 7), "error: ") << b.dump();
    EXPECT_EQ(bad, "tokens") << b.dump();
  }
  EXPECT_EQ(content({{"tokens", {65, 98}}}), "error: 'tokens' [1] = 98 is not a token id of this model (0 to 97)");
  EXPECT_EQ(content({{"tokens", json(std::vector<int>(kMaxTokensPerAnswer + 1, 65))}}).substr(0, 7), "error: ");
}

TEST(TokenEndpoints, ApplyTemplateRendersWhatChatWouldTokenize) {
  auto t = ChatTemplate::from_source(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
      "{% if tools %}[{{ tools | length }} tools]{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}",
      "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.error().message;
  std::string bad;
  const json msgs = json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi <b>"}}});
  auto prompt = [&](const json& body, const ChatTemplate* chat) {
    auto r = apply_template_answer(body, chat, &bad);
    return r.ok() ? json::parse(r.value()).at("prompt").get<std::string>() : "error: " + r.error().message;
  };
  EXPECT_EQ(prompt({{"messages", msgs}}, &t.value()), "<s><system>Be brief.</system><user>Hi <b></user><assistant>");
  EXPECT_EQ(prompt({{"messages", msgs}, {"add_generation_prompt", false}}, &t.value()),
            "<s><system>Be brief.</system><user>Hi <b></user>");
  EXPECT_EQ(prompt({{"messages", msgs}, {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})}}, &t.value()),
            "<s><system>Be brief.</system><user>Hi <b></user>[1 tools]<assistant>");
  // Validated as /v1/chat/completions validates its body.
  for (const json& b : {json{{"messages", json::array()}}, json{{"messages", "hi"}}, json{{"messages", {{{"content", "x"}}}}},
                        json::object()}) {
    bad.clear();
    EXPECT_EQ(prompt(b, &t.value()).substr(0, 7), "error: ") << b.dump();
    EXPECT_EQ(bad.substr(0, 8), "messages") << b.dump();  // "messages", or the entry's path ("messages[0]")
  }
  EXPECT_EQ(prompt({{"messages", msgs}, {"add_generation_prompt", 1}}, &t.value()).substr(0, 7), "error: ");
  EXPECT_EQ(bad, "add_generation_prompt");
  EXPECT_EQ(prompt({{"messages", msgs}, {"tools", "x"}}, &t.value()).substr(0, 7), "error: ");
  EXPECT_EQ(prompt({{"messages", msgs}}, nullptr), "error: this model has no usable chat template");
  // A template's own error is the caller's (a 400 naming the messages).
  auto raising = ChatTemplate::from_source("{{ raise_exception('roles must alternate') }}", "", "");
  ASSERT_TRUE(raising.ok());
  EXPECT_NE(prompt({{"messages", msgs}}, &raising.value()).find("roles must alternate"), std::string::npos);
  EXPECT_EQ(bad, "messages");
}

// ---- the whole server on a tiny model: routes, the page, the access policy ----

struct ServerFixture : ::testing::Test {
  std::unique_ptr<Model> model;
  std::unique_ptr<GgufFile> vocab_file;
  std::unique_ptr<Tokenizer> tok;
  std::optional<ChatTemplate> chat;
  std::unique_ptr<BlockPool> pool;
  Metrics metrics;
  std::unique_ptr<ServingLoop> loop;
  std::unique_ptr<HttpServer> server;
  std::unique_ptr<Model> draft;  // with_draft: a smaller random model of the same vocabulary
  std::unique_ptr<BlockPool> draft_pool;

  void start(const std::string& api_key, bool with_draft = false) {
    test::TinyShape s;
    s.n_ctx = 128;
    auto m = Model::from_gguf(test::tiny_model_file(s));
    ASSERT_TRUE(m.ok()) << m.error().message;
    model = std::move(m.value());
    vocab_file = test::tiny_model_file(s);
    auto t = Tokenizer::from_gguf(*vocab_file);
    ASSERT_TRUE(t.ok());
    tok = std::move(t.value());
    auto c = ChatTemplate::from_source("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}", "", "");
    ASSERT_TRUE(c.ok());
    chat = std::move(c.value());
    const ModelConfig& cfg = model->config();
    auto p = BlockPool::create({cfg.n_layer, cfg.n_kv_head, cfg.head_dim, 16, 32, DType::F16}, model->backend());
    ASSERT_TRUE(p.ok());
    pool = std::move(p.value());
    SchedulerOptions so;
    if (with_draft) {
      test::TinyShape d = s;
      d.n_layer = 1;
      auto dm = Model::from_gguf(test::tiny_model_file(d, 5));
      ASSERT_TRUE(dm.ok());
      draft = std::move(dm.value());
      auto dp = new_draft_pool(*draft, *pool);
      ASSERT_TRUE(dp.ok());
      draft_pool = std::move(dp.value());
      so.draft_model = {draft.get(), draft_pool.get()};
    }
    loop = std::make_unique<ServingLoop>(*model, *pool, so, metrics);
    ServerOptions o;
    o.port = 0;
    if (!api_key.empty()) o.api_keys = {api_key};
    server = std::make_unique<HttpServer>(*model, *tok, &*chat, *loop, metrics, o);
    ASSERT_TRUE(server->bind().ok());
    server->start();
  }
  void TearDown() override {
    if (server) server->stop();
  }
  // The whole response (one request, Connection: close).
  std::string request(const std::string& method, const std::string& path, const std::string& body = "", HttpHeaders h = {}) {
    std::string req = method + " " + path + " HTTP/1.1\r\nConnection: close\r\n";
    bool has_host = false;
    for (const auto& [k, v] : h) {
      req += k + ": " + v + "\r\n";
      has_host = has_host || k == "Host";
    }
    if (!has_host) req += "Host: 127.0.0.1:" + std::to_string(server->port()) + "\r\n";
    if (method == "POST") req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    const int fd = dial(server->port());
    send_all(fd, req + "\r\n" + body);
    std::string got = read_until_quiet(fd, 3000);
    ::close(fd);
    return got;
  }
  static int status(const std::string& response) { return response.size() > 12 ? std::stoi(response.substr(9, 3)) : 0; }
  static std::string body(const std::string& response) {
    const size_t at = response.find("\r\n\r\n");
    return at == std::string::npos ? "" : response.substr(at + 4);
  }
};

TEST_F(ServerFixture, ChatPageIsServedWithItsPolicy) {
  start("k");
  const std::string page = request("GET", "/");
  EXPECT_EQ(status(page), 200) << page;  // open: the page holds nothing, its API calls carry the key
  EXPECT_NE(page.find("Content-Type: text/html; charset=utf-8\r\n"), std::string::npos);
  EXPECT_NE(page.find(std::string("Content-Security-Policy: ") + kChatPageCsp + "\r\n"), std::string::npos) << page;
  EXPECT_NE(page.find("X-Content-Type-Options: nosniff\r\n"), std::string::npos);
  EXPECT_NE(page.find("X-Frame-Options: DENY\r\n"), std::string::npos);
  const std::string html = body(page);
  EXPECT_NE(html.find("<script src=\"/chat.js\""), std::string::npos);
  // The policy allows no inline code or style: the page must have none.
  EXPECT_EQ(html.find("<script>"), std::string::npos);
  EXPECT_EQ(html.find("<style"), std::string::npos);
  EXPECT_EQ(html.find("style=\""), std::string::npos);
  for (const char* handler : {"onclick=", "onload=", "onsubmit=", "javascript:"}) EXPECT_EQ(html.find(handler), std::string::npos) << handler;
  const std::string js = request("GET", "/chat.js");
  EXPECT_EQ(status(js), 200);
  EXPECT_NE(js.find("Content-Type: text/javascript; charset=utf-8\r\n"), std::string::npos);
  EXPECT_NE(js.find("Content-Security-Policy: "), std::string::npos);
  EXPECT_NE(body(js).find("/v1/chat/completions"), std::string::npos);
  EXPECT_NE(body(js).find("stream: true"), std::string::npos);
  EXPECT_EQ(body(js).find("innerHTML"), std::string::npos);  // model text is set as text only
  EXPECT_EQ(body(js).find("insertAdjacentHTML"), std::string::npos);
  EXPECT_EQ(status(request("GET", "/chat.css")), 200);
  EXPECT_EQ(status(request("GET", "/?x=1")), 200);
  EXPECT_EQ(status(request("GET", "/chat.jsx")), 404);
  EXPECT_EQ(status(request("POST", "/", "{}")), 405);
  // The DNS-rebinding and cross-origin guards hold for the page too.
  EXPECT_EQ(status(request("GET", "/", "", {{"Host", "rebind.evil.example:" + std::to_string(server->port())}})), 403);
  EXPECT_EQ(status(request("GET", "/chat.js", "", {{"Origin", "http://evil.example"}})), 403);
}

TEST_F(ServerFixture, TokenEndpointsAreBehindTheKey) {
  start("k");
  const HttpHeaders key = {{"Authorization", "Bearer k"}};
  for (const char* path : {"/tokenize", "/detokenize", "/apply-template"})
    EXPECT_EQ(status(request("POST", path, "{}")), 401) << path;
  EXPECT_EQ(status(request("GET", "/metrics")), 401);  // what the page's KV view polls needs the key too
  // The page's KV view shows the pool before any request has run.
  const std::string m = request("GET", "/metrics", "", key);
  EXPECT_EQ(status(m), 200);
  EXPECT_NE(body(m).find("\ntandem_kv_blocks_total 32\n"), std::string::npos) << m;
  std::string r = request("POST", "/tokenize", R"({"content":"abc","with_pieces":true})", key);
  EXPECT_EQ(status(r), 200) << r;
  EXPECT_EQ(body(r), R"({"tokens":[{"id":65,"piece":"a"},{"id":66,"piece":"b"},{"id":67,"piece":"c"}]})");
  r = request("POST", "/detokenize", R"({"tokens":[65,66,67]})", key);
  EXPECT_EQ(body(r), R"({"content":"abc"})") << r;
  r = request("POST", "/detokenize", R"({"tokens":[65,96]})", key);
  EXPECT_EQ(status(r), 400);
  EXPECT_NE(body(r).find(R"("param":"tokens")"), std::string::npos) << r;
  r = request("POST", "/apply-template", R"({"messages":[{"role":"user","content":"hi"}]})", key);
  EXPECT_EQ(body(r), R"({"prompt":"user:hi;"})") << r;
  EXPECT_EQ(status(request("GET", "/tokenize", "", key)), 405);
  EXPECT_EQ(status(request("POST", "/tokenize", "{not json", key)), 400);
  EXPECT_EQ(status(request("POST", "/tokenize", "[[[[" + std::string(100, '[') + std::string(104, ']'), key)), 400);  // too deep
}

// "speculative": "draft" per request: the server's draft model proposes, the output is the
// plain one, /metrics counts the draft model's passes; a server without one refuses it.
TEST_F(ServerFixture, DraftModelPerRequest) {
  start("", true);
  auto completion = [&](const std::string& spec) {
    const std::string r = request("POST", "/v1/completions",
                                  R"({"prompt":"abcabcabcab","max_tokens":16,"temperature":0,"speculative":)" + spec + "}");
    EXPECT_EQ(status(r), 200) << r;
    const auto j = nlohmann::json::parse(body(r), nullptr, false);
    return j.is_object() ? j["choices"][0]["text"].get<std::string>() : std::string("(not json)");
  };
  const std::string plain = completion(R"("off")");
  EXPECT_FALSE(plain.empty());
  EXPECT_EQ(completion(R"({"mode":"draft","draft_max":3})"), plain);
  const std::string m = body(request("GET", "/metrics"));
  const size_t at = m.find("\ntandem_draft_model_passes_total ");
  ASSERT_NE(at, std::string::npos) << m;
  EXPECT_GT(std::stod(m.substr(at + 33)), 0) << m;
}

TEST_F(ServerFixture, DraftModeWithoutADraftModelIsRefused) {
  start("");
  const std::string r = request("POST", "/v1/completions", R"({"prompt":"abc","max_tokens":4,"speculative":"draft"})");
  EXPECT_EQ(status(r), 400) << r;
  EXPECT_NE(body(r).find("--draft-model"), std::string::npos) << r;
}

}  // namespace
}  // namespace tandem::server
