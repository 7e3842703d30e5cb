#include "server/token_endpoints.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <string_view>

#include "server/openai_request.h"
#include "server/tool_use.h"

namespace tandem::server {

namespace {

Status fail(std::string* bad, const char* param, const std::string& what) {
  *bad = param;
  return make_error("'{}' {}", param, what);
}

// An optional boolean field: absent or null keeps `*out`.
Status optional_bool(const ojson& body, const char* key, bool* out, std::string* bad) {
  if (!body.contains(key) || body[key].is_null()) return Status::Ok();
  if (!body[key].is_boolean()) return fail(bad, key, "must be true or false");
  *out = body[key].get<bool>();
  return Status::Ok();
}

Status require_object(const ojson& body, std::string* bad) {
  if (body.is_object()) return Status::Ok();
  *bad = "";
  return make_error("the request body must be a JSON object");
}

// Like the OpenAI endpoints, a field this endpoint does not read is a 400 naming it: a client's
// typo (or an option llama-server has and tandem does not) is never silently ignored.
Status only_known_fields(const ojson& body, std::initializer_list<std::string_view> known, std::string* bad) {
  for (const auto& [key, value] : body.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string names;
    for (std::string_view k : known) names += fmt::format("{}'{}'", names.empty() ? "" : ", ", k);
    *bad = key;
    return make_error("'{}' is not a field of this endpoint (it reads {})", key, names);
  }
  return Status::Ok();
}

// llama-server's piece: the text when it is valid UTF-8, else its bytes as numbers (a token may
// hold part of a character).
std::string piece_json(const std::string& piece) {
  if (is_valid_utf8(piece)) return dump_json(ojson(piece));
  std::string o = "[";
  for (size_t i = 0; i < piece.size(); i++) o += fmt::format("{}{}", i ? "," : "", (unsigned)(unsigned char)piece[i]);
  return o + "]";
}

}  // namespace

Result<std::string> tokenize_answer(const ojson& body, const Tokenizer& tok, std::string* bad) {
  TANDEM_TRY(require_object(body, bad));
  if (!body.contains("content")) return fail(bad, "content", "is required (the text to tokenize)").error();
  if (!body["content"].is_string()) return fail(bad, "content", "must be a string").error();
  TANDEM_TRY(only_known_fields(body, {"content", "add_special", "parse_special", "with_pieces"}, bad));
  bool add_special = false, parse_special = true, with_pieces = false;
  TANDEM_TRY(optional_bool(body, "add_special", &add_special, bad));
  TANDEM_TRY(optional_bool(body, "parse_special", &parse_special, bad));
  TANDEM_TRY(optional_bool(body, "with_pieces", &with_pieces, bad));
  const auto& content = body["content"].get_ref<const std::string&>();
  const std::vector<int32_t> ids = tok.encode(content, add_special, parse_special);
  if (ids.size() > kMaxTokensPerAnswer)
    return fail(bad, "content", fmt::format("is {} tokens, more than the {} one answer holds; send it in parts", ids.size(), kMaxTokensPerAnswer))
        .error();
  // Written directly rather than as a JSON tree: a tree costs ~100 bytes per token.
  std::string o = R"({"tokens":[)";
  for (size_t i = 0; i < ids.size(); i++) {
    if (i) o += ',';
    if (with_pieces) o += fmt::format(R"({{"id":{},"piece":{}}})", ids[i], piece_json(tok.token_to_piece(ids[i], true)));
    else o += std::to_string(ids[i]);
  }
  return o + "]}";
}

Result<std::string> detokenize_answer(const ojson& body, const Tokenizer& tok, std::string* bad) {
  TANDEM_TRY(require_object(body, bad));
  if (!body.contains("tokens")) return fail(bad, "tokens", "is required (an array of token ids)").error();
  const ojson& tokens = body["tokens"];
  if (!tokens.is_array()) return fail(bad, "tokens", "must be an array of token ids").error();
  TANDEM_TRY(only_known_fields(body, {"tokens"}, bad));
  if (tokens.size() > kMaxTokensPerAnswer)
    return fail(bad, "tokens", fmt::format("has {} ids, more than the {} one answer holds; send them in parts", tokens.size(), kMaxTokensPerAnswer))
        .error();
  const int32_t n_vocab = tok.vocab().size();
  std::vector<int32_t> ids;
  ids.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); i++) {
    const ojson& t = tokens[i];
    if (!t.is_number_integer()) return fail(bad, "tokens", fmt::format("[{}] is not an integer token id", i)).error();
    const int64_t id = t.is_number_unsigned() && t.get<uint64_t>() > (uint64_t)INT64_MAX ? INT64_MAX : t.get<int64_t>();
    if (id < 0 || id >= n_vocab)
      return fail(bad, "tokens", fmt::format("[{}] = {} is not a token id of this model (0 to {})", i, id, n_vocab - 1)).error();
    ids.push_back((int32_t)id);
  }
  // Control tokens give their text, as llama-server's detokenize does; bytes that are not valid
  // UTF-8 (a character cut between tokens) become U+FFFD in the JSON.
  return dump_json(ojson{{"content", tok.decode(ids, true)}});
}

Result<std::string> apply_template_answer(const ojson& body, const ChatTemplate* chat, std::string* bad, ToolFormatMode tool_format) {
  TANDEM_TRY(require_object(body, bad));
  // The same body as /v1/chat/completions, validated the same way (messages, tools, ...).
  auto parsed = parse_request(body, true, 0, bad, {"add_generation_prompt"});
  if (!parsed.ok()) return parsed.error();
  bool add_generation_prompt = true;
  TANDEM_TRY(optional_bool(body, "add_generation_prompt", &add_generation_prompt, bad));
  if (!chat) {
    *bad = "";
    return make_error("this model has no usable chat template");
  }
  const ParsedRequest& pr = parsed.value();
  if (Status s = check_template_fields(*chat, pr); !s.ok()) {
    *bad = "reasoning_effort";
    return s.error();
  }
  auto f = tool_format_for(pr, *chat, nullptr, tool_format);
  if (!f.ok()) {
    *bad = "tools";
    return f.error();
  }
  auto rendered = render_chat_prompt(*chat, pr, add_generation_prompt, f->family);
  if (!rendered.ok()) {
    *bad = "messages";
    return rendered.error();
  }
  return dump_json(ojson{{"prompt", rendered.value().text}});
}

HttpResponse run_token_endpoint(TokenEndpoint which, EndpointContext& ctx, const HttpRequest& req, const HttpHeaders& extra) {
  std::string bad;
  auto body = parse_json_body(req.body);
  Result<std::string> answer = make_error("");
  if (!body.ok()) answer = body.error();
  else if (which == TokenEndpoint::Tokenize) answer = tokenize_answer(body.value(), ctx.tok, &bad);
  else if (which == TokenEndpoint::Detokenize) answer = detokenize_answer(body.value(), ctx.tok, &bad);
  else answer = apply_template_answer(body.value(), ctx.chat, &bad, ctx.tool_format);
  if (answer.ok()) return {200, "application/json", std::move(answer.value()), extra};
  ctx.metrics.request_rejected();
  return {400, "application/json", dump_json(error_body(answer.error().message, "invalid_request_error", bad)), extra};
}

}  // namespace tandem::server
