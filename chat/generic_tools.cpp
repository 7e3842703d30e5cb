#include "chat/generic_tools.h"

#include <fmt/format.h>

#include <cstdlib>

#include "core/json_brackets.h"

namespace tandem {

namespace {

using ojson = nlohmann::ordered_json;

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// A message's content as text: a string, or the text of its parts.
std::string content_text(const ojson& m) {
  if (!m.contains("content") || m["content"].is_null()) return "";
  const ojson& c = m["content"];
  if (c.is_string()) return c.get<std::string>();
  std::string out;
  if (c.is_array())
    for (const ojson& part : c)
      if (part.is_object() && part.contains("text") && part["text"].is_string()) out += (out.empty() ? "" : "\n") + part["text"].get<std::string>();
  return out;
}

// What the model is told: the tools, then the one JSON object it answers with.
std::string tools_description(const GenericToolPrompt& p) {
  ojson list = ojson::array();
  for (const ojson& t : *p.tools) {
    const ojson& fn = t["function"];
    ojson d = {{"name", fn["name"]}};
    if (fn.contains("description") && fn["description"].is_string()) d["description"] = fn["description"];
    d["parameters"] = fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"] : ojson::object();
    list.push_back(std::move(d));
  }
  std::string s = "You can call these tools (functions); each one's arguments follow its JSON Schema:\n" + dump(list) +
                  "\n\nAnswer with one JSON object and nothing else:\n"
                  "- to call a tool: {\"tool_call\": {\"name\": \"<the tool's name>\", \"arguments\": {<its arguments>}}}\n";
  if (p.parallel && p.forced_function.empty())
    s += "- to call several tools at once: {\"tool_calls\": [{\"name\": ..., \"arguments\": {...}}, ...]}\n";
  if (!p.required) s += "- to answer the user directly: {\"response\": \"<your answer>\"}\n";
  if (!p.forced_function.empty()) s += "You must call the tool \"" + p.forced_function + "\".\n";
  else if (p.required) s += "You must call a tool.\n";
  s += "A tool's result comes back in a later message; use it to answer.";
  return s;
}

// A past assistant turn's calls as the JSON the model writes for them.
std::string calls_json(const ojson& tool_calls) {
  ojson calls = ojson::array();
  for (const ojson& c : tool_calls) {
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) continue;
    const ojson& fn = c["function"];
    ojson args = ojson::object();
    if (fn.contains("arguments") && fn["arguments"].is_string()) {
      ojson parsed = ojson::parse(fn["arguments"].get<std::string>(), nullptr, false);
      if (!parsed.is_discarded()) args = std::move(parsed);
    }
    calls.push_back({{"name", fn.value("name", "")}, {"arguments", std::move(args)}});
  }
  if (calls.size() == 1) return dump(ojson{{"tool_call", calls[0]}});
  return dump(ojson{{"tool_calls", std::move(calls)}});
}

// The function a tool result answers, from the assistant call with its id.
std::string function_of(const ojson& messages, const std::string& call_id) {
  for (const ojson& m : messages) {
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (const ojson& c : m["tool_calls"])
      if (c.is_object() && c.value("id", "") == call_id && c.contains("function") && c["function"].is_object())
        return c["function"].value("name", "");
  }
  return "";
}

// The whole calls of a {"tool_calls": [ ... that was cut short; false when there are none.
bool cut_calls(std::string_view text, std::vector<ToolCall>* calls) {
  static constexpr std::string_view kOpen = "{\"tool_calls\": [";
  if (text.substr(0, kOpen.size()) != kOpen) return false;
  size_t i = kOpen.size();
  for (;;) {
    while (i < text.size() && (text[i] == ' ' || text[i] == ',' || text[i] == '\n')) i++;
    if (i >= text.size() || text[i] != '{') break;
    const JsonBrackets b = scan_json_brackets(text, i, 64, true);
    if (b.end == std::string::npos) break;
    ToolCall c;
    if (!tool_call_from_json(ojson::parse(text.substr(i, b.end - i), nullptr, false), &c)) break;
    calls->push_back(std::move(c));
    i = b.end;
  }
  return !calls->empty();
}

}  // namespace

