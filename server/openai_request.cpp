#include "server/openai_request.h"

#include <algorithm>
#include <unordered_set>

namespace tandem::server {

namespace {

using json = nlohmann::ordered_json;

struct Checker {
  const json& body;
  std::string* bad;
  Status fail(const std::string& key, const std::string& what) {
    *bad = key;
    return make_error("'{}' {}", key, what);
  }
  // Number fields: present and numeric, within [lo, hi].
  Status number(const char* key, double lo, double hi, double* out) {
    if (!body.contains(key) || body[key].is_null()) return Status::Ok();
    if (!body[key].is_number()) return fail(key, "must be a number");
    const double v = body[key].get<double>();
    if (!(v >= lo && v <= hi)) return fail(key, fmt::format("must be between {} and {}", lo, hi));
    *out = v;
    return Status::Ok();
  }
  Status integer(const char* key, int64_t lo, int64_t hi, int64_t* out, bool* given = nullptr) {
    if (!body.contains(key) || body[key].is_null()) return Status::Ok();
    if (!body[key].is_number_integer()) return fail(key, "must be an integer");
    const int64_t v = body[key].get<int64_t>();
    if (v < lo || v > hi) return fail(key, fmt::format("must be between {} and {}", lo, hi));
    *out = v;
    if (given) *given = true;
    return Status::Ok();
  }
  Status boolean(const char* key, bool* out) {
    if (!body.contains(key) || body[key].is_null()) return Status::Ok();
    if (!body[key].is_boolean()) return fail(key, "must be true or false");
    *out = body[key].get<bool>();
    return Status::Ok();
  }
};

// A nested object's keys against the ones tandem reads there: like an unknown top-level field,
// an unknown (or misspelt) nested one is refused, naming its JSON path, rather than ignored.
Status known_keys(Checker& c, const json& obj, const std::string& path, std::initializer_list<std::string_view> keys,
                  std::string_view hint = "") {
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (std::find(keys.begin(), keys.end(), it.key()) == keys.end())
      return c.fail(fmt::format("{}.{}", path, it.key()), hint.empty() ? std::string("is not supported") : fmt::format("is not supported {}", hint));
  return Status::Ok();
}

// Caps on the lists a request carries, checked before any work that grows faster than a list's
// length: a request over them is refused, not slowly served.
constexpr size_t kMaxMessages = 4096;
constexpr size_t kMaxContentParts = 256;    // per message
constexpr size_t kMaxToolCalls = 128;       // per assistant message
constexpr size_t kMaxTools = 128;           // OpenAI's own limit

// "speculative": a mode name, or {"mode": name, "draft_max": 1..64}; null or absent: unset.
Status parse_speculative(Checker& c, std::optional<SpeculativeParams>* out) {
  if (!c.body.contains("speculative") || c.body["speculative"].is_null()) return Status::Ok();
  const json& v = c.body["speculative"];
  const json* mode = &v;
  SpeculativeParams p;
  if (v.is_object()) {
    if (!v.contains("mode")) return c.fail("speculative", "needs a 'mode' (\"lookup\", \"draft\" or \"off\")");
    TANDEM_TRY(known_keys(c, v, "speculative", {"mode", "draft_max"}));
    mode = &v["mode"];
    if (v.contains("draft_max")) {
      if (!v["draft_max"].is_number_integer() || v["draft_max"].get<int64_t>() < 1 || v["draft_max"].get<int64_t>() > 64)
        return c.fail("speculative", "'draft_max' must be an integer between 1 and 64");
      p.draft_max = (int)v["draft_max"].get<int64_t>();
    }
  }
  if (!mode->is_string()) return c.fail("speculative", "must be \"lookup\", \"draft\", \"off\" or {\"mode\": ..., \"draft_max\": N}");
  auto m = parse_speculative_mode(mode->get<std::string>());
  if (!m.ok()) return c.fail("speculative", "mode must be \"lookup\", \"draft\" or \"off\"");
  p.mode = m.value();
  *out = p;
  return Status::Ok();
}


// Every OpenAI field of each endpoint, and whether tandem honours it (Read), accepts it only
// at the value that changes nothing (NoOp, checked by no_op_ok), or does not do it at all
// (Refused: only null, the default, passes).
enum class Use { Read, NoOp, Refused };
struct Field {
  std::string_view name;
  bool chat, completions;
  Use use;
};
constexpr Field kFields[] = {
    {"model", true, true, Use::Read},
    {"messages", true, false, Use::Read},
    {"prompt", false, true, Use::Read},
    {"max_tokens", true, true, Use::Read},
    {"max_completion_tokens", true, false, Use::Read},
    {"temperature", true, true, Use::Read},
    {"top_p", true, true, Use::Read},
    {"seed", true, true, Use::Read},
    {"n", true, true, Use::Read},
    {"stream", true, true, Use::Read},
    {"stream_options", true, true, Use::Read},
    {"stop", true, true, Use::Read},
    {"logprobs", true, true, Use::Read},
    {"top_logprobs", true, false, Use::Read},
    {"echo", false, true, Use::Read},
    {"tools", true, false, Use::Read},
    {"tool_choice", true, false, Use::Read},
    {"parallel_tool_calls", true, false, Use::Read},
    {"response_format", true, false, Use::Read},
    {"speculative", true, true, Use::Read},  // tandem's
    {"grammar", true, true, Use::Read},      // tandem's
    {"cache_salt", true, true, Use::Read},   // vLLM's and tandem's
    {"ignore_eos", true, true, Use::Read},   // vLLM's and llama-server's
    {"frequency_penalty", true, true, Use::NoOp},
    {"presence_penalty", true, true, Use::NoOp},
    {"logit_bias", true, true, Use::NoOp},
    {"user", true, true, Use::NoOp},
    {"best_of", false, true, Use::NoOp},
    {"store", true, false, Use::NoOp},
    {"metadata", true, false, Use::NoOp},
    {"service_tier", true, false, Use::NoOp},
    {"modalities", true, false, Use::NoOp},
    {"prompt_cache_key", true, false, Use::NoOp},
    {"safety_identifier", true, false, Use::NoOp},
    {"functions", true, false, Use::Refused},
    {"function_call", true, false, Use::Refused},
    {"audio", true, false, Use::Refused},
    {"prediction", true, false, Use::Refused},
    {"web_search_options", true, false, Use::Refused},
    {"reasoning_effort", true, false, Use::Read},
    {"verbosity", true, false, Use::Refused},
    {"suffix", false, true, Use::Refused},
};

// The value of a NoOp field that changes nothing; the message says which that is.
bool no_op_ok(std::string_view key, const json& v, std::string* what) {
  if (key == "frequency_penalty" || key == "presence_penalty") {
    *what = "is not supported (tandem accepts only 0)";
    return v.is_number() && v.get<double>() == 0;
  }
  if (key == "logit_bias") {
    *what = "is not supported (tandem accepts only {})";
    return v.is_object() && v.empty();
  }
  if (key == "best_of") {
    *what = "is not supported (tandem accepts only 1)";
    return v.is_number_integer() && v.get<int64_t>() == 1;
  }
  if (key == "store") {
    *what = "is not supported (tandem stores nothing: only false)";
    return v.is_boolean() && !v.get<bool>();
  }
  if (key == "service_tier") {
    *what = "is not supported (tandem accepts only \"auto\" or \"default\")";
    return v.is_string() && (v.get<std::string>() == "auto" || v.get<std::string>() == "default");
  }
  if (key == "modalities") {
    *what = "is not supported (tandem answers in text only: [\"text\"])";
    return v == json::array({"text"});
  }
  if (key == "metadata") {
    *what = "must be an object of strings";
    if (!v.is_object()) return false;
    return std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_string(); });
  }
  *what = "must be a string";  // user, prompt_cache_key, safety_identifier: informational
  return v.is_string();
}

