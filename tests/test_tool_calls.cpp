// Tool calls (chat/tool_calls.h): each family's format parsed from model output, malformed
// calls kept as text, streaming in any split giving the one-shot answer, the family read from
// real templates, messages prepared for templates, and the GBNF a forced call follows.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "chat/chat_template.h"
#include "chat/tool_calls.h"
#include "tool_call_testing.h"

namespace tandem {
namespace {

using json = nlohmann::ordered_json;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string template_text(const std::string& name) {
  return slurp(std::string(TANDEM_SOURCE_DIR) + "/tests/data/chat_templates/" + name + ".jinja");
}

TEST(ToolCalls, HermesOneCall) {
  const auto out = parse_tool_calls(ToolCallFamily::Hermes,
                                    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>");
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments, "{\"city\":\"Paris\",\"days\":2}");  // compact, key order kept
}

TEST(ToolCalls, HermesSeveralCallsAndText) {
  const std::string text =
      "Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"b\", \"arguments\": \"{\\\"y\\\": [1, 2]}\"}</tool_call>\nDone.";
  const auto out = parse_tool_calls(ToolCallFamily::Hermes, text);
  EXPECT_EQ(out.content, "Let me check both.Done.");
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0].name, "a");
  EXPECT_EQ(out.calls[1].name, "b");
  EXPECT_EQ(out.calls[1].arguments, "{\"y\":[1,2]}");  // arguments given as a string: the object it encodes
  expect_split_invariant(ToolCallFamily::Hermes, text);
}

TEST(ToolCalls, PlainTextIsUntouched) {
  for (const std::string text : {"Hello there.\n\n", "  a < b and <tool is not a call\n", "{\"name\": \"x\"} is JSON", ""}) {
    const auto out = parse_tool_calls(ToolCallFamily::Hermes, text);
    EXPECT_EQ(out.content, text);
    EXPECT_TRUE(out.calls.empty());
    expect_split_invariant(ToolCallFamily::Hermes, text);
  }
}

TEST(ToolCalls, MalformedCallsStayText) {
  const std::vector<std::string> bad = {
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}\n</tool_call>",  // the object never closes
      "<tool_call>\nnot json at all\n</tool_call> after",
      "<tool_call>{\"arguments\": {}}</tool_call>",                    // no name
      "<tool_call>{\"name\": 7, \"arguments\": {}}</tool_call>",       // name not a string
      "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>",  // arguments not an object
      "<tool_call>{\"name\": \"a\", \"arguments\": \"{oops\"}</tool_call>",
      "<tool_call>{\"name\": \"a\"} trailing words</tool_call>",
      "<tool_call>\n{\"name\": \"a\", \"argu",  // cut off mid-call
      "<tool_call>",
      "<tool_c",
      "<tool_call>" + std::string(200, '[') + std::string(200, ']') + "</tool_call>",  // too deep
  };
  for (const auto& text : bad) {
    const auto out = parse_tool_calls(ToolCallFamily::Hermes, text);
    EXPECT_TRUE(out.calls.empty()) << text;
    EXPECT_EQ(out.content, text) << text;
    expect_split_invariant(ToolCallFamily::Hermes, text);
  }
  // A closing tag inside an argument's string does not end the call, however the text is split.
  const std::string tag_in_string = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"</tool_call>\"}}</tool_call>";
  ASSERT_EQ(parse_tool_calls(ToolCallFamily::Hermes, tag_in_string).calls.size(), 1u);
  EXPECT_EQ(parse_tool_calls(ToolCallFamily::Hermes, tag_in_string).calls[0].arguments, "{\"a\":\"</tool_call>\"}");
  expect_split_invariant(ToolCallFamily::Hermes, tag_in_string);
  // A malformed call does not hide a good one after it.
  const std::string mixed = "<tool_call>junk</tool_call><tool_call>{\"name\": \"ok\", \"arguments\": {}}</tool_call>";
  const auto out = parse_tool_calls(ToolCallFamily::Hermes, mixed);
  EXPECT_EQ(out.content, "<tool_call>junk</tool_call>");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "ok");
  expect_split_invariant(ToolCallFamily::Hermes, mixed);
}