ojson generic_tool_messages(const ojson& messages, const GenericToolPrompt& p) {
  ojson out = ojson::array();
  auto add = [&](const std::string& role, std::string text) {
    // Consecutive turns of one role (tool results, a user message after them) become one:
    // many templates insist that user and assistant alternate.
    if (!out.empty() && out.back()["role"] == role && role != "system") {
      out.back()["content"] = out.back()["content"].get<std::string>() + "\n\n" + text;
      return;
    }
    out.push_back({{"role", role}, {"content", std::move(text)}});
  };
  const std::string tools = tools_description(p);
  bool described = false;
  for (const ojson& m : messages) {
    const std::string role = m.value("role", "");
    if ((role == "system" || role == "developer") && !described) {
      const std::string own = content_text(m);
      add("system", own.empty() ? tools : own + "\n\n" + tools);
      described = true;
    } else if (role == "system" || role == "developer") {
      add("system", content_text(m));
    } else if (role == "tool") {
      const std::string id = m.value("tool_call_id", "");
      const std::string fn = function_of(messages, id);
      add("user", fmt::format("Result of tool call {}{}: {}", id, fn.empty() ? "" : " (" + fn + ")", content_text(m)));
    } else if (role == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array() && !m["tool_calls"].empty()) {
      add("assistant", calls_json(m["tool_calls"]));
    } else if (role == "assistant") {
      add("assistant", dump(ojson{{"response", content_text(m)}}));  // past answers in the format asked for
    } else {
      add(role, content_text(m));
    }
  }
  if (!described) out.insert(out.begin(), ojson{{"role", "system"}, {"content", tools}});
  return out;
}

std::string generic_tool_gbnf(const std::vector<ToolGrammarFunction>& functions, bool parallel, bool allow_response) {
  std::string g = allow_response ? "root ::= generic-call | generic-response\n" : "root ::= generic-call\n";
  g += "generic-call ::= \"{\\\"tool_call\\\": \" tool-call \"}\"";
  // At most kMaxParallelCalls: a small model sampled freely may otherwise repeat a call until
  // its token limit.
  if (parallel)
    g += fmt::format(" | \"{{\\\"tool_calls\\\": [\" tool-call (\", \" tool-call){{0,{}}} \"]}}\"", kMaxParallelCalls - 1);
  g += "\ntool-call ::= ";
  for (size_t i = 0; i < functions.size(); i++) {
    if (i) g += "\n    | ";
    g += gbnf_literal("{\"name\": \"" + functions[i].name + "\", \"arguments\": ") + " " + functions[i].args_rule + " \"}\"";
  }
  g += "\n";
  if (allow_response) {
    g += "generic-response ::= \"{\\\"response\\\": \\\"\" generic-char* \"\\\"}\"\n";
    g += R"gbnf(generic-char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ))gbnf";
    g += "\n";
  }
  return g;
}

// A small model asked for calls may repeat one call until the grammar's limit (SmolLM2 writes
// the same get_weather call 8 times): a call identical to one before it in the answer (name and
// arguments) is returned once.
void ToolCallStream::add_generic_calls(std::vector<ToolCall> calls, ToolCallOutput* out) {
  for (ToolCall& c : calls) {
    if (saturated()) break;
    if (!generic_seen_.insert(c.name + '\0' + c.arguments).second) continue;
    out->calls.push_back(std::move(c));
    n_calls_++;
  }
}

// The generic answer: {"response": "..."} streams its text as it comes (the string decoded);
// a call object is held until it closes, then becomes calls. Anything else is text.
void ToolCallStream::process_generic(bool final, ToolCallOutput* out) {
  for (;;) {
    switch (generic_) {
      case GenericState::Undecided:
        if (!generic_decide(final)) return;
        break;
      case GenericState::InResponse:
        generic_response_text(final, out);
        if (generic_ == GenericState::InResponse) return;
        break;
      case GenericState::CallObject:
        if (!generic_call_object(final, out)) return;
        break;
      case GenericState::Done:  // the closing brace and whatever follows: not text
        buf_.clear();
        return;
      case GenericState::Text:  // not the format asked for: passed on as it is, at the end
        if (final) {
          out->content += buf_;
          buf_.clear();
        }
        return;
    }
  }
}

