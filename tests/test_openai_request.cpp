// Request fields tandem does not honour are 400s naming them; tools, tool_choice,
// response_format and grammar parse into what the engine enforces (server/openai_request.h),
// and a chat request with tools renders them and constrains a forced call (server/tool_use.h).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "chat/harmony_tools.h"
#include "chat/reasoning.h"
#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/token_terminal.h"
#include "server/openai_request.h"
#include "server/tool_use.h"

namespace tandem::server {
namespace {

using json = nlohmann::ordered_json;
using Kind = ParsedRequest::OutputConstraint::Kind;
using TC = ParsedRequest::ToolChoice;

const json kMsgs = json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}});

json weather_tool() {
  return json::parse(R"({"type": "function", "function": {"name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}}})");
}

json chat_body(json extra = json::object()) {
  json b = {{"messages", kMsgs}};
  for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
  return b;
}

// The parameter a bad body is refused for ("" when accepted).
std::string refused_for(const json& body, bool chat = true) {
  std::string bad;
  auto r = parse_request(body, chat, 1, &bad);
  return r.ok() ? "" : bad;
}

TEST(OpenAiFields, EveryUnhonouredFieldIsA400NamingIt) {
  const std::vector<std::pair<std::string, json>> chat_bad = {
      {"frequency_penalty", 0.5}, {"presence_penalty", -1}, {"logit_bias", {{"50256", -100}}}, {"store", true},
      {"service_tier", "flex"},   {"modalities", {"text", "audio"}}, {"audio", {{"voice", "alloy"}}},
      {"functions", json::array()}, {"function_call", "auto"}, {"prediction", {{"type", "content"}}},
      {"web_search_options", json::object()}, {"reasoning_effort", "extreme"}, {"verbosity", "low"}, {"user", 5},
      {"metadata", {{"k", 1}}}, {"best_of", 1}, {"echo", false}, {"suffix", "x"}, {"prompt", "x"},
      {"no_such_field", nullptr}, {"stream_options", {{"include_obfuscation", true}}}, {"stream_options", {{"x", 1}}},
  };
  for (const auto& [key, value] : chat_bad) {
    const std::string param = refused_for(chat_body({{key, value}}));
    EXPECT_EQ(param, key == "stream_options" ? "stream_options." + value.begin().key() : key) << key << " = " << value.dump();
  }
  std::string bad;
  auto r = parse_request(chat_body({{"functions", json::array()}}), true, 1, &bad);
  EXPECT_EQ(r.error().message, "'functions' is not supported; use 'tools' and 'tool_choice'");
  r = parse_request(chat_body({{"frequency_penalty", 0.5}}), true, 1, &bad);
  EXPECT_EQ(r.error().message, "'frequency_penalty' is not supported (tandem accepts only 0)");
  r = parse_request(chat_body({{"mirostat", 2}}), true, 1, &bad);
  EXPECT_EQ(r.error().message, "'mirostat' is not supported by /v1/chat/completions in tandem");
  // Completions: its own set (no tools, no response_format; best_of and echo at their defaults).
  for (const char* key : {"tools", "tool_choice", "response_format", "messages", "top_logprobs", "store"})
    EXPECT_EQ(refused_for({{"prompt", "x"}, {key, "auto"}}, false), key);
  EXPECT_EQ(refused_for({{"prompt", "x"}, {"best_of", 2}}, false), "best_of");
}

TEST(OpenAiFields, NoOpValuesAndNullsAreAccepted) {
  const json ok = chat_body({{"frequency_penalty", 0}, {"presence_penalty", 0.0}, {"logit_bias", json::object()}, {"user", "u1"},
                             {"store", false}, {"metadata", {{"k", "v"}}}, {"service_tier", "auto"}, {"modalities", {"text"}},
                             {"prompt_cache_key", "abc"}, {"safety_identifier", "h"}, {"parallel_tool_calls", true},
                             {"audio", nullptr}, {"reasoning_effort", nullptr}, {"response_format", {{"type", "text"}}},
                             {"stream_options", {{"include_usage", true}, {"include_obfuscation", false}}}, {"model", "m"}});
  EXPECT_EQ(refused_for(ok), "");
  EXPECT_EQ(refused_for({{"prompt", "x"}, {"best_of", 1}, {"echo", false}, {"suffix", nullptr}, {"user", "u"}}, false), "");
  // An endpoint's own keys, when it says so.
  std::string bad;
  EXPECT_FALSE(parse_request(chat_body({{"add_generation_prompt", false}}), true, 1, &bad).ok());
  EXPECT_TRUE(parse_request(chat_body({{"add_generation_prompt", false}}), true, 1, &bad, {"add_generation_prompt"}).ok());
}

