#include "server/openai_json.h"

#include <fmt/format.h>

#include "core/json_brackets.h"

namespace tandem::server {

int json_nesting_depth(std::string_view text, int limit) { return scan_json_brackets(text, 0, limit, false).deepest; }

Result<ojson> parse_json_body(std::string_view body, int max_depth) {
  // Counted before parsing: the parse itself is what a hostile body makes expensive.
  const JsonShape shape = scan_json_shape(body, max_depth);
  if (shape.deepest > max_depth)
    return make_error("the request body nests arrays/objects deeper than {} levels", max_depth);
  if (shape.widest_object > kMaxObjectKeys)
    return make_error("the request body has an object of more than {} keys", kMaxObjectKeys);
  if (shape.key_pairs > kMaxKeyPairs)
    return make_error("the request body's objects hold too many keys together (at most {} pairs of keys within "
                      "objects, e.g. {} objects of 256 keys)", kMaxKeyPairs, kMaxKeyPairs / (256 * 255 / 2));
  if (shape.values > kMaxJsonValues)
    return make_error("the request body holds more than {} JSON values", kMaxJsonValues);
  ojson j = ojson::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded()) return make_error("the request body is not valid JSON (UTF-8)");
  return j;
}

std::string dump_json(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ojson error_body(const std::string& message, const std::string& type, const std::string& param) {
  return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? ojson(nullptr) : ojson(param)}, {"code", nullptr}}}};
}

size_t utf8_wellformed_len(std::string_view s, size_t i) {
  const unsigned char c = (unsigned char)s[i];
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range (RFC 3629's table)
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c == 0xE0) n = 3, lo = 0xA0;
  else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) n = 3;
  else if (c == 0xED) n = 3, hi = 0x9F;  // no surrogates
  else if (c == 0xF0) n = 4, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) n = 4;
  else if (c == 0xF4) n = 4, hi = 0x8F;  // nothing past U+10FFFF
  else return 0;
  if (i + n > s.size()) return 0;
  const unsigned char c1 = (unsigned char)s[i + 1];
  if (c1 < lo || c1 > hi) return 0;
  for (size_t k = 2; k < n; k++)
    if (((unsigned char)s[i + k] & 0xC0) != 0x80) return 0;
  return n;
}

bool is_valid_utf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = utf8_wellformed_len(bytes, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string token_display(std::string_view bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = utf8_wellformed_len(bytes, i);
    if (n) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += fmt::format("\\x{:02x}", (unsigned char)bytes[i]);
      i++;
    }
  }
  return out;
}

namespace {

ojson byte_values(std::string_view bytes) {
  ojson a = ojson::array();
  for (unsigned char c : bytes) a.push_back((int)c);
  return a;
}

std::string legacy_token(std::string_view bytes) {
  return is_valid_utf8(bytes) ? std::string(bytes) : "bytes:" + token_display(bytes);
}

}  // namespace

ojson chat_logprobs(const std::vector<TokenLogprob>& tokens) {
  ojson content = ojson::array();
  for (const TokenLogprob& t : tokens) {
    ojson top = ojson::array();
    for (const auto& [b, lp] : t.top) top.push_back({{"token", token_display(b)}, {"logprob", lp}, {"bytes", byte_values(b)}});
    content.push_back({{"token", token_display(t.bytes)}, {"logprob", t.logprob}, {"bytes", byte_values(t.bytes)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

ojson completion_logprobs(const std::vector<TokenLogprob>& tokens, bool with_top, size_t first_offset) {
  ojson toks = ojson::array(), lps = ojson::array(), tops = ojson::array(), offs = ojson::array();
  size_t off = first_offset;
  for (const TokenLogprob& t : tokens) {
    toks.push_back(legacy_token(t.bytes));
    lps.push_back(t.logprob);
    offs.push_back(off);
    off += t.bytes.size();
    if (with_top) {
      ojson alt = ojson::object();
      for (const auto& [b, lp] : t.top) alt[legacy_token(b)] = lp;
      tops.push_back(alt);
    }
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", with_top ? tops : ojson(nullptr)}, {"text_offset", offs}};
}

}  // namespace tandem::server