// What the answer is, from its first bytes; false while that is still open.
bool ToolCallStream::generic_decide(bool final) {
  static constexpr std::string_view kResponse = "{\"response\": \"";
  const size_t i = buf_.find_first_not_of(" \t\r\n");
  if (i == std::string::npos) {
    if (final) buf_.clear();
    return false;
  }
  const std::string_view rest = std::string_view(buf_).substr(i);
  if (rest.substr(0, kResponse.size()) == kResponse) {
    buf_.erase(0, i + kResponse.size());
    generic_ = GenericState::InResponse;
    return true;
  }
  if (rest.size() < kResponse.size() && kResponse.substr(0, rest.size()) == rest && !final) return false;  // may still be
  generic_ = rest[0] == '{' ? GenericState::CallObject : GenericState::Text;
  return true;
}

// The response string's bytes, decoded as they come (an escape once whole); Done at its quote.
void ToolCallStream::generic_response_text(bool final, ToolCallOutput* out) {
  size_t k = 0;
  while (k < buf_.size()) {
    const char c = buf_[k];
    if (c == '"') {
      generic_ = GenericState::Done;
      k++;
      break;
    }
    if (c != '\\') {
      out->content += c;
      k++;
      continue;
    }
    // \uXXXX takes its low surrogate with it when it is a high one.
    size_t len = k + 1 < buf_.size() && buf_[k + 1] == 'u' ? 6 : 2;
    if (len == 6 && k + 6 <= buf_.size()) {
      const unsigned long unit = std::strtoul(buf_.substr(k + 2, 4).c_str(), nullptr, 16);
      if (unit >= 0xD800 && unit <= 0xDBFF) len = 12;
    }
    if (k + len > buf_.size()) {
      if (final) k = buf_.size();  // a cut escape at the very end: dropped
      break;
    }
    const ojson s = ojson::parse("\"" + buf_.substr(k, len) + "\"", nullptr, false);
    if (s.is_string()) out->content += s.get<std::string>();
    k += len;
  }
  buf_.erase(0, k);
}

// A call object, once it closes (or the answer ends): its calls, else text. False while open.
bool ToolCallStream::generic_call_object(bool final, ToolCallOutput* out) {
  const size_t i = buf_.find('{');
  const JsonBrackets b = scan_json_brackets(buf_, i, 64, true);
  if (b.end == std::string::npos && !final) return false;
  std::vector<ToolCall> calls;
  generic_ = GenericState::Done;
  if (b.end == std::string::npos && cut_calls(std::string_view(buf_).substr(i), &calls)) {
    // Cut short (max_tokens) inside {"tool_calls": [...: the calls that are whole are calls.
    add_generic_calls(std::move(calls), out);
    return true;
  }
  const ojson j = ojson::parse(buf_.substr(i, b.end == std::string::npos ? std::string::npos : b.end - i), nullptr, false);
  bool ok = j.is_object() && (j.contains("tool_call") || j.contains("tool_calls"));
  if (ok && j.contains("tool_call")) {
    ToolCall c;
    ok = tool_call_from_json(j["tool_call"], &c);
    if (ok) calls.push_back(std::move(c));
  } else if (ok) {
    ok = j["tool_calls"].is_array();
    for (size_t n = 0; ok && n < j["tool_calls"].size(); n++) {
      ToolCall c;
      ok = tool_call_from_json(j["tool_calls"][n], &c);
      if (ok) calls.push_back(std::move(c));
    }
  } else if (j.is_object() && j.contains("response") && j["response"].is_string()) {  // spaced differently
    out->content += j["response"].get<std::string>();
    return true;
  }
  if (!ok) {
    generic_ = GenericState::Text;
    return true;
  }
  add_generic_calls(std::move(calls), out);
  return true;
}

}  // namespace tandem
