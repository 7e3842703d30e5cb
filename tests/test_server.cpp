// The server's parts: request validation, JSON depth and UTF-8 handling, stop strings over a
// token stream, metrics text, the access policy, the HTTP transport's limits and deadlines
// (over real loopback sockets). llama-server's tokenizer endpoints and the whole server's
// routes: test_server_routes.cpp.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
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
#include "loopback_socket.h"
#include "tiny_model.h"

namespace tandem::server {
namespace {

using json = nlohmann::ordered_json;
using loopback::closed_by_peer;
using loopback::dial;
using loopback::read_until_quiet;
using loopback::send_all;

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

TEST(OpenAiJson, ShapeCountsWhatParsingWouldBuild) {
  const JsonShape a = scan_json_shape(R"({"a":1,"b":"x,:{[","c":[1,2,{"d":null}],"e":{}})", 64);
  EXPECT_EQ(a.deepest, 3);
  EXPECT_EQ(a.values, 9u);  // the root, 1, "x,:{[", [..], 1, 2, {..}, null, {}
  EXPECT_EQ(a.widest_object, 4u);
  EXPECT_EQ(a.key_pairs, 6u + 0u + 0u);  // 4 keys: 6 pairs; {"d"}: none
  EXPECT_EQ(scan_json_shape("[]", 64).values, 1u);
  EXPECT_EQ(scan_json_shape(" 12345 ", 64).values, 1u);
  EXPECT_EQ(scan_json_shape(R"(["\"", true, -1.5e3])", 64).values, 4u);
  EXPECT_EQ(scan_json_shape(std::string(100, '['), 8).deepest, 9);  // stops past the limit
}

// Issue 45: 300k keys in one unknown field took 160 s to parse (ordered_json's linear key
// search); the shape scan refuses such bodies before the parser sees them.
TEST(OpenAiJson, BodiesThatAreQuadraticToParseAreRefusedQuickly) {
  auto object_of = [](size_t n, size_t key_len) {
    std::string s = "{";
    for (size_t i = 0; i < n; i++) s += fmt::format("{}\"{:0{}}\":0", i ? "," : "", i, key_len);
    return s + "}";
  };
  const std::string wide = "{\"prompt\":\"hi\",\"x\":" + object_of(300000, 6) + "}";
  const auto t0 = std::chrono::steady_clock::now();
  auto r = parse_json_body(wide);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("more than 1024 keys"), std::string::npos) << r.error().message;
  EXPECT_LT(ms, 200.0);  // ~10 ms; the parse it replaces took minutes
  EXPECT_TRUE(parse_json_body(object_of(kMaxObjectKeys, 4)).ok());
  EXPECT_FALSE(parse_json_body(object_of(kMaxObjectKeys + 1, 4)).ok());
  // Many objects just under the per-object bound: refused by the pairs over all objects.
  std::string many = "[";
  for (int i = 0; i < 64; i++) many += (i ? "," : "") + object_of(1000, 4);
  many += "]";
  r = parse_json_body(many);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("too many keys together"), std::string::npos) << r.error().message;
  // The worst body that passes parses in well under a second (kMaxKeyPairs in 1000-key objects).
  std::string worst = "[";
  for (size_t i = 0; i < kMaxKeyPairs / (1000 * 999 / 2); i++) worst += (i ? "," : "") + object_of(1000, 8);
  worst += "]";
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_TRUE(parse_json_body(worst).ok());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 1.0);
  // Values: /detokenize's 262144 ids fit; a body of more than kMaxJsonValues does not.
  std::string ids = "[0";
  for (size_t i = 1; i < 262144; i++) ids += ",7";
  EXPECT_TRUE(parse_json_body("{\"tokens\":" + ids + "]}").ok());
  for (size_t i = 262144; i < kMaxJsonValues; i++) ids += ",7";
  r = parse_json_body("{\"tokens\":" + ids + "]}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("JSON values"), std::string::npos) << r.error().message;
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

// Issue 45: a tenant read another's prompt and output lengths and cache hits from the one
// global view. A tenant's view counts its own requests only and holds nothing engine-wide.
TEST(Metrics, EachTenantSeesItsOwnRequests) {
  Metrics m;
  m.request_started("key0");
  m.observe_ttft(0.02, "key0");
  m.request_finished("stop", "key0", 120, 64, 9);
  const std::string a_before = m.render_tenant("key0");
  m.request_started("key1");
  m.observe_ttft(0.5, "key1");
  m.request_finished("length", "key1", 4000, 3000, 300);
  m.request_rejected("key1");
  Gauges g;
  g.kv_blocks_used = 7;
  m.set_gauges(g);
  EXPECT_EQ(m.render_tenant("key0"), a_before);  // nothing of key1 moves key0's view
  const std::string b = m.render_tenant("key1");
  EXPECT_NE(b.find("\ntandem_prompt_tokens_total 4000\n"), std::string::npos) << b;
  EXPECT_NE(b.find("\ntandem_prompt_tokens_cached_total 3000\n"), std::string::npos);
  EXPECT_NE(b.find("\ntandem_generated_tokens_total 300\n"), std::string::npos);
  EXPECT_NE(b.find("\ntandem_requests_rejected_total 1\n"), std::string::npos);
  EXPECT_EQ(b.find("tandem_kv_blocks_used"), std::string::npos);  // engine-wide: operators only
  const std::string all = m.render();
  EXPECT_NE(all.find("\ntandem_requests_started_total 2\n"), std::string::npos) << all;
  EXPECT_NE(all.find("\ntandem_kv_blocks_used 7\n"), std::string::npos);
  EXPECT_NE(m.render_tenant("nobody").find("\ntandem_requests_started_total 0\n"), std::string::npos);
}

TEST(AccessPolicy, KeysNameTheirTenantNeverTheKey) {
  AccessPolicy p(AccessOptions{{"ka", "kb"}, {"op"}, "127.0.0.1", 8080, {}, {}});
  auto with = [](const char* auth) {
    HttpRequest r;
    r.headers = {{"Authorization", auth}};
    return r;
  };
  EXPECT_EQ(p.match_key(with("Bearer ka")).tenant, "key0");
  EXPECT_EQ(p.match_key(with("Bearer kb")).tenant, "key1");
  const KeyMatch op = p.match_key(with("Bearer op"));
  EXPECT_TRUE(op.known && op.operator_key);
  EXPECT_EQ(op.tenant, "operator0");
  EXPECT_FALSE(p.match_key(with("Bearer kc")).known);
  EXPECT_FALSE(p.match_key(HttpRequest{}).known);
  EXPECT_FALSE(p.match_key(with("Bearer ka")).operator_key);
}

TEST(AccessPolicy, KeyHostOriginContentType) {
  EXPECT_TRUE(constant_time_equal("sekrit", "sekrit"));
  EXPECT_FALSE(constant_time_equal("sekrit", "sekriT"));
  EXPECT_FALSE(constant_time_equal("sekrit", "sekrit2"));
  EXPECT_FALSE(constant_time_equal("sekrit", ""));
  EXPECT_FALSE(constant_time_equal("sekrit", "sek"));
  AccessPolicy p(AccessOptions{{"k"}, {}, "127.0.0.1", 8080, {"https://app.example"}, {"llm.lan"}});
  for (const char* ok : {"127.0.0.1:8080", "localhost:8080", "LOCALHOST:8080", "[::1]:8080", "llm.lan", "llm.lan:443"})
    EXPECT_TRUE(p.host_allowed(ok)) << ok;
  for (const char* bad : {"evil.example:8080", "127.0.0.1:8081", "127.0.0.1", "", "[::1", "127.0.0.1:80a", "10.0.0.1:8080"})
    EXPECT_FALSE(p.host_allowed(bad)) << bad;
  AccessPolicy any(AccessOptions{{}, {}, "0.0.0.0", 8080, {}, {}});
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
  bool privileged(const HttpRequest& r) override { return r.header("Authorization") == std::string_view("Bearer ok"); }
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
    l.max_connections_per_peer = 8;
    l.reserved_connections = 1;
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

// Issue 45: an unauthenticated client holding every slot made every tenant and /health get
// 503. One address holds at most its share of the ordinary slots; past it, and past them, the
// last slots serve privileged requests only, and only for 1 s of waiting.
TEST_F(TransportFixture, OnePeerCannotTakeEverySlotAndTheLastAreKept) {
  HttpLimits l = small();
  l.max_connections = 8;
  l.max_connections_per_peer = 3;
  l.reserved_connections = 2;
  start(l);
  auto wait_open = [&](int n) {
    for (int i = 0; i < 300 && t->open_connections() != n; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return t->open_connections();
  };
  // Loopback dials from 127.0.0.1 and from other 127/8 addresses are different peers.
  auto dial_from = [&](const char* source) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    inet_pton(AF_INET, source, &src.sin_addr);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src), 0);
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_port = htons((uint16_t)t->port());
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst), 0);
    return fd;
  };
  auto refused_as_unkeyed = [&](int fd) {
    send_all(fd, "GET /inline HTTP/1.1\r\nHost: x\r\n\r\n");
    const std::string got = read_until_quiet(fd, 1000);
    ::close(fd);
    return got.substr(0, 12) == "HTTP/1.1 503" && got.find("kept for authenticated clients") != std::string::npos;
  };
  std::vector<int> a;
  for (int i = 0; i < 3; i++) a.push_back(dial_from("127.0.0.2"));
  ASSERT_EQ(wait_open(3), 3);
  // Past its address's share (3) a connection lands in a kept slot: privileged requests only.
  EXPECT_TRUE(refused_as_unkeyed(dial_from("127.0.0.2")));
  ASSERT_EQ(wait_open(3), 3);
  std::vector<int> b;
  for (int i = 0; i < 3; i++) b.push_back(dial_from("127.0.0.3"));
  ASSERT_EQ(wait_open(6), 6);  // the 6 ordinary slots are taken
  EXPECT_TRUE(refused_as_unkeyed(dial_from("127.0.0.4")));
  // Two clients sit in the 2 kept slots: the next connection is refused at once, and the
  // sitters are closed after 1 s of idling (a flood cannot keep them).
  const int r1 = dial_from("127.0.0.4"), r2 = dial_from("127.0.0.5");
  ASSERT_EQ(wait_open(8), 8);
  const int x = dial_from("127.0.0.6");
  EXPECT_EQ(read_until_quiet(x, 1000).substr(0, 12), "HTTP/1.1 503");
  ::close(x);
  EXPECT_TRUE(closed_by_peer(r1, 3000));
  EXPECT_TRUE(closed_by_peer(r2, 3000));
  ::close(r1);
  ::close(r2);
  // A request with the key is served in a kept slot.
  const int keyed = dial_from("127.0.0.4");
  send_all(keyed, "GET /inline HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ok\r\n\r\n");
  EXPECT_NE(read_until_quiet(keyed, 1000).find("inline"), std::string::npos);
  ::close(keyed);
  for (int fd : a) ::close(fd);
  for (int fd : b) ::close(fd);
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
  // Issue 45: two Authorization headers were read as the first; fields that decide access come once.
  EXPECT_EQ(framing_status("GET", with({{"Authorization", "Bearer a"}, {"authorization", "Bearer b"}})), 400);
  EXPECT_EQ(framing_status("POST", with({{"Content-Type", "application/json"}, {"Content-Type", "text/plain"}})), 400);
  EXPECT_EQ(framing_status("GET", with({{"Origin", "http://a"}, {"Origin", "http://b"}})), 400);
  EXPECT_EQ(framing_status("GET", with({{"Authorization", "Bearer a"}})), 0);
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