Status check_fields(Checker& c, bool chat, std::initializer_list<std::string_view> also_allowed) {
  for (auto it = c.body.begin(); it != c.body.end(); ++it) {
    const std::string& key = it.key();
    if (std::find(also_allowed.begin(), also_allowed.end(), key) != also_allowed.end()) continue;
    const Field* f = nullptr;
    for (const Field& x : kFields)
      if (x.name == key && (chat ? x.chat : x.completions)) f = &x;
    if (!f)
      return c.fail(key, chat ? "is not supported by /v1/chat/completions in tandem" : "is not supported by /v1/completions in tandem");
    if (f->use == Use::Refused && !it.value().is_null()) {
      if (key == "functions" || key == "function_call") return c.fail(key, "is not supported; use 'tools' and 'tool_choice'");
      return c.fail(key, "is not supported");
    }
    std::string what;
    if (f->use == Use::NoOp && !it.value().is_null() && !no_op_ok(key, it.value(), &what)) return c.fail(key, what);
  }
  return Status::Ok();
}

bool valid_function_name(const json& v) {
  if (!v.is_string()) return false;
  const std::string& s = v.get_ref<const std::string&>();
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
  });
}

bool present(const json& o, const char* key) { return o.contains(key) && !o[key].is_null(); }

// Messages: a role each; content a string, text parts or null; an assistant's tool_calls and a
// tool message's tool_call_id in OpenAI's shape. Every key is one tandem reads.
Status parse_message(Checker& c, const json& m, const std::string& at) {
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) return c.fail(at, "needs a string 'role'");
  TANDEM_TRY(known_keys(c, m, at, {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"}));
  if (present(m, "name") && !m["name"].is_string()) return c.fail(at + ".name", "must be a string");
  // An earlier answer's reasoning, as tandem and llama-server return it: templates that keep it
  // read it (Qwen3's as reasoning_content, gpt-oss's as thinking).
  if (present(m, "reasoning_content") && !m["reasoning_content"].is_string())
    return c.fail(at + ".reasoning_content", "must be a string");
  if (m.contains("content") && m["content"].is_array()) {
    const json& parts = m["content"];
    if (parts.size() > kMaxContentParts) return c.fail(at + ".content", fmt::format("has more than {} parts", kMaxContentParts));
    for (size_t j = 0; j < parts.size(); j++) {
      const std::string pat = fmt::format("{}.content[{}]", at, j);
      const json& part = parts[j];
      if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string())
        return c.fail(pat, "must be {\"type\": \"text\", \"text\": \"...\"} (tandem's models read text only)");
      TANDEM_TRY(known_keys(c, part, pat, {"type", "text"}));
    }
  } else if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
    return c.fail(at + ".content", "must be a string or an array of parts");
  }
  if (present(m, "tool_calls")) {
    if (m["role"] != "assistant" || !m["tool_calls"].is_array())
      return c.fail(at + ".tool_calls", "must be an array, on an assistant message");
    if (m["tool_calls"].size() > kMaxToolCalls) return c.fail(at + ".tool_calls", fmt::format("has more than {} calls", kMaxToolCalls));
    for (size_t j = 0; j < m["tool_calls"].size(); j++) {
      const json& tc = m["tool_calls"][j];
      const std::string tat = fmt::format("{}.tool_calls[{}]", at, j);
      if (!tc.is_object() || !tc.contains("id") || !tc["id"].is_string() || !tc.contains("function") ||
          !tc["function"].is_object() || !tc["function"].contains("name") || !tc["function"]["name"].is_string() ||
          !tc["function"].contains("arguments") || !tc["function"]["arguments"].is_string())
        return c.fail(tat, "needs an 'id' and a 'function' with a string 'name' and 'arguments'");
      if (tc.contains("type") && tc["type"] != "function") return c.fail(tat + ".type", "must be \"function\"");
      TANDEM_TRY(known_keys(c, tc, tat, {"id", "type", "function"}));
      TANDEM_TRY(known_keys(c, tc["function"], tat + ".function", {"name", "arguments"}));
    }
  }
  if (present(m, "tool_call_id") && !m["tool_call_id"].is_string()) return c.fail(at + ".tool_call_id", "must be a string");
  if (m["role"] == "tool" && !present(m, "tool_call_id")) return c.fail(at, "is a 'tool' message and needs a string 'tool_call_id'");
  return Status::Ok();
}