TEST(OpenAiTools, ToolsAndToolChoiceParse) {
  std::string bad;
  auto r = parse_request(chat_body({{"tools", {weather_tool()}}}), true, 1, &bad);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->tools_active());
  EXPECT_FALSE(r->tool_call_forced());
  EXPECT_EQ(r->tool_choice, TC::Auto);
  r = parse_request(chat_body({{"tools", {weather_tool()}}, {"tool_choice", "none"}}), true, 1, &bad);
  EXPECT_FALSE(r->tools_active());
  r = parse_request(chat_body({{"tools", {weather_tool()}}, {"tool_choice", "required"}, {"parallel_tool_calls", false}}), true, 1, &bad);
  EXPECT_TRUE(r->tool_call_forced());
  EXPECT_FALSE(r->parallel_tool_calls);
  r = parse_request(chat_body({{"tools", {weather_tool()}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}),
                    true, 1, &bad);
  EXPECT_EQ(r->tool_choice, TC::Function);
  EXPECT_EQ(r->tool_choice_function, "get_weather");
  EXPECT_EQ(r->constraint.kind, Kind::None);  // the call's grammar needs the template's format: tool_use.h
  EXPECT_FALSE(parse_request(chat_body({{"tools", json::array()}}), true, 1, &bad)->tools_active());
}

