// The generic tool-call format (chat/generic_tools.h) for templates without tools: the
// conversation as plain turns, the grammar an answer follows, and the answer parsed back
// (streamed in any split as in one piece).
#include <gtest/gtest.h>

#include "chat/generic_tools.h"
#include "engine/grammar/gbnf_parser.h"
#include "grammar_recognizer.h"
#include "tool_call_testing.h"

namespace tandem {
namespace {

using json = nlohmann::ordered_json;

const json kTools = json::array({{{"type", "function"},
                                  {"function",
                                   {{"name", "get_weather"},
                                    {"description", "Weather in a city"},
                                    {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});

TEST(GenericTools, AnswersParseBackToCallsOrText) {
  auto one = parse_tool_calls(ToolCallFamily::Generic, R"({"tool_call": {"name": "get_weather", "arguments": {"city": "Rome"}}})");
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "get_weather");
  EXPECT_EQ(one.calls[0].arguments, R"({"city":"Rome"})");
  EXPECT_EQ(one.content, "");
  auto two = parse_tool_calls(ToolCallFamily::Generic,
                              R"({"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]})");
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[1].name, "b");
  EXPECT_EQ(parse_tool_calls(ToolCallFamily::Generic, R"({"tool_calls": [{"name": "a"}, {"name": "b"}]})", 1).calls.size(), 1u);
  // A call repeated word for word is returned once; the same function with other arguments is another call.
  auto repeated = parse_tool_calls(ToolCallFamily::Generic, R"({"tool_calls": [{"name": "a", "arguments": {"x": 1}},
      {"name": "a", "arguments": {"x": 1}}, {"name": "a", "arguments": {"x": 2}}]})");
  ASSERT_EQ(repeated.calls.size(), 2u);
  EXPECT_EQ(repeated.calls[1].arguments, R"({"x":2})");
  auto text = parse_tool_calls(ToolCallFamily::Generic, R"({"response": "Line 1\nit's \"fine\" \u00e9\ud83d\ude00"})");
  EXPECT_TRUE(text.calls.empty());
  EXPECT_EQ(text.content, "Line 1\nit's \"fine\" \xc3\xa9\xf0\x9f\x98\x80");
  // Not the format: the text as it is.
  EXPECT_EQ(parse_tool_calls(ToolCallFamily::Generic, "Hello there").content, "Hello there");
  EXPECT_EQ(parse_tool_calls(ToolCallFamily::Generic, R"({"other": 1})").content, R"({"other": 1})");
  EXPECT_EQ(parse_tool_calls(ToolCallFamily::Generic, R"({"tool_call": {"arguments": {}}})").calls.size(), 0u);
  // Cut short by max_tokens inside the array: its whole calls are calls, the rest is dropped.
  auto cut = parse_tool_calls(ToolCallFamily::Generic, R"({"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "argu)");
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].name, "a");
  EXPECT_EQ(cut.content, "");
}

TEST(GenericTools, StreamingInAnySplitEqualsOnePiece) {
  expect_split_invariant(ToolCallFamily::Generic, R"({"response": "a\nb \"q\" \u00e9 \ud83d\ude00 end"})");
  expect_split_invariant(ToolCallFamily::Generic, R"({"tool_call": {"name": "get_weather", "arguments": {"city": "Rome"}}})");
  expect_split_invariant(ToolCallFamily::Generic, R"({"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": [1, {"y": "}"}]}}]})");
  expect_split_invariant(ToolCallFamily::Generic, "  plain text, not JSON");
  expect_split_invariant(ToolCallFamily::Generic, R"({"tool_calls": [{"name": "a", "arguments": {"k": "v"}}, {"name": "a", "argu)");
  // The response's text streams before the answer ends.
  ToolCallStream s(ToolCallFamily::Generic);
  EXPECT_EQ(s.push(R"({"response": "Hel)").content, "Hel");
  EXPECT_EQ(s.push(R"(lo\)").content, "lo");  // an escape waits for its second byte
  EXPECT_EQ(s.push(R"(n"})").content, "\n");
  EXPECT_EQ(s.finish().content, "");
}

