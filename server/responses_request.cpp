#include "server/responses_request.h"

#include "server/request_checks.h"


namespace tandem::server {

namespace {

constexpr size_t kMaxInputItems = 4096;  // as chat's messages
constexpr size_t kMaxParts = 256;        // per message, as chat's

// The input as chat messages, each with the path it came from (for the chat parser's errors).
struct Conversation {
  ojson messages = ojson::array();
  std::vector<std::string> sources;
  std::string pending_reasoning;  // a reasoning item's text, for the assistant message that follows
};

void add_message(Conversation* c, ojson m, const std::string& source) {
  if (m["role"] == "assistant" && !c->pending_reasoning.empty()) {
    m["reasoning_content"] = std::move(c->pending_reasoning);
    c->pending_reasoning.clear();
  }
  c->messages.push_back(std::move(m));
  c->sources.push_back(source);
}

// content: a string, or input_text / output_text parts (text only), joined: the text a
// template reads (most read a message's content as one string).
Status message_content(const FieldCheck& fc, const ojson& content, const std::string& at, ojson* out) {
  if (content.is_string()) {
    *out = content;
    return Status::Ok();
  }
  if (!content.is_array()) return fc.fail(at, "must be a string or an array of input_text parts");
  if (content.size() > kMaxParts) return fc.fail(at, fmt::format("has more than {} parts", kMaxParts));
  std::string joined;
  for (size_t j = 0; j < content.size(); j++) {
    const ojson& p = content[j];
    const std::string pat = fmt::format("{}[{}]", at, j);
    const bool text_part = p.is_object() && (p.value("type", ojson()) == "input_text" || p.value("type", ojson()) == "output_text");
    if (!text_part || !p.contains("text") || !p["text"].is_string())
      return fc.fail(pat, "must be {\"type\": \"input_text\", \"text\": \"...\"} (tandem's models read text only)");
    TANDEM_TRY(fc.known(p, pat, {"type", "text", "annotations", "logprobs"}));
    for (const char* k : {"annotations", "logprobs"})
      if (present(p, k) && !(p[k].is_array() && p[k].empty())) return fc.fail(pat + "." + k, "is not supported (only [])");
    joined += p["text"].get<std::string>();
  }
  *out = std::move(joined);
  return Status::Ok();
}

Status message_item(const FieldCheck& fc, const ojson& item, const std::string& at, Conversation* c) {
  TANDEM_TRY(fc.known(item, at, {"type", "role", "content", "id", "status"}));
  const ojson role = item.value("role", ojson());
  if (role != "user" && role != "assistant" && role != "system" && role != "developer")
    return fc.fail(at + ".role", "must be \"user\", \"assistant\", \"system\" or \"developer\"");
  if (!item.contains("content")) return fc.fail(at, "needs a 'content'");
  ojson content;
  TANDEM_TRY(message_content(fc, item["content"], at + ".content", &content));
  add_message(c, {{"role", role == "developer" ? "system" : role}, {"content", std::move(content)}}, at);
  return Status::Ok();
}

// A call the model made earlier: joins the assistant message before it, as chat's tool_calls.
Status function_call_item(const FieldCheck& fc, const ojson& item, const std::string& at, Conversation* c) {
  TANDEM_TRY(fc.known(item, at, {"type", "call_id", "name", "arguments", "id", "status"}));
  for (const char* k : {"call_id", "name", "arguments"})
    if (!item.contains(k) || !item[k].is_string()) return fc.fail(fmt::format("{}.{}", at, k), "must be a string");
  const ojson call = {{"id", item["call_id"]}, {"type", "function"}, {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
  if (!c->messages.empty() && c->messages.back()["role"] == "assistant" && c->pending_reasoning.empty()) {
    ojson& last = c->messages.back();
    if (!last.contains("tool_calls")) last["tool_calls"] = ojson::array();
    last["tool_calls"].push_back(call);
    return Status::Ok();
  }
  add_message(c, {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ojson::array({call})}}, at);
  return Status::Ok();
}

Status function_call_output_item(const FieldCheck& fc, const ojson& item, const std::string& at, Conversation* c) {
  TANDEM_TRY(fc.known(item, at, {"type", "call_id", "output", "id", "status"}));
  if (!item.contains("call_id") || !item["call_id"].is_string()) return fc.fail(at + ".call_id", "must be a string");
  if (!item.contains("output")) return fc.fail(at, "needs an 'output'");
  ojson output;
  TANDEM_TRY(message_content(fc, item["output"], at + ".output", &output));
  add_message(c, {{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", std::move(output)}}, at);
  return Status::Ok();
}

// An earlier answer's reasoning: the reasoning_content of the assistant message that follows.
Status reasoning_item(const FieldCheck& fc, const ojson& item, const std::string& at, Conversation* c) {
  TANDEM_TRY(fc.known(item, at, {"type", "id", "summary", "content", "encrypted_content", "status"}));
  if (present(item, "encrypted_content")) return fc.fail(at + ".encrypted_content", "is not supported (tandem encrypts nothing)");
  for (const char* k : {"summary", "content"}) {
    if (!present(item, k)) continue;
    const ojson& parts = item[k];
    if (!parts.is_array() || parts.size() > kMaxParts) return fc.fail(fmt::format("{}.{}", at, k), "must be an array of text parts");
    for (size_t j = 0; j < parts.size(); j++) {
      const std::string pat = fmt::format("{}.{}[{}]", at, k, j);
      if (!parts[j].is_object() || !parts[j].contains("text") || !parts[j]["text"].is_string())
        return fc.fail(pat, "must be {\"type\": \"reasoning_text\" | \"summary_text\", \"text\": \"...\"}");
      TANDEM_TRY(fc.known(parts[j], pat, {"type", "text"}));
      if (std::string(k) == "content") c->pending_reasoning += parts[j]["text"].get<std::string>();
    }
  }
  return Status::Ok();
}

Status translate_input(const FieldCheck& fc, const ojson& input, Conversation* c) {
  if (input.is_string()) {
    add_message(c, {{"role", "user"}, {"content", input}}, "input");
    return Status::Ok();
  }
  if (!input.is_array() || input.empty()) return fc.fail("input", "must be a string or a non-empty array of items");
  if (input.size() > kMaxInputItems) return fc.fail("input", fmt::format("has more than {} items", kMaxInputItems));
  for (size_t i = 0; i < input.size(); i++) {
    const ojson& item = input[i];
    const std::string at = fmt::format("input[{}]", i);
    if (!item.is_object()) return fc.fail(at, "must be an object (a message or an item)");
    const ojson type = item.contains("type") ? item["type"] : ojson("message");
    if (type == "message") TANDEM_TRY(message_item(fc, item, at, c));
    else if (type == "function_call") TANDEM_TRY(function_call_item(fc, item, at, c));
    else if (type == "function_call_output") TANDEM_TRY(function_call_output_item(fc, item, at, c));
    else if (type == "reasoning") TANDEM_TRY(reasoning_item(fc, item, at, c));
    else return fc.fail(at + ".type", "must be \"message\", \"function_call\", \"function_call_output\" or \"reasoning\"");
  }
  return Status::Ok();
}

// Responses' flat function tools -> chat's {"type": "function", "function": {...}}.
Status translate_tools(const FieldCheck& fc, const ojson& tools, ojson* chat) {
  if (!tools.is_array()) return fc.fail("tools", "must be an array");
  *chat = ojson::array();
  for (size_t i = 0; i < tools.size() && i <= 128; i++) {  // the chat parser refuses more than 128
    const ojson& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object() || t.value("type", ojson()) != "function")
      return fc.fail(at + ".type", "must be \"function\" (other tool types are not supported)");
    TANDEM_TRY(fc.known(t, at, {"type", "name", "description", "parameters", "strict"}));
    ojson fn = t;
    fn.erase("type");
    chat->push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  for (size_t i = 129; i < tools.size(); i++) chat->push_back(tools[i]);  // counted (and refused) there
  return Status::Ok();
}

Status translate_tool_choice(const FieldCheck& fc, const ojson& v, ojson* chat) {
  if (v.is_string()) {
    *chat = v;  // "none", "auto", "required": checked there
    return Status::Ok();
  }
  if (!v.is_object() || v.value("type", ojson()) != "function" || !v.contains("name"))
    return fc.fail("tool_choice", "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}");
  TANDEM_TRY(fc.known(v, "tool_choice", {"type", "name"}));
  *chat = {{"type", "function"}, {"function", {{"name", v["name"]}}}};
  return Status::Ok();
}

// text: {"format": {"type": "text" | "json_object"} | {"type": "json_schema", "name", "schema", ...}}.
Status translate_text(const FieldCheck& fc, const ojson& text, ojson* response_format) {
  if (!text.is_object()) return fc.fail("text", "must be an object: {\"format\": {...}}");
  TANDEM_TRY(fc.known(text, "text", {"format", "verbosity"}));
  if (present(text, "verbosity") && text["verbosity"] != "medium")
    return fc.fail("text.verbosity", "is not supported (tandem accepts only \"medium\")");
  if (!present(text, "format")) return Status::Ok();
  const ojson& f = text["format"];
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
    return fc.fail("text.format", "must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}");
  if (f["type"] != "json_schema") {
    TANDEM_TRY(fc.known(f, "text.format", {"type"}));
    *response_format = f;
    return Status::Ok();
  }
  TANDEM_TRY(fc.known(f, "text.format", {"type", "name", "schema", "description", "strict"}));
  ojson js = f;
  js.erase("type");
  *response_format = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
  return Status::Ok();
}

Status translate_reasoning(const FieldCheck& fc, const ojson& r, ojson* chat_body) {
  if (!r.is_object()) return fc.fail("reasoning", "must be an object: {\"effort\": ...}");
  TANDEM_TRY(fc.known(r, "reasoning", {"effort", "summary", "generate_summary"}));
  for (const char* k : {"summary", "generate_summary"})
    if (present(r, k)) return fc.fail(fmt::format("reasoning.{}", k), "is not supported (tandem returns the reasoning itself, not a summary)");
  if (present(r, "effort")) (*chat_body)["reasoning_effort"] = r["effort"];
  return Status::Ok();
}

// Top-level fields: read ones (translated below), and those accepted at their no-op value.
Status check_fields(const FieldCheck& fc, const ojson& body) {
  static constexpr std::string_view kRead[] = {
      "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "max_output_tokens",
      "temperature", "top_p", "stream", "previous_response_id", "store", "reasoning", "metadata", "user",
      "prompt_cache_key", "safety_identifier", "service_tier", "truncation", "include", "background",
      "speculative", "cache_salt", "ignore_eos", "grammar"};  // the last four: tandem's, as in chat completions
  for (auto it = body.begin(); it != body.end(); ++it)
    if (std::find(std::begin(kRead), std::end(kRead), it.key()) == std::end(kRead))
      return fc.fail(it.key(), "is not supported by /v1/responses in tandem");
  auto is = [&](const char* k, const ojson& v) { return !present(body, k) || body[k] == v; };
  if (!is("truncation", "disabled")) return fc.fail("truncation", "is not supported (tandem accepts only \"disabled\")");
  if (!is("background", false)) return fc.fail("background", "is not supported (tandem answers in the foreground only)");
  if (!is("include", ojson::array())) return fc.fail("include", "is not supported (tandem accepts only [])");
  if (present(body, "service_tier") && body["service_tier"] != "auto" && body["service_tier"] != "default")
    return fc.fail("service_tier", "is not supported (tandem accepts only \"auto\" or \"default\")");
  for (const char* k : {"user", "prompt_cache_key", "safety_identifier", "previous_response_id", "instructions"})
    if (present(body, k) && !body[k].is_string()) return fc.fail(k, "must be a string");
  if (present(body, "store") && !body["store"].is_boolean()) return fc.fail("store", "must be true or false");
  if (present(body, "metadata") &&
      (!body["metadata"].is_object() || !std::all_of(body["metadata"].begin(), body["metadata"].end(), [](const ojson& v) { return v.is_string(); })))
    return fc.fail("metadata", "must be an object of strings");
  return Status::Ok();
}

// The conversation so far: the stored one of previous_response_id, then the input.
Status build_conversation(const FieldCheck& fc, const ojson& body, ResponsesStore& store, const std::string& tenant, Conversation* c) {
  if (present(body, "previous_response_id")) {
    const std::string id = body["previous_response_id"].get<std::string>();
    auto prev = store.get(id, tenant);
    if (!prev)
      return fc.fail("previous_response_id",
                     fmt::format("names '{}', which this server does not hold: unknown, deleted, made with store: false or "
                                 "another API key, or evicted from the server's store (--responses-store {} bytes)",
                                 id, store.max_bytes()));
    for (const ojson& m : prev->messages) {
      c->messages.push_back(m);
      c->sources.push_back("previous_response_id");
    }
  }
  if (!body.contains("input")) return fc.fail("input", "is required");
  return translate_input(fc, body["input"], c);
}

// The chat body of the same request (apart from its messages).
Status chat_fields(const FieldCheck& fc, const ojson& body, ojson* chat) {
  for (const char* k : {"model", "parallel_tool_calls", "temperature", "top_p", "stream", "speculative", "cache_salt", "ignore_eos", "grammar"})
    if (body.contains(k)) (*chat)[k] = body[k];
  if (body.contains("max_output_tokens")) (*chat)["max_completion_tokens"] = body["max_output_tokens"];
  if (present(body, "tools")) TANDEM_TRY(translate_tools(fc, body["tools"], &(*chat)["tools"]));
  if (present(body, "tool_choice")) TANDEM_TRY(translate_tool_choice(fc, body["tool_choice"], &(*chat)["tool_choice"]));
  if (present(body, "text")) {
    ojson rf;
    TANDEM_TRY(translate_text(fc, body["text"], &rf));
    if (!rf.is_null()) (*chat)["response_format"] = std::move(rf);
  }
  if (present(body, "reasoning")) TANDEM_TRY(translate_reasoning(fc, body["reasoning"], chat));
  return Status::Ok();
}

// What the response object repeats of the request, with OpenAI's defaults.
ojson echo_fields(const ojson& body) {
  auto get = [&](const char* k, ojson dflt) { return present(body, k) ? body[k] : dflt; };
  return {{"instructions", get("instructions", nullptr)},
          {"max_output_tokens", get("max_output_tokens", nullptr)},
          {"metadata", get("metadata", ojson::object())},
          {"parallel_tool_calls", get("parallel_tool_calls", true)},
          {"previous_response_id", get("previous_response_id", nullptr)},
          {"reasoning", {{"effort", present(body, "reasoning") ? get("reasoning", ojson::object()).value("effort", ojson()) : ojson()},
                         {"summary", nullptr}}},
          {"store", get("store", true)},
          {"temperature", get("temperature", 1.0)},
          {"text", present(body, "text") && present(body["text"], "format") ? ojson{{"format", body["text"]["format"]}}
                                                                             : ojson{{"format", {{"type", "text"}}}}},
          {"tool_choice", get("tool_choice", "auto")},
          {"tools", get("tools", ojson::array())},
          {"top_p", get("top_p", 1.0)},
          {"truncation", "disabled"},
          {"user", get("user", nullptr)}};
}

}  // namespace

std::string responses_param(const std::string& chat_param) {
  return rewrite_path(chat_param, {{"max_completion_tokens", "max_output_tokens"},
                                   {"max_tokens", "max_output_tokens"},
                                   {"response_format.json_schema", "text.format"},
                                   {"response_format", "text.format"},
                                   {"reasoning_effort", "reasoning.effort"},
                                   {"messages", "input"}});
}

Result<ResponsesRequest> parse_responses_request(const ojson& body, ResponsesStore& store, const std::string& tenant,
                                                 uint64_t seed_if_absent, std::string* bad) {
  const FieldCheck fc{bad};
  if (!body.is_object()) return fc.fail("", "the request body must be a JSON object").error();
  TANDEM_TRY(check_fields(fc, body));
  Conversation c;
  if (present(body, "instructions")) add_message(&c, {{"role", "system"}, {"content", body["instructions"]}}, "instructions");
  TANDEM_TRY(build_conversation(fc, body, store, tenant, &c));
  ojson chat = ojson::object();
  TANDEM_TRY(chat_fields(fc, body, &chat));
  chat["messages"] = c.messages;
  std::string chat_bad;
  auto pr = parse_request(chat, true, seed_if_absent, &chat_bad);
  if (!pr.ok()) return translated_error(pr.error().message, chat_bad, c.sources, responses_param, bad).error();
  ResponsesRequest r;
  r.pr = std::move(pr.value());
  r.store = !present(body, "store") || body["store"].get<bool>();
  const size_t first_input = present(body, "instructions") ? 1 : 0;  // instructions are not carried over
  r.conversation = ojson::array();
  for (size_t k = first_input; k < c.messages.size(); k++) r.conversation.push_back(c.messages[k]);
  r.echo = echo_fields(body);
  return r;
}

}  // namespace tandem::server