Status parse_messages(Checker& c, ParsedRequest* r) {
  const json& body = c.body;
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    return c.fail("messages", "must be a non-empty array of {\"role\": ..., \"content\": ...}");
  if (body["messages"].size() > kMaxMessages) return c.fail("messages", fmt::format("has more than {} messages", kMaxMessages));
  for (size_t i = 0; i < body["messages"].size(); i++)
    TANDEM_TRY(parse_message(c, body["messages"][i], fmt::format("messages[{}]", i)));
  r->messages = body["messages"];
  return Status::Ok();
}

// tools: [{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}],
// at most kMaxTools, names unique (checked by hashing: a quadratic check was a way to hold a worker).
Status parse_tools(Checker& c, ParsedRequest* r) {
  if (!present(c.body, "tools")) return Status::Ok();
  const json& tools = c.body["tools"];
  if (!tools.is_array()) return c.fail("tools", "must be an array");
  if (tools.size() > kMaxTools) return c.fail("tools", fmt::format("has {} tools; at most {} are allowed", tools.size(), kMaxTools));
  std::unordered_set<std::string> names;
  for (size_t i = 0; i < tools.size(); i++) {
    const json& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object() || !t.contains("type") || t["type"] != "function")
      return c.fail(at, "must be {\"type\": \"function\", \"function\": {...}} (other tool types are not supported)");
    if (!t.contains("function") || !t["function"].is_object()) return c.fail(at, "needs a 'function' object");
    TANDEM_TRY(known_keys(c, t, at, {"type", "function"}));
    const json& fn = t["function"];
    TANDEM_TRY(known_keys(c, fn, at + ".function", {"name", "description", "parameters", "strict"}));
    if (!fn.contains("name") || !valid_function_name(fn["name"]))
      return c.fail(at + ".function.name", "must be 1 to 64 letters, digits, '_' or '-'");
    if (present(fn, "description") && !fn["description"].is_string()) return c.fail(at + ".function.description", "must be a string");
    if (present(fn, "parameters") && !fn["parameters"].is_object())
      return c.fail(at + ".function.parameters", "must be a JSON Schema object");
    if (present(fn, "strict") && !fn["strict"].is_boolean()) return c.fail(at + ".function.strict", "must be true or false");
    if (!names.insert(fn["name"].get<std::string>()).second)
      return c.fail(at + ".function.name", fmt::format("'{}' is the name of an earlier tool: function names must be unique", fn["name"].get<std::string>()));
  }
  r->tools = tools;
  return Status::Ok();
}

