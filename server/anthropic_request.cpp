#include "server/anthropic_request.h"

#include "server/request_checks.h"

namespace tandem::server {

namespace {

constexpr size_t kMaxMessages = 4096;  // as chat's
constexpr size_t kMaxBlocks = 256;     // per message, as chat's parts
constexpr size_t kMaxStops = 16;

// The chat messages, each with the path it came from (for the chat parser's errors).
struct Conversation {
  ojson messages = ojson::array();
  std::vector<std::string> sources;
};

// Text blocks ({"type": "text", "text", "cache_control"?, "citations"?}) joined, or a string.
Status text_of(const FieldCheck& fc, const ojson& v, const std::string& at, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return Status::Ok();
  }
  if (!v.is_array() || v.size() > kMaxBlocks) return fc.fail(at, fmt::format("must be a string or an array of at most {} text blocks", kMaxBlocks));
  for (size_t j = 0; j < v.size(); j++) {
    const std::string bat = fmt::format("{}[{}]", at, j);
    if (!v[j].is_object() || v[j].value("type", ojson()) != "text" || !v[j].contains("text") || !v[j]["text"].is_string())
      return fc.fail(bat, "must be {\"type\": \"text\", \"text\": \"...\"} (tandem's models read text only)");
    TANDEM_TRY(fc.known(v[j], bat, {"type", "text", "cache_control", "citations"}));
    if (present(v[j], "citations") && !(v[j]["citations"].is_array() && v[j]["citations"].empty()))
      return fc.fail(bat + ".citations", "is not supported");
    *out += v[j]["text"].get<std::string>();
  }
  return Status::Ok();
}

// An assistant turn: its text, tool_use blocks as chat tool_calls, thinking as reasoning_content.
Status assistant_turn(const FieldCheck& fc, const ojson& blocks, const std::string& at, Conversation* c) {
  ojson m = {{"role", "assistant"}, {"content", ""}};
  std::string text, thinking;
  for (size_t j = 0; j < blocks.size(); j++) {
    const ojson& b = blocks[j];
    const std::string bat = fmt::format("{}.content[{}]", at, j);
    const ojson type = b.is_object() ? b.value("type", ojson()) : ojson();
    if (type == "text") {
      TANDEM_TRY(text_of(fc, ojson::array({b}), fmt::format("{}.content", at), &text));
    } else if (type == "tool_use") {
      TANDEM_TRY(fc.known(b, bat, {"type", "id", "name", "input", "cache_control"}));
      if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") || !b["name"].is_string())
        return fc.fail(bat, "needs a string 'id' and 'name'");
      if (!b.contains("input") || !b["input"].is_object()) return fc.fail(bat + ".input", "must be an object");
      if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
      m["tool_calls"].push_back({{"id", b["id"]}, {"type", "function"}, {"function", {{"name", b["name"]}, {"arguments", dump_json(b["input"])}}}});
    } else if (type == "thinking") {
      TANDEM_TRY(fc.known(b, bat, {"type", "thinking", "signature"}));
      if (!b.contains("thinking") || !b["thinking"].is_string()) return fc.fail(bat + ".thinking", "must be a string");
      thinking += b["thinking"].get<std::string>();
    } else {
      return fc.fail(bat + ".type", "must be \"text\", \"tool_use\" or \"thinking\" in an assistant message");
    }
  }
  m["content"] = m.contains("tool_calls") && text.empty() ? ojson(nullptr) : ojson(text);
  if (!thinking.empty()) m["reasoning_content"] = thinking;
  c->messages.push_back(std::move(m));
  c->sources.push_back(at);
  return Status::Ok();
}

// A user turn: each tool_result a chat tool message, the text between them user messages.
Status user_turn(const FieldCheck& fc, const ojson& blocks, const std::string& at, Conversation* c) {
  std::string text;
  auto flush_text = [&] {
    if (text.empty()) return;
    c->messages.push_back({{"role", "user"}, {"content", std::move(text)}});
    c->sources.push_back(at);
    text.clear();
  };
  for (size_t j = 0; j < blocks.size(); j++) {
    const ojson& b = blocks[j];
    const std::string bat = fmt::format("{}.content[{}]", at, j);
    const ojson type = b.is_object() ? b.value("type", ojson()) : ojson();
    if (type == "text") {
      TANDEM_TRY(text_of(fc, ojson::array({b}), fmt::format("{}.content", at), &text));
      continue;
    }
    if (type != "tool_result") return fc.fail(bat + ".type", "must be \"text\" or \"tool_result\" in a user message (text only)");
    TANDEM_TRY(fc.known(b, bat, {"type", "tool_use_id", "content", "is_error", "cache_control"}));
    if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string()) return fc.fail(bat + ".tool_use_id", "must be a string");
    if (present(b, "is_error") && !b["is_error"].is_boolean()) return fc.fail(bat + ".is_error", "must be true or false");
    std::string result;
    if (present(b, "content")) TANDEM_TRY(text_of(fc, b["content"], bat + ".content", &result));
    flush_text();
    c->messages.push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", std::move(result)}});
    c->sources.push_back(bat);
  }
  flush_text();
  return Status::Ok();
}

