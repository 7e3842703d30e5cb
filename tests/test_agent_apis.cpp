// The Responses and Messages translators, the Responses store, and both APIs' stream events
// (server/responses_*.h, server/anthropic_*.h), without a model.
#include <gtest/gtest.h>

#include "server/anthropic_messages.h"
#include "server/anthropic_request.h"
#include "server/responses_api.h"
#include "server/responses_request.h"
#include "server/responses_store.h"

namespace tandem::server {
namespace {

ojson J(const char* s) { return ojson::parse(s); }

TEST(ResponsesStore, EvictsLeastRecentlyUsedAndKeepsTenantsApart) {
  ResponsesStore store(2000);
  const StoredResponse r{"key0", J(R"([{"role":"user","content":"hi"}])"), J(R"({"id":"x"})")};
  ASSERT_TRUE(store.put("a", r));
  ASSERT_TRUE(store.put("b", r));
  EXPECT_TRUE(store.get("a", "key0"));  // a is now the most recent
  EXPECT_FALSE(store.get("a", "key1")) << "another tenant reads nothing";
  EXPECT_FALSE(store.erase("a", "key1"));
  for (int i = 0; i < 8; i++) store.put("c" + std::to_string(i), r);
  EXPECT_LE(store.bytes(), store.max_bytes());
  EXPECT_FALSE(store.get("b", "key0")) << "the least recently used went first";
  EXPECT_FALSE(store.put("huge", {"key0", ojson(std::string(5000, 'x')), ojson()})) << "larger than the whole store";
}

TEST(ResponsesRequest, TranslatesItemsAndNamesPaths) {
  ResponsesStore store(1 << 20);
  std::string bad;
  auto r = parse_responses_request(J(R"({"instructions":"be brief","input":[
      {"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
      {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
      {"type":"function_call_output","call_id":"c1","output":"42"}],
      "tools":[{"type":"function","name":"f"}],"max_output_tokens":9})"), store, "", 1, &bad);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ojson& m = r->pr.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0], J(R"({"role":"system","content":"be brief"})"));
  EXPECT_EQ(m[1]["content"], "ab");
  EXPECT_EQ(m[2]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(m[3], J(R"({"role":"tool","tool_call_id":"c1","content":"42"})"));
  EXPECT_EQ(r->conversation.size(), 3u) << "instructions are not kept for previous_response_id";
  EXPECT_EQ(r->pr.max_tokens, 9);
  EXPECT_FALSE(parse_responses_request(J(R"({"input":[{"role":"user","content":"x","x":1}]})"), store, "", 1, &bad).ok());
  EXPECT_EQ(bad, "input[0].x");
  EXPECT_FALSE(parse_responses_request(J(R"({"input":"x","tools":[{"type":"function","name":"bad name"}]})"), store, "", 1, &bad).ok());
  EXPECT_EQ(bad, "tools[0].name") << "the chat parser's tools[0].function.name in this API's terms";
  EXPECT_FALSE(parse_responses_request(J(R"({"input":"x","previous_response_id":"resp_1"})"), store, "", 1, &bad).ok());
  EXPECT_EQ(bad, "previous_response_id");
}

TEST(AnthropicRequest, TranslatesBlocksAndNamesPaths) {
  std::string bad;
  auto r = parse_anthropic_request(J(R"({"max_tokens":5,"system":[{"type":"text","text":"s"}],"top_k":3,"stop_sequences":["\n\n"],
      "messages":[{"role":"user","content":"q"},
                  {"role":"assistant","content":[{"type":"text","text":"t"},{"type":"tool_use","id":"u1","name":"f","input":{"a":1}}]},
                  {"role":"user","content":[{"type":"tool_result","tool_use_id":"u1","content":"r"},{"type":"text","text":"more"}]}],
      "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"}})"), 1, &bad);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ojson& m = r->messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");
  EXPECT_EQ(m[3], J(R"({"role":"tool","tool_call_id":"u1","content":"r"})"));
  EXPECT_EQ(m[4], J(R"({"role":"user","content":"more"})"));
  EXPECT_EQ(r->sampling.top_k, 3);
  EXPECT_EQ(r->stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(r->tool_choice, ParsedRequest::ToolChoice::Required);
  EXPECT_FALSE(parse_anthropic_request(J(R"({"messages":[{"role":"user","content":"q"}]})"), 1, &bad).ok());
  EXPECT_EQ(bad, "max_tokens");
  EXPECT_FALSE(parse_anthropic_request(J(R"({"max_tokens":1,"messages":[{"role":"user","content":"q"}],
      "tools":[{"name":"f","input_schema":[]}]})"), 1, &bad).ok());
  EXPECT_EQ(bad, "tools[0].input_schema");
}

// The events of a stream: their names, in order, and each data line's JSON.
std::vector<ojson> events_of(const std::string& sse) {
  std::vector<ojson> out;
  for (size_t at = sse.find("data: "); at != std::string::npos; at = sse.find("data: ", at + 1))
    out.push_back(ojson::parse(sse.substr(at + 6, sse.find('\n', at) - at - 6)));
  return out;
}

TEST(ResponsesWire, StreamsItemsInOrderWithSequenceNumbers) {
  ResponsesStore store(1 << 20);
  ResponsesRequest req;
  req.conversation = J(R"([{"role":"user","content":"q"}])");
  req.echo = ojson::object();
  ResponsesWire w(req, "m", &store, "key0");
  w.set_engine_id(1);
  Answer a;
  a.reasoning = "think";
  a.text = "hi";
  a.tool_calls = {J(R"({"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}})")};
  a.finish = "tool_calls";
  std::string sse = w.open();  // (one call a statement: the events must come in this order)
  sse += w.reasoning("think");
  sse += w.text("h", nullptr);
  sse += w.text("i", nullptr);
  sse += w.calls(a.tool_calls, 0);
  sse += w.close(a);
  std::vector<std::string> types;
  int64_t seq = 0;
  for (const ojson& e : events_of(sse)) {
    EXPECT_EQ(e["sequence_number"], seq++);
    types.push_back(e["type"]);
  }
  EXPECT_EQ(types.front(), "response.created");
  EXPECT_EQ(types.back(), "response.completed");
  const ojson done = events_of(sse).back()["response"];
  ASSERT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][0]["type"], "reasoning");
  EXPECT_EQ(done["output"][1]["content"][0]["text"], "hi");
  EXPECT_EQ(done["output"][2]["call_id"], "call_1");
  auto kept = store.get(w.id(), "key0");
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->messages.back()["tool_calls"][0]["id"], "call_1") << "the answer continues the stored conversation";
}

TEST(AnthropicWire, StreamsBlocksWithIndices) {
  AnthropicWire w("m", 10);
  w.set_engine_id(1);
  Answer a;
  a.text = "ab";
  a.finish = "stop";
  a.stop_sequence = "\n";
  a.usage = {10, 2, 4};
  std::string sse = w.open();
  sse += w.text("a", nullptr);
  sse += w.text("b", nullptr);
  sse += w.close(a);
  const std::vector<ojson> ev = events_of(sse);
  std::vector<std::string> types;
  for (const ojson& e : ev) types.push_back(e["type"]);
  EXPECT_EQ(types, (std::vector<std::string>{"message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
                                             "content_block_stop", "message_delta", "message_stop"}));
  EXPECT_EQ(ev[6]["delta"]["stop_reason"], "stop_sequence");
  EXPECT_EQ(ev[6]["usage"]["input_tokens"], 6) << "input_tokens excludes the cache's";
  EXPECT_EQ(w.whole(a)["content"][0]["text"], "ab");
  EXPECT_EQ(anthropic_error("x", "server_error")["error"]["type"], "api_error");
}

}  // namespace
}  // namespace tandem::server
