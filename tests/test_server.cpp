// The server's pure parts: request validation, stop strings over a token stream, metrics text.
#include <gtest/gtest.h>

#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/text_stream.h"

namespace tandem::server {
namespace {

using json = nlohmann::ordered_json;

TEST(OpenAiRequest, ParsesAndValidates) {
  std::string bad;
  auto r = parse_request(json{{"prompt", "hi"}, {"max_tokens", 5}, {"temperature", 0.5}, {"top_p", 0.9}, {"seed", 3},
                              {"stop", {"a", "b"}}, {"stream", true}, {"logprobs", 2}, {"unknown_field", {1, 2}}},
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
  };
  for (const auto& [body, param] : bad_bodies) {
    auto b = parse_request(body, false, 1, &bad);
    EXPECT_FALSE(b.ok()) << body.dump();
    EXPECT_EQ(bad, param) << body.dump();
  }
  EXPECT_FALSE(parse_request(json::array(), false, 1, &bad).ok());
  EXPECT_FALSE(parse_request(json{{"messages", json::array()}}, true, 1, &bad).ok());
  EXPECT_FALSE(parse_request(json{{"messages", {{{"content", "no role"}}}}}, true, 1, &bad).ok());
  auto chat = parse_request(json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"logprobs", true}}, true, 1, &bad);
  ASSERT_TRUE(chat.ok());
  EXPECT_TRUE(chat->logprobs);
  EXPECT_FALSE(parse_request(json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"logprobs", 3}}, true, 1, &bad).ok());
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
  m.set_gauges(g);
  const std::string t = m.render();
  EXPECT_NE(t.find("tandem_time_to_first_token_seconds_bucket{le=\"0.05\"} 1"), std::string::npos) << t;
  EXPECT_NE(t.find("tandem_time_to_first_token_seconds_bucket{le=\"0.025\"} 0"), std::string::npos);
  EXPECT_NE(t.find("tandem_requests_finished_total{reason=\"stop\"} 1"), std::string::npos);
  EXPECT_NE(t.find("tandem_prefix_cache_hit_rate 0.25"), std::string::npos);
  EXPECT_NE(t.find("# TYPE tandem_kv_blocks_total gauge"), std::string::npos);
}

}  // namespace
}  // namespace tandem::server