Status parse_tool_choice(Checker& c, ParsedRequest* r) {
  using TC = ParsedRequest::ToolChoice;
  TANDEM_TRY(c.boolean("parallel_tool_calls", &r->parallel_tool_calls));
  if (!present(c.body, "tool_choice")) return Status::Ok();
  const json& v = c.body["tool_choice"];
  const bool have_tools = r->tools.is_array() && !r->tools.empty();
  if (v == "none") {
    r->tool_choice = TC::None;
  } else if (v == "auto") {
    r->tool_choice = TC::Auto;
  } else if (v == "required") {
    if (!have_tools) return c.fail("tool_choice", "\"required\" needs 'tools'");
    r->tool_choice = TC::Required;
  } else if (v.is_object() && v.contains("type") && v["type"] == "function") {
    if (!v.contains("function") || !v["function"].is_object() || !v["function"].contains("name") || !v["function"]["name"].is_string())
      return c.fail("tool_choice", "must name its function: {\"type\": \"function\", \"function\": {\"name\": ...}}");
    TANDEM_TRY(known_keys(c, v, "tool_choice", {"type", "function"}));
    TANDEM_TRY(known_keys(c, v["function"], "tool_choice.function", {"name"}));
    const std::string name = v["function"]["name"].get<std::string>();
    bool known = false;
    if (have_tools)
      for (const auto& t : r->tools) known = known || t["function"]["name"] == name;
    if (!known) return c.fail("tool_choice", fmt::format("names '{}', which is not one of 'tools'", name));
    r->tool_choice = TC::Function;
    r->tool_choice_function = name;
  } else {
    return c.fail("tool_choice", "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  return Status::Ok();
}

// response_format: {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema":
// {"name", "schema", "description"?, "strict"?}}.
Status parse_response_format(Checker& c, ParsedRequest* r) {
  using Kind = ParsedRequest::OutputConstraint::Kind;
  if (!present(c.body, "response_format")) return Status::Ok();
  const json& v = c.body["response_format"];
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
    return c.fail("response_format", "must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}");
  const std::string type = v["type"].get<std::string>();
  // llama-server's {"type": "json_object", "schema": {...}} would silently lose its schema here.
  TANDEM_TRY(known_keys(c, v, "response_format", {"type", "json_schema"},
                        "(for a schema send OpenAI's form: {\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}})"));
  if (type != "json_schema" && v.contains("json_schema"))
    return c.fail("response_format.json_schema", fmt::format("is read only with type json_schema, not '{}'", type));
  if (type == "text") return Status::Ok();
  if (type == "json_object") {
    r->constraint.kind = Kind::JsonObject;
    r->constraint.name = "json_object";
    return Status::Ok();
  }
  if (type != "json_schema") return c.fail("response_format", fmt::format("type '{}' is not supported", type));
  if (!v.contains("json_schema") || !v["json_schema"].is_object())
    return c.fail("response_format", "type json_schema needs a 'json_schema' object: {\"name\": ..., \"schema\": {...}}");
  const json& js = v["json_schema"];
  TANDEM_TRY(known_keys(c, js, "response_format.json_schema", {"name", "schema", "description", "strict"}));
  if (!js.contains("name") || !valid_function_name(js["name"]))
    return c.fail("response_format", "json_schema's 'name' must be 1 to 64 letters, digits, '_' or '-'");
  if (!js.contains("schema") || !js["schema"].is_object()) return c.fail("response_format", "json_schema needs a 'schema' object");
  if (present(js, "strict") && !js["strict"].is_boolean()) return c.fail("response_format", "json_schema's 'strict' must be true or false");
  if (present(js, "description") && !js["description"].is_string())
    return c.fail("response_format", "json_schema's 'description' must be a string");
  r->constraint.kind = Kind::JsonSchema;
  r->constraint.schema = js["schema"];
  r->constraint.name = js["name"].get<std::string>();
  return Status::Ok();
}

// At most one constraint: response_format, grammar, or a forced tool call.
Status parse_grammar(Checker& c, ParsedRequest* r) {
  using Kind = ParsedRequest::OutputConstraint::Kind;
  const char* only_one = "only one of 'response_format' (json), 'grammar' and a forced tool call may constrain a request";
  if (present(c.body, "grammar")) {
    const json& g = c.body["grammar"];
    if (!g.is_string() || g.get_ref<const std::string&>().empty()) return c.fail("grammar", "must be GBNF text (a non-empty string)");
    if (r->constraint.kind != Kind::None) return c.fail("grammar", only_one);
    r->constraint.kind = Kind::Gbnf;
    r->constraint.gbnf = g.get<std::string>();
    r->constraint.name = "grammar";
  }
  if (r->tool_call_forced() && r->constraint.kind != Kind::None) return c.fail("tool_choice", only_one);
  return Status::Ok();
}

// The completions prompt: a string, or an array of exactly one string.
Status parse_prompt(Checker& c, ParsedRequest* r) {
  if (!c.body.contains("prompt")) return c.fail("prompt", "is required");
  const json& p = c.body["prompt"];
  if (p.is_string()) {
    r->prompt = p.get<std::string>();
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    r->prompt = p[0].get<std::string>();
  } else {
    return c.fail("prompt", "must be a string (or an array of one string)");
  }
  return Status::Ok();
}

// Length and sampling: max_tokens (chat's max_completion_tokens wins), temperature, top_p, seed, n.
Status parse_sampling(Checker& c, bool chat, uint64_t seed_if_absent, ParsedRequest* r) {
  const json& body = c.body;
  int64_t max_tokens = r->max_tokens;
  TANDEM_TRY(c.integer(chat && body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens", 0, 1 << 20,
                       &max_tokens, &r->max_tokens_given));
  r->max_tokens = (int)max_tokens;
  double temp = 1.0, top_p = 1.0;
  TANDEM_TRY(c.number("temperature", 0, 2, &temp));
  TANDEM_TRY(c.number("top_p", 0, 1, &top_p));
  r->sampling.temperature = (float)temp;
  r->sampling.top_p = (float)top_p;
  r->sampling.top_k = 0;    // OpenAI has no top-k or min-p: the full distribution
  r->sampling.min_p = 0;
  int64_t seed = -1;
  TANDEM_TRY(c.integer("seed", INT64_MIN, INT64_MAX, &seed));
  r->sampling.seed = body.contains("seed") && !body["seed"].is_null() ? (uint64_t)seed : seed_if_absent;
  int64_t n = 1;
  TANDEM_TRY(c.integer("n", 1, 128, &n));
  if (n != 1) return c.fail("n", "must be 1 (tandem returns one choice)");
  return Status::Ok();
}

// The prefix cache's salt and the chat template's reasoning effort: plain strings, checked here.
Status parse_salt_and_effort(Checker& c, ParsedRequest* r) {
  if (present(c.body, "cache_salt")) {
    const json& salt = c.body["cache_salt"];
    if (!salt.is_string() || salt.get_ref<const std::string&>().empty() || salt.get_ref<const std::string&>().size() > 256)
      return c.fail("cache_salt", "must be a string of 1 to 256 bytes");
    r->cache_salt = salt.get<std::string>();
  }
  if (present(c.body, "reasoning_effort")) {
    const json& e = c.body["reasoning_effort"];
    if (!e.is_string() || (e != "low" && e != "medium" && e != "high"))
      return c.fail("reasoning_effort", "must be \"low\", \"medium\" or \"high\"");
    r->reasoning_effort = e.get<std::string>();
  }
  return Status::Ok();
}

// stream, ignore_eos and stream_options, whose only key tandem acts on is include_usage.
Status parse_streaming(Checker& c, ParsedRequest* r) {
  TANDEM_TRY(c.boolean("stream", &r->stream));
  TANDEM_TRY(c.boolean("ignore_eos", &r->ignore_eos));
  if (!c.body.contains("stream_options") || c.body["stream_options"].is_null()) return Status::Ok();
  const json& so = c.body["stream_options"];
  if (!so.is_object()) return c.fail("stream_options", "must be an object");
  for (auto it = so.begin(); it != so.end(); ++it) {
    // tandem pads no chunks: include_obfuscation is accepted only as false.
    if (it.key() == "include_obfuscation" && (it.value().is_null() || it.value() == false)) continue;
    if (it.key() != "include_usage") return c.fail("stream_options." + it.key(), "is not supported");
  }
  if (so.contains("include_usage")) {
    if (!so["include_usage"].is_boolean()) return c.fail("stream_options", "include_usage must be true or false");
    r->include_usage = so["include_usage"].get<bool>();
  }
  return Status::Ok();
}

// Stop sequences: one string or an array of up to 4, as OpenAI allows.
Status parse_stop(Checker& c, ParsedRequest* r) {
  if (!c.body.contains("stop") || c.body["stop"].is_null()) return Status::Ok();
  const json& s = c.body["stop"];
  if (s.is_string()) {
    r->stop.push_back(s.get<std::string>());
  } else if (s.is_array() && s.size() <= 4) {
    for (const auto& x : s) {
      if (!x.is_string()) return c.fail("stop", "must be a string or an array of up to 4 strings");
      r->stop.push_back(x.get<std::string>());
    }
  } else {
    return c.fail("stop", "must be a string or an array of up to 4 strings");
  }
  return Status::Ok();
}

// logprobs differs by endpoint: chat takes a boolean plus top_logprobs, completions a count from 0 to 5.
Status parse_logprobs(Checker& c, bool chat, ParsedRequest* r) {
  if (c.body.contains("logprobs") && !c.body["logprobs"].is_null()) {
    const json& l = c.body["logprobs"];
    if (chat) {
      if (!l.is_boolean()) return c.fail("logprobs", "must be true or false");
      r->logprobs = l.get<bool>();
    } else {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() > 5)
        return c.fail("logprobs", "must be an integer from 0 to 5");
      r->logprobs = true;
      r->top_logprobs = (int)l.get<int64_t>();
    }
  }
  if (chat) {
    int64_t top = 0;
    TANDEM_TRY(c.integer("top_logprobs", 0, 20, &top));
    if (top > 0 && !r->logprobs) return c.fail("top_logprobs", "needs 'logprobs': true");
    r->top_logprobs = (int)top;
  }
  return Status::Ok();
}

}  // namespace