TEST(OpenAiTools, BadToolsAndToolChoiceAre400s) {
  json no_name = weather_tool();
  no_name["function"].erase("name");
  json bad_name = weather_tool();
  bad_name["function"]["name"] = "get weather";
  json bad_params = weather_tool();
  bad_params["function"]["parameters"] = "object";
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"tools", "x"}}, "tools"},
      {{{"tools", {{{"type", "custom"}, {"custom", {{"name", "x"}}}}}}}, "tools[0]"},
      {{{"tools", {no_name}}}, "tools[0].function.name"},
      {{{"tools", {bad_name}}}, "tools[0].function.name"},
      {{{"tools", {bad_params}}}, "tools[0].function.parameters"},
      {{{"tools", {weather_tool(), weather_tool()}}}, "tools[1].function.name"},  // names must be unique
      {{{"tool_choice", "required"}}, "tool_choice"},            // no tools
      {{{"tools", {weather_tool()}}, {"tool_choice", "sometimes"}}, "tool_choice"},
      {{{"tools", {weather_tool()}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "other"}}}}}}, "tool_choice"},
      {{{"tools", {weather_tool()}}, {"tool_choice", {{"type", "allowed_tools"}}}}, "tool_choice"},
      {{{"tools", {weather_tool()}}, {"parallel_tool_calls", "yes"}}, "parallel_tool_calls"},
  };
  for (const auto& [extra, param] : cases) EXPECT_EQ(refused_for(chat_body(extra)), param) << extra.dump();
  // Conversation messages with calls and results in OpenAI's shape.
  const json call = {{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{}"}}}};
  json ok = {{"messages", {kMsgs[0], {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}},
                           {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18C"}}}}};
  EXPECT_EQ(refused_for(ok), "");
  json args_object = call;
  args_object["function"]["arguments"] = json::object();
  const std::vector<std::pair<json, std::string>> bad_messages = {
      {{{"role", "assistant"}, {"tool_calls", {args_object}}}, "messages[1].tool_calls[0]"},
      {{{"role", "assistant"}, {"tool_calls", "x"}}, "messages[1].tool_calls"},
      {{{"role", "user"}, {"content", "x"}, {"tool_calls", {call}}}, "messages[1].tool_calls"},
      {{{"role", "tool"}, {"content", "18C"}}, "messages[1]"},
  };
  for (const auto& [m, param] : bad_messages) EXPECT_EQ(refused_for({{"messages", {kMsgs[0], m}}}), param) << m.dump();
}

// An unknown key at any depth is refused with its JSON path, as an unknown top-level field is
// (issue 34: they were silently ignored).
TEST(OpenAiFields, UnknownNestedFieldsAre400sNamingTheirPath) {
  const json call = {{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}};
  json call_extra = call;
  call_extra["function"]["argumentz"] = "{}";
  json tool_extra = weather_tool();
  tool_extra["function"]["strictt"] = true;
  json tool_top_extra = weather_tool();
  tool_top_extra["cache_control"] = {{"type", "ephemeral"}};
  const json schema = {{"type", "object"}};
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"messages", {{{"role", "user"}, {"content", "hi"}, {"temperature", 0}}}}}, "messages[0].temperature"},
      {{{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}, {"cache", 1}}}}}}}}, "messages[0].content[0].cache"},
      {{{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", {{"url", "x"}}}}}}}}}}, "messages[0].content[0]"},
      {{{"messages", {kMsgs[0], {{"role", "assistant"}, {"tool_calls", {call_extra}}}}}}, "messages[1].tool_calls[0].function.argumentz"},
      {{{"response_format", {{"type", "json_object"}, {"schema", schema}}}}, "response_format.schema"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}, {"strictt", true}}}}}},
       "response_format.json_schema.strictt"},
      {{{"speculative", {{"mode", "lookup"}, {"draftmax", 4}}}}, "speculative.draftmax"},
      {{{"stream_options", {{"include_usage", true}, {"x", 1}}}}, "stream_options.x"},
      {{{"tools", {tool_extra}}}, "tools[0].function.strictt"},
      {{{"tools", {tool_top_extra}}}, "tools[0].cache_control"},
      {{{"tools", {weather_tool()}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}, {"x", 1}}}}}},
       "tool_choice.function.x"},
  };
  for (const auto& [extra, param] : cases) EXPECT_EQ(refused_for(chat_body(extra)), param) << extra.dump();
  std::string bad;
  auto r = parse_request(chat_body({{"response_format", {{"type", "json_object"}, {"schema", schema}}}}), true, 1, &bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("json_schema"), std::string::npos) << "the message shows OpenAI's form: " << r.error().message;
  // The known nested keys still pass.
  EXPECT_EQ(refused_for(chat_body({{"messages", {{{"role", "user"}, {"name", "ann"}, {"content", {{{"type", "text"}, {"text", "a"}}}}}}},
                                   {"speculative", {{"mode", "lookup"}, {"draft_max", 4}}},
                                   {"stream_options", {{"include_usage", true}}}})),
            "");
}

// Lists are capped before work that grows faster than their length, and the tools' unique-name
// check is a hash set: 40,000 tools held a worker 93 s when it compared every pair.
TEST(OpenAiTools, ListsAreCappedAndDuplicatesFoundByHashing) {
  json many = json::array();
  for (int i = 0; i < 40000; i++) {
    json t = weather_tool();
    t["function"]["name"] = "f" + std::to_string(i);
    many.push_back(t);
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(refused_for(chat_body({{"tools", many}})), "tools");
  json at_cap(many.begin(), many.begin() + 128);
  EXPECT_EQ(refused_for(chat_body({{"tools", at_cap}})), "");
  at_cap[127]["function"]["name"] = "f3";
  EXPECT_EQ(refused_for(chat_body({{"tools", at_cap}})), "tools[127].function.name");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  json msgs = json::array();
  for (int i = 0; i < 5000; i++) msgs.push_back(kMsgs[0]);
  EXPECT_EQ(refused_for({{"messages", msgs}}), "messages");
  json parts = json::array();
  for (int i = 0; i < 300; i++) parts.push_back({{"type", "text"}, {"text", "a"}});
  EXPECT_EQ(refused_for({{"messages", {{{"role", "user"}, {"content", parts}}}}}), "messages[0].content");
  EXPECT_EQ(refused_for({{"prompt", "x"}, {"cache_salt", ""}}, false), "cache_salt");
  EXPECT_EQ(refused_for({{"prompt", "x"}, {"cache_salt", "tenant-a"}}, false), "");
  // ignore_eos (vLLM's and llama-server's): a boolean.
  EXPECT_EQ(refused_for({{"prompt", "x"}, {"ignore_eos", "yes"}}, false), "ignore_eos");
  std::string bad;
  auto r = parse_request({{"prompt", "x"}, {"ignore_eos", true}}, false, 1, &bad);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->ignore_eos);
  EXPECT_FALSE(parse_request({{"prompt", "x"}}, false, 1, &bad)->ignore_eos);
}