Status translate_messages(const FieldCheck& fc, const ojson& body, Conversation* c) {
  if (present(body, "system")) {
    std::string system;
    TANDEM_TRY(text_of(fc, body["system"], "system", &system));
    c->messages.push_back({{"role", "system"}, {"content", std::move(system)}});
    c->sources.push_back("system");
  }
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    return fc.fail("messages", "must be a non-empty array of {\"role\": ..., \"content\": ...}");
  const ojson& ms = body["messages"];
  if (ms.size() > kMaxMessages) return fc.fail("messages", fmt::format("has more than {} messages", kMaxMessages));
  for (size_t i = 0; i < ms.size(); i++) {
    const std::string at = fmt::format("messages[{}]", i);
    if (!ms[i].is_object()) return fc.fail(at, "must be {\"role\": ..., \"content\": ...}");
    TANDEM_TRY(fc.known(ms[i], at, {"role", "content"}));
    const ojson role = ms[i].value("role", ojson());
    if (role != "user" && role != "assistant") return fc.fail(at + ".role", "must be \"user\" or \"assistant\"");
    if (!ms[i].contains("content")) return fc.fail(at, "needs a 'content'");
    const ojson& content = ms[i]["content"];
    if (content.is_string()) {
      c->messages.push_back({{"role", role}, {"content", content}});
      c->sources.push_back(at);
      continue;
    }
    if (!content.is_array() || content.size() > kMaxBlocks)
      return fc.fail(at + ".content", fmt::format("must be a string or an array of at most {} blocks", kMaxBlocks));
    TANDEM_TRY(role == "user" ? user_turn(fc, content, at, c) : assistant_turn(fc, content, at, c));
  }
  return Status::Ok();
}

// tools: [{"name", "description"?, "input_schema", "type"?: "custom", "cache_control"?}] -> chat's.
Status translate_tools(const FieldCheck& fc, const ojson& tools, ojson* chat) {
  if (!tools.is_array()) return fc.fail("tools", "must be an array");
  *chat = ojson::array();
  for (size_t i = 0; i < tools.size(); i++) {
    const ojson& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object()) return fc.fail(at, "must be a tool object");
    if (present(t, "type") && t["type"] != "custom") return fc.fail(at + ".type", "is not supported (tandem runs client tools only: \"custom\")");
    TANDEM_TRY(fc.known(t, at, {"type", "name", "description", "input_schema", "cache_control"}));
    if (!t.contains("input_schema")) return fc.fail(at, "needs an 'input_schema'");
    ojson fn = {{"name", t.value("name", ojson())}, {"parameters", t["input_schema"]}};
    if (t.contains("description")) fn["description"] = t["description"];
    chat->push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return Status::Ok();
}