// Each field group is checked in a fixed order, so a body with several bad fields always names the same one.
Result<ParsedRequest> parse_request(const json& body, bool chat, uint64_t seed_if_absent, std::string* bad,
                                    std::initializer_list<std::string_view> also_allowed) {
  if (!body.is_object()) {
    *bad = "";
    return make_error("the request body must be a JSON object");
  }
  Checker c{body, bad};
  TANDEM_TRY(check_fields(c, chat, also_allowed));
  ParsedRequest r;
  r.chat = chat;
  if (body.contains("model") && !body["model"].is_null() && !body["model"].is_string())
    return c.fail("model", "must be a string").error();
  if (chat) {
    TANDEM_TRY(parse_messages(c, &r));
    TANDEM_TRY(parse_tools(c, &r));
    TANDEM_TRY(parse_tool_choice(c, &r));
    TANDEM_TRY(parse_response_format(c, &r));
  } else {
    TANDEM_TRY(parse_prompt(c, &r));
  }
  TANDEM_TRY(parse_sampling(c, chat, seed_if_absent, &r));
  TANDEM_TRY(parse_speculative(c, &r.speculative));
  TANDEM_TRY(parse_salt_and_effort(c, &r));
  TANDEM_TRY(parse_streaming(c, &r));
  TANDEM_TRY(parse_stop(c, &r));
  TANDEM_TRY(parse_logprobs(c, chat, &r));
  bool echo = false;
  TANDEM_TRY(c.boolean("echo", &echo));
  if (echo) return c.fail("echo", "is not supported").error();
  TANDEM_TRY(parse_grammar(c, &r));
  return r;
}

}  // namespace tandem::server