TEST(OpenAiConstraint, ResponseFormatAndGrammar) {
  std::string bad;
  auto r = parse_request(chat_body({{"response_format", {{"type", "json_object"}}}}), true, 1, &bad);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->constraint.kind, Kind::JsonObject);
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}, {"required", {"a"}}};
  r = parse_request(
      chat_body({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "thing"}, {"schema", schema}, {"strict", true}}}}}}),
      true, 1, &bad);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->constraint.kind, Kind::JsonSchema);
  EXPECT_EQ(r->constraint.schema, schema);
  EXPECT_EQ(r->constraint.name, "thing");
  r = parse_request({{"prompt", "x"}, {"grammar", "root ::= \"yes\" | \"no\""}}, false, 1, &bad);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->constraint.kind, Kind::Gbnf);
  EXPECT_EQ(r->constraint.gbnf, "root ::= \"yes\" | \"no\"");
  EXPECT_EQ(parse_request(chat_body(), true, 1, &bad)->constraint.kind, Kind::None);

  const std::vector<std::pair<json, std::string>> cases = {
      {{{"response_format", "json"}}, "response_format"},
      {{{"response_format", {{"type", "yaml"}}}}, "response_format"},
      {{{"response_format", {{"type", "json_schema"}}}}, "response_format"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", schema}}}}}}, "response_format"},  // no name
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a b"}, {"schema", schema}}}}}}, "response_format"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "t"}}}}}}, "response_format"},  // no schema
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}, {"strict", "y"}}}}}},
       "response_format"},
      {{{"grammar", ""}}, "grammar"},
      {{{"grammar", 3}}, "grammar"},
      // Only one constraint at a time.
      {{{"grammar", "root ::= \"a\""}, {"response_format", {{"type", "json_object"}}}}, "grammar"},
      {{{"tools", {weather_tool()}}, {"tool_choice", "required"}, {"grammar", "root ::= \"a\""}}, "tool_choice"},
      {{{"tools", {weather_tool()}}, {"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}}, "tool_choice"},
  };
  for (const auto& [extra, param] : cases) EXPECT_EQ(refused_for(chat_body(extra)), param) << extra.dump();
  // tools with tool_choice auto may share a request with a response_format.
  EXPECT_EQ(refused_for(chat_body({{"tools", {weather_tool()}}, {"response_format", {{"type", "json_object"}}}})), "");
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ChatTemplate chat_template(const std::string& name) {
  auto t = ChatTemplate::from_source(slurp(std::string(TANDEM_SOURCE_DIR) + "/tests/data/chat_templates/" + name + ".jinja"), "",
                                     "<|im_end|>");
  EXPECT_TRUE(t.ok());
  return std::move(t.value());
}

// Issue 51: a template without tools gets the generic format (auto), or a 400 when the server
// takes only templates' own formats (--tool-format template); generic can be forced anywhere.
TEST(ToolUse, TemplatesWithoutToolsGetTheGenericFormat) {
  std::string bad;
  auto pr = parse_request(chat_body({{"tools", {weather_tool()}}}), true, 1, &bad);
  const ChatTemplate smollm = chat_template("smollm2");
  auto f = tool_format_for(pr.value(), smollm, nullptr);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->family, ToolCallFamily::Generic);
  auto refused = tool_format_for(pr.value(), smollm, nullptr, ToolFormatMode::Template);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("the model's chat template does not accept tools"), std::string::npos);
  EXPECT_EQ(tool_format_for(pr.value(), chat_template("smollm2-tools"), nullptr, ToolFormatMode::Generic)->family,
            ToolCallFamily::Generic);
  EXPECT_EQ(tool_format_for(pr.value(), chat_template("smollm2-tools"), nullptr)->family, ToolCallFamily::Hermes);
  // The generic prompt: the tools in the system message; auto is constrained to a call or a response.
  auto r = render_chat_prompt(smollm, pr.value(), true, ToolCallFamily::Generic);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_NE(r->text.find("<|im_start|>system\nYou can call these tools"), std::string::npos) << r->text;
  auto gbnf_of = [](const json&, const std::string& prefix) -> Result<std::string> { return prefix + "root ::= \"{}\""; };
  ASSERT_TRUE(add_tool_call_constraint(&pr.value(), ToolCallFamily::Generic, gbnf_of).ok());
  EXPECT_EQ(pr->constraint.gbnf.rfind("root ::= generic-call | generic-response\n", 0), 0u) << pr->constraint.gbnf;
  // It cannot be combined with another constraint.
  auto both = parse_request(chat_body({{"tools", {weather_tool()}}, {"response_format", {{"type", "json_object"}}}}), true, 1, &bad);
  ASSERT_TRUE(both.ok());
  EXPECT_FALSE(add_tool_call_constraint(&both.value(), ToolCallFamily::Generic, gbnf_of).ok());
  // tool_choice "none" renders no tools: any template will do.
  pr = parse_request(chat_body({{"tools", {weather_tool()}}, {"tool_choice", "none"}}), true, 1, &bad);
  EXPECT_TRUE(tool_format_for(pr.value(), smollm, nullptr, ToolFormatMode::Template).ok());
}