TEST(ToolCalls, HermesUnterminatedCallAtTheEndIsACall) {
  // Generation that stops at the end-of-turn token before </tool_call>.
  const auto out = parse_tool_calls(ToolCallFamily::Hermes, "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, "{}");
  EXPECT_EQ(out.content, "");
}

TEST(ToolCalls, Llama3BareJsonAndPythonTag) {
  const std::string bare = " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
  auto out = parse_tool_calls(ToolCallFamily::Llama3, bare);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(out.content, "");
  expect_split_invariant(ToolCallFamily::Llama3, bare);

  const std::string tagged = "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": null}}";
  out = parse_tool_calls(ToolCallFamily::Llama3, tagged);
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[1].name, "b");
  EXPECT_EQ(out.calls[1].arguments, "{\"k\":null}");
  expect_split_invariant(ToolCallFamily::Llama3, tagged);

  const std::string after_text = "Checking.<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x\"}}";
  out = parse_tool_calls(ToolCallFamily::Llama3, after_text);
  EXPECT_EQ(out.content, "Checking.");
  ASSERT_EQ(out.calls.size(), 1u);
  expect_split_invariant(ToolCallFamily::Llama3, after_text);
}

TEST(ToolCalls, Llama3JsonThatIsNotACallIsText) {
  // A JSON answer, JSON in the middle of text, and Python after the tag are all text.
  for (const std::string text : {"{\"answer\": 42}", "{ not json", "The object {\"name\": \"a\", \"parameters\": {}} is text",
                                 "<|python_tag|>print(1)", "{}", "{\"name\": \"a\", \"parameters\": {"}) {
    const auto out = parse_tool_calls(ToolCallFamily::Llama3, text);
    EXPECT_TRUE(out.calls.empty()) << text;
    EXPECT_EQ(out.content, text);
    expect_split_invariant(ToolCallFamily::Llama3, text);
  }
}

TEST(ToolCalls, MistralArrayOfCalls) {
  const std::string text =
      "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": \"]}\"}, \"id\": \"abc123def\"}, {\"name\": \"b\", \"arguments\": {}}]";
  const auto out = parse_tool_calls(ToolCallFamily::Mistral, text);
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0].arguments, "{\"x\":\"]}\"}");  // brackets inside strings do not end the call
  EXPECT_EQ(out.calls[1].name, "b");
  EXPECT_EQ(out.content, "");
  expect_split_invariant(ToolCallFamily::Mistral, text);
  const std::string args_form = "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]now[ARGS]{}";
  const auto o2 = parse_tool_calls(ToolCallFamily::Mistral, args_form);
  ASSERT_EQ(o2.calls.size(), 2u);
  EXPECT_EQ(o2.calls[0].name, "get_weather");
  EXPECT_EQ(o2.calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(o2.calls[1].name, "now");
  EXPECT_EQ(o2.content, "Sure.");
  expect_split_invariant(ToolCallFamily::Mistral, args_form);
  for (const std::string bad : {"[TOOL_CALLS] hello", "[TOOL_CALLS]f[ARGS][1]", "[TOOL_CALLS]f[ARG", "[TOOL_CALLS]f(x)", "[TOOL_CALLS][{\"name\": \"a\"}, 3]", "[TOOL_CALLS] []", "[TOOL_CALLS][{"}) {
    const auto o = parse_tool_calls(ToolCallFamily::Mistral, bad);
    EXPECT_TRUE(o.calls.empty()) << bad;
    EXPECT_EQ(o.content, bad);
    expect_split_invariant(ToolCallFamily::Mistral, bad);
  }
}