// tool_choice: {"type": "auto" | "any" | "tool" (with "name") | "none", "disable_parallel_tool_use"?}.
Status translate_tool_choice(const FieldCheck& fc, const ojson& v, ojson* chat) {
  if (!v.is_object() || !v.contains("type")) return fc.fail("tool_choice", "must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\", ...}");
  TANDEM_TRY(fc.known(v, "tool_choice", {"type", "name", "disable_parallel_tool_use"}));
  const ojson& type = v["type"];
  if (type == "auto" || type == "none") (*chat)["tool_choice"] = type;
  else if (type == "any") (*chat)["tool_choice"] = "required";
  else if (type == "tool" && present(v, "name")) (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", v["name"]}}}};
  else return fc.fail("tool_choice", "must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": ...}");
  if (present(v, "disable_parallel_tool_use")) {
    if (!v["disable_parallel_tool_use"].is_boolean()) return fc.fail("tool_choice.disable_parallel_tool_use", "must be true or false");
    (*chat)["parallel_tool_calls"] = !v["disable_parallel_tool_use"].get<bool>();
  }
  return Status::Ok();
}

Status check_fields(const FieldCheck& fc, const ojson& body) {
  static constexpr std::string_view kRead[] = {"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p",
                                               "top_k", "stream", "tools", "tool_choice", "metadata", "thinking", "service_tier",
                                               "speculative", "cache_salt", "ignore_eos", "grammar"};  // the last four: tandem's
  for (auto it = body.begin(); it != body.end(); ++it)
    if (std::find(std::begin(kRead), std::end(kRead), it.key()) == std::end(kRead))
      return fc.fail(it.key(), "is not supported by /v1/messages in tandem");
  if (present(body, "metadata")) {
    if (!body["metadata"].is_object()) return fc.fail("metadata", "must be an object");
    TANDEM_TRY(fc.known(body["metadata"], "metadata", {"user_id"}));
  }
  if (present(body, "thinking") && body["thinking"] != ojson{{"type", "disabled"}})
    return fc.fail("thinking", "is not supported (tandem accepts only {\"type\": \"disabled\"}; a reasoning model's thinking comes as "
                               "thinking blocks regardless)");
  if (present(body, "service_tier") && body["service_tier"] != "auto" && body["service_tier"] != "standard_only")
    return fc.fail("service_tier", "is not supported (tandem accepts only \"auto\" or \"standard_only\")");
  if (!body.contains("max_tokens")) return fc.fail("max_tokens", "is required");
  if (!body["max_tokens"].is_number_integer() || body["max_tokens"].get<int64_t>() < 1) return fc.fail("max_tokens", "must be an integer of at least 1");
  if (present(body, "temperature") && (!body["temperature"].is_number() || body["temperature"].get<double>() > 1))
    return fc.fail("temperature", "must be a number between 0 and 1");
  return Status::Ok();
}

// stop_sequences and top_k, which the chat request has not (or not as many).
Status sampling_extras(const FieldCheck& fc, const ojson& body, ParsedRequest* pr) {
  if (present(body, "stop_sequences")) {
    const ojson& s = body["stop_sequences"];
    if (!s.is_array() || s.size() > kMaxStops) return fc.fail("stop_sequences", fmt::format("must be an array of at most {} strings", kMaxStops));
    for (size_t i = 0; i < s.size(); i++) {
      if (!s[i].is_string() || s[i].get_ref<const std::string&>().empty())
        return fc.fail(fmt::format("stop_sequences[{}]", i), "must be a non-empty string");
      pr->stop.push_back(s[i].get<std::string>());
    }
  }
  if (present(body, "top_k")) {
    if (!body["top_k"].is_number_integer() || body["top_k"].get<int64_t>() < 0 || body["top_k"].get<int64_t>() > (1 << 20))
      return fc.fail("top_k", "must be a non-negative integer");
    pr->sampling.top_k = (int)body["top_k"].get<int64_t>();
  }
  return Status::Ok();
}

}  // namespace

std::string anthropic_param(const std::string& chat_param) {
  std::string p = rewrite_path(chat_param, {{"max_completion_tokens", "max_tokens"}, {"stop", "stop_sequences"}, {"parallel_tool_calls", "tool_choice"}});
  if (const size_t at = p.find("].parameters"); p.rfind("tools[", 0) == 0 && at != std::string::npos) p.replace(at + 1, 11, ".input_schema");
  return p;
}

Result<ParsedRequest> parse_anthropic_request(const ojson& body, uint64_t seed_if_absent, std::string* bad) {
  const FieldCheck fc{bad};
  if (!body.is_object()) return fc.fail("", "the request body must be a JSON object").error();
  TANDEM_TRY(check_fields(fc, body));
  Conversation c;
  TANDEM_TRY(translate_messages(fc, body, &c));
  ojson chat = {{"messages", c.messages}};
  for (const char* k : {"model", "max_tokens", "temperature", "top_p", "stream", "speculative", "cache_salt", "ignore_eos", "grammar"})
    if (body.contains(k)) chat[k] = body[k];
  if (present(body, "tools")) TANDEM_TRY(translate_tools(fc, body["tools"], &chat["tools"]));
  if (present(body, "tool_choice")) TANDEM_TRY(translate_tool_choice(fc, body["tool_choice"], &chat));
  std::string chat_bad;
  auto pr = parse_request(chat, true, seed_if_absent, &chat_bad);
  if (!pr.ok()) return translated_error(pr.error().message, chat_bad, c.sources, anthropic_param, bad).error();
  TANDEM_TRY(sampling_extras(fc, body, &pr.value()));
  return pr;
}

}  // namespace tandem::server