TEST(ToolUse, ToolsAreRenderedUnlessNone) {
  std::string bad;
  const ChatTemplate t = chat_template("smollm2-tools");
  auto with = parse_request(chat_body({{"tools", {weather_tool()}}}), true, 1, &bad);
  auto none = parse_request(chat_body({{"tools", {weather_tool()}}, {"tool_choice", "none"}}), true, 1, &bad);
  auto f = tool_format_for(with.value(), t, nullptr);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->family, ToolCallFamily::Hermes);
  auto a = render_chat_prompt(t, with.value(), true);
  auto b = render_chat_prompt(t, none.value(), true);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->text.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""), std::string::npos) << a->text;
  EXPECT_EQ(b->text.find("<tools>"), std::string::npos) << b->text;
}

TEST(ToolUse, ForcedCallGrammarSplicesEachFunctionsSchema) {
  std::string bad;
  json time_tool = {{"type", "function"}, {"function", {{"name", "now"}}}};  // no parameters: {}
  auto pr = parse_request(chat_body({{"tools", {weather_tool(), time_tool}}, {"tool_choice", "required"}}), true, 1, &bad);
  ASSERT_TRUE(pr.ok());
  std::vector<std::pair<json, std::string>> seen;
  auto fake = [&](const json& schema, const std::string& prefix) -> Result<std::string> {
    seen.emplace_back(schema, prefix);
    return prefix + "root ::= \"{\\\"city\\\": \\\"x\\\"}\"";
  };
  ASSERT_TRUE(add_tool_call_constraint(&pr.value(), ToolCallFamily::Hermes, fake).ok());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].first, weather_tool()["function"]["parameters"]);
  EXPECT_EQ(seen[0].second, "fn0-");
  EXPECT_EQ(pr->constraint.kind, Kind::Gbnf);
  EXPECT_EQ(pr->constraint.name, "tool_choice");
  const std::string& g = pr->constraint.gbnf;
  EXPECT_EQ(g.rfind("root ::= tool-call (\"\\n\" tool-call){0,7}\n", 0), 0u) << g;
  EXPECT_NE(g.find("get_weather\\\", \\\"arguments\\\": \" fn0-root"), std::string::npos) << g;
  EXPECT_NE(g.find("now\\\", \\\"arguments\\\": \" fn1-root"), std::string::npos) << g;
  EXPECT_NE(g.find("fn0-root ::= \"{\\\"city\\\""), std::string::npos) << g;
  EXPECT_NE(g.find("fn1-root ::= \"{}\""), std::string::npos) << g;

  // A named function, one call: only its rules; a schema the front end refuses is an error naming it.
  auto named = parse_request(chat_body({{"tools", {weather_tool(), time_tool}}, {"parallel_tool_calls", false},
                                        {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}),
                             true, 1, &bad);
  ASSERT_TRUE(add_tool_call_constraint(&named.value(), ToolCallFamily::Hermes, fake).ok());
  EXPECT_EQ(named->constraint.gbnf.find("now"), std::string::npos);
  EXPECT_EQ(named->constraint.gbnf.rfind("root ::= tool-call\n", 0), 0u);
  auto refused = [](const json&, const std::string&) -> Result<std::string> { return make_error("'format' is not supported"); };
  named->constraint = {};
  auto s = add_tool_call_constraint(&named.value(), ToolCallFamily::Hermes, refused);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message, "function 'get_weather': its parameters cannot constrain a call: 'format' is not supported");
  // Auto: nothing to constrain.
  auto automatic = parse_request(chat_body({{"tools", {weather_tool()}}}), true, 1, &bad);
  ASSERT_TRUE(add_tool_call_constraint(&automatic.value(), ToolCallFamily::Hermes, refused).ok());
  EXPECT_EQ(automatic->constraint.kind, Kind::None);
}

