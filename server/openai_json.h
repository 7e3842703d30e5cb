// The JSON the OpenAI endpoints read and write, kept apart from HTTP so it can be tested alone:
// request bodies parsed with a bounded nesting depth, responses dumped as valid UTF-8 whatever
// the model produced, and logprob entries for token bytes that need not be valid UTF-8.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tandem::server {

using ojson = nlohmann::ordered_json;

// Request bodies nest at most this deep (arrays and objects); deeper is a 400 before parsing,
// so nothing that walks the JSON recursively (copies, dumps, templates) sees deep input.
constexpr int kMaxJsonDepth = 64;
// Parsing an object of n keys costs n^2/2 key comparisons (ordered_json searches linearly), so
// bodies are bounded in keys per object and in those comparisons over all objects, and in
// values (each one an allocation), before parsing: such a body gets its 400 in milliseconds.
// The values bound leaves room for /detokenize's 262144 ids.
constexpr size_t kMaxObjectKeys = 1024;
constexpr size_t kMaxKeyPairs = size_t{1} << 21;
constexpr size_t kMaxJsonValues = size_t{1} << 19;

// The deepest nesting of arrays/objects in `text` (strings skipped), counting stops past `limit`.
int json_nesting_depth(std::string_view text, int limit);
// Parses a request body; errors name what is wrong ("nests deeper than 64 levels", "an object of more
// than 1024 keys", "not valid JSON").
Result<ojson> parse_json_body(std::string_view body, int max_depth = kMaxJsonDepth);

// Dumps with any invalid UTF-8 replaced by U+FFFD: a last line of defence, never an exception.
std::string dump_json(const ojson& j);
ojson error_body(const std::string& message, const std::string& type, const std::string& param = "");

// Length of the well-formed UTF-8 sequence starting at s[i]; 0 when none starts there.
size_t utf8_wellformed_len(std::string_view s, size_t i);
// A token's bytes as text: well-formed UTF-8 kept, every other byte written as "\xHH" (as
// OpenAI shows byte-fallback tokens), so the result is always valid UTF-8.
std::string token_display(std::string_view bytes);
bool is_valid_utf8(std::string_view bytes);

// One generated token for logprobs: its bytes, log-probability, and the alternatives asked for.
struct TokenLogprob {
  std::string bytes;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // bytes of each alternative, most likely first
};

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token","logprob","bytes"}]}]}.
ojson chat_logprobs(const std::vector<TokenLogprob>& tokens);
// Completions: {"tokens", "token_logprobs", "top_logprobs" ([{token: logprob}] or null when
// none were asked for), "text_offset"}. A token that is not valid UTF-8 reads "bytes:\xHH..."
// as in OpenAI's legacy API. Offsets count bytes of the completion from `first_offset`.
ojson completion_logprobs(const std::vector<TokenLogprob>& tokens, bool with_top, size_t first_offset = 0);

}  // namespace tandem::server