TEST(ToolCalls, StreamHoldsOnlyWhatMayBeACall) {
  ToolCallStream s(ToolCallFamily::Hermes);
  EXPECT_EQ(s.push("Hello <").content, "Hello");  // '<' may open a marker; the space waits for what follows
  EXPECT_EQ(s.push("b>").content, " <b>");
  auto o = s.push("<tool_call>{\"name\": \"f\", \"arguments\": {}}");
  EXPECT_EQ(o.content, "");  // whitespace before a call is dropped
  EXPECT_TRUE(o.calls.empty());  // the closing tag has not come yet
  o = s.push("</tool_call>");
  ASSERT_EQ(o.calls.size(), 1u);  // emitted as soon as it completes
  EXPECT_EQ(o.calls[0].name, "f");
  EXPECT_TRUE(s.finish().calls.empty());
}

TEST(ToolCalls, MaxCallsDropsTheRest) {
  const std::string text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call> bye";
  const auto one = parse_tool_calls(ToolCallFamily::Hermes, text, 1);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "a");
  EXPECT_EQ(one.content, "");
  ToolCallStream s(ToolCallFamily::Hermes, 1);
  s.push(text.substr(0, 50));
  EXPECT_TRUE(s.push(text.substr(50)).calls.size() == 1 && s.saturated());
}

TEST(ToolCalls, FamilyFromTheTemplate) {
  auto f = detect_tool_call_format(template_text("qwen2.5"), nullptr);
  EXPECT_TRUE(f.accepts_tools);
  EXPECT_EQ(f.family, ToolCallFamily::Hermes);
  f = detect_tool_call_format(template_text("llama-3.1"), nullptr);
  EXPECT_TRUE(f.accepts_tools);
  EXPECT_EQ(f.family, ToolCallFamily::Llama3);
  f = detect_tool_call_format(template_text("mistral-instruct-v0.3"), nullptr);
  EXPECT_TRUE(f.accepts_tools);
  EXPECT_EQ(f.family, ToolCallFamily::Mistral);
  for (const char* name : {"smollm2", "llama-3", "llama-2", "gemma-2", "phi-3-mini", "mistral-instruct-v0.1"})
    EXPECT_FALSE(detect_tool_call_format(template_text(name), nullptr).accepts_tools) << name;
  EXPECT_TRUE(detect_tool_call_format(template_text("smollm2-tools"), nullptr).accepts_tools);
}

TEST(ToolCalls, FamilyFromTheVocabularyWhenTheTemplateSaysNothing) {
  Vocab v;
  v.add_token("<|python_tag|>", TokenType::Control);
  const std::string src = "{% for t in tools %}{{ t.function.name }}{% endfor %}";
  EXPECT_EQ(detect_tool_call_format(src, &v).family, ToolCallFamily::Llama3);
  EXPECT_EQ(detect_tool_call_format(src, nullptr).family, ToolCallFamily::Hermes);
}

TEST(ToolCalls, TemplateReadsVariable) {
  EXPECT_TRUE(template_reads_variable("{% if tools %}x{% endif %}", "tools"));
  EXPECT_TRUE(template_reads_variable("{{- tools | tojson }}", "tools"));
  EXPECT_FALSE(template_reads_variable("You have tools. {{ 'tools' }}{# tools #}", "tools"));
  EXPECT_FALSE(template_reads_variable("{{ builtin_tools }}{{ m.tools }}{% set tools_in_user_message = 1 %}", "tools"));
}