// With the real JSON Schema front end: the forced-call grammar compiles, takes the call each
// family's template writes (and that call parses back), and refuses another function or bad
// arguments.
TEST(ToolUse, ForcedCallGrammarCompilesAndMatchesTheFamilysCalls) {
  std::string bad;
  auto to_gbnf = [](const json& schema, const std::string& prefix) { return grammar::json_schema_to_gbnf(schema, prefix); };
  const json time_tool = {{"type", "function"}, {"function", {{"name", "now"}}}};
  struct Case {
    ToolCallFamily family;
    std::string good, wrong_name, bad_args;
  };
  const std::vector<Case> cases = {
      {ToolCallFamily::Hermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>\n"
       "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_time\"", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\""},
      {ToolCallFamily::Llama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", "{\"name\": \"x",
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": 3"},
      {ToolCallFamily::Mistral,
       "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, {\"name\": \"now\", \"arguments\": {}}]",
       "[TOOL_CALLS] [{\"name\": \"nope", "[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {\"a\""},
  };
  for (const Case& c : cases) {
    auto pr = parse_request(chat_body({{"tools", {weather_tool(), time_tool}}, {"tool_choice", "required"}}), true, 1, &bad);
    ASSERT_TRUE(pr.ok());
    const Status s = add_tool_call_constraint(&pr.value(), c.family, to_gbnf);
    ASSERT_TRUE(s.ok()) << s.error().message;
    auto g = grammar::parse_gbnf(pr->constraint.gbnf);
    ASSERT_TRUE(g.ok()) << g.error().message << "\n" << pr->constraint.gbnf;
    auto m = grammar::Matcher::create(g.value());
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_TRUE(m->can_accept(c.good)) << tool_call_family_name(c.family) << "\n" << pr->constraint.gbnf;
    grammar::Matcher done = m.value();
    ASSERT_TRUE(done.accept(c.good));
    EXPECT_TRUE(done.can_end()) << tool_call_family_name(c.family);
    EXPECT_FALSE(m->can_accept(c.wrong_name)) << tool_call_family_name(c.family);
    EXPECT_FALSE(m->can_accept(c.bad_args)) << tool_call_family_name(c.family);
    const auto parsed = parse_tool_calls(c.family, c.good);
    ASSERT_GE(parsed.calls.size(), 1u);
    EXPECT_EQ(parsed.calls[0].name, "get_weather");
    EXPECT_EQ(parsed.calls[0].arguments, "{\"city\":\"Rome\"}");
    EXPECT_EQ(parsed.content, "");
  }
  // One named function, one call: a second call cannot follow.
  auto named = parse_request(chat_body({{"tools", {weather_tool(), time_tool}}, {"parallel_tool_calls", false},
                                        {"tool_choice", {{"type", "function"}, {"function", {{"name", "now"}}}}}}),
                             true, 1, &bad);
  ASSERT_TRUE(add_tool_call_constraint(&named.value(), ToolCallFamily::Hermes, to_gbnf).ok());
  auto m = grammar::Matcher::create(grammar::parse_gbnf(named->constraint.gbnf).value());
  ASSERT_TRUE(m.ok());
  const std::string one = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  ASSERT_TRUE(m->accept(one));
  EXPECT_TRUE(m->must_end());
}

// Harmony (gpt-oss): a forced call is one message to functions.NAME written with control
// tokens (grammar token terminals); the text it matches, with the tokens rendered, parses back
// into the call (chat/reasoning.h).
TEST(ToolUse, ForcedHarmonyCallIsGptOssMessageToTheFunction) {
  std::string bad;
  auto to_gbnf = [](const json& schema, const std::string& prefix) { return grammar::json_schema_to_gbnf(schema, prefix); };
  const json time_tool = {{"type", "function"}, {"function", {{"name", "now"}}}};
  const auto tok = [](std::string_view t) { return grammar::token_terminal_bytes(t); };
  for (bool named : {false, true}) {
    json body = chat_body({{"tools", {weather_tool(), time_tool}}, {"tool_choice", "required"}});
    if (named) body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
    auto pr = parse_request(body, true, 1, &bad);
    ASSERT_TRUE(pr.ok());
    const Status s = add_tool_call_constraint(&pr.value(), ToolCallFamily::Hermes, to_gbnf, true);
    ASSERT_TRUE(s.ok()) << s.error().message;
    const std::string& gbnf = pr->constraint.gbnf;
    EXPECT_EQ(gbnf.rfind("root ::= <|channel|> \"commentary to=functions.\" tool-call <|call|>\n", 0), 0u) << gbnf;
    EXPECT_EQ(gbnf.find("now") != std::string::npos, !named) << gbnf;
    auto g = grammar::parse_gbnf(gbnf);
    ASSERT_TRUE(g.ok()) << g.error().message << "\n" << gbnf;
    auto m = grammar::Matcher::create(g.value());
    ASSERT_TRUE(m.ok()) << m.error().message;
    const std::string call = tok("<|channel|>") + "commentary to=functions.get_weather " + tok("<|constrain|>") + "json" +
                             tok("<|message|>") + "{\"city\": \"Rome\"}" + tok("<|call|>");
    grammar::Matcher done = m.value();
    ASSERT_TRUE(done.accept(call)) << gbnf;
    EXPECT_TRUE(done.must_end()) << "one call: harmony ends the turn at <|call|>";
    EXPECT_EQ(m->can_accept(tok("<|channel|>") + "commentary to=functions.now " + tok("<|constrain|>")), !named);
    EXPECT_FALSE(m->can_accept("<|channel|>")) << "the markup is the control tokens, not their text";
    EXPECT_FALSE(m->can_accept(tok("<|channel|>") + "analysis"));
    EXPECT_FALSE(m->can_accept(tok("<|channel|>") + "commentary to=functions.get_weather " + tok("<|constrain|>") + "json" +
                               tok("<|message|>") + "{\"town\""));
    // As the server renders the tokens for the harmony parser: their text.
    const ReasoningOutput out = parse_reasoning(
        ReasoningFormat::Harmony, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Rome\"}<|call|>");
    ASSERT_EQ(out.calls.size(), 1u);
    EXPECT_EQ(out.calls[0].name, "get_weather");
    EXPECT_EQ(out.calls[0].arguments, "{\"city\":\"Rome\"}");
    EXPECT_EQ(out.content, "");
  }
}

TEST(ToolUse, HarmonyCallTokensAreCheckedInTheVocabulary) {
  Vocab v;
  v.add_token("a", TokenType::Normal);
  EXPECT_EQ(missing_harmony_call_token(v), "<|channel|>");
  for (const char* t : {"<|channel|>", "<|constrain|>", "<|message|>", "<|call|>"}) v.add_token(t, TokenType::Control);
  EXPECT_EQ(missing_harmony_call_token(v), "");
  v.types[(size_t)v.find("<|constrain|>")] = TokenType::Normal;  // as text: the grammar's terminal cannot match it
  EXPECT_EQ(missing_harmony_call_token(v), "<|constrain|>");
}

}  // namespace
}  // namespace tandem::server
