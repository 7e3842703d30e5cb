// The server's routes: llama-server's tokenizer endpoints, and the chat page, the access
// policy and the draft model of the whole server on a tiny model.
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
#include "loopback_socket.h"
#include "tiny_model.h"

namespace tandem::server {
namespace {

using json = nlohmann::ordered_json;
using loopback::dial;
using loopback::read_until_quiet;
using loopback::send_all;

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
  // Issue 45: unknown fields are refused by name, as on the OpenAI endpoints.
  auto unknown = tokenize_answer({{"content", "a"}, {"add_bos", true}}, *tok, &bad);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(bad, "add_bos");
  EXPECT_NE(unknown.error().message.find("'add_bos' is not a field"), std::string::npos) << unknown.error().message;
  EXPECT_FALSE(detokenize_answer({{"tokens", {65}}, {"skip_special", true}}, *tok, &bad).ok());
  EXPECT_EQ(bad, "skip_special");
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