TEST(ToolCalls, MessagesForTemplatesHaveArgumentObjects) {
  const json msgs = json::parse(R"([{"role": "user", "content": "hi"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"city\": \"Paris\"}"}},
      {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18C"}])");
  const json out = messages_for_template(msgs);
  EXPECT_EQ(out[1]["tool_calls"][0]["function"]["arguments"], json({{"city", "Paris"}}));
  EXPECT_EQ(out[1]["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_EQ(out[2], msgs[2]);
  // The Qwen template then writes the call as the model would.
  auto t = ChatTemplate::from_source(template_text("qwen2.5"), "", "<|im_end|>");
  ASSERT_TRUE(t.ok());
  const json vars = {{"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})}};
  auto r = t->render_json(json::array({out[0], out[1], out[2]}), true, &vars);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_NE(r->text.find("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"), std::string::npos) << r->text;
  EXPECT_NE(r->text.find("<tool_response>\n18C\n</tool_response>"), std::string::npos);
}

// An earlier answer's reasoning_content is gpt-oss's "thinking": the template keeps it before
// a call (the only reasoning it renders back).
TEST(ToolCalls, ReasoningContentIsGptOssThinking) {
  const json msgs = json::parse(R"([{"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "reasoning_content": "Need the weather.", "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18C"}])");
  const json out = messages_for_template(msgs);
  EXPECT_EQ(out[1]["thinking"], "Need the weather.");
  auto t = ChatTemplate::from_source(template_text("gpt-oss"), "<|startoftext|>", "<|return|>");
  ASSERT_TRUE(t.ok()) << t.error().message;
  auto r = t->render_json(out, true, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_NE(r->text.find("<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
                         "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>"),
            std::string::npos)
      << r->text;
}

TEST(ToolCalls, IdsPerFamily) {
  std::mt19937_64 rng(1);
  const std::string m = make_tool_call_id(ToolCallFamily::Mistral, rng);
  EXPECT_EQ(m.size(), 9u);  // Mistral's templates raise on any other length
  const std::string h = make_tool_call_id(ToolCallFamily::Hermes, rng);
  EXPECT_EQ(h.rfind("call_", 0), 0u);
  EXPECT_NE(h, make_tool_call_id(ToolCallFamily::Hermes, rng));
}

TEST(ToolCalls, GrammarForAForcedCall) {
  const std::vector<ToolGrammarFunction> fns = {{"get_weather", "fn0-root"}, {"get_time", "fn1-root"}};
  const std::string h = tool_call_gbnf(ToolCallFamily::Hermes, fns, true);
  EXPECT_EQ(h,
            "root ::= tool-call (\"\\n\" tool-call){0,7}\n"
            "tool-call ::= \"<tool_call>\\n{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": \" fn0-root \"}\\n</tool_call>\"\n"
            "    | \"<tool_call>\\n{\\\"name\\\": \\\"get_time\\\", \\\"arguments\\\": \" fn1-root \"}\\n</tool_call>\"\n");
  const std::string l = tool_call_gbnf(ToolCallFamily::Llama3, {fns[0]}, true);
  EXPECT_EQ(l, "root ::= tool-call\ntool-call ::= \"{\\\"name\\\": \\\"get_weather\\\", \\\"parameters\\\": \" fn0-root \"}\"\n");
  const std::string m = tool_call_gbnf(ToolCallFamily::Mistral, {fns[0]}, false);
  EXPECT_EQ(m.substr(0, m.find('\n')), "root ::= \"[TOOL_CALLS] [\" tool-call \"]\"");
  EXPECT_EQ(gbnf_literal("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\x01\"");
}

TEST(ToolCalls, WhatTheGrammarWritesParsesBack) {
  // The text a forced call produces is a call to the parser of the same family.
  const std::vector<std::pair<ToolCallFamily, std::string>> outputs = {
      {ToolCallFamily::Hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>"},
      {ToolCallFamily::Llama3, "{\"name\": \"f\", \"parameters\": {\"a\": 1}}"},
      {ToolCallFamily::Mistral, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": 1}}]"},
  };
  for (const auto& [family, text] : outputs) {
    const auto out = parse_tool_calls(family, text);
    ASSERT_EQ(out.calls.size(), 1u) << text;
    EXPECT_EQ(out.calls[0].arguments, "{\"a\":1}");
    EXPECT_EQ(out.content, "");
  }
}

}  // namespace
}  // namespace tandem