TEST(GenericTools, ConversationBecomesPlainTurns) {
  GenericToolPrompt p;
  p.tools = &kTools;
  const json messages = json::array(
      {{{"role", "system"}, {"content", "Be brief."}},
       {{"role", "user"}, {"content", "Weather in Rome and Paris?"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls", json::array({{{"id", "call_1"}, {"type", "function"},
                                     {"function", {{"name", "get_weather"}, {"arguments", R"({"city":"Rome"})"}}}},
                                    {{"id", "call_2"}, {"type", "function"},
                                     {"function", {{"name", "get_weather"}, {"arguments", R"({"city":"Paris"})"}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "21 C"}},
       {{"role", "tool"}, {"tool_call_id", "call_2"}, {"content", "18 C"}}});
  const json out = generic_tool_messages(messages, p);
  ASSERT_EQ(out.size(), 4u) << out.dump(2);
  EXPECT_EQ(out[0]["role"], "system");
  const std::string sys = out[0]["content"];
  EXPECT_EQ(sys.rfind("Be brief.\n\nYou can call these tools", 0), 0u) << sys;  // merged, the user's own first
  EXPECT_NE(sys.find(R"("name":"get_weather")"), std::string::npos) << sys;
  EXPECT_NE(sys.find(R"({"response": "<your answer>"})"), std::string::npos);  // auto: a response is allowed
  EXPECT_EQ(out[2]["role"], "assistant");
  EXPECT_EQ(out[2]["content"], R"({"tool_calls":[{"name":"get_weather","arguments":{"city":"Rome"}},{"name":"get_weather","arguments":{"city":"Paris"}}]})");
  EXPECT_EQ(out[3]["role"], "user");  // both results, one turn, naming the call and the function
  EXPECT_EQ(out[3]["content"], "Result of tool call call_1 (get_weather): 21 C\n\nResult of tool call call_2 (get_weather): 18 C");
  for (const json& m : out) EXPECT_TRUE(m["content"].is_string());
  // No system message: one is added first. A named function: the model is told to call it.
  p.required = true;
  p.forced_function = "get_weather";
  const json forced = generic_tool_messages(json::array({{{"role", "user"}, {"content", "Hi"}}}), p);
  ASSERT_EQ(forced.size(), 2u);
  const std::string fsys = forced[0]["content"];
  EXPECT_NE(fsys.find("You must call the tool \"get_weather\"."), std::string::npos) << fsys;
  EXPECT_EQ(fsys.find("\"response\""), std::string::npos) << fsys;
}

TEST(GenericTools, GrammarAllowsExactlyTheFormat) {
  const std::vector<ToolGrammarFunction> fns = {{"get_weather", "fn0-root"}};
  const std::string args = "fn0-root ::= \"{\" [^}]* \"}\"\n";
  auto autog = grammar::parse_gbnf(generic_tool_gbnf(fns, true, true) + args);
  ASSERT_TRUE(autog.ok()) << autog.error().message;
  for (const char* ok : {R"({"tool_call": {"name": "get_weather", "arguments": {"city": "Rome"}}})",
                         R"({"tool_calls": [{"name": "get_weather", "arguments": {}}, {"name": "get_weather", "arguments": {}}]})",
                         R"({"response": "It is \"sunny\"\n"})"})
    EXPECT_TRUE(test::earley_accepts(*autog.value(), ok)) << ok;
  for (const char* bad : {R"({"tool_call": {"name": "other", "arguments": {}}})", R"({"response": "raw
newline"})", "Sunny.", R"({"response": "a"} trailing)"})
    EXPECT_FALSE(test::earley_accepts(*autog.value(), bad)) << bad;
  auto required = grammar::parse_gbnf(generic_tool_gbnf(fns, false, false) + args);
  ASSERT_TRUE(required.ok()) << required.error().message;
  EXPECT_TRUE(test::earley_accepts(*required.value(), R"({"tool_call": {"name": "get_weather", "arguments": {}}})"));
  EXPECT_FALSE(test::earley_accepts(*required.value(), R"({"response": "no"})"));
  EXPECT_FALSE(test::earley_accepts(*required.value(), R"({"tool_calls": [{"name": "get_weather", "arguments": {}}]})"));
}

}  // namespace
}  // namespace tandem
