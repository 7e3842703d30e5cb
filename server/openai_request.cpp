#include "server/openai_request.h"

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

// "speculative": a mode name, or {"mode": name, "draft_max": 1..64}; null or absent: unset.
Status parse_speculative(Checker& c, std::optional<SpeculativeParams>* out) {
  if (!c.body.contains("speculative") || c.body["speculative"].is_null()) return Status::Ok();
  const json& v = c.body["speculative"];
  const json* mode = &v;
  SpeculativeParams p;
  if (v.is_object()) {
    if (!v.contains("mode")) return c.fail("speculative", "needs a 'mode' (\"lookup\", \"draft\" or \"off\")");
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

}  // namespace

Result<ParsedRequest> parse_request(const json& body, bool chat, uint64_t seed_if_absent, std::string* bad) {
  if (!body.is_object()) {
    *bad = "";
    return make_error("the request body must be a JSON object");
  }
  Checker c{body, bad};
  ParsedRequest r;
  r.chat = chat;
  if (body.contains("model") && !body["model"].is_null() && !body["model"].is_string())
    return c.fail("model", "must be a string").error();
  if (chat) {
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
      return c.fail("messages", "must be a non-empty array of {\"role\": ..., \"content\": ...}").error();
    for (const auto& m : body["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        return c.fail("messages", "entries need a string 'role'").error();
      if (m.contains("content") && !m["content"].is_string() && !m["content"].is_array() && !m["content"].is_null())
        return c.fail("messages", "'content' must be a string or an array of parts").error();
    }
    r.messages = body["messages"];
    if (body.contains("tools") && !body["tools"].is_null()) {
      if (!body["tools"].is_array()) return c.fail("tools", "must be an array").error();
      r.tools = body["tools"];
    }
  } else {
    if (!body.contains("prompt")) return c.fail("prompt", "is required").error();
    const json& p = body["prompt"];
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt = p[0].get<std::string>();
    } else {
      return c.fail("prompt", "must be a string (or an array of one string)").error();
    }
  }
  int64_t max_tokens = r.max_tokens;
  TANDEM_TRY(c.integer(chat && body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens", 0, 1 << 20,
                       &max_tokens, &r.max_tokens_given));
  r.max_tokens = (int)max_tokens;
  double temp = 1.0, top_p = 1.0;
  TANDEM_TRY(c.number("temperature", 0, 2, &temp));
  TANDEM_TRY(c.number("top_p", 0, 1, &top_p));
  r.sampling.temperature = (float)temp;
  r.sampling.top_p = (float)top_p;
  r.sampling.top_k = 0;    // OpenAI has no top-k or min-p: the full distribution
  r.sampling.min_p = 0;
  int64_t seed = -1;
  TANDEM_TRY(c.integer("seed", INT64_MIN, INT64_MAX, &seed));
  r.sampling.seed = body.contains("seed") && !body["seed"].is_null() ? (uint64_t)seed : seed_if_absent;
  int64_t n = 1;
  TANDEM_TRY(c.integer("n", 1, 128, &n));
  if (n != 1) return c.fail("n", "must be 1 (tandem returns one choice)").error();
  TANDEM_TRY(parse_speculative(c, &r.speculative));
  TANDEM_TRY(c.boolean("stream", &r.stream));
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& so = body["stream_options"];
    if (!so.is_object()) return c.fail("stream_options", "must be an object").error();
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean()) return c.fail("stream_options", "include_usage must be true or false").error();
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& s = body["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const auto& x : s) {
        if (!x.is_string()) return c.fail("stop", "must be a string or an array of up to 4 strings").error();
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      return c.fail("stop", "must be a string or an array of up to 4 strings").error();
    }
  }
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    const json& l = body["logprobs"];
    if (chat) {
      if (!l.is_boolean()) return c.fail("logprobs", "must be true or false").error();
      r.logprobs = l.get<bool>();
    } else {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() > 5)
        return c.fail("logprobs", "must be an integer from 0 to 5").error();
      r.logprobs = true;
      r.top_logprobs = (int)l.get<int64_t>();
    }
  }
  if (chat) {
    int64_t top = 0;
    TANDEM_TRY(c.integer("top_logprobs", 0, 20, &top));
    if (top > 0 && !r.logprobs) return c.fail("top_logprobs", "needs 'logprobs': true").error();
    r.top_logprobs = (int)top;
  }
  bool echo = false;
  TANDEM_TRY(c.boolean("echo", &echo));
  if (echo) return c.fail("echo", "is not supported").error();
  return r;
}

}  // namespace tandem::server
